//! The hand-off at start (issue 37): a restarted node takes what its
//! peers owe it before it pops.
//!
//! While a node is down its peers keep every replication message they
//! owe it (a create, an update, a delete, a pop), queued in memory until
//! it answers (`cluster/replicate/`; beyond a queue's bound, a repair:
//! `shard/repair.rs`). A node restarted from its log holds the timers as
//! they stood when it stopped: one deleted meanwhile would pop here before
//! the delete arrives. So after every shard has replayed its log, shard 0
//! asks every other node what it still owes this one
//! (`GET /handoff?node=<this node>&wait-ms=<n>`): the peer answers once
//! its shards have settled every message they had queued for it when
//! asked (a count: `queued_total` then against `settled_total` now, so
//! the messages load keeps queueing do not hold it up; a retried one
//! behind a settled one may be counted early) and owe it no repair (none
//! marked, none running, and every message of the last one settled; the
//! peer itself done replaying its log and re-sending what the log held,
//! `shard/resend.rs`, which queues only as fast as the queue drains), or
//! `wait-ms` has passed, with `{"owed":N,"repair":false}`. Asking also
//! brings a repair owed to the asker forward, past its back-off (at most
//! one per 5 s: `Replicator::owed`), so the wait is not for a repair due
//! minutes later. Until every
//! peer said nothing is owed, or could not be reached (a peer that is
//! down owes nothing it can deliver now), or [`CATCH_UP_MS_MAX`] passed,
//! no shard pops and `/ready` answers `503 catching up`. Requests and
//! replication are served meanwhile (that is how the owed messages
//! arrive). A single node, or one without `[storage]` (it restarts
//! empty), does not wait.
//!
//! Bounds: one request in flight per peer at a time (peers asked in
//! turn), each within `replication-timeout-ms` plus its `wait-ms`; the
//! whole wait within [`CATCH_UP_MS_MAX`] after the log's replay.

use super::mesh::{MeshMsg, Reply};
use super::Shard;
use crate::http::client::{Client, ClientConfig};
use crate::http::tls;
use crate::http::uri::percent_decode;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The longest a restarted node waits for its peers before it pops,
/// counted from the end of its log's replay.
pub const CATCH_UP_MS_MAX: u64 = 15_000;
/// The longest one `GET /handoff` waits for its shards to owe nothing.
pub const HANDOFF_WAIT_MS_MAX: u64 = 5_000;
/// How often a waiting `GET /handoff`, and a shard waiting for the
/// hand-off, look again.
const POLL: Duration = Duration::from_millis(20);

impl Shard {
    /// Per shard, what it has owed the node at `address`: messages ever
    /// queued for it and ever settled; and whether any owes it a repair.
    pub async fn owed_to(&self, address: &str, out: &mut Vec<(u64, u64)>) -> bool {
        out.clear();
        let mut repair = false;
        for shard in 0..self.base.shards {
            let (queued, settled, r) = if shard == self.base.id {
                self.owed_here(address)
            } else {
                let node = address.to_string();
                let asked = self
                    .base
                    .mesh
                    .ask(shard, |reply| MeshMsg::Owed { node, reply });
                match asked.await {
                    Some(Reply::Owed(q, s, r)) => (q, s, r),
                    _ => (0, 0, false),
                }
            };
            out.push((queued, settled));
            repair |= r;
        }
        repair
    }

    /// What this shard has owed the node at `address` (see [`Self::owed_to`]).
    /// While this node replays its log, more is owed than the queue shows
    /// (the re-send at start follows): a repair is reported, as while the
    /// re-send has not yet queued all it holds for that node
    /// (`Replicator::resend_started`), or a peer restarted meanwhile
    /// settles on the part queued so far and pops the deleted timers the
    /// re-send had not reached (CI: 7 of 20).
    pub fn owed_here(&self, address: &str) -> (u64, u64, bool) {
        let to_come = self.recovering();
        match self.outbound.replicator.owed(address) {
            Some((queued, settled, repair)) => (queued, settled, repair || to_come),
            None => (0, 0, false),
        }
    }

