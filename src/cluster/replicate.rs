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

use super::acks::{Acks, Ticket};
use super::owed::Owed;
use crate::http::client::Client;
use crate::runtime::clock;
use crate::runtime::gate::Gate;
use crate::runtime::notify::Notify;
use crate::stats::{ShardStats, REPLICATION_LAG_BOUNDS_US};
use crate::timer::TimerId;
use futures_lite::future;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::Write;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// The most a replication request's head takes besides the peer address
/// in `Host` and the `Authorization` value (request line, content type
/// and length, header names).
const REQUEST_HEAD_BYTES_MAX: usize = 256;
/// Bytes the `start-time-delta` value takes in a queued body: an `i64`
/// with its sign, padded with spaces (JSON whitespace) so that the sender
/// can rewrite it in place when the message actually goes out.
const DELTA_WIDTH: usize = 20;
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
const SPARE_SEGMENTS_MAX: usize = 8;

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

/// What a replicator counts.
#[derive(Clone, Copy)]
enum Count {
    Enqueued = 0,
    Sent = 1,
    Failed = 2,
    Dropped = 3,
    Retried = 4,
}

/// Count `n` of `what` for `peer` (a site slot's counters, or the
/// cluster's replication counters).
fn count(stats: &ShardStats, peer: Option<&Peer>, what: Count, n: u64) {
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
fn set_queued(stats: &ShardStats, peer: &Peer, queued: usize) {
    peer.queued.set(queued);
    if let Some(slot) = peer.site {
        stats.site_queued[slot].store(queued as i64, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What one replication message says about a timer.
pub struct Body<'a> {
    pub interval_ms: u32,
    pub repeat_for_ms: u32,
    /// Start of the incarnation relative to the sender's now (≤ 0 normally).
    pub start_time_delta_ms: i64,
    pub sequence: u32,
    pub version_us: u64,
    /// Empty URI and opaque: a tombstone.
    pub uri: &'a str,
    pub opaque: &'a str,
    pub view_id: u64,
    /// Empty in a body for another site (GR): that site places it.
    pub replicas: &'a [&'a str],
    /// The timer's site list (GR), first the site that took it.
    pub sites: &'a [&'a str],
    /// The replication factor the client asked for (this project's
    /// extension: `replicas` may be fewer, capped at the cluster size).
    pub factor_requested: u8,
    /// `(tag, count)`.
    pub tags: &'a [(&'a str, u32)],
    /// A resync entry's `start-time` (seed 000: wall-clock ms since the
    /// epoch, modulo `u32::MAX`); replication bodies carry only the delta.
    pub start_time_unix_ms: Option<u64>,
    /// `reliability.only-newer` (this project's extension): the receiver
    /// applies it only over an older version, never by sequence or as a
    /// tombstone at a tie (a re-send after a start, `shard/resend.rs`).
    pub only_newer: bool,
}

/// Seconds with millisecond resolution, as the codec reads them.
fn write_seconds(out: &mut Vec<u8>, ms: u32) {
    if ms.is_multiple_of(1000) {
        let _ = write!(out, "{}", ms / 1000);
    } else {
        let _ = write!(out, "{}.{:03}", ms / 1000, ms % 1000);
    }
}

fn write_json_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
}

/// The JSON body of a replication `PUT`.
pub fn encode_body(out: &mut Vec<u8>, b: &Body<'_>) {
    encode(out, b, false);
}

/// The JSON body with `start-time-delta` in a fixed-width field; returns
/// where the field's value starts in `out` (see [`write_delta`]).
pub fn encode_body_patchable(out: &mut Vec<u8>, b: &Body<'_>) -> usize {
    encode(out, b, true).expect("a patchable body has the field")
}

/// Write `delta_ms` over the `DELTA_WIDTH` bytes of a patchable field.
pub fn write_delta(field: &mut [u8], delta_ms: i64) {
    assert_eq!(field.len(), DELTA_WIDTH);
    let mut text = [b' '; DELTA_WIDTH];
    let mut cursor = std::io::Cursor::new(&mut text[..]);
    write!(cursor, "{delta_ms}").expect("an i64 fits 20 bytes");
    field.copy_from_slice(&text);
}

