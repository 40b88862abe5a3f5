//! The requesting side's run: every other node paged in turn, seed 003's
//! rules applied to each timer listed, the leaving nodes told of them;
//! each request retried with backoff for `resync-peer-retry-ms`. One page
//! in hand, one request at a time.

use super::page::{parse_page, Entry};
use crate::cluster::{Cluster, Node};
use crate::http::client::{Client, ClientConfig};
use crate::http::tls;
use crate::runtime::bulk::{self, Pacer};
use crate::runtime::clock;
use crate::shard::conflict::Source;
use crate::shard::room::{Room, Who};
use crate::shard::Shard;
use crate::stats::ShardStats;
use crate::timer::spec::TAGS_MAX;
use crate::timer::{TimerHead, TimerId, TimerSpec};
use futures_lite::future;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Backoff between attempts at an unreachable node.
const BACKOFF_MS_MIN: u64 = 100;
const BACKOFF_MS_MAX: u64 = 2_000;

/// The start-up grace period: a peer error that clears within it (a
/// cluster's nodes starting one after the other, a joining node whose
/// peers have not reloaded yet) is logged at info; one that lasts longer
/// is a warning.
pub const PEER_ERROR_GRACE_MS: u64 = 5_000;

/// Why a run stopped early: a reload changed the view under it. The run
/// is started again under the new view.
pub(super) const VIEW_CHANGED: &str = "the cluster view changed during the run";

/// How often a resync waiting for the node's recovery looks again.
const RECOVERY_POLL: Duration = Duration::from_millis(10);

/// Page every other node in turn.
pub(super) async fn run(shard: &Rc<Shard>, all_views: bool) -> Result<(), String> {
    // The log is the first source (`[storage]`): what a resync adds goes
    // over the recovered store, never under it.
    while shard.recovering() {
        if shard.base.gate.is_closing() {
            return Err("shutting down".into());
        }
        glommio::timer::sleep(RECOVERY_POLL).await;
    }
    let cluster = shard.timers.cluster();
    let Some(me) = cluster.local.and(cluster.local_peer()) else {
        return Err("this node is leaving: it serves resyncs but runs none".into());
    };
    let c = &shard.base.resolved.config.cluster;
    let timeout = Duration::from_millis(c.resync_timeout_ms);
    let client = Client::new(ClientConfig {
        timeout,
        connect_timeout: timeout.min(Duration::from_secs(1)),
        per_host_max: 1,
    })
    .with_peer_tls(shard.base.resolved.peer_tls.as_ref().map(tls::for_shard));
    let peers: Vec<usize> = (0..cluster.all_nodes().count())
        .filter(|&p| p != me)
        .collect();
    let left = &shard.base.my_stats().resync_peers_left;
    left.store(peers.len() as i64, Relaxed);
    let mut failed = Vec::new();
    let mut run = Run {
        shard,
        client: &client,
        cluster: &cluster,
        all_views,
        deaf_leaving: 0,
        room: Room::new(Who::Resync),
    };
    for peer in peers {
        match run.sync_from(peer).await {
            Err(e) if e == VIEW_CHANGED => return Err(e),
            Err(e) => {
                tracing::error!(target: "chronos::resync", "{}: {e}", cluster.node_at(peer).address);
                failed.push(format!("{}: {e}", cluster.node_at(peer).address));
            }
            Ok(()) => {}
        }
        left.fetch_sub(1, Relaxed);
        if shard.base.gate.is_closing() {
            return Err("shutting down".into());
        }
        if shard.timers.cluster().view_id != cluster.view_id {
            return Err(VIEW_CHANGED.into());
        }
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(failed.join("; ")),
    }
}

/// What one run works with.
struct Run<'a> {
    shard: &'a Rc<Shard>,
    client: &'a Client,
    cluster: &'a Cluster,
    all_views: bool,
    /// Leaving nodes (peer mask) a DELETE could not reach in this run.
    deaf_leaving: u64,
    /// Backpressure on the replication queues.
    room: Room,
}

