//! A peer's queue: its segments, its bounds (messages and bytes), its
//! counters and gauges (a site slot's for a replicator to other sites),
//! and queueing one message, which never waits: a full queue drops it.

use super::body::{encode_body_patchable, Body};
use super::segment::{Message, Segment};
use super::{Replicator, BATCH_MAX, REQUEST_HEAD_BYTES_MAX, SEGMENT_BYTES_MAX};
use crate::runtime::clock;
use crate::runtime::notify::Notify;
use crate::stats::ShardStats;
use crate::timer::TimerId;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::Write;
use std::net::SocketAddr;
use std::rc::Rc;

/// What a replicator counts.
#[derive(Clone, Copy)]
pub(super) enum Count {
    Enqueued = 0,
    Sent = 1,
    Failed = 2,
    Dropped = 3,
    Retried = 4,
}

/// Count `n` of `what` for `peer` (a site slot's counters, or the
/// cluster's replication counters).
pub(super) fn count(stats: &ShardStats, peer: Option<&Peer>, what: Count, n: u64) {
    if let Some(slot) = peer.and_then(|p| p.site) {
        ShardStats::add(&stats.site_counts[what as usize][slot], n);
        return;
    }
    let counter = match what {
        Count::Enqueued => &stats.replication_enqueued,
        Count::Sent => &stats.replication_sent,
        Count::Failed => &stats.replication_failed,
        Count::Dropped => &stats.replication_dropped,
        Count::Retried => &stats.replication_retried,
    };
    ShardStats::add(counter, n);
}