fn encode(out: &mut Vec<u8>, b: &Body<'_>, patchable: bool) -> Option<usize> {
    out.extend_from_slice(b"{\"timing\":{\"interval\":");
    write_seconds(out, b.interval_ms);
    out.extend_from_slice(b",\"repeat-for\":");
    write_seconds(out, b.repeat_for_ms);
    if let Some(ms) = b.start_time_unix_ms {
        let _ = write!(out, ",\"start-time\":{}", ms % u32::MAX as u64);
    }
    out.extend_from_slice(b",\"start-time-delta\":");
    let delta_at = out.len();
    if patchable {
        out.resize(delta_at + DELTA_WIDTH, b' ');
        write_delta(&mut out[delta_at..], b.start_time_delta_ms);
    } else {
        let _ = write!(out, "{}", b.start_time_delta_ms);
    }
    let _ = write!(
        out,
        ",\"sequence-number\":{},\"version\":{}}},\"callback\":",
        b.sequence, b.version_us
    );
    if b.uri.is_empty() {
        out.extend_from_slice(b"{}");
    } else {
        out.extend_from_slice(b"{\"http\":{\"uri\":");
        write_json_str(out, b.uri);
        out.extend_from_slice(b",\"opaque\":");
        write_json_str(out, b.opaque);
        out.extend_from_slice(b"}}");
    }
    let _ = write!(
        out,
        ",\"reliability\":{{\"replication-factor\":{},\"cluster-view-id\":\"{}\"",
        b.factor_requested.max(1),
        b.view_id
    );
    for (key, list) in [("replicas", b.replicas), ("sites", b.sites)] {
        if list.is_empty() {
            continue;
        }
        let _ = write!(out, ",\"{key}\":[");
        for (i, r) in list.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json_str(out, r);
        }
        out.push(b']');
    }
    if b.only_newer {
        out.extend_from_slice(b",\"only-newer\":true");
    }
    out.push(b'}');
    if !b.tags.is_empty() {
        out.extend_from_slice(b",\"statistics\":{\"tag-info\":[");
        for (i, (tag, count)) in b.tags.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"type\":");
            write_json_str(out, tag);
            let _ = write!(out, ",\"count\":{count}}}");
        }
        out.extend_from_slice(b"]}");
    }
    out.push(b'}');
    patchable.then_some(delta_at)
}

/// One queued request's place in its segment and what the sender needs
/// to know of it when it goes out.
#[derive(Clone, Copy, Debug)]
struct Message {
    /// Where the request ends in the segment's bytes.
    end: u32,
    /// Where its `start-time-delta` value starts (relative to the
    /// request's first byte), rewritten at each send.
    delta_at: u32,
    /// The timer's start, engine-clock ms (the delta is counted from it).
    start_ms: u64,
    /// The acknowledgement a client operation waits for (0: none).
    ticket: Ticket,
    /// A tombstone's timer (unique part) owed to a member ([`Owed`]; 0:
    /// not a tombstone, or to another site).
    owed: u64,
    /// Engine-clock ms since when the peer has answered it, at every try,
    /// with a status worth retrying (5xx, 408, 429), counted from a try
    /// where it took others: it is alive and refuses this message (0: not
    /// refusing; a try left unanswered resets it).
    refused_since_ms: u64,
    /// Engine-clock ms it was first queued: past `deliver_within` a
    /// message to another site is given up, never sent (a tombstone may
    /// no longer stop it); one to a member is reported late.
    born_ms: u64,
}

/// One contiguous run of encoded requests, oldest first.
struct Segment {
    bytes: Vec<u8>,
    /// One per request, in order (at most `BATCH_MAX`).
    messages: Vec<Message>,
}

impl Segment {
    fn count(&self) -> usize {
        self.messages.len()
    }

    /// Where request `i` starts in `bytes`.
    fn start_of(&self, i: usize) -> usize {
        assert!(i < self.count());
        if i == 0 {
            0
        } else {
            self.messages[i - 1].end as usize
        }
    }

