//! `GET /timers/<id>` (issue 42): the timer from this node's copy, or,
//! where this node holds none, from a node the ID names.
//!
//! A node without a copy asks the others that may hold one
//! (`Shard::look_up_peers`: the nodes the ID names and its replicas under
//! this view and the one before), in turn, with [`LOCAL_ONLY`] set so that
//! they answer from their own store and never ask further: the first `200`
//! is the answer. So does a node whose copy is a tombstone: a delete
//! leaves one, and so does an update that moved the timer to other
//! replicas. `404` when every node asked answered and none holds a live
//! copy; `503` while this node replays its log, or when a node that may
//! hold the timer did not answer (a copy is never taken as missing on a
//! silence: an idempotent create would make it again).
//!
//! Bounds: at most one request in flight per look-up, each within the
//! cluster's `replication-timeout-ms`; at most as many as the nodes that
//! may hold a copy (the replication factor, and the view before's).

use super::{error, json};
use crate::http::client::{Client, ClientConfig};
use crate::http::{tls, Request};
use crate::shard::lookup::Found;
use crate::shard::outbound::get_from_peer;
use crate::shard::Shard;
use crate::timer::TimerId;
use std::cell::OnceCell;
use std::time::Duration;

/// The header that asks a node for its own copy only (what a node sends
/// the others when it holds none).
pub const LOCAL_ONLY: &str = "X-Chronos-Local-Only";

/// The `404` reason of a node whose own copy is a tombstone, asked with
/// [`LOCAL_ONLY`].
const DELETED_HERE: &str = "no such timer: a tombstone on this node";

/// A look-up on a node still replaying its log: its store is not whole.
pub const RECOVERING: &str = "recovering: the node is replaying its timer log; retry shortly";

/// What the other nodes that may hold a timer said.
pub enum Elsewhere {
    /// One holds a live copy: its answer.
    Live(String),
    /// None holds a live copy; one holds a tombstone.
    Deleted,
    /// None holds a copy at all.
    Absent,
}

/// The client a shard's look-ups ask other nodes with, made on first use.
#[derive(Default)]
pub struct Lookups {
    client: OnceCell<Client>,
}

impl Lookups {
    fn client(&self, shard: &Shard) -> &Client {
        self.client.get_or_init(|| {
            let timeout =
                Duration::from_millis(shard.base.resolved.config.cluster.replication_timeout_ms);
            Client::new(ClientConfig {
                timeout,
                connect_timeout: timeout.min(Duration::from_secs(1)),
                per_host_max: 4,
            })
            .with_peer_tls(shard.base.resolved.peer_tls.as_ref().map(tls::for_shard))
        })
    }
}

/// Answer `GET /timers/<id>` into `out`.
pub async fn timer_get(
    lookups: &Lookups,
    shard: &Shard,
    id: TimerId,
    req: &Request<'_>,
    out: &mut Vec<u8>,
    close: bool,
) -> u16 {
    if shard.recovering() {
        return error(out, 503, RECOVERING, close);
    }
    match shard.look_up(id).await {
        Found::Live(body) => json(out, 200, &body, close),
        Found::Deleted if req.local_only => error(out, 404, DELETED_HERE, close),
        Found::Absent if req.local_only => error(out, 404, "no such timer on this node", close),
        // A tombstone here may be a delete, or the mark a move to other
        // replicas left (an update under a new view): they are asked too.
        Found::Deleted | Found::Absent => match ask_others(lookups, shard, id).await {
            Ok(Elsewhere::Live(body)) => json(out, 200, &body, close),
            Ok(_) => error(out, 404, "no such timer", close),
            Err(reason) => error(out, 503, &reason, close),
        },
    }
}

/// Ask the other nodes that may hold `id`, in turn: the first live copy,
/// or whether any holds a tombstone; `Err` none of them answered.
pub async fn ask_others(
    lookups: &Lookups,
    shard: &Shard,
    id: TimerId,
) -> Result<Elsewhere, String> {
    let peers = shard.look_up_peers(id);
    if peers.is_empty() {
        return Ok(Elsewhere::Absent);
    }
    let local_only: [(&str, &[u8]); 1] = [(LOCAL_ONLY, b"1")];
    let path = format!("/timers/{}", id.to_hex_string());
    let client = lookups.client(shard);
    let (mut answered, mut deleted, mut failures) = (false, false, Vec::new());
    for node in &peers {
        let resolved = &shard.base.resolved;
        let asked = get_from_peer(client, resolved, node, &path, &local_only).await;
        match asked {
            Ok(r) if r.status == 200 => {
                return Ok(Elsewhere::Live(
                    String::from_utf8_lossy(&r.body).into_owned(),
                ));
            }
            Ok(r) if r.status == 404 => {
                answered = true;
                deleted |= r.body.starts_with(DELETED_HERE.as_bytes());
            }
            Ok(r) => failures.push(format!("{}: {}", node.address, r.status)),
            Err(e) => failures.push(format!("{}: {e}", node.address)),
        }
    }
    // No copy is known missing while a node that may hold one did not
    // answer: an idempotent create would otherwise make it again.
    match (deleted, failures.is_empty()) {
        (true, _) => Ok(Elsewhere::Deleted),
        (false, true) if answered => Ok(Elsewhere::Absent),
        _ => Err(format!(
            "a node that may hold this timer did not answer: {}",
            failures.join("; ")
        )),
    }
}