impl Run<'_> {
    /// Page through one node's listing.
    async fn sync_from(&mut self, peer: usize) -> Result<(), String> {
        let node = self.cluster.node_at(peer);
        let c = &self.shard.base.resolved.config.cluster;
        let range = c.resync_page_timers.to_string();
        let mut cursor: Option<String> = None;
        loop {
            let path = self.page_path(cursor.as_deref());
            let headers: [(&str, &[u8]); 1] = [("Range", range.as_bytes())];
            let body = self.fetch(node, "GET", &path, &headers, b"").await?;
            let received_ms = clock::now_ms();
            // The fetch's last poll read the end of the page: a breath
            // before the parse starts its own stretch.
            bulk::breathe().await;
            let mut pacer = Pacer::new();
            let (entries, next) = parse_page(&body, &mut pacer).await?;
            let mut refs = Vec::with_capacity(entries.len());
            for entry in entries {
                // At most one STRETCH of applying between breaths, so
                // this shard's pops are not held up by a resync.
                pacer.tick().await;
                ShardStats::add(&self.shard.base.my_stats().resync_received, 1);
                let id = entry.id.clone();
                match self.apply_entry(entry, received_ms).await {
                    Ok(r) => refs.push(r),
                    Err(e) => {
                        tracing::warn!(target: "chronos::resync", "{}: timer {id} skipped: {e}", node.address);
                    }
                }
            }
            pacer.tick().await;
            self.tell_leaving(&refs).await;
            match next {
                Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
                Some(_) => return Err("the listing did not advance".into()),
                None => return Ok(()),
            }
            if self.shard.base.gate.is_closing() {
                return Err("shutting down".into());
            }
        }
    }

    fn page_path(&self, cursor: Option<&str>) -> String {
        let mut path = format!(
            "/timers?node-for-replicas={}&cluster-view-id={}",
            percent_encode(&self.cluster.local_address),
            self.cluster.view_id
        );
        if let Some(c) = cursor {
            path.push_str("&cursor=");
            path.push_str(&percent_encode(c));
        }
        if self.all_views {
            path.push_str("&all-views=true");
        }
        path
    }

    /// Seed 003's rules for one listed timer; the `(ID, ReplicaIndex)`
    /// to tell the leaving nodes.
    /// Send an entry's timer to the `replicate` peers and its tombstone
    /// to the `tombstone` ones (masks), naming its `new` replicas.
    fn pass_on(&self, head: &TimerHead, spec: &TimerSpec, new: &[&str], masks: (u64, u64)) {
        let (shard, cluster) = (self.shard, self.cluster);
        let mut tags = [("", 0u32); TAGS_MAX];
        for (slot, (name, count)) in tags.iter_mut().zip(&spec.tags) {
            *slot = (name.as_ref(), *count);
        }
        let tags = &tags[..spec.tags.len().min(TAGS_MAX)];
        let ext = super::super::replication::ext_of(spec, head);
        let callback = (spec.uri.as_ref(), spec.opaque.as_ref(), &ext[..]);
        shard.send_replication(cluster, head, callback, tags, new, masks.0);
        let tombstone = super::super::replication::TOMBSTONE;
        shard.send_replication(cluster, head, tombstone, &[], new, masks.1);
    }

    async fn apply_entry(
        &mut self,
        e: Entry<'_>,
        received_ms: u64,
    ) -> Result<(TimerId, u8), String> {
        let (shard, cluster) = (self.shard, self.cluster);
        let id = TimerId::parse(e.id.as_bytes()).ok_or("a TimerID that is not 32 hex digits")?;
        let spec = e.timer.spec()?;
        let r = spec
            .replication
            .as_ref()
            .ok_or("the timer names no replicas")?;
        let new: Vec<&str> = r.replicas.iter().map(|a| a.as_ref()).collect();
        let me = cluster.local_address.as_str();
        let p = new
            .iter()
            .position(|a| *a == me)
            .ok_or("this node is not one of its new replicas")?;
        let old_pos = |a: &str| e.old.iter().position(|o| o == a).unwrap_or(usize::MAX);
        let moved = e.old.len() != new.len() || e.old.iter().zip(&new).any(|(o, n)| o != n);
        let (mut replicate, mut tombstone) = (0u64, 0u64);
        if moved {
            for a in new.iter().skip(p + 1).filter(|a| old_pos(a) >= p) {
                replicate |= cluster.peer_of(a).map_or(0, |i| 1u64 << i);
            }
            let leaving = |a: &str| cluster.leaving.iter().any(|n| n.address == a);
            for a in e.old.iter().skip(p) {
                if !new.contains(&a.as_ref()) && !leaving(a) {
                    tombstone |= cluster.peer_of(a).map_or(0, |i| 1u64 << i);
                }
            }
        }
        let (replicate, tombstone) = (shard.without_me(replicate), shard.without_me(tombstone));
        self.room
            .wait(
                &shard.base.gate,
                &shard.outbound.replicator,
                replicate | tombstone,
            )
            .await?;
        let (mut head, _) = shard.replica_head(id, &spec);
        // The start came as a delta to the serving node's clock when it
        // wrote the page; count it from when the page arrived, not from
        // now: applying a page can take a while (backpressure), and every
        // ms of it would make this copy pop a ms late. (Never early: the
        // page was written before it arrived.)
        // (An absolute start, issue 42's timing, needs no such care.)
        if spec.timing.is_none() {
            let lag_ms = clock::now_ms().saturating_sub(received_ms);
            head.start_ms = head.start_ms.saturating_sub(lag_ms);
        }
        self.pass_on(&head, &spec, &new, (replicate, tombstone));
        let s = shard.base.my_stats();
        ShardStats::add(&s.resync_replicated, replicate.count_ones() as u64);
        ShardStats::add(&s.resync_tombstoned, tombstone.count_ones() as u64);
        if p <= old_pos(me) {
            shard
                .route_apply(head, Some(spec), Source::Peer)
                .await
                .map_err(|e| e.reason)?;
            ShardStats::add(&s.resync_added, 1);
        }
        Ok((id, p as u8))
    }

    /// `DELETE /timers/references` with this page's timers to every
    /// leaving node (one that does not answer is skipped for the rest of
    /// the run).
    async fn tell_leaving(&mut self, refs: &[(TimerId, u8)]) {
        // No body to build when no node is leaving (a join, as here
        // usually): 1,000 IDs encoded for nobody cost a fifth of a ms.
        if refs.is_empty() || self.cluster.leaving.is_empty() {
            return;
        }
        let mut body = String::with_capacity(16 + refs.len() * 64);
        body.push_str("{\"IDs\":[");
        for (i, (id, index)) in refs.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str("{\"ID\":\"");
            body.push_str(&id.to_hex_string());
            body.push_str("\",\"ReplicaIndex\":");
            body.push_str(&index.to_string());
            body.push('}');
        }
        body.push_str("]}");
        let cluster = self.cluster;
        for (k, node) in cluster.leaving.iter().enumerate() {
            let peer = cluster.nodes.len() + k;
            if self.deaf_leaving & (1u64 << peer) != 0 || node.address == cluster.local_address {
                continue;
            }
            let sent = self
                .fetch(node, "DELETE", "/timers/references", &[], body.as_bytes())
                .await;
            if let Err(e) = sent {
                tracing::error!(target: "chronos::resync", "{}: references not delivered, skipped for this run: {e}", node.address);
                self.deaf_leaving |= 1u64 << peer;
            }
        }
    }

    /// One request, retried with backoff for `resync-peer-retry-ms`; the
    /// body of a 2xx answer.
    async fn fetch(
        &self,
        node: &Node,
        method: &str,
        path: &str,
        headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> Result<Vec<u8>, String> {
        let shard = self.shard;
        let retry = Duration::from_millis(shard.base.resolved.config.cluster.resync_peer_retry_ms);
        let deadline = Instant::now() + retry;
        let host = node.socket.ip().to_string();
        let mut all: Vec<(&str, &[u8])> = headers.to_vec();
        if let Some(value) = crate::shard::authorization(&shard.base.resolved) {
            all.push(("Authorization", value.as_bytes()));
        }
        let headers = &all[..];
        let mut backoff_ms = BACKOFF_MS_MIN;
        let first_failure = Instant::now();
        let mut logged = Logged::Nothing;
        loop {
            let answer = self
                .client
                .request(
                    &host,
                    node.socket.port(),
                    &node.address,
                    method,
                    path,
                    headers,
                    body,
                    true,
                )
                .await;
            let error = match answer {
                Ok(r) if (200..300).contains(&r.status) => return Ok(r.body),
                Ok(r) => answer_error(method, r.status, &r.body),
                Err(e) => Ok(e),
            };
            ShardStats::add(&shard.base.my_stats().resync_peer_errors, 1);
            let error = error?;
            let backoff = Duration::from_millis(backoff_ms);
            if shard.timers.cluster().view_id != self.cluster.view_id {
                return Err(VIEW_CHANGED.into());
            }
            if Instant::now() + backoff > deadline || shard.base.gate.is_closing() {
                return Err(error);
            }
            log_retry(node, first_failure, &mut logged, &error, retry);
            let sleep = glommio::timer::sleep(backoff);
            future::or(sleep, shard.base.gate.closing()).await;
            backoff_ms = (backoff_ms * 2).min(BACKOFF_MS_MAX);
        }
    }
}