    /// Request `i`'s bytes.
    fn request(&self, i: usize) -> &[u8] {
        &self.bytes[self.start_of(i)..self.messages[i].end as usize]
    }

    /// Drop the first `n` requests (the oldest).
    fn drop_front(&mut self, n: usize) {
        assert!(n <= self.count());
        if n == 0 {
            return;
        }
        let cut = self.messages[n - 1].end;
        self.bytes.drain(..cut as usize);
        self.messages.drain(..n);
        for m in &mut self.messages {
            m.end -= cut;
        }
    }

    /// Rewrite every request's `start-time-delta` as seen from `now_ms`:
    /// a message sent later than it was queued still starts the timer
    /// when it started.
    fn restamp(&mut self, now_ms: u64) {
        for i in 0..self.count() {
            let m = self.messages[i];
            let at = self.start_of(i) + m.delta_at as usize;
            let delta_ms = m.start_ms as i64 - now_ms as i64;
            write_delta(&mut self.bytes[at..at + DELTA_WIDTH], delta_ms);
        }
    }
}

/// The queue and connection state for one peer node.
struct Peer {
    address: String,
    socket: SocketAddr,
    segments: RefCell<VecDeque<Segment>>,
    queued: Cell<usize>,
    /// Bytes of the encoded requests queued.
    queued_bytes: Cell<usize>,
    spare: RefCell<Vec<Vec<u8>>>,
    /// Segments' message lists kept for reuse (emptied), as `spare`.
    spare_messages: RefCell<Vec<Vec<Message>>>,
    wake: Notify,
    running: Cell<bool>,
    /// No longer a peer (a reload dropped it): its sender stops once the
    /// queue is empty.
    retired: Cell<bool>,
    /// Messages taken off the queue and not yet settled (the batch being
    /// delivered): with `queued`, what the peer is still owed.
    in_flight: Cell<usize>,
    /// Messages ever queued for it, and ever settled (taken, refused or
    /// given up): a hand-off waits until `settled` reaches what `queued_total`
    /// was when it asked (a snapshot: new messages under load do not hold
    /// it up).
    queued_total: Cell<u64>,
    settled_total: Cell<u64>,
    /// A message to this member was dropped at a full queue: the shard
    /// owes it a repair ([`Replicator::take_repair`]).
    repair_owed: Cell<bool>,
    /// A repair of it is running ([`Replicator::repair_done`] ends it).
    repairing: Cell<bool>,
    /// Repairs back off (a peer that refuses for good would otherwise get
    /// everything again every `deliver_within`): the next may start at
    /// `repair_at_ms` (engine clock); the last started at
    /// `repair_last_ms`, `repair_backoff_ms` after the one before.
    repair_at_ms: Cell<u64>,
    repair_last_ms: Cell<u64>,
    repair_backoff_ms: Cell<u64>,
    /// The current outage's lateness was logged (reset once the queue
    /// drains).
    late_logged: Cell<bool>,
    /// Its remote site slot, for a replicator to other sites.
    site: Option<usize>,
}

