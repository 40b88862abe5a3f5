//! Replication to other nodes: the internal `PUT /timers/<id>` of seed 000.
//!
//! Each shard has one `Replicator` with a queue per peer node. Enqueueing is
//! synchronous and never waits (the pop loop and request handlers call it);
//! one sender task per peer drains the queue in batches of up to
//! `BATCH_MAX` requests, handed to the shard's HTTP client as one pipelined
//! batch ([`Client::pipeline`]: one `write_all` on a pooled keep-alive
//! connection, answered in order). Senders hold the shard's gate: at
//! shutdown each delivers the batch in hand and stops.
//!
//! Bounds, per shard and peer: `queue_max` messages and `queue_bytes_max`
//! bytes waiting (beyond either a message is dropped and counted; for a
//! member of the cluster the peer is then owed a repair, see
//! [`Replicator::take_repair`]), one
//! connection, one batch of at most `BATCH_MAX` requests and about
//! `SEGMENT_BYTES_MAX` bytes in flight,
//! a timeout per batch (beyond it the batch is counted as failed and the
//! connection closed), and an exponential reconnect backoff
//! (`BACKOFF_MS_MIN`..`BACKOFF_MS_MAX`). What a peer did not answer, or
//! answered with a 5xx, 408 or 429, goes back to the front of its queue
//! and is retried in order: to a member of the cluster until delivered or
//! the peer leaves the cluster (issue 37: a replica down longer than the
//! window used to miss the deletes made meanwhile, and popped them), except
//! that a message the member answered and kept refusing for
//! `deliver_within` is given up and the member owed a repair (so that one
//! message it refuses for good cannot hold up every later one); to
//! another site (or a peer that left) until delivered or `deliver_within`
//! after it was queued (then it is given up and counted as failed). A
//! member still owed messages past `deliver_within` is logged, once per
//! outage. A 4xx refusal is final. Order is kept, so a later message for a timer (a delete after a
//! create) is never delivered before an earlier one; the receiver's
//! conflict rules discard what a later message superseded.
//!
//! The files, one concern each: the replication body and its patchable
//! `start-time-delta` (`body.rs`); the segments queued requests are kept
//! in (`segment.rs`); a peer's queue, its bounds and its counters, and
//! queueing a message (`queue.rs`); the sender task that drains a peer's
//! queue in batches, retries and gives up (`sender.rs`); a dropped
//! message's repair mark and the repairs' back-off (`repair.rs`). Here:
//! the [`Replicator`] itself, its bounds, and its peer list. A replicator
//! to other sites (GR) is the same code with `ReplicatorConfig::sites`
//! set: its counters go to each site's slot.

mod body;
mod queue;
mod repair;
mod segment;
mod sender;

pub use body::{encode_body, encode_body_patchable, write_delta, Body};

use super::acks::Acks;
use super::owed::Owed;
use crate::http::client::Client;
use crate::runtime::gate::Gate;
use crate::stats::ShardStats;
use queue::Peer;
use sender::Sender;
use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// The most a replication request's head takes besides the peer address
/// in `Host` and the `Authorization` value (request line, content type
/// and length, header names).
pub(super) const REQUEST_HEAD_BYTES_MAX: usize = 256;
/// Bytes the `start-time-delta` value takes in a queued body: an `i64`
/// with its sign, padded with spaces (JSON whitespace) so that the sender
/// Bytes per pipelined write (a batch closes once it reaches this), so
/// that the batch in flight, outside the queue's count, stays small too.
pub const SEGMENT_BYTES_MAX: usize = 1024 * 1024;
/// Requests per pipelined write.
pub const BATCH_MAX: usize = 256;
/// Reconnect backoff after a failed connect or batch.
pub const BACKOFF_MS_MIN: u64 = 50;
pub const BACKOFF_MS_MAX: u64 = 2_000;
/// A peer's repairs back off from this to at most [`REPAIR_BACKOFF_MS_MAX`]
/// while they follow each other (each within twice the last backoff).
pub const REPAIR_BACKOFF_MS_MIN: u64 = 5_000;
pub const REPAIR_BACKOFF_MS_MAX: u64 = 600_000;
/// Spare segment buffers kept per peer.
pub(super) const SPARE_SEGMENTS_MAX: usize = 8;

/// A replicator's bounds and timeouts (from `[cluster]`).
#[derive(Clone, Copy, Debug)]
pub struct ReplicatorConfig {
    /// Messages queued per peer; beyond it a message is dropped (counted).
    pub queue_max: usize,
    /// Bytes queued per peer (encoded requests); beyond it a message is
    /// dropped (counted). Bodies vary up to the request size limit, so a
    /// count alone does not bound memory.
    pub queue_bytes_max: usize,
    /// A batch must be answered within this.
    pub timeout: Duration,
    /// To another site (`sites`) or a peer that left the cluster: a
    /// message not delivered this long after it was queued is given up
    /// (counted as failed); until then it is retried. To a member: kept
    /// until delivered, and a warning is logged once it is this late.
    pub deliver_within: Duration,
    /// Peers are remote sites (GR): count per site slot
    /// (`ShardStats::site_counts`), not as replication within the site.
    pub sites: bool,
    /// The `Authorization` header value every request carries (the
    /// cluster's shared secret), if any.
    pub authorization: Option<&'static str>,
}