/// What a non-2xx answer to a resync request means: `Ok` the error to
/// retry, `Err` one final for this peer: a 403 (the secrets differ, and
/// retrying cannot mend a config).
fn answer_error(method: &str, status: u16, body: &[u8]) -> Result<String, String> {
    let body = String::from_utf8_lossy(body);
    if status == 403 {
        return Err(format!("{method} answered 403, shared-secret mismatch: this node's [cluster] shared-secret differs from the peer's; not retried ({body})"));
    }
    Ok(format!("{method} answered {status}: {body}"))
}

/// What [`log_retry`] has said of one request's failures so far.
#[derive(Clone, Copy)]
enum Logged {
    Nothing,
    Info,
    Warned,
}

/// A failed attempt at `node`, to be retried: the first one at info (a
/// peer starting or reloading a moment after this node is normal), then
/// once at warn when the peer has failed for longer than
/// [`PEER_ERROR_GRACE_MS`] (counted from the first attempt).
fn log_retry(node: &Node, since: Instant, logged: &mut Logged, error: &str, retry: Duration) {
    let retry_ms = retry.as_millis();
    let past_grace = since.elapsed() > Duration::from_millis(PEER_ERROR_GRACE_MS);
    match *logged {
        // A first attempt that took longer than the grace (a timeout).
        Logged::Nothing | Logged::Info if past_grace => {
            *logged = Logged::Warned;
            tracing::warn!(target: "chronos::resync", "{}: still failing after {PEER_ERROR_GRACE_MS} ms (the start-up grace period): {error}; retrying for up to {retry_ms} ms in all", node.address);
        }
        Logged::Nothing => {
            *logged = Logged::Info;
            tracing::info!(target: "chronos::resync", "{}: {error}; retrying for up to {retry_ms} ms", node.address);
        }
        Logged::Info | Logged::Warned => {}
    }
}

/// Percent-encode everything but unreserved characters and `:`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn percent_encode_keeps_addresses_readable() {
        assert_eq!(super::percent_encode("127.0.0.1:7253"), "127.0.0.1:7253");
        assert_eq!(super::percent_encode("[::1]:7253"), "%5B::1%5D:7253");
        assert_eq!(super::percent_encode("1-2a"), "1-2a");
    }
}
