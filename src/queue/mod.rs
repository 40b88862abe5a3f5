//! The Kafka delay queue of seed 004, on the engine. Independent of the
//! timer service: it names only the engine's leaves (`runtime`, `wheel`,
//! `stats`).
//!
//! Input topic → (late? publish at once : insert into Postgres) → claim rows
//! whose deadline is within the look-ahead (`readied_at`/`readied_by`, `FOR
//! UPDATE SKIP LOCKED`) → hold them in the shard's queue wheel → publish at
//! `deadline - timing advance` with the original key, value and non-chronos
//! headers → delete the row once the broker acknowledged. Failure detection
//! resets rows readied longer than the hold time ago.
//!
//! Threads and shards:
//! - one librdkafka consumer per node, polled by a plain thread
//!   (`consumer.rs`), which hands each message to the shard owning its
//!   partition (`partition % shards`) over a bounded awaitable channel
//!   (pausing the partition while the shard has no room), and fetches a
//!   partition again where the broker skipped records (`gaps.rs`);
//! - one librdkafka producer per node (and one that sends batches of one
//!   message, for a message whose batch was refused); their delivery
//!   callback routes each acknowledgement back to the shard that sent the
//!   message (`producer.rs`);
//! - per shard: three Postgres connections (`pg.rs`: the input's, with
//!   durable commits; the claims' and the deletes', with asynchronous
//!   ones) and tasks that hold the
//!   shard's gate: enqueue (`enqueue.rs`), claim and fire (`fire.rs`),
//!   delivery and delete (`producer.rs`, `delete.rs`); shard 0 also runs
//!   failure detection (`failure.rs`), the node's own vacuum of the
//!   table, on a fourth connection (`vacuum.rs`), and the takeover of
//!   dead nodes' rows, on a fifth (`takeover.rs`). The header codec is `headers.rs`,
//!   ISO 8601 deadlines and time conversions `deadline.rs`.
//!
//! At least once: an input offset is stored for commit only after every
//! message up to it was inserted or published (acknowledged); a row is
//! deleted only after its publish was acknowledged; a publish that failed
//! for a transient reason is retried with backoff and never deleted. A
//! message that can never be published (refused for good: too large, an
//! invalid record, no right to write the output topic) is logged, counted
//! as `unpublishable` and skipped (its row deleted, its offset committed),
//! so that it cannot hold back the messages behind it.
//!
//! Bounded in messages and bytes: per shard, the inbox and the batch in
//! hand (`INBOX_CAPACITY`, `inbox-bytes-max`: beyond them the consumer
//! thread waits for room, and past `pause-after-ms` pauses the shard's
//! partitions and keeps polling), and the
//! claimed messages held, publishing or waiting for their delete
//! (`CLAIMED_IN_HAND_BATCHES`, `in-hand-bytes-max`: beyond them claims
//! stop).

mod config;
mod consumer;
pub mod deadline;
mod delete;
mod enqueue;
mod failure;
mod fire;
mod gaps;
pub mod headers;
mod output;
pub mod pg;
mod producer;
mod sql;
mod takeover;
mod vacuum;

pub use config::QueueConfig;
pub use consumer::Inbound;
pub use headers::{HEADER_DEADLINE, HEADER_ID, ID_CHARS_MAX};

use crate::runtime::clock;
use crate::runtime::gate::Gate;
use crate::runtime::notify::Notify;
use crate::stats::ShardStats;
use crate::wheel::Wheel;
use headers::HeaderList;
use pg::{Pg, Role};
use producer::{Delivery, DeliveryRouter};
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::ThreadedProducer;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Messages waiting per shard between the consumer thread and the shard
/// (and `[queue] inbox-bytes-max` bytes, with the batch being handled).
pub const INBOX_CAPACITY: usize = 8192;
/// Claimed messages a shard may hold, publish or have yet to delete, in
/// claim batches (16 × 2000: a full second of look-ahead at 20,000
/// messages/s, and more); and `[queue] in-hand-bytes-max` bytes.
const CLAIMED_IN_HAND_BATCHES: usize = 16;
/// What a message costs beyond its bytes (its structs and allocations),
/// roughly, in the byte bounds: so that many empty messages count too.
const MESSAGE_OVERHEAD_BYTES: usize = 128;
/// What a header costs beyond its name and value, roughly.
const HEADER_OVERHEAD_BYTES: usize = 48;

