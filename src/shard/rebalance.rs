//! The requesting side of resynchronisation (seed 001 step 2, seed 003):
//! this node pages `GET /timers?node-for-replicas=<me>&cluster-view-id=..`
//! from every other node, applies seed 003's rules to each timer listed,
//! and sends `DELETE /timers/references` to the leaving nodes.
//!
//! For a timer listed with new replica list `new`, old list `old`, and this
//! node at `p` in `new` (a node not in `old` counts as infinitely high):
//!
//! 1. **Add** it here only if this node moved down or stayed
//!    (`p <= old position`).
//! 2. **Replicate** it to each new replica above `p` whose old position is
//!    at or above `p`.
//! 3. **Tombstone** it on each old replica at or above `p` that is no
//!    longer a replica and is not leaving.
//! 4. Tell the leaving nodes `(ID, p)`: they mark that replica `p` and
//!    those above it know the timer.
//!
//! A timer whose lists are equal (a restore: `all-views`, listed to a node
//! that restarted empty) is only added: the others already have it.
//!
//! A run happens on shard 0, one at a time; requests during a run are
//! coalesced into one more run. An unreachable node is retried with
//! backoff for `resync-peer-retry-ms`, then reported, and the run goes on
//! with the next; the run then ends `failed`. Bounds: one page in hand
//! (`resync-page-timers`, and the serving node's byte bound), one request
//! at a time, each within `resync-timeout-ms`.

use super::conflict::Source;
use super::room::{Room, Who};
use super::Shard;
use crate::cluster::{Cluster, Node};
use crate::http::client::{Client, ClientConfig};
use crate::http::tls;
use crate::http::uri;
use crate::runtime::bulk::{self, Pacer};
use crate::runtime::clock;
use crate::runtime::notify::Notify;
use crate::stats::{self, ShardStats};
use crate::timer::spec::TimerSpec;
use crate::timer::spec::TAGS_MAX;
use crate::timer::{spec, TimerId};
use futures_lite::future;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::cell::Cell;
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
const VIEW_CHANGED: &str = "the cluster view changed during the run";

/// Resync requests waiting for shard 0's resync loop.
#[derive(Default)]
pub struct Trigger {
    /// A run is wanted (`true`: restore every replica, not only old-view
    /// ones). Requests coalesce.
    pending: Cell<Option<bool>>,
    wake: Notify,
    /// Runs started so far (shard 0).
    started: Cell<u64>,
}

impl Trigger {
    /// Ask for a run; returns the number of the run that will serve this
    /// request (the next one to start).
    pub fn request(&self, all_views: bool) -> u64 {
        let all = self.pending.get().unwrap_or(false) || all_views;
        self.pending.set(Some(all));
        self.wake.notify();
        self.started.get() + 1
    }
}

/// Shard 0's resync loop: one run per (coalesced) request, until shutdown.
pub async fn resync_loop(shard: Rc<Shard>) {
    assert_eq!(shard.id, 0, "the resync runs on shard 0");
    while !shard.gate.is_closing() {
        let Some(all_views) = shard.rebalance.pending.take() else {
            future::or(shard.rebalance.wake.wait(), shard.gate.closing()).await;
            continue;
        };
        let t = &shard.rebalance;
        t.started.set(t.started.get() + 1);
        run_recorded(&shard, all_views).await;
    }
}

/// One run, with its state and outcome in the stats and the log.
async fn run_recorded(shard: &Rc<Shard>, all_views: bool) {
    let s = shard.my_stats();
    s.resync_begin();
    let kind = if all_views { "restore" } else { "resync" };
    tracing::info!(target: "chronos::resync", "{kind} started");
    let started = Instant::now();
    // Each poll of a run is one stretch of the shard's thread without a
    // breath: measured (`GET /cluster`, "stretch-us-max").
    let mut result = bulk::metered(run(shard, all_views)).await;
    // A reload during the run: it starts again under the new view.
    while result.as_ref().is_err_and(|e| e == VIEW_CHANGED) && !shard.gate.is_closing() {
        tracing::warn!(target: "chronos::resync", "{kind}: {VIEW_CHANGED}; starting again");
        result = bulk::metered(run(shard, all_views)).await;
    }
    s.resync_peers_left.store(0, Relaxed);
    let ms = started.elapsed().as_millis();
    match result {
        Ok(()) => {
            tracing::info!(target: "chronos::resync", "{kind} complete in {ms} ms");
            *s.resync_error.lock().expect("not poisoned") = String::new();
            s.resync_end(stats::RESYNC_COMPLETE);
        }
        Err(e) => {
            tracing::error!(target: "chronos::resync", "{kind} failed after {ms} ms: {e}");
            s.resync_failed.fetch_add(1, Relaxed);
            *s.resync_error.lock().expect("not poisoned") = e;
            s.resync_end(stats::RESYNC_FAILED);
        }
    }
}