    /// `GET /handoff?node=<address>[&wait-ms=<n>]`: the JSON answer once
    /// every message this node had queued for that node when asked is
    /// settled and no repair is owed, or `wait-ms` (at most
    /// [`HANDOFF_WAIT_MS_MAX`]) has passed; `Err` a status and reason.
    /// Messages queued after the question do not hold the answer up (under
    /// load the queues are never empty).
    pub async fn handoff(&self, query: &str) -> Result<String, (u16, String)> {
        let (node, wait_ms) = handoff_query(query)?;
        if self.timers.cluster().peer_of(&node).is_none() {
            return Err((404, format!("{node} is not a node of this cluster")));
        }
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        let (mut asked, mut now) = (Vec::new(), Vec::new());
        self.owed_to(&node, &mut asked).await;
        loop {
            let repair = self.owed_to(&node, &mut now).await;
            let owed: u64 = asked
                .iter()
                .zip(&now)
                .map(|(&(queued, _), &(_, settled))| queued.saturating_sub(settled))
                .sum();
            let done = owed == 0 && !repair;
            if done || Instant::now() >= deadline || self.base.gate.is_closing() {
                return Ok(format!("{{\"owed\":{owed},\"repair\":{repair}}}"));
            }
            glommio::timer::sleep(POLL).await;
        }
    }
}

/// `node` and `wait-ms` (0 if absent, capped at [`HANDOFF_WAIT_MS_MAX`]).
fn handoff_query(query: &str) -> Result<(String, u64), (u16, String)> {
    let (mut node, mut wait_ms) = (None, 0u64);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v).ok_or((400, format!("{k}: bad percent-encoding")))?;
        match k {
            "node" => node = Some(v),
            "wait-ms" => {
                let digits = !v.is_empty() && v.len() <= 9 && v.bytes().all(|b| b.is_ascii_digit());
                let ms: u64 = match digits {
                    true => v.parse().unwrap_or(u64::MAX),
                    false => return Err((400, format!("wait-ms {v:?} is not a number of ms"))),
                };
                wait_ms = ms.min(HANDOFF_WAIT_MS_MAX);
            }
            _ => {
                return Err((
                    400,
                    format!("unknown parameter {k:?}; expected node, wait-ms"),
                ))
            }
        }
    }
    let node = node.ok_or((400, "missing node".to_string()))?;
    Ok((node, wait_ms))
}

/// Shard 0, once every shard has replayed its log: ask every other node
/// for what it owes this one, then let every shard pop.
pub async fn catch_up(shard: &Rc<Shard>) {
    assert_eq!(shard.base.id, 0, "shard 0 runs the hand-off");
    let started = Instant::now();
    while shard.recovering() && !shard.base.gate.is_closing() {
        glommio::timer::sleep(POLL).await;
    }
    // The bound counts from the end of the replay: the peers' messages
    // and repairs are refused (503 recovering) until then, so a long
    // replay must not eat the time they have to arrive.
    let deadline = Instant::now() + Duration::from_millis(CATCH_UP_MS_MAX);
    let cluster = shard.timers.cluster();
    let timeout = Duration::from_millis(shard.base.resolved.config.cluster.replication_timeout_ms);
    let client = Rc::new(
        Client::new(ClientConfig {
            timeout: timeout + Duration::from_millis(HANDOFF_WAIT_MS_MAX),
            connect_timeout: timeout.min(Duration::from_secs(1)),
            per_host_max: 1,
        })
        .with_peer_tls(shard.base.resolved.peer_tls.as_ref().map(tls::for_shard)),
    );
    let me = cluster.local_address.clone();
    // Every peer at once, each within what is left of the bound.
    let asks: Vec<_> = cluster
        .all_nodes()
        .filter(|n| n.address != me)
        .map(|node| {
            let (shard, client, node, me) =
                (shard.clone(), client.clone(), node.clone(), me.clone());
            crate::runtime::spawn::spawn_local(async move {
                let left = deadline.saturating_duration_since(Instant::now());
                let asked =
                    async { ask_until_settled(&shard, &client, &node, &me, deadline).await };
                let bound = async {
                    glommio::timer::sleep(left).await;
                    false
                };
                (
                    node.address.clone(),
                    futures_lite::future::or(asked, bound).await,
                )
            })
        })
        .collect();
    let mut waited_out = Vec::new();
    for ask in asks {
        let (address, settled) = ask.await;
        if !settled {
            waited_out.push(address);
        }
    }
    let ms = started.elapsed().as_millis();
    match waited_out.is_empty() {
        true => {
            tracing::info!(target: "chronos::replication", "caught up with the peers in {ms} ms: popping")
        }
        false => {
            tracing::warn!(target: "chronos::replication", "still owed replication by {} after {ms} ms ({CATCH_UP_MS_MAX} ms at most): popping; what arrives later applies then", waited_out.join(", "))
        }
    }
    shard.base.stats[0]
        .catching_up
        .store(false, Ordering::Release);
}