/// The bytes a message takes in the byte bounds: ID, key, value, header
/// names and values, and the overheads.
fn message_bytes(
    id: &str,
    key: &Option<Vec<u8>>,
    value: &Option<Vec<u8>>,
    headers: &HeaderList,
) -> usize {
    let headers: usize = headers
        .iter()
        .map(|(k, v)| HEADER_OVERHEAD_BYTES + k.len() + v.as_ref().map_or(0, Vec::len))
        .sum();
    MESSAGE_OVERHEAD_BYTES
        + id.len()
        + key.as_ref().map_or(0, Vec::len)
        + value.as_ref().map_or(0, Vec::len)
        + headers
}

/// The bytes an ID waiting for its delete takes in the in-hand bound.
fn id_bytes(id: &str) -> usize {
    MESSAGE_OVERHEAD_BYTES + id.len()
}

/// The claimed messages a shard has in hand, in messages and bytes:
/// held in its wheel, being published, or waiting for their delete.
#[derive(Default)]
struct InHand {
    count: Cell<usize>,
    bytes: Cell<usize>,
}

impl InHand {
    fn add(&self, count: usize, bytes: usize) {
        self.count.set(self.count.get() + count);
        self.bytes.set(self.bytes.get().saturating_add(bytes));
    }

    /// Give back what [`InHand::add`] took (never below zero).
    fn sub(&self, count: usize, bytes: usize) {
        debug_assert!(
            count <= self.count.get() && bytes <= self.bytes.get(),
            "gives back only what was taken"
        );
        self.count.set(self.count.get().saturating_sub(count));
        self.bytes.set(self.bytes.get().saturating_sub(bytes));
    }
}

/// What every shard shares: the config, the node ID, Kafka clients, and
/// the channel ends.
pub struct QueueShared {
    pub config: QueueConfig,
    /// This process's node ID (a random UUID, new at every start).
    pub node_id: String,
    pub producer: ThreadedProducer<DeliveryRouter>,
    /// The same, in batches of one message: for a message whose batch was
    /// refused, to learn whether the refusal is about it.
    pub solo: ThreadedProducer<DeliveryRouter>,
    pub consumer: Arc<BaseConsumer<consumer::Group>>,
    inboxes: Vec<async_channel::Receiver<Inbound>>,
    /// Per shard: the bytes of the messages in its inbox or its batch in
    /// hand (each message's [`consumer::Charge`] gives its share back).
    inbox_bytes: Vec<Arc<AtomicUsize>>,
    deliveries: Vec<async_channel::Receiver<Delivery>>,
    /// Whether the consumer has seen the broker answer.
    pub kafka_up: AtomicBool,
    /// Whether the output is blocked by the configuration or the cluster.
    pub output: output::Output,
    /// Each shard's Postgres health (the consumer leaves the group while
    /// Postgres is stalled).
    pub pg_health: Arc<pg::Health>,
    /// Set by [`QueueShared::stop`]: the consumer thread ends.
    stopped: AtomicBool,
}

impl QueueShared {
    /// Stop the consumer thread (at shutdown): it ends after its current
    /// poll, and its inbox senders drop, which ends the enqueue tasks.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// Readiness of the queue: every shard's Postgres connection up and the
    /// broker answering. `Err` lists what is not.
    pub fn readiness(&self, stats: &[ShardStats]) -> Result<(), String> {
        let mut missing = Vec::new();
        let pg_down = stats
            .iter()
            .filter(|s| s.pg_up.iter().any(|up| !up.load(Ordering::Relaxed)))
            .count();
        if pg_down > 0 {
            missing.push(format!(
                "Postgres not connected or not answering on {pg_down} shard(s)"
            ));
        }
        if !self.kafka_up.load(Ordering::Relaxed) {
            missing.push("Kafka broker not answering".to_string());
        }
        if let Some(why) = self.output.problem() {
            missing.push(why);
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("; "))
        }
    }
}