impl Peer {
    fn new(address: &str, socket: SocketAddr, site: Option<usize>) -> Rc<Peer> {
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
            repair_at_ms: Cell::new(0),
            repair_last_ms: Cell::new(0),
            repair_backoff_ms: Cell::new(0),
            late_logged: Cell::new(false),
            site,
        })
    }
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
                    None => Peer::new(address, *socket, None),
                }
            })
            .collect();
        for old in current.iter() {
            if !next.iter().any(|p| Rc::ptr_eq(p, old)) {
                old.retired.set(true);
                old.wake.notify();
            }
        }
        *current = next;
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

    /// What this shard has owed the peer at `address`: messages ever
    /// queued for it, ever settled (taken, refused or given up), and
    /// whether it owes it a repair. `None` if it is not a peer.
    pub fn owed(&self, address: &str) -> Option<(u64, u64, bool)> {
        let peers = self.peers.borrow();
        let p = peers.iter().find(|p| p.address == address)?;
        let repair = p.repair_owed.get() || p.repairing.get();
        Some((p.queued_total.get(), p.settled_total.get(), repair))
    }

    /// The peers (a mask over the peer order) owed a repair whose queue
    /// has drained below half its bound (they answer again), with their
    /// marks cleared: the caller sends each what this shard holds for it
    /// (`shard/repair.rs`). A message dropped meanwhile marks it again.
    pub fn take_repair(&self) -> u64 {
        let peers = self.peers.borrow();
        let now_ms = clock::now_ms();
        let mut mask = 0u64;
        for (i, p) in peers.iter().enumerate() {
            let due = now_ms >= p.repair_at_ms.get();
            if p.repair_owed.get() && self.half_empty(p) && due && i < 64 {
                p.repair_owed.set(false);
                p.repairing.set(true);
                let backoff = p.repair_backoff_ms.get().max(REPAIR_BACKOFF_MS_MIN);
                let quiet = now_ms.saturating_sub(p.repair_last_ms.get()) > 2 * backoff;
                let next = match quiet {
                    true => REPAIR_BACKOFF_MS_MIN,
                    false => (backoff * 2).min(REPAIR_BACKOFF_MS_MAX),
                };
                p.repair_backoff_ms.set(next);
                p.repair_last_ms.set(now_ms);
                p.repair_at_ms.set(now_ms + next);
                mask |= 1u64 << i;
            }
        }
        mask
    }

    /// The repairs of the peers in `mask` ended (every message queued).
    pub fn repair_done(&self, mask: u64) {
        for (i, p) in self.peers.borrow().iter().enumerate() {
            if i < 64 && mask & (1u64 << i) != 0 {
                p.repairing.set(false);
            }
        }
    }

    /// Whether `p`'s queue is less than half full, in messages and bytes
    /// (empty, for a queue of one message).
    fn half_empty(&self, p: &Peer) -> bool {
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
        assert!(p.queued.get() <= self.config.queue_max);
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
        assert!(seg.count() <= BATCH_MAX);
        added
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

/// The next batch for `peer`: its first segment, with the segments after
/// it appended while the whole stays within [`BATCH_MAX`] requests and
/// [`SEGMENT_BYTES_MAX`] bytes. A retried segment (what the peer refused
/// or did not answer, put back alone at the front) so goes out with the
/// messages queued behind it, and a message the peer refuses while it
/// takes others can be told from a peer that takes nothing.
fn take_batch(peer: &Peer) -> Option<Segment> {
    let mut segments = peer.segments.borrow_mut();
    let mut seg = segments.pop_front()?;
    while let Some(next) = segments.front() {
        let fits = seg.count() + next.count() <= BATCH_MAX
            && seg.bytes.len() + next.bytes.len() <= SEGMENT_BYTES_MAX;
        if !fits {
            break;
        }
        let next = segments.pop_front().expect("just seen");
        let shift = seg.bytes.len() as u32;
        seg.bytes.extend_from_slice(&next.bytes);
        seg.messages.extend(next.messages.iter().map(|m| Message {
            end: m.end + shift,
            ..*m
        }));
        let mut spare = peer.spare.borrow_mut();
        if spare.len() < SPARE_SEGMENTS_MAX {
            let mut bytes = next.bytes;
            bytes.clear();
            spare.push(bytes);
        }
    }
    assert!(seg.count() <= BATCH_MAX, "a batch is bounded");
    Some(seg)
}

/// One peer's sender task.
struct Sender {
    peer: Rc<Peer>,
    client: Rc<Client>,
    gate: Rc<Gate>,
    config: ReplicatorConfig,
    stats: Arc<[ShardStats]>,
    shard: usize,
    acks: Rc<Acks>,
    owed: Rc<Owed>,
}

impl Sender {
    /// Message `m` is settled for good: taken, refused or given up.
    fn settled(&self, m: &Message, taken: bool) {
        let peer = &self.peer;
        peer.settled_total.set(peer.settled_total.get() + 1);
        self.acks.settle(m.ticket, taken);
        if m.owed != 0 {
            self.owed.settle(m.owed);
        }
    }

    /// Drain the peer's queue until shutdown (or retirement) finds it empty.
    async fn run(self) {
        let peer = &self.peer;
        let mut backoff_ms = 0u64;
        // Reused for every segment (at most `BATCH_MAX` statuses).
        let mut statuses = Vec::with_capacity(BATCH_MAX);
        loop {
            let next = take_batch(peer);
            let Some(mut seg) = next else {
                if self.gate.is_closing() || peer.retired.get() {
                    peer.running.set(false);
                    return;
                }
                future::or(peer.wake.wait(), self.gate.closing()).await;
                continue;
            };
            assert!(
                peer.queued.get() >= seg.count(),
                "queued counts every segment"
            );
            set_queued(
                &self.stats[self.shard],
                peer,
                peer.queued.get() - seg.count(),
            );
            assert!(peer.queued_bytes.get() >= seg.bytes.len());
            peer.queued_bytes
                .set(peer.queued_bytes.get() - seg.bytes.len());
            self.give_up_expired(&mut seg);
            if seg.count() > 0 {
                peer.in_flight.set(seg.count());
                seg.restamp(clock::now_ms());
                statuses.clear();
                backoff_ms = self.deliver(&seg, backoff_ms, &mut statuses).await;
                self.requeue_unanswered(&seg, &statuses);
                peer.in_flight.set(0);
            }
            if peer.queued.get() == 0 {
                peer.late_logged.set(false);
            }
            seg.bytes.clear();
            seg.messages.clear();
            {
                let mut spare = peer.spare.borrow_mut();
                if spare.len() < SPARE_SEGMENTS_MAX && seg.bytes.capacity() <= 1 << 20 {
                    spare.push(seg.bytes);
                }
                let mut spare = peer.spare_messages.borrow_mut();
                if spare.len() < SPARE_SEGMENTS_MAX && seg.messages.capacity() <= BATCH_MAX {
                    spare.push(seg.messages);
                }
            }
            if backoff_ms > 0 && !self.gate.is_closing() {
                let pause = glommio::timer::sleep(Duration::from_millis(backoff_ms));
                future::or(pause, self.gate.closing()).await;
            }
        }
    }

    /// Give up the segment's messages queued longer than `deliver_within`
    /// ago (counted as failed), to another site or a peer that left the
    /// cluster: a receiver's tombstone lives only that long (plus the
    /// timeout), so a create sent later could bring a deleted timer back.
    /// Messages are queued in order, so they are a prefix. To a member,
    /// only a prefix of messages it answered and kept refusing (5xx, 408,
    /// 429) that long is given up, and the member is then owed a repair;
    /// a message it never answered (down, stopped) is kept, and lateness
    /// is logged once per outage.
    fn give_up_expired(&self, seg: &mut Segment) {
        let now_ms = clock::now_ms();
        let within_ms = self.config.deliver_within.as_millis() as u64;
        let peer = &self.peer;
        let member = !self.config.sites && !peer.retired.get();
        // To a member, only what it answered and refused at every try for
        // that long (it is alive, and a message it refuses for good would
        // hold up every later one; a node answering 503 while it recovers
        // briefly is not that).
        let expired = seg
            .messages
            .iter()
            .take_while(|m| match member {
                true => m.refused_since_ms != 0 && m.refused_since_ms + within_ms <= now_ms,
                false => m.born_ms + within_ms <= now_ms,
            })
            .count();
        let late = seg
            .messages
            .get(expired)
            .is_some_and(|m| m.born_ms + within_ms <= now_ms);
        if member && late && !peer.late_logged.replace(true) {
            tracing::warn!(target: "chronos::replication", "to {}: messages queued over {within_ms} ms ago are still undelivered; they are kept until the peer answers or leaves the cluster", peer.address);
        }
        if expired == 0 {
            return;
        }
        if member && !peer.repair_owed.replace(true) {
            tracing::warn!(target: "chronos::replication", "to {}: {expired} messages it kept refusing for over {within_ms} ms are given up; this shard will send the peer everything it holds for it", peer.address);
        }
        count(
            &self.stats[self.shard],
            Some(peer),
            Count::Failed,
            expired as u64,
        );
        tracing::warn!(target: "chronos::replication", "to {}: {expired} messages given up, queued over {within_ms} ms ago", peer.address);
        for m in &seg.messages[..expired] {
            self.settled(m, false);
        }
        seg.drop_front(expired);
    }

    /// Send one segment as a pipelined batch and count the outcome (the
    /// answered statuses land in `statuses`); returns the next backoff.
    async fn deliver(&self, seg: &Segment, backoff_ms: u64, statuses: &mut Vec<u16>) -> u64 {
        let stats = &self.stats[self.shard];
        let peer = &self.peer;
        let outcome = self
            .client
            .pipeline(
                peer.socket,
                &seg.bytes,
                seg.count(),
                self.config.timeout,
                statuses,
            )
            .await;
        let sent = statuses.iter().filter(|s| (200..300).contains(*s)).count();
        self.record_lag(seg, statuses);
        for (m, status) in seg.messages.iter().zip(statuses.iter()) {
            match *status {
                200..=299 => self.settled(m, true),
                s if is_final_refusal(s) => self.settled(m, false),
                _ => {}
            }
        }
        let refused = statuses.iter().filter(|s| is_final_refusal(**s)).count();
        log_forbidden(
            &peer.address,
            statuses.iter().filter(|s| **s == 403).count(),
        );
        count(stats, Some(peer), Count::Sent, sent as u64);
        count(stats, Some(peer), Count::Failed, refused as u64);
        let retry = seg.count() - sent - refused;
        match outcome {
            Ok(()) if retry == 0 => 0,
            Ok(()) => (backoff_ms * 2).clamp(BACKOFF_MS_MIN, BACKOFF_MS_MAX),
            Err(e) => {
                tracing::debug!(target: "chronos::replication", "to {}: {retry} messages to retry: {e}", peer.address);
                if e.starts_with("TLS handshake") {
                    log_tls_refused(&peer.address, retry, &e);
                }
                (backoff_ms * 2).clamp(BACKOFF_MS_MIN, BACKOFF_MS_MAX)
            }
        }
    }

    /// `chronos_replication_lag_seconds`: each message the peer took (2xx),
    /// from when it was first queued (retries included) until now.
    fn record_lag(&self, seg: &Segment, statuses: &[u16]) {
        let lag = &self.stats[self.shard].replication_lag[usize::from(self.peer.site.is_some())];
        let now_ms = clock::now_ms();
        for (m, status) in seg.messages.iter().zip(statuses) {
            if (200..300).contains(status) {
                let ms = now_ms.saturating_sub(m.born_ms);
                lag.record(&REPLICATION_LAG_BOUNDS_US, ms.saturating_mul(1000));
            }
        }
    }

    /// Put what was not delivered (unanswered, or answered with a status
    /// worth retrying) back at the front of the queue, in order, unless
    /// shutdown began or the peer was retired: then it is given up and
    /// counted as failed. (Messages past `deliver_within` are given up
    /// before the next send.)
    fn requeue_unanswered(&self, seg: &Segment, statuses: &[u16]) {
        let stats = &self.stats[self.shard];
        let again: Vec<usize> = (0..seg.count())
            .filter(|&i| statuses.get(i).is_none_or(|s| retryable(*s)))
            .collect();
        if again.is_empty() {
            return;
        }
        let peer = &self.peer;
        if self.gate.is_closing() || peer.retired.get() {
            count(stats, Some(peer), Count::Failed, again.len() as u64);
            for &i in &again {
                self.settled(&seg.messages[i], false);
            }
            tracing::warn!(target: "chronos::replication", "to {}: {} messages given up undelivered", peer.address, again.len());
            return;
        }
        let mut retry = Segment {
            bytes: peer.spare.borrow_mut().pop().unwrap_or_default(),
            messages: Vec::with_capacity(again.len()),
        };
        let now_ms = clock::now_ms();
        // A refusal starts counting against a message only when the peer
        // took others of the batch: a peer refusing everything (503 while
        // it replays its log, or while its disk is behind) is unavailable,
        // as one that does not answer is, and is waited for (the soak: a
        // node restarted from a long log had its deletes given up). Once
        // started, the count goes on while the message is refused, alone
        // or not; a try left unanswered ends it.
        let took_others = statuses.iter().any(|s| (200..300).contains(s));
        for &i in &again {
            retry.bytes.extend_from_slice(seg.request(i));
            let m = &seg.messages[i];
            let refused_since_ms = match statuses.get(i) {
                Some(_) if m.refused_since_ms == 0 && took_others => now_ms,
                Some(_) => m.refused_since_ms,
                None => 0,
            };
            retry.messages.push(Message {
                end: retry.bytes.len() as u32,
                refused_since_ms,
                ..*m
            });
        }
        count(stats, Some(peer), Count::Retried, retry.count() as u64);
        set_queued(stats, peer, peer.queued.get() + retry.count());
        peer.queued_bytes
            .set(peer.queued_bytes.get() + retry.bytes.len());
        peer.segments.borrow_mut().push_front(retry);
    }
}

/// The least time between two "refused with 403" lines of a shard.
const FORBIDDEN_LOG_EVERY: Duration = Duration::from_secs(10);

thread_local! {
    /// This shard's "refused with 403" line (a shard is a thread).
    static FORBIDDEN_LOGGED: crate::runtime::loglimit::LogLimit = const { Cell::new((None, 0)) };
}

/// `n` messages to `address` refused with 403: the secrets differ. At
/// warn, at most once per [`FORBIDDEN_LOG_EVERY`] per shard.
fn log_forbidden(address: &str, n: usize) {
    if n == 0 {
        return;
    }
    FORBIDDEN_LOGGED.with(|limit| {
        if let Some(more) = log_now(limit) {
            tracing::warn!(target: "chronos::replication", "to {address}: {n} messages refused with 403, shared-secret mismatch: this node's [cluster] shared-secret differs from the peer's; given up, not retried{more}");
        }
    });
}

/// Whether a line limited by `limit` is due now (at most once per
/// [`FORBIDDEN_LOG_EVERY`]): `Some` with the note on the batches not
/// logged since the last one.
fn log_now(limit: &crate::runtime::loglimit::LogLimit) -> Option<String> {
    let now = std::time::Instant::now();
    let quiet = crate::runtime::loglimit::log_due(limit, now, FORBIDDEN_LOG_EVERY)?;
    Some(match quiet {
        0 => String::new(),
        q => format!(" (and {q} more batches so since the last such line)"),
    })
}

thread_local! {
    /// This shard's "TLS handshake failed" line.
    static TLS_LOGGED: crate::runtime::loglimit::LogLimit = const { Cell::new((None, 0)) };
}

/// A peer's TLS handshake failed (its certificate does not verify against
/// `[cluster] tls-ca-file`, or it does not speak TLS): a configuration
/// error that nothing else shows at warn. At most once per
/// [`FORBIDDEN_LOG_EVERY`] per shard; the messages stay queued.
fn log_tls_refused(address: &str, n: usize, reason: &str) {
    TLS_LOGGED.with(|limit| {
        if let Some(more) = log_now(limit) {
            tracing::warn!(target: "chronos::replication", "to {address}: {n} messages not delivered, retried: {reason}{more}");
        }
    });
}

/// A status that says the peer read the message and refused it for good
/// (a 4xx other than timeout or too many requests): not retried.
fn is_final_refusal(status: u16) -> bool {
    (400..500).contains(&status) && status != 408 && status != 429
}

/// A status after which the same message may succeed later (5xx, 408, 429).
fn retryable(status: u16) -> bool {
    !(200..300).contains(&status) && !is_final_refusal(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timer::spec;

    #[test]
    fn bodies_parse_back() {
        let replicas = ["10.0.0.1:7253", "10.0.0.2:7253"];
        let tags = [("CALL", 2u32), ("q\"uote", 1)];
        let body = Body {
            interval_ms: 1500,
            repeat_for_ms: 6000,
            start_time_delta_ms: -250,
            sequence: 3,
            version_us: 1_700_000_000_123_456,
            uri: "http://127.0.0.1:9/cb",
            opaque: "o\"p\\aque\n",
            view_id: 90691053180028962,
            replicas: &replicas,
            sites: &["a", "b"],
            factor_requested: 3,
            tags: &tags,
            start_time_unix_ms: None,
            only_newer: true,
        };
        let mut out = Vec::new();
        encode_body(&mut out, &body);
        let s = spec::parse(&out, crate::http::uri::check).unwrap();
        assert_eq!((s.interval_ms, s.repeat_for_ms), (1500, 6000));
        assert_eq!(
            s.replication_factor,
            Some(3),
            "the requested factor travels"
        );
        assert_eq!(s.uri, "http://127.0.0.1:9/cb");
        assert_eq!(s.opaque, "o\"p\\aque\n");
        assert_eq!(s.tags.len(), 2);
        assert_eq!(s.tags[1].0, "q\"uote");
        let r = s.replication.unwrap();
        assert_eq!(r.start_time_delta_ms, -250);
        assert_eq!(r.sequence_number, 3);
        assert_eq!(r.version_us, Some(1_700_000_000_123_456));
        assert_eq!(r.cluster_view_id.as_deref(), Some("90691053180028962"));
        assert_eq!(r.replicas, vec!["10.0.0.1:7253", "10.0.0.2:7253"]);
        assert!(r.only_newer, "only-newer travels");

        let tomb = Body {
            uri: "",
            opaque: "",
            tags: &[],
            interval_ms: 0,
            repeat_for_ms: 0,
            ..body
        };
        out.clear();
        encode_body(&mut out, &tomb);
        let s = spec::parse(&out, crate::http::uri::check).unwrap();
        assert!(s.is_tombstone());
        let plain = Body {
            only_newer: false,
            ..body
        };
        out.clear();
        encode_body(&mut out, &plain);
        let s = spec::parse(&out, crate::http::uri::check).unwrap();
        assert!(!s.replication.unwrap().only_newer);
    }

    fn body_with_delta(delta_ms: i64) -> Body<'static> {
        Body {
            interval_ms: 1000,
            repeat_for_ms: 1000,
            start_time_delta_ms: delta_ms,
            sequence: 0,
            version_us: 1,
            uri: "http://127.0.0.1:9/cb",
            opaque: "o",
            view_id: 7,
            replicas: &[],
            sites: &[],
            factor_requested: 1,
            tags: &[],
            start_time_unix_ms: None,
            only_newer: false,
        }
    }

    #[test]
    fn a_patchable_delta_is_rewritten_in_place_and_parses() {
        // Table: the delta when queued, the delta written at the send.
        for (queued, sent) in [(-5, -1500), (0, i64::MIN), (-1, i64::MAX), (3000, 0)] {
            let mut out = Vec::new();
            let at = encode_body_patchable(&mut out, &body_with_delta(queued));
            let len = out.len();
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["timing"]["start-time-delta"].as_i64(), Some(queued));
            write_delta(&mut out[at..at + DELTA_WIDTH], sent);
            assert_eq!(out.len(), len, "Content-Length stays right");
            let text = std::str::from_utf8(&out).unwrap();
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(v["timing"]["start-time-delta"].as_i64(), Some(sent));
        }
    }

    #[test]
    fn a_segment_restamps_and_drops_its_oldest_messages() {
        let mut seg = Segment {
            bytes: Vec::new(),
            messages: Vec::new(),
        };
        for (i, born_ms) in [100u64, 200, 300].into_iter().enumerate() {
            let before = seg.bytes.len();
            seg.bytes.extend_from_slice(b"HEAD\r\n\r\n");
            let at = encode_body_patchable(&mut seg.bytes, &body_with_delta(0)) - before;
            seg.messages.push(Message {
                end: seg.bytes.len() as u32,
                delta_at: at as u32,
                start_ms: 1_000 + i as u64,
                ticket: 0,
                owed: 0,
                refused_since_ms: 0,
                born_ms,
            });
        }
        seg.drop_front(1);
        assert_eq!(seg.count(), 2);
        assert_eq!(seg.messages[0].born_ms, 200);
        seg.restamp(5_000);
        for i in 0..seg.count() {
            let request = seg.request(i);
            let body = &request[b"HEAD\r\n\r\n".len()..];
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
            let want = 1_000 + (i as i64 + 1) - 5_000;
            assert_eq!(v["timing"]["start-time-delta"].as_i64(), Some(want));
        }
    }
}