/// Ask `node` until it owes this node nothing; `false` if it still did at
/// `deadline`. A node that cannot be reached, or refuses the request (a
/// build without the hand-off, another cluster view), owes nothing that
/// could arrive now.
async fn ask_until_settled(
    shard: &Shard,
    client: &Client,
    node: &crate::cluster::Node,
    me: &str,
    deadline: Instant,
) -> bool {
    while Instant::now() < deadline && !shard.base.gate.is_closing() {
        let left_ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis() as u64;
        let wait_ms = left_ms.min(HANDOFF_WAIT_MS_MAX);
        let path = format!("/handoff?node={}&wait-ms={wait_ms}", encode(me));
        let answer =
            super::outbound::get_from_peer(client, &shard.base.resolved, node, &path, &[]).await;
        match answer {
            Ok(r) if r.status == 200 && settled(&r.body) => return true,
            Ok(r) if r.status == 200 => continue,
            Ok(r) => {
                tracing::info!(target: "chronos::replication", "{}: the hand-off answered {}; not waited for", node.address, r.status);
                return true;
            }
            Err(e) => {
                tracing::info!(target: "chronos::replication", "{}: no hand-off ({e}); not waited for", node.address);
                return true;
            }
        }
    }
    false
}

/// Whether a hand-off answer says nothing is owed.
fn settled(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Owed {
        owed: u64,
        repair: bool,
    }
    serde_json::from_slice::<Owed>(body).is_ok_and(|o| o.owed == 0 && !o.repair)
}

/// `address` as a query value (`[`, `]` of an IPv6 address encoded).
fn encode(address: &str) -> String {
    address
        .replace('%', "%25")
        .replace('[', "%5B")
        .replace(']', "%5D")
        .replace('&', "%26")
}

/// Every shard: wait until shard 0 has finished the hand-off.
pub async fn wait_caught_up(shard: &Shard) {
    while shard.base.stats[0].catching_up.load(Ordering::Acquire) && !shard.base.gate.is_closing() {
        glommio::timer::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_names_a_node_and_a_bounded_wait() {
        assert_eq!(
            handoff_query("node=127.0.0.1:7253&wait-ms=100"),
            Ok(("127.0.0.1:7253".to_string(), 100))
        );
        assert_eq!(
            handoff_query("wait-ms=999999&node=%5B::1%5D:7253"),
            Ok(("[::1]:7253".to_string(), HANDOFF_WAIT_MS_MAX))
        );
        assert_eq!(handoff_query("node=a:1"), Ok(("a:1".to_string(), 0)));
        assert_eq!(handoff_query("").unwrap_err().0, 400);
        assert_eq!(handoff_query("node=a:1&wait-ms=+5").unwrap_err().0, 400);
        assert_eq!(handoff_query("node=a:1&x=1").unwrap_err().0, 400);
    }

    #[test]
    fn only_nothing_owed_is_settled() {
        assert!(settled(br#"{"owed":0,"repair":false}"#));
        assert!(!settled(br#"{"owed":3,"repair":false}"#));
        assert!(!settled(br#"{"owed":0,"repair":true}"#));
        assert!(!settled(b"not json"));
    }

    #[test]
    fn an_address_is_encoded_for_the_query() {
        assert_eq!(encode("127.0.0.1:7253"), "127.0.0.1:7253");
        assert_eq!(encode("[::1]:7253"), "%5B::1%5D:7253");
    }
}