/// A random UUID (version 4) from the kernel's random source.
fn new_uuid() -> String {
    let mut b = [0u8; 16];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 16 {
        // Fall back on the clock and PID: unique enough for observability.
        let t = clock::unix_us() as u128 ^ ((std::process::id() as u128) << 64);
        b = t.to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A claimed message waiting in the wheel for its fire time.
struct Held {
    id: String,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: HeaderList,
    deadline_us: i64,
}

impl Held {
    fn bytes(&self) -> usize {
        message_bytes(&self.id, &self.key, &self.value, &self.headers)
    }
}

/// Waits for a set of immediate publishes.
struct Batch {
    left: Cell<usize>,
    done: Notify,
}

enum Kind {
    /// From the table: delete the row once acknowledged (or refused for
    /// good).
    Held { id: String, deadline_us: i64 },
    /// Late on arrival: the enqueue batch waits for it.
    Immediate { wait: Rc<Batch>, id: String },
}

/// A publish in flight.
struct Pending {
    kind: Kind,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: HeaderList,
    attempts: u32,
    /// Sent through the producer of one-message batches, since a batch
    /// holding it was refused for good.
    alone: bool,
    /// When it was last handed to the producer (the `publish_ack` stage).
    sent: Instant,
}

impl Pending {
    fn id(&self) -> &str {
        match &self.kind {
            Kind::Held { id, .. } | Kind::Immediate { id, .. } => id,
        }
    }

    /// As [`Held::bytes`] for a message from the table.
    fn bytes(&self) -> usize {
        message_bytes(self.id(), &self.key, &self.value, &self.headers)
    }
}

/// One shard's part of the queue.
pub struct QueueShard {
    shared: Arc<QueueShared>,
    shard: usize,
    stats: Arc<[ShardStats]>,
    gate: Rc<Gate>,
    /// Inserts and the late messages' look-up ([`pg::Role::Input`]).
    pub pg: Pg,
    /// Claims and the refresh ([`pg::Role::Claim`]).
    pub pg_claim: Pg,
    /// Deletes and failure detection ([`pg::Role::Delete`]).
    pub pg_delete: Pg,
    held: RefCell<Wheel<Held>>,
    held_wake: Notify,
    pending: RefCell<HashMap<usize, Pending>>,
    next_token: Cell<usize>,
    /// Published rows to delete: each ID with the deadline it was
    /// published with (the incarnation: `pg.rs`, `delete_sql`).
    to_delete: RefCell<Vec<(String, i64)>>,
    in_hand: InHand,
    delete_wake: Notify,
    /// Wakes the claim loop before its poll interval (a takeover reset
    /// rows that may be due now).
    claim_wake: Notify,
    rng: Cell<u64>,
    publish_warned: Cell<Option<Instant>>,
    publish_failures_unlogged: Cell<u64>,
}

impl QueueShard {
    fn stats(&self) -> &ShardStats {
        &self.stats[self.shard]
    }

    fn cfg(&self) -> &QueueConfig {
        &self.shared.config
    }

    /// Start this shard's queue tasks (they own the shard part and hold
    /// `gate`).
    pub fn start(shared: Arc<QueueShared>, shard: usize, stats: Arc<[ShardStats]>, gate: Rc<Gate>) {
        assert!(shard < shared.inboxes.len(), "shard {shard} has an inbox");
        let q = Rc::new(QueueShard {
            pg: Pg::new(&shared, stats.clone(), (shard, Role::Input), gate.clone()),
            pg_claim: Pg::new(&shared, stats.clone(), (shard, Role::Claim), gate.clone()),
            pg_delete: Pg::new(&shared, stats.clone(), (shard, Role::Delete), gate.clone()),
            shared,
            shard,
            stats,
            gate: gate.clone(),
            held: RefCell::new(Wheel::new(clock::now_ms())),
            held_wake: Notify::default(),
            pending: RefCell::new(HashMap::new()),
            next_token: Cell::new(0),
            to_delete: RefCell::new(Vec::new()),
            in_hand: InHand::default(),
            delete_wake: Notify::default(),
            claim_wake: Notify::default(),
            rng: Cell::new(clock::unix_us() | 1),
            publish_warned: Cell::new(None),
            publish_failures_unlogged: Cell::new(0),
        });
        gate.spawn(async move {
            // Connects (creating the table and indexes if missing) before
            // anything else runs.
            for pg in [&q.pg, &q.pg_claim, &q.pg_delete] {
                if pg.get().await.is_none() {
                    return;
                }
            }
            let gate = q.gate.clone();
            gate.spawn(q.clone().enqueue_loop());
            gate.spawn(q.clone().claim_loop());
            gate.spawn(q.clone().fire_loop());
            gate.spawn(q.clone().delete_loop());
            gate.spawn(q.clone().delivery_loop());
            gate.spawn(q.clone().refresh_loop());
            if q.shard == 0 {
                gate.spawn(q.clone().failure_detection_loop());
                if q.cfg().takeover_after_ms > 0 {
                    gate.spawn(q.clone().takeover_loop());
                }
                gate.spawn(q.clone().vacuum_loop());
            }
        });
    }

    fn jitter_ms(&self, max: u64) -> u64 {
        // xorshift64: a little randomness so nodes do not poll in lockstep.
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        if max == 0 {
            0
        } else {
            x % (max + 1)
        }
    }

    /// Sleep `ms`, or less if shutdown begins.
    async fn pause(&self, ms: u64) {
        let sleep = glommio::timer::sleep(std::time::Duration::from_millis(ms));
        futures_lite::future::or(sleep, self.gate.closing()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_shape() {
        let u = new_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_ne!(u, new_uuid());
    }
}