/// How often a resync waiting for the node's recovery looks again.
const RECOVERY_POLL: Duration = Duration::from_millis(10);

/// Page every other node in turn.
async fn run(shard: &Rc<Shard>, all_views: bool) -> Result<(), String> {
    // The log is the first source (`[storage]`): what a resync adds goes
    // over the recovered store, never under it.
    while shard.recovering() {
        if shard.gate.is_closing() {
            return Err("shutting down".into());
        }
        glommio::timer::sleep(RECOVERY_POLL).await;
    }
    let cluster = shard.cluster();
    let Some(me) = cluster.local.and(cluster.local_peer()) else {
        return Err("this node is leaving: it serves resyncs but runs none".into());
    };
    let c = &shard.resolved.config.cluster;
    let timeout = Duration::from_millis(c.resync_timeout_ms);
    let client = Client::new(ClientConfig {
        timeout,
        connect_timeout: timeout.min(Duration::from_secs(1)),
        per_host_max: 1,
    })
    .with_peer_tls(shard.resolved.peer_tls.as_ref().map(tls::for_shard));
    let peers: Vec<usize> = (0..cluster.all_nodes().count())
        .filter(|&p| p != me)
        .collect();
    let left = &shard.my_stats().resync_peers_left;
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
        if shard.gate.is_closing() {
            return Err("shutting down".into());
        }
        if shard.cluster().view_id != cluster.view_id {
            return Err(VIEW_CHANGED.into());
        }
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(failed.join("; ")),
    }
}

/// One page of a listing, as the serving node writes it, without its
/// `timers` (split off and parsed one by one: [`parse_page`]).
#[derive(Deserialize)]
struct PageRest {
    timers: Vec<IgnoredAny>,
    cursor: Option<String>,
}

#[derive(Deserialize)]
struct Entry<'a> {
    #[serde(rename = "TimerID", borrow)]
    id: Cow<'a, str>,
    #[serde(rename = "OldReplicas", borrow)]
    old: Vec<Cow<'a, str>>,
    #[serde(rename = "Timer", borrow)]
    timer: Listed<'a>,
}

/// An entry's timer: parsed already, by [`fast_entry`] (one pass over
/// its bytes), or its JSON as serde found it, parsed when applied.
enum Listed<'a> {
    Parsed(Result<TimerSpec<'a>, String>),
    Raw(&'a RawValue),
}

impl<'de: 'a, 'a> Deserialize<'de> for Listed<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(Listed::Raw)
    }
}

impl<'a> Listed<'a> {
    /// The timer, checked (a JSON that is no timer is this entry's error).
    fn spec(self) -> Result<TimerSpec<'a>, String> {
        match self {
            Listed::Parsed(spec) => spec,
            Listed::Raw(raw) => spec::parse(raw.get().as_bytes(), uri::check),
        }
    }
}

/// The entry at the start of `text` as this service writes it,
/// `{"TimerID":"..","OldReplicas":[".."],"Timer":{..}}`, read in one pass
/// with the timer's fast reader ([`spec::parse_prefix`]), and the bytes it
/// took; `None` for anything else (escapes in a string, whitespace, other
/// keys or another order, a timer that reader declines): serde reads it.
fn fast_entry(text: &[u8]) -> Option<(Entry<'_>, usize)> {
    let mut at = text.strip_prefix(b"{\"TimerID\":")?;
    let id = plain_str(&mut at)?;
    at = at.strip_prefix(b",\"OldReplicas\":[")?;
    let mut old = Vec::new();
    if let Some(rest) = at.strip_prefix(b"]") {
        at = rest;
    } else {
        loop {
            old.push(plain_str(&mut at)?);
            let (&next, rest) = at.split_first()?;
            at = rest;
            match next {
                b',' => {}
                b']' => break,
                _ => return None,
            }
        }
    }
    at = at.strip_prefix(b",\"Timer\":")?;
    let (spec, used) = spec::parse_prefix(at, uri::check)?;
    at = at[used..].strip_prefix(b"}")?;
    let entry = Entry {
        id,
        old,
        timer: Listed::Parsed(spec),
    };
    Some((entry, text.len() - at.len()))
}