/// A shard's replication client.
pub struct Replicator {
    /// In cluster peer order; replaced as a whole by a reload.
    peers: RefCell<Vec<Rc<Peer>>>,
    config: ReplicatorConfig,
    client: Rc<Client>,
    gate: Rc<Gate>,
    stats: Arc<[ShardStats]>,
    shard: usize,
    /// Reused body buffer.
    scratch: RefCell<Vec<u8>>,
    /// The acknowledgements client operations wait for.
    acks: Rc<Acks>,
    /// Tombstones owed to members.
    owed: Rc<Owed>,
    /// Bumped by a [`Replicator::set_peers`] that changes the peers or
    /// their order: a peer mask taken before it names other peers after
    /// it (a repair's slice is scanned again).
    peers_epoch: Cell<u64>,
}

impl Replicator {
    /// `peers`: every node's `(address, socket)` in cluster order (`nodes`
    /// then `leaving`); the local node's entry is simply never used.
    pub fn new(
        peers: &[(String, SocketAddr)],
        config: ReplicatorConfig,
        client: Rc<Client>,
        gate: Rc<Gate>,
        stats: Arc<[ShardStats]>,
        shard: usize,
    ) -> Replicator {
        assert!(shard < stats.len(), "shard {shard} has no stats");
        Replicator {
            peers: RefCell::new(
                peers
                    .iter()
                    .enumerate()
                    .map(|(i, (address, socket))| {
                        Peer::new(address, *socket, config.sites.then_some(i))
                    })
                    .collect(),
            ),
            config: ReplicatorConfig {
                queue_max: config.queue_max.max(1),
                queue_bytes_max: config.queue_bytes_max.max(1),
                ..config
            },
            client,
            gate,
            stats,
            shard,
            scratch: RefCell::new(Vec::with_capacity(1024)),
            acks: Rc::new(Acks::default()),
            owed: Rc::new(Owed::default()),
            peers_epoch: Cell::new(0),
        }
    }

    fn stats(&self) -> &ShardStats {
        &self.stats[self.shard]
    }

    /// A new peer list (a cluster reload), in the new cluster's peer order.
    /// A peer that stays keeps its queue and connection; a peer that goes
    /// is retired: its sender delivers what is queued, then stops.
    pub fn set_peers(&self, peers: &[(String, SocketAddr)]) {
        let mut current = self.peers.borrow_mut();
        let next: Vec<Rc<Peer>> = peers
            .iter()
            .map(|(address, socket)| {
                match current
                    .iter()
                    .find(|p| p.address == *address && p.socket == *socket)
                {
                    Some(p) => p.clone(),
                    None => {
                        // A node moved to another socket is still owed the
                        // re-send at start under its address.
                        let p = Peer::new(address, *socket, None);
                        let moved = current.iter().find(|p| p.address == *address);
                        p.resending.set(moved.is_some_and(|m| m.resending.get()));
                        p
                    }
                }
            })
            .collect();
        for old in current.iter() {
            if !next.iter().any(|p| Rc::ptr_eq(p, old)) {
                old.retired.set(true);
                old.wake.notify();
            }
        }
        let same =
            current.len() == next.len() && current.iter().zip(&next).all(|(a, b)| Rc::ptr_eq(a, b));
        *current = next;
        if !same {
            self.peers_epoch.set(self.peers_epoch.get() + 1);
        }
    }

    /// Changes with every change of the peer list or its order: a peer
    /// mask is valid only under the epoch it was taken in.
    pub fn peers_epoch(&self) -> u64 {
        self.peers_epoch.get()
    }

    /// The acknowledgements client operations wait for: a ticket opened
    /// before an operation's messages are queued covers them all.
    pub fn acks(&self) -> &Acks {
        &self.acks
    }

    /// Whether a tombstone of `unique` is still queued for a member: it
    /// must not expire yet ([`Owed`]).
    pub fn owes_tombstone(&self, unique: u64) -> bool {
        self.owed.holds(unique)
    }

    /// The address of peer `i` (for a log line).
    pub fn address(&self, i: usize) -> Option<String> {
        self.peers.borrow().get(i).map(|p| p.address.clone())
    }

    /// What this shard has owed the peer at `address`, asked by that
    /// peer's hand-off: messages ever queued for it, ever settled (taken,
    /// refused or given up), and whether it owes it a repair (marked,
    /// running, or with messages still unsettled) or the re-send at start
    /// (running for it, or with messages still unsettled). `None` if it is not a
    /// peer. A peer that asks is back and waits for the answer (at most
    /// 15 s): a repair owed to it is due [`REPAIR_BACKOFF_MS_MIN`] after
    /// the last one at the latest, whatever its back-off, or the hand-off
    /// gives up first and the peer pops what the repair would have
    /// deleted. (Not sooner: a peer that asks again and again still gets
    /// at most one repair per that time.)
    pub fn owed(&self, address: &str) -> Option<(u64, u64, bool)> {
        let peers = self.peers.borrow();
        let p = peers.iter().find(|p| p.address == address)?;
        if p.repair_owed.get() {
            let soonest_ms = p.repair_last_ms.get() + REPAIR_BACKOFF_MS_MIN;
            p.repair_at_ms.set(p.repair_at_ms.get().min(soonest_ms));
        }
        Some((
            p.queued_total.get(),
            p.settled_total.get(),
            p.repair_pending(),
        ))
    }

    /// Start `peer`'s sender task (it holds the gate); `false` at shutdown.
    fn start_sender(&self, peer: &Rc<Peer>) -> bool {
        let sender = Sender {
            peer: peer.clone(),
            client: self.client.clone(),
            gate: self.gate.clone(),
            config: self.config,
            stats: self.stats.clone(),
            shard: self.shard,
            acks: self.acks.clone(),
            owed: self.owed.clone(),
        };
        self.gate.spawn(sender.run())
    }
}