/// Set a peer's queue length (and its site's gauge).
pub(super) fn set_queued(stats: &ShardStats, peer: &Peer, queued: usize) {
    peer.queued.set(queued);
    if let Some(slot) = peer.site {
        stats.site_queued[slot].store(queued as i64, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The queue and connection state for one peer node.
pub(super) struct Peer {
    pub(super) address: String,
    pub(super) socket: SocketAddr,
    pub(super) segments: RefCell<VecDeque<Segment>>,
    pub(super) queued: Cell<usize>,
    /// Bytes of the encoded requests queued.
    pub(super) queued_bytes: Cell<usize>,
    pub(super) spare: RefCell<Vec<Vec<u8>>>,
    /// Segments' message lists kept for reuse (emptied), as `spare`.
    pub(super) spare_messages: RefCell<Vec<Vec<Message>>>,
    pub(super) wake: Notify,
    pub(super) running: Cell<bool>,
    /// No longer a peer (a reload dropped it): its sender stops once the
    /// queue is empty.
    pub(super) retired: Cell<bool>,
    /// Messages taken off the queue and not yet settled (the batch being
    /// delivered): with `queued`, what the peer is still owed.
    pub(super) in_flight: Cell<usize>,
    /// Messages ever queued for it, and ever settled (taken, refused or
    /// given up): a hand-off waits until `settled` reaches what `queued_total`
    /// was when it asked (a snapshot: new messages under load do not hold
    /// it up).
    pub(super) queued_total: Cell<u64>,
    pub(super) settled_total: Cell<u64>,
    /// A message to this member was dropped at a full queue: the shard
    /// owes it a repair ([`Replicator::take_repair`]).
    pub(super) repair_owed: Cell<bool>,
    /// A repair of it is running ([`Replicator::repair_done`] ends it).
    pub(super) repairing: Cell<bool>,
    /// `queued_total` when the last repair had queued its last message:
    /// until `settled_total` reaches it, what the repair sent may still be
    /// in the queue, and a hand-off still waits ([`Peer::repair_pending`]).
    pub(super) repair_tail: Cell<u64>,
    /// The re-send at start (`shard/resend.rs`) has not yet queued all it
    /// holds for this peer: a hand-off waits ([`Peer::repair_pending`]).
    pub(super) resending: Cell<bool>,
    /// Repairs back off (a peer that refuses for good would otherwise get
    /// everything again every `deliver_within`): the next may start at
    /// `repair_at_ms` (engine clock); the last started at
    /// `repair_last_ms`, `repair_backoff_ms` after the one before.
    pub(super) repair_at_ms: Cell<u64>,
    pub(super) repair_last_ms: Cell<u64>,
    pub(super) repair_backoff_ms: Cell<u64>,
    /// The current outage's lateness was logged (reset once the queue
    /// drains).
    pub(super) late_logged: Cell<bool>,
    /// Its remote site slot, for a replicator to other sites.
    pub(super) site: Option<usize>,
}

impl Peer {
    pub(super) fn new(address: &str, socket: SocketAddr, site: Option<usize>) -> Rc<Peer> {
        assert!(
            site.is_none_or(|k| k < crate::stats::SITE_SLOTS),
            "a site slot"
        );
        Rc::new(Peer {
            address: address.to_string(),
            socket,
            segments: RefCell::new(VecDeque::new()),
            queued: Cell::new(0),
            queued_bytes: Cell::new(0),
            spare: RefCell::new(Vec::new()),
            spare_messages: RefCell::new(Vec::new()),
            wake: Notify::default(),
            running: Cell::new(false),
            retired: Cell::new(false),
            in_flight: Cell::new(0),
            queued_total: Cell::new(0),
            settled_total: Cell::new(0),
            repair_owed: Cell::new(false),
            repairing: Cell::new(false),
            repair_tail: Cell::new(0),
            resending: Cell::new(false),
            repair_at_ms: Cell::new(0),
            repair_last_ms: Cell::new(0),
            repair_backoff_ms: Cell::new(0),
            late_logged: Cell::new(false),
            site,
        })
    }

    /// Whether a repair is owed, running, or has messages not yet settled
    /// (queued by a repair or a re-send at start that has ended), or the
    /// re-send at start still runs for it: a restarted peer's hand-off
    /// waits for all four, or it pops before the deletes arrive.
    pub(super) fn repair_pending(&self) -> bool {
        self.repair_owed.get()
            || self.repairing.get()
            || self.resending.get()
            || self.settled_total.get() < self.repair_tail.get()
    }
}

impl Replicator {
    /// Whether `p`'s queue is less than half full, in messages and bytes
    /// (empty, for a queue of one message).
    pub(super) fn half_empty(&self, p: &Peer) -> bool {
        let c = &self.config;
        2 * p.queued.get() < c.queue_max.max(2)
            && 2 * p.queued_bytes.get() < c.queue_bytes_max.max(2)
    }

    /// Whether every peer in `mask` (over the peer order) has less than
    /// half its queue bound waiting, in messages and in bytes: bulk senders
    /// (a resync) wait for this, so they never crowd out, or get dropped
    /// with, the replication of client operations and pops.
    pub fn has_room(&self, mask: u64) -> bool {
        let peers = self.peers.borrow();
        peers
            .iter()
            .enumerate()
            .all(|(i, p)| mask & (1u64 << i) == 0 || self.half_empty(p))
    }

    /// Whether a message of about `body_bytes` would be queued for every
    /// peer in `mask` now (a client operation that no local copy backs
    /// is refused rather than dropped).
    pub fn can_queue(&self, mask: u64, body_bytes: usize) -> bool {
        let peers = self.peers.borrow();
        let c = &self.config;
        let mut rest = mask;
        while rest != 0 {
            let i = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let Some(p) = peers.get(i) else {
                return false;
            };
            let bytes = body_bytes + self.head_allowance(p);
            if p.queued.get() >= c.queue_max || p.queued_bytes.get() + bytes > c.queue_bytes_max {
                return false;
            }
        }
        true
    }

    /// The most a request head to `p` takes.
    fn head_allowance(&self, p: &Peer) -> usize {
        let auth = self.config.authorization.map_or(0, |a| a.len() + 17);
        REQUEST_HEAD_BYTES_MAX + p.address.len() + auth
    }

    /// Queue a replication `PUT /timers/<id>` to `peer`. Never waits: a
    /// full queue drops the message (counted), and a member is then owed
    /// a repair.
    pub fn send(&self, peer: usize, id: TimerId, body: &Body<'_>) {
        let peers = self.peers.borrow();
        let Some(p) = peers.get(peer) else {
            // Not a peer of the current view (a reload raced the caller).
            count(self.stats(), None, Count::Dropped, 1);
            self.acks.settle(self.acks.queued(), false);
            return;
        };
        if p.queued.get() >= self.config.queue_max {
            self.drop_at_bound(p);
            return;
        }
        let mut scratch = self.scratch.borrow_mut();
        scratch.clear();
        let delta_at = encode_body_patchable(&mut scratch, body);
        let now_ms = clock::now_ms();
        let start_ms = (now_ms as i64 + body.start_time_delta_ms).max(0) as u64;
        // The body plus at most this much head.
        let bytes = scratch.len() + self.head_allowance(p);
        if p.queued_bytes.get() + bytes > self.config.queue_bytes_max {
            self.drop_at_bound(p);
            return;
        }
        count(self.stats(), Some(p), Count::Enqueued, 1);
        let message = Message {
            end: 0,
            delta_at: delta_at as u32,
            start_ms,
            ticket: self.acks.queued(),
            owed: 0,
            refused_since_ms: 0,
            born_ms: now_ms,
        };
        let message = match !self.config.sites && body.uri.is_empty() {
            true => {
                self.owed.add(id.unique);
                Message {
                    owed: id.unique,
                    ..message
                }
            }
            false => message,
        };
        let added = self.append(p, id, &scratch, message);
        assert!(added <= bytes, "the head fits its allowance");
        set_queued(self.stats(), p, p.queued.get() + 1);
        p.queued_total.set(p.queued_total.get() + 1);
        p.queued_bytes.set(p.queued_bytes.get() + added);
        assert!(
            p.queued.get() <= self.config.queue_max,
            "the queue keeps to its bound in messages"
        );
        if !p.running.get() && self.start_sender(p) {
            p.running.set(true);
        }
        p.wake.notify();
    }

    /// A message to `p` did not fit its queue: counted, and a member of the
    /// cluster is marked for a repair (logged when first marked).
    fn drop_at_bound(&self, p: &Peer) {
        count(self.stats(), Some(p), Count::Dropped, 1);
        self.acks.settle(self.acks.queued(), false);
        if self.config.sites || p.repair_owed.replace(true) {
            return;
        }
        tracing::warn!(target: "chronos::replication", "to {}: the queue is full (replication-queue-max, replication-queue-bytes-max): a message was dropped, and this shard will send the peer everything it holds for it once it answers again", p.address);
    }

    /// Append one request (head, then `body`) to `p`'s last segment, or a
    /// new one when it is full; `message` has its `delta_at` within the
    /// body. Returns the bytes added.
    fn append(&self, p: &Peer, id: TimerId, body: &[u8], message: Message) -> usize {
        let mut segments = p.segments.borrow_mut();
        if segments
            .back()
            .is_none_or(|s| s.count() >= BATCH_MAX || s.bytes.len() >= SEGMENT_BYTES_MAX)
        {
            let bytes = p
                .spare
                .borrow_mut()
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(64 * 1024));
            let messages = p
                .spare_messages
                .borrow_mut()
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(BATCH_MAX));
            segments.push_back(Segment { bytes, messages });
        }
        let seg = segments.back_mut().expect("just ensured");
        let out = &mut seg.bytes;
        let before = out.len();
        out.extend_from_slice(b"PUT /timers/");
        out.extend_from_slice(&id.to_hex());
        let _ = write!(
            out,
            " HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            p.address,
            body.len()
        );
        if let Some(value) = self.config.authorization {
            let _ = write!(out, "Authorization: {value}\r\n");
        }
        out.extend_from_slice(b"\r\n");
        let body_at = out.len() - before;
        out.extend_from_slice(body);
        seg.messages.push(Message {
            end: out.len() as u32,
            delta_at: (body_at as u32) + message.delta_at,
            ..message
        });
        let added = out.len() - before;
        assert!(seg.count() <= BATCH_MAX, "a batch keeps to its bound");
        added
    }
}