/// A JSON string at the start of `*at` with no escape and no control
/// character (serde borrows such a string as it is), moving `*at` past it.
fn plain_str<'a>(at: &mut &'a [u8]) -> Option<Cow<'a, str>> {
    let rest = at.strip_prefix(b"\"")?;
    let end = rest
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    (rest[end] == b'"').then_some(())?;
    let text = std::str::from_utf8(&rest[..end]).ok()?;
    *at = &rest[end + 1..];
    Some(Cow::Borrowed(text))
}

/// A page's entries and its cursor. The page (about 400 KB for 1,000
/// timers) is parsed entry by entry, with a breath whenever the pacer's
/// stretch is used up: parsed in one go it held the reactor for about a
/// millisecond. Any part that is
/// not JSON fails the whole page, as one parse would.
async fn parse_page<'a>(
    body: &'a [u8],
    pacer: &mut Pacer,
) -> Result<(Vec<Entry<'a>>, Option<String>), String> {
    let bad = |e: &dyn std::fmt::Display| format!("a resync page that is not JSON: {e}");
    let (entries, rest) = bulk::parse_array_fast(body, "timers", pacer, fast_entry)
        .await
        .map_err(|e| bad(&e))?;
    let rest: PageRest = serde_json::from_slice(&rest).map_err(|e| bad(&e))?;
    // Emptied by the split, unless the key came escaped (never, from us).
    if !rest.timers.is_empty() {
        return Err(bad(&"a timers key spelled with escapes"));
    }
    Ok((entries, rest.cursor))
}

/// For the fuzz target `resync_page` (issue 40: the hand-written reader
/// had none): a page read as a resync reads it (the one-pass entry reader
/// first, serde behind it) and by serde alone, each as its entry count or
/// its error. Whatever serde refuses the resync must refuse too, and where
/// both read the page they find the same entries.
pub fn parse_page_both(body: &[u8]) -> (Result<usize, String>, Result<usize, String>) {
    let mut pacer = Pacer::unpaced();
    let fast = futures_lite::future::block_on(parse_page(body, &mut pacer)).map(|(e, _)| e.len());
    let serde_only = futures_lite::future::block_on(async {
        let (entries, _rest) = bulk::parse_array::<Entry>(body, "timers", &mut pacer).await?;
        Ok(entries.len())
    });
    (fast, serde_only)
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
        let c = &self.shard.resolved.config.cluster;
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
                ShardStats::add(&self.shard.my_stats().resync_received, 1);
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
            if self.shard.gate.is_closing() {
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
            .wait(&shard.gate, &shard.replicator, replicate | tombstone)
            .await?;
        let (mut head, _) = shard.replica_head(id, &spec);
        // The start came as a delta to the serving node's clock when it
        // wrote the page; count it from when the page arrived, not from
        // now: applying a page can take a while (backpressure), and every
        // ms of it would make this copy pop a ms late. (Never early: the
        // page was written before it arrived.)
        let lag_ms = clock::now_ms().saturating_sub(received_ms);
        head.start_ms = head.start_ms.saturating_sub(lag_ms);
        let mut tags = [("", 0u32); TAGS_MAX];
        for (slot, (name, count)) in tags.iter_mut().zip(&spec.tags) {
            *slot = (name.as_ref(), *count);
        }
        let tags = &tags[..spec.tags.len().min(TAGS_MAX)];
        let callback = (spec.uri.as_ref(), spec.opaque.as_ref());
        shard.send_replication(cluster, &head, callback, tags, &new, replicate);
        shard.send_replication(cluster, &head, ("", ""), &[], &new, tombstone);
        let s = shard.my_stats();
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
        let retry = Duration::from_millis(shard.resolved.config.cluster.resync_peer_retry_ms);
        let deadline = Instant::now() + retry;
        let host = node.socket.ip().to_string();
        let mut all: Vec<(&str, &[u8])> = headers.to_vec();
        if let Some(value) = super::authorization(&shard.resolved) {
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
            ShardStats::add(&shard.my_stats().resync_peer_errors, 1);
            let error = error?;
            let backoff = Duration::from_millis(backoff_ms);
            if shard.cluster().view_id != self.cluster.view_id {
                return Err(VIEW_CHANGED.into());
            }
            if Instant::now() + backoff > deadline || shard.gate.is_closing() {
                return Err(error);
            }
            log_retry(node, first_failure, &mut logged, &error, retry);
            let sleep = glommio::timer::sleep(backoff);
            future::or(sleep, shard.gate.closing()).await;
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

impl Shard {
    /// Ask for a resync from any shard: shard 0 runs it. The number of the
    /// run that will serve the request.
    pub async fn request_resync(&self, all_views: bool) -> Option<u64> {
        if self.id == 0 {
            return Some(self.rebalance.request(all_views));
        }
        let reply = self
            .mesh
            .ask(0, |reply| super::MeshMsg::StartResync { all_views, reply })
            .await;
        match reply {
            Some(super::Reply::ResyncRun(n)) => Some(n),
            _ => None,
        }
    }

    /// `GET /cluster`: this node's view and the resync's state, as JSON.
    pub fn cluster_report(&self) -> String {
        let c = self.cluster();
        let names = |l: &[Node]| l.iter().map(|n| n.address.clone()).collect::<Vec<_>>();
        let members = c.nodes.len() - c.joining;
        let s = &self.stats[0];
        let (state, started_runs, finished_runs) = s.resync_progress();
        let count = |f: &std::sync::atomic::AtomicU64| f.load(Relaxed);
        let (stretch_us_max, stretch_wall_us_max, stretch_counts) = bulk::stretches();
        serde_json::json!({
            "localhost": c.local_address,
            "cluster-view-id": c.view_id_string(),
            "nodes": names(&c.nodes[..members]),
            "joining": names(&c.nodes[members..]),
            "leaving": names(&c.leaving),
            "instance-id": self.store.borrow().ids.instance(),
            "sites": {
                "local_site": self.resolved.sites.local,
                "remote_site": self.resolved.sites.remote.iter().map(|r| format!("{}={}", r.name, r.address)).collect::<Vec<_>>(),
                "replicate_timers_across_sites": self.resolved.sites.across,
            },
            "resync": {
                "state": stats::RESYNC_STATES[state],
                "started-runs": started_runs,
                "finished-runs": finished_runs,
                "failed-runs": s.resync_failed.load(Relaxed),
                "peers-left": s.resync_peers_left.load(Relaxed),
                "received": count(&s.resync_received),
                "added": count(&s.resync_added),
                "replicated": count(&s.resync_replicated),
                "tombstoned": count(&s.resync_tombstoned),
                "peer-errors": count(&s.resync_peer_errors),
                // This node's longest stretch of bulk work (resync runs,
                // pages served, references marked) without a breath, in
                // thread CPU time and in wall-clock time (preemptions by
                // the kernel included), and the stretches per bucket (CPU
                // µs, up to each bound).
                "stretch-us-max": stretch_us_max,
                "stretch-wall-us-max": stretch_wall_us_max,
                "stretch-us-bounds": bulk::STRETCH_BOUNDS_US,
                "stretch-counts": stretch_counts,
                "last-error": *s.resync_error.lock().expect("not poisoned"),
            },
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry as `resync.rs` writes it (the timer through the
    /// replication encoder), with `old` replicas and `extra` tags.
    fn written(old: &str, tags: &[(&str, u32)], opaque: &str) -> String {
        let body = crate::cluster::replicate::Body {
            interval_ms: 3_600_000,
            repeat_for_ms: 3_600_000,
            start_time_delta_ms: -1234,
            sequence: 3,
            version_us: 1_764_000_000_000_000,
            uri: "http://127.0.0.1:9000/cb?x=1",
            opaque,
            view_id: 77,
            replicas: &["127.0.0.1:7253", "127.0.0.2:7253"],
            sites: &[],
            factor_requested: 2,
            tags,
            start_time_unix_ms: Some(1_764_000_000_123),
            only_newer: false,
        };
        let mut timer = Vec::new();
        crate::cluster::replicate::encode_body(&mut timer, &body);
        let timer = String::from_utf8(timer).unwrap();
        let id = "0123456789abcdef0000000000000003";
        format!(r#"{{"TimerID":"{id}","OldReplicas":[{old}],"Timer":{timer}}}"#)
    }

    /// What the fuzz target `resync_page` holds the page reader to: both
    /// readings find the same entries; what serde refuses, both refuse.
    #[test]
    fn a_page_reads_alike_fast_and_by_serde_alone() {
        let entry = written(r#""127.0.0.1:7253""#, &[("CALL", 2)], "o");
        let page = format!(r#"{{"timers":[{entry},{entry}],"cursor":"c"}}"#);
        let (fast, serde_only) = parse_page_both(page.as_bytes());
        assert_eq!(fast, Ok(2));
        assert_eq!(serde_only, Ok(2));
        for bad in [
            &b"{\"timers\":[{\"TimerID\":"[..],
            b"",
            b"[]",
            b"{\"timers\":[1,]}",
        ] {
            let (fast, serde_only) = parse_page_both(bad);
            assert!(fast.is_err() && serde_only.is_err(), "{bad:?}");
        }
    }

    /// What an entry reads as: ID, old replicas, the timer's verdict.
    type Read<'a> = (
        Cow<'a, str>,
        Vec<Cow<'a, str>>,
        Result<TimerSpec<'a>, String>,
    );

    fn read(e: Entry<'_>) -> Read<'_> {
        (e.id, e.old, e.timer.spec())
    }

    /// The one-pass reading gives what serde and `spec::parse` give, takes
    /// exactly the entry's bytes, and declines what it does not know.
    #[test]
    fn fast_entry_reads_as_serde_and_spec_parse_do() {
        let plain = written(r#""127.0.0.1:7253""#, &[], "o");
        let cases = [
            (plain.clone(), true),
            (written("", &[], "o"), true),
            (written(r#""a:1","b:2","c:3""#, &[("CALL", 2)], "ü"), true),
            // Valid JSON, but no valid timer: this entry's error.
            (
                plain.replace("\"interval\":3600", "\"interval\":-3600"),
                false,
            ),
            (plain.replace("\"uri\":\"http:", "\"uri\":\"ftp:"), true),
            // Not as written: serde's.
            (
                plain.replace("\"OldReplicas\":", "\"OldReplicas\": "),
                false,
            ),
            (
                plain.replace("127.0.0.1:7253\"]", "127.0.0.1:7253\\u0041\"]"),
                false,
            ),
            (
                plain.replace("\"TimerID\"", "\"Other\":1,\"TimerID\""),
                false,
            ),
            (written("", &[], "a\\\"b"), false),
        ];
        for (text, fast) in &cases {
            let serde: Entry = serde_json::from_str(text).expect(text);
            let want = read(serde);
            let followed = format!("{text},{text}]");
            match fast_entry(followed.as_bytes()) {
                Some((e, used)) => {
                    assert!(fast, "read: {text}");
                    assert_eq!(used, text.len(), "{text}");
                    assert_eq!(read(e), want, "{text}");
                }
                None => assert!(!fast, "declined: {text}"),
            }
        }
        assert!(read(fast_entry(plain.as_bytes()).unwrap().0).2.is_ok());
        for bad in [&plain[..plain.len() - 1], "{\"TimerID\":\"x", "", "{"] {
            assert!(fast_entry(bad.as_bytes()).is_none(), "{bad}");
        }
    }

    /// A page of entries read in one pass and by serde, mixed, reads as
    /// serde alone reads it; what is not JSON still fails the page.
    #[test]
    fn a_page_reads_as_serde_alone_reads_it() {
        let a = written(r#""127.0.0.1:7253""#, &[("T", 1)], "o");
        let b = a.replace("\"Timer\":", "\"Timer\": ");
        let page = format!(r#"{{"timers":[{a},{b} , {a}],"cursor":"12-00ff"}}"#);
        let run = |body: &[u8], fast: bool| {
            let body = body.to_vec();
            glommio::LocalExecutor::default().run(async move {
                let mut pacer = Pacer::unpaced();
                let got = match fast {
                    true => parse_page(&body, &mut pacer).await,
                    false => bulk::parse_array::<Entry>(&body, "timers", &mut pacer)
                        .await
                        .map(|(e, _)| (e, Some("12-00ff".to_string()))),
                };
                got.map(|(entries, cursor)| {
                    let read: Vec<String> = entries
                        .into_iter()
                        .map(|e| format!("{:?}", read(e)))
                        .collect();
                    (read, cursor)
                })
            })
        };
        let fast = run(page.as_bytes(), true).unwrap();
        assert_eq!(fast, run(page.as_bytes(), false).unwrap());
        assert_eq!(fast.0.len(), 3);
        assert_eq!(fast.1.as_deref(), Some("12-00ff"));
        let broken = page.replacen("},{", "},x{", 1);
        assert!(run(broken.as_bytes(), true).is_err());
    }

    #[test]
    fn percent_encode_keeps_addresses_readable() {
        assert_eq!(super::percent_encode("127.0.0.1:7253"), "127.0.0.1:7253");
        assert_eq!(super::percent_encode("[::1]:7253"), "%5B::1%5D:7253");
        assert_eq!(super::percent_encode("1-2a"), "1-2a");
    }
}
