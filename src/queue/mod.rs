//! The Kafka delay queue of seed 004, on the engine.
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
//!   (`chronos-consumer`), which hands each message to the shard owning its
//!   partition (`partition % shards`) over a bounded awaitable channel;
//! - one librdkafka producer per node; its delivery callback routes each
//!   acknowledgement back to the shard that sent the message;
//! - per shard: one Postgres connection and four tasks (enqueue, claim,
//!   fire, delete); shard 0 also runs failure detection.
//!
//! At least once: an input offset is stored for commit only after every
//! message up to it was inserted or published (acknowledged); a row is
//! deleted only after its publish was acknowledged; a rejected publish is
//! retried with backoff and never deleted.

pub mod deadline;
pub mod pg;

use crate::config::QueueConfig;
use crate::runtime::clock;
use crate::runtime::notify::Notify;
use crate::shard::SHUTDOWN;
use crate::stats::ShardStats;
use crate::wheel::Wheel;
use pg::{retry_query, Pg};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, DefaultConsumerContext};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The two headers every input message needs.
pub const HEADER_ID: &str = "chronosMessageId";
pub const HEADER_DEADLINE: &str = "chronosDeadline";
/// Longest message ID (the table's `varchar(128)`).
pub const ID_CHARS_MAX: usize = 128;
/// Messages waiting per shard between the consumer thread and the shard.
pub const INBOX_CAPACITY: usize = 8192;
/// Claimed messages a shard may hold or have in flight, in claim batches
/// (16 × 2000: a full second of look-ahead at 20,000 messages/s, and more).
const CLAIMED_IN_HAND_BATCHES: usize = 16;
/// Messages published per turn of the fire task.
const FIRE_PER_TURN_MAX: usize = 1024;
/// IDs deleted per statement.
const DELETE_BATCH_MAX: usize = 5000;
/// Rows examined per failure-detection pass.
const STUCK_BATCH_MAX: i64 = 1000;
/// At most one publish-failure log line per shard this often.
const PUBLISH_LOG_EVERY: Duration = Duration::from_secs(10);
/// How often the consumer thread checks that the broker answers.
const KAFKA_PROBE_EVERY: Duration = Duration::from_secs(2);
/// Publish retry backoff.
const PUBLISH_BACKOFF_MS_MIN: u64 = 100;
const PUBLISH_BACKOFF_MS_MAX: u64 = 5_000;

/// A message from the input topic, owned, on its way to a shard.
pub struct Inbound {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// A publish acknowledgement (or failure) for the shard that sent it.
pub struct Delivery {
    token: usize,
    result: Result<(), String>,
}

/// Routes delivery reports to the sending shard (the shard is in the
/// token's top bits).
pub struct DeliveryRouter {
    senders: Vec<async_channel::Sender<Delivery>>,
}

const TOKEN_SHARD_SHIFT: u32 = 48;

impl ClientContext for DeliveryRouter {}

impl ProducerContext for DeliveryRouter {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, token: usize) {
        let result = match result {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(e.to_string()),
        };
        let shard = token >> TOKEN_SHARD_SHIFT;
        if let Some(tx) = self.senders.get(shard) {
            // Unbounded: at most librdkafka's own queue of in-flight
            // messages (queue.buffering.max.messages) can be waiting here.
            let _ = tx.try_send(Delivery { token, result });
        }
    }
}

/// What every shard shares: the config, the node ID, Kafka clients, and
/// the channel ends.
pub struct QueueShared {
    pub config: QueueConfig,
    /// This process's node ID (a random UUID, new at every start).
    pub node_id: String,
    pub producer: ThreadedProducer<DeliveryRouter>,
    pub consumer: Arc<BaseConsumer<DefaultConsumerContext>>,
    inboxes: Vec<async_channel::Receiver<Inbound>>,
    deliveries: Vec<async_channel::Receiver<Delivery>>,
    /// Whether the consumer has seen the broker answer.
    pub kafka_up: AtomicBool,
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

impl QueueShared {
    /// Create the Kafka clients and start the consumer thread.
    pub fn start(config: &QueueConfig, shards: usize) -> Result<Arc<QueueShared>, String> {
        let mut inbox_tx = Vec::new();
        let mut inboxes = Vec::new();
        let mut delivery_tx = Vec::new();
        let mut deliveries = Vec::new();
        for _ in 0..shards {
            let (tx, rx) = async_channel::bounded(INBOX_CAPACITY);
            inbox_tx.push(tx);
            inboxes.push(rx);
            let (tx, rx) = async_channel::unbounded();
            delivery_tx.push(tx);
            deliveries.push(rx);
        }
        let mut pc = ClientConfig::new();
        pc.set("bootstrap.servers", &config.kafka_brokers);
        for (k, v) in &config.producer {
            pc.set(k, QueueConfig::property(v));
        }
        let producer: ThreadedProducer<DeliveryRouter> = pc
            .create_with_context(DeliveryRouter {
                senders: delivery_tx,
            })
            .map_err(|e| format!("[queue.producer]: {e}"))?;
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &config.kafka_brokers)
            .set("group.id", &config.consumer_group)
            .set("enable.auto.commit", "true")
            .set("enable.auto.offset.store", "false")
            .set("auto.commit.interval.ms", "1000")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "20");
        for (k, v) in &config.consumer {
            cc.set(k, QueueConfig::property(v));
        }
        let consumer: BaseConsumer<DefaultConsumerContext> =
            cc.create().map_err(|e| format!("[queue.consumer]: {e}"))?;
        consumer
            .subscribe(&[config.input_topic.as_str()])
            .map_err(|e| format!("subscribe to {}: {e}", config.input_topic))?;
        let shared = Arc::new(QueueShared {
            config: config.clone(),
            node_id: new_uuid(),
            producer,
            consumer: Arc::new(consumer),
            inboxes,
            deliveries,
            kafka_up: AtomicBool::new(false),
        });
        tracing::info!(target: "chronos::queue", node_id = %shared.node_id, "delay queue node started");
        let s = shared.clone();
        std::thread::Builder::new()
            .name("chronos-consumer".into())
            .spawn(move || consume_thread(s, inbox_tx))
            .map_err(|e| format!("cannot start the consumer thread: {e}"))?;
        Ok(shared)
    }
}

/// Poll the consumer and hand each message to its partition's shard. Ends
/// at shutdown (dropping the senders ends the shards' enqueue tasks).
fn consume_thread(shared: Arc<QueueShared>, inboxes: Vec<async_channel::Sender<Inbound>>) {
    let shards = inboxes.len();
    let mut last_error_log: Option<Instant> = None;
    let mut last_probe: Option<Instant> = None;
    while !SHUTDOWN.load(Ordering::Relaxed) {
        // Readiness: can the broker be reached? (An idle topic yields no
        // messages, so ask for metadata now and then.)
        if last_probe.is_none_or(|t| t.elapsed() >= KAFKA_PROBE_EVERY) {
            last_probe = Some(Instant::now());
            let up = shared
                .consumer
                .fetch_metadata(Some(&shared.config.input_topic), Duration::from_secs(1))
                .is_ok();
            shared.kafka_up.store(up, Ordering::Relaxed);
        }
        let Some(result) = shared.consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = match result {
            Ok(m) => m,
            Err(e) => {
                if last_error_log.is_none_or(|t| t.elapsed() > Duration::from_secs(30)) {
                    tracing::warn!(target: "chronos::queue", "Kafka consumer: {e}");
                    last_error_log = Some(Instant::now());
                }
                continue;
            }
        };
        shared.kafka_up.store(true, Ordering::Relaxed);
        let mut headers = Vec::new();
        if let Some(h) = m.headers() {
            for i in 0..h.count() {
                let hd = h.get(i);
                headers.push((hd.key.to_string(), hd.value.map(<[u8]>::to_vec)));
            }
        }
        let inbound = Inbound {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers,
        };
        let shard = m.partition().unsigned_abs() as usize % shards;
        // Blocks when the shard is behind: backpressure onto the consumer.
        if inboxes[shard].send_blocking(inbound).is_err() {
            return;
        }
    }
}

/// A claimed message waiting in the wheel for its fire time.
struct Held {
    id: String,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    deadline_us: i64,
}

/// Waits for a set of immediate publishes.
struct Batch {
    left: Cell<usize>,
    done: Notify,
}

enum Kind {
    /// From the table: delete the row once acknowledged.
    Held { id: String, deadline_us: i64 },
    /// Late on arrival: the enqueue batch waits for it.
    Immediate(Rc<Batch>),
}

/// A publish in flight.
struct Pending {
    kind: Kind,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    attempts: u32,
}

/// One shard's part of the queue.
pub struct QueueShard {
    shared: Arc<QueueShared>,
    shard: usize,
    stats: Arc<[ShardStats]>,
    pub pg: Pg,
    held: RefCell<Wheel<Held>>,
    held_wake: Notify,
    pending: RefCell<HashMap<usize, Pending>>,
    next_token: Cell<usize>,
    to_delete: RefCell<Vec<String>>,
    delete_wake: Notify,
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

    /// Start this shard's queue tasks (they own the shard part).
    pub fn start(shared: Arc<QueueShared>, shard: usize, stats: Arc<[ShardStats]>) {
        let q = Rc::new(QueueShard {
            pg: Pg::new(&shared.config, stats.clone(), shard),
            shared,
            shard,
            stats,
            held: RefCell::new(Wheel::new(clock::now_ms())),
            held_wake: Notify::default(),
            pending: RefCell::new(HashMap::new()),
            next_token: Cell::new(0),
            to_delete: RefCell::new(Vec::new()),
            delete_wake: Notify::default(),
            rng: Cell::new(clock::unix_us() | 1),
            publish_warned: Cell::new(None),
            publish_failures_unlogged: Cell::new(0),
        });
        let first = q;
        glommio::spawn_local(async move {
            // Connects (creating the table and indexes if missing) before
            // anything else runs.
            if first.pg.get().await.is_none() {
                return;
            }
            glommio::spawn_local(first.clone().enqueue_loop()).detach();
            glommio::spawn_local(first.clone().claim_loop()).detach();
            glommio::spawn_local(first.clone().fire_loop()).detach();
            glommio::spawn_local(first.clone().delete_loop()).detach();
            glommio::spawn_local(first.clone().delivery_loop()).detach();
            if first.shard == 0 {
                glommio::spawn_local(first.clone().failure_detection_loop()).detach();
            }
        })
        .detach();
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

    // ---- consuming and enqueuing ----

    async fn enqueue_loop(self: Rc<Self>) {
        let inbox = self.shared.inboxes[self.shard].clone();
        let max = self.cfg().insert_batch_max;
        let mut batch: Vec<Inbound> = Vec::with_capacity(max);
        loop {
            let Ok(first) = inbox.recv().await else {
                return;
            };
            batch.push(first);
            while batch.len() < max {
                match inbox.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            if !self.enqueue_batch(&mut batch).await {
                return;
            }
        }
    }

    /// Handle one batch; `false` only at shutdown.
    async fn enqueue_batch(self: &Rc<Self>, batch: &mut Vec<Inbound>) -> bool {
        let stats = self.stats();
        ShardStats::add(&stats.queue_consumed, batch.len() as u64);
        // The last offset of each partition in the batch.
        let mut last: Vec<(i32, i64)> = Vec::new();
        let mut ids: Vec<String> = Vec::new();
        let mut deadlines: Vec<SystemTime> = Vec::new();
        let mut header_json: Vec<String> = Vec::new();
        let mut keys: Vec<Option<Vec<u8>>> = Vec::new();
        let mut values: Vec<Option<Vec<u8>>> = Vec::new();
        let mut late: Vec<(String, Inbound)> = Vec::new();
        let now_us = clock::unix_us() as i64;
        let advance_us = self.cfg().timing_advance_ms as i64 * 1000;
        for mut m in batch.drain(..) {
            match last.iter_mut().find(|(p, _)| *p == m.partition) {
                Some(entry) => entry.1 = entry.1.max(m.offset),
                None => last.push((m.partition, m.offset)),
            }
            let (id, deadline_us) = match validate(&m.headers) {
                Ok(v) => v,
                Err(reason) => {
                    ShardStats::add(&stats.queue_skipped_invalid, 1);
                    tracing::warn!(
                        target: "chronos::queue",
                        partition = m.partition,
                        offset = m.offset,
                        "skipping input message: {reason}"
                    );
                    continue;
                }
            };
            m.headers
                .retain(|(k, _)| k != HEADER_ID && k != HEADER_DEADLINE);
            if deadline_us - advance_us <= now_us {
                late.push((id, m));
            } else {
                ids.push(id);
                deadlines.push(system_time_of(deadline_us));
                header_json.push(headers_json(&m.headers));
                keys.push(m.key);
                values.push(m.value);
            }
        }
        if !ids.is_empty() {
            let started = Instant::now();
            if retry_query(
                &self.pg,
                |c| &c.insert,
                &[&ids, &deadlines, &header_json, &keys, &values],
            )
            .await
            .is_none()
            {
                return false;
            }
            stats.record_pg_batch(started.elapsed());
            ShardStats::add(&stats.queue_enqueued, ids.len() as u64);
        }
        if !late.is_empty() {
            // Seed 004: publish at once unless the ID is already waiting.
            let late_ids: Vec<&str> = late.iter().map(|(id, _)| id.as_str()).collect();
            let Some(rows) = retry_query(&self.pg, |c| &c.exists, &[&late_ids]).await else {
                return false;
            };
            let waiting: Vec<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
            let wait = Rc::new(Batch {
                left: Cell::new(0),
                done: Notify::default(),
            });
            let mut published: std::collections::HashSet<String> = Default::default();
            for (id, m) in late {
                // Already waiting in the table, or a duplicate ID within
                // this batch: published once.
                if waiting.contains(&id) || !published.insert(id) {
                    continue;
                }
                ShardStats::add(&stats.queue_late, 1);
                wait.left.set(wait.left.get() + 1);
                self.publish(Pending {
                    kind: Kind::Immediate(wait.clone()),
                    key: m.key,
                    value: m.value,
                    headers: m.headers,
                    attempts: 0,
                });
            }
            while wait.left.get() > 0 {
                if SHUTDOWN.load(Ordering::Relaxed) {
                    return false;
                }
                futures_lite::future::or(
                    wait.done.wait(),
                    glommio::timer::sleep(Duration::from_millis(100)),
                )
                .await;
            }
        }
        let topic = &self.cfg().input_topic;
        for (partition, offset) in last {
            if let Err(e) = self.shared.consumer.store_offset(topic, partition, offset) {
                // The partition moved to another member: it will redeliver.
                tracing::debug!(target: "chronos::queue", "store offset {partition}/{offset}: {e}");
            }
        }
        true
    }

    // ---- readying (claiming) and firing ----

    async fn claim_loop(self: Rc<Self>) {
        let cfg = self.cfg().clone();
        // Claimed messages held or being published stay below this: while
        // the broker is away, claims stop instead of piling up in memory.
        let in_hand_max = cfg.claim_batch_max * CLAIMED_IN_HAND_BATCHES;
        loop {
            if SHUTDOWN.load(Ordering::Relaxed) {
                return;
            }
            let in_hand = self.held.borrow().len() + self.pending.borrow().len();
            if in_hand >= in_hand_max {
                glommio::timer::sleep(Duration::from_millis(cfg.poll_interval_ms)).await;
                continue;
            }
            let now = SystemTime::now();
            let horizon = now + Duration::from_millis(cfg.look_ahead_ms);
            let limit = cfg.claim_batch_max.min(in_hand_max - in_hand) as i64;
            let started = Instant::now();
            let Some(rows) = retry_query(
                &self.pg,
                |c| &c.ready,
                &[&now, &self.shared.node_id, &horizon, &limit],
            )
            .await
            else {
                return;
            };
            self.stats().record_pg_batch(started.elapsed());
            let claimed = rows.len();
            if claimed > 0 {
                let now_ms = clock::now_ms();
                let now_unix_us = clock::unix_us() as i64;
                let advance_us = cfg.timing_advance_ms as i64 * 1000;
                let mut held = self.held.borrow_mut();
                for row in rows {
                    let deadline: SystemTime = row.get(1);
                    let deadline_us = unix_us_of(deadline);
                    let headers: Option<String> = row.get(4);
                    let h = Held {
                        id: row.get(0),
                        key: row.get(2),
                        value: row.get(3),
                        headers: headers
                            .as_deref()
                            .map(parse_headers_json)
                            .unwrap_or_default(),
                        deadline_us,
                    };
                    // Fire at deadline - advance, on the engine clock; round up.
                    let wait_us = (deadline_us - advance_us - now_unix_us).max(0) as u64;
                    held.insert(now_ms + wait_us.div_ceil(1000), h);
                }
                drop(held);
                self.held_wake.notify();
            }
            if claimed as i64 == limit {
                glommio::yield_if_needed().await;
                continue;
            }
            // The poll interval, with a little jitter (up to 10%).
            let jitter = self.jitter_ms(cfg.poll_interval_ms / 10);
            let spent = started.elapsed();
            let wait = Duration::from_millis(cfg.poll_interval_ms + jitter).saturating_sub(spent);
            glommio::timer::sleep(wait).await;
        }
    }

    async fn fire_loop(self: Rc<Self>) {
        let mut due: Vec<Held> = Vec::with_capacity(FIRE_PER_TURN_MAX);
        loop {
            if SHUTDOWN.load(Ordering::Relaxed) {
                return;
            }
            let now = clock::now_ms();
            let fired = self
                .held
                .borrow_mut()
                .poll(now, FIRE_PER_TURN_MAX, |_, _, h| due.push(h));
            for h in due.drain(..) {
                self.publish(Pending {
                    kind: Kind::Held {
                        id: h.id,
                        deadline_us: h.deadline_us,
                    },
                    key: h.key,
                    value: h.value,
                    headers: h.headers,
                    attempts: 0,
                });
            }
            if fired == FIRE_PER_TURN_MAX {
                glommio::yield_if_needed().await;
                continue;
            }
            let next = self.held.borrow().next_deadline_ms();
            let wake = next.unwrap_or(u64::MAX).min(clock::now_ms() + 100);
            let sleep = clock::instant_of(wake).saturating_duration_since(Instant::now());
            if !sleep.is_zero() {
                futures_lite::future::or(glommio::timer::sleep(sleep), self.held_wake.wait()).await;
            }
        }
    }

    /// Hand a message to the producer (retried with backoff while its queue
    /// is full).
    fn publish(self: &Rc<Self>, p: Pending) {
        let token = (self.shard << TOKEN_SHARD_SHIFT)
            | (self.next_token.get() & ((1 << TOKEN_SHARD_SHIFT) - 1));
        self.next_token.set(self.next_token.get().wrapping_add(1));
        self.pending.borrow_mut().insert(token, p);
        self.send(token);
    }

    fn send(self: &Rc<Self>, token: usize) {
        let outcome = {
            let pending = self.pending.borrow();
            let Some(p) = pending.get(&token) else {
                return;
            };
            let mut headers = OwnedHeaders::new_with_capacity(p.headers.len());
            for (k, v) in &p.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: v.as_deref(),
                });
            }
            let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(
                &self.shared.config.output_topic,
                token,
            )
            .headers(headers);
            if let Some(k) = &p.key {
                record = record.key(k.as_slice());
            }
            if let Some(v) = &p.value {
                record = record.payload(v.as_slice());
            }
            self.shared.producer.send(record).map_err(|(e, _)| e)
        };
        if let Err(e) = outcome {
            self.retry_later(token, &e.to_string());
        }
    }

    fn retry_later(self: &Rc<Self>, token: usize, why: &str) {
        ShardStats::add(&self.stats().queue_producer_errors, 1);
        let attempts = {
            let mut pending = self.pending.borrow_mut();
            let Some(p) = pending.get_mut(&token) else {
                return;
            };
            p.attempts += 1;
            p.attempts
        };
        // One line per `PUBLISH_LOG_EVERY` per shard, however many fail.
        let quiet = self.publish_warned.get();
        if quiet.is_none_or(|t| t.elapsed() >= PUBLISH_LOG_EVERY) {
            let more = self.publish_failures_unlogged.replace(0);
            tracing::warn!(target: "chronos::queue", "publish failed, retrying with backoff ({more} more failures since the last report): {why}");
            self.publish_warned.set(Some(Instant::now()));
        } else {
            self.publish_failures_unlogged
                .set(self.publish_failures_unlogged.get() + 1);
        }
        let backoff = (PUBLISH_BACKOFF_MS_MIN << attempts.min(10)).min(PUBLISH_BACKOFF_MS_MAX);
        let me = self.clone();
        glommio::spawn_local(async move {
            glommio::timer::sleep(Duration::from_millis(backoff)).await;
            me.send(token);
        })
        .detach();
    }

    async fn delivery_loop(self: Rc<Self>) {
        let rx = self.shared.deliveries[self.shard].clone();
        while let Ok(d) = rx.recv().await {
            if let Err(e) = d.result {
                self.retry_later(d.token, &e);
                continue;
            }
            let Some(p) = self.pending.borrow_mut().remove(&d.token) else {
                continue;
            };
            let stats = self.stats();
            match p.kind {
                Kind::Held { id, deadline_us } => {
                    ShardStats::add(&stats.queue_fired, 1);
                    let late_us = clock::unix_us() as i64 - deadline_us;
                    stats.record_queue_lateness(late_us);
                    self.to_delete.borrow_mut().push(id);
                    self.delete_wake.notify();
                }
                Kind::Immediate(batch) => {
                    batch.left.set(batch.left.get() - 1);
                    if batch.left.get() == 0 {
                        batch.done.notify();
                    }
                }
            }
        }
    }

    async fn delete_loop(self: Rc<Self>) {
        loop {
            if SHUTDOWN.load(Ordering::Relaxed) && self.to_delete.borrow().is_empty() {
                return;
            }
            if self.to_delete.borrow().is_empty() {
                futures_lite::future::or(
                    self.delete_wake.wait(),
                    glommio::timer::sleep(Duration::from_millis(100)),
                )
                .await;
                continue;
            }
            let ids: Vec<String> = {
                let mut all = self.to_delete.borrow_mut();
                let n = all.len().min(DELETE_BATCH_MAX);
                all.drain(..n).collect()
            };
            let started = Instant::now();
            let Some(rows) = retry_query(&self.pg, |c| &c.delete, &[&ids]).await else {
                return;
            };
            self.stats().record_pg_batch(started.elapsed());
            if rows.len() < ids.len() {
                let gone: std::collections::HashSet<String> =
                    rows.iter().map(|r| r.get::<_, String>(0)).collect();
                for id in ids.iter().filter(|id| !gone.contains(*id)) {
                    tracing::warn!(target: "chronos::queue", "message {id} was already deleted (taken over by a peer after a suspected failure)");
                }
            }
        }
    }

    // ---- failure detection ----

    async fn failure_detection_loop(self: Rc<Self>) {
        let cfg = self.cfg().clone();
        loop {
            let jitter = self.jitter_ms(cfg.failure_detection_interval_ms / 10);
            glommio::timer::sleep(Duration::from_millis(
                cfg.failure_detection_interval_ms + jitter,
            ))
            .await;
            if SHUTDOWN.load(Ordering::Relaxed) {
                return;
            }
            let cutoff = SystemTime::now() - Duration::from_millis(cfg.hold_time_ms);
            let Some(rows) =
                retry_query(&self.pg, |c| &c.stuck, &[&cutoff, &STUCK_BATCH_MAX]).await
            else {
                return;
            };
            if rows.is_empty() {
                continue;
            }
            let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            let by: Vec<String> = rows.iter().map(|r| r.get(1)).collect();
            let at: Vec<SystemTime> = rows.iter().map(|r| r.get(2)).collect();
            let Some(reset) = retry_query(&self.pg, |c| &c.reset, &[&ids, &by, &at]).await else {
                return;
            };
            for r in &reset {
                let id: String = r.get(0);
                let node: String = r.get(1);
                tracing::warn!(target: "chronos::queue", "suspected failure of {node} for message {id}");
            }
            ShardStats::add(&self.stats().queue_reset, reset.len() as u64);
        }
    }
}

/// Check the chronos headers: `(id, deadline in Unix µs)`.
fn validate(headers: &[(String, Option<Vec<u8>>)]) -> Result<(String, i64), String> {
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_deref())
    };
    let id = match find(HEADER_ID) {
        None => return Err(format!("no {HEADER_ID} header")),
        Some(None) => return Err(format!("{HEADER_ID} header has no value")),
        Some(Some(v)) => std::str::from_utf8(v)
            .map_err(|_| format!("{HEADER_ID} is not UTF-8"))?
            .to_string(),
    };
    if id.is_empty() || id.chars().count() > ID_CHARS_MAX {
        return Err(format!(
            "{HEADER_ID} must be 1 to {ID_CHARS_MAX} characters"
        ));
    }
    let deadline = match find(HEADER_DEADLINE) {
        None => return Err(format!("no {HEADER_DEADLINE} header (message {id})")),
        Some(None) => {
            return Err(format!(
                "{HEADER_DEADLINE} header has no value (message {id})"
            ))
        }
        Some(Some(v)) => std::str::from_utf8(v)
            .map_err(|_| format!("{HEADER_DEADLINE} is not UTF-8 (message {id})"))?,
    };
    let us = deadline::parse_unix_us(deadline).map_err(|e| format!("{e} (message {id})"))?;
    Ok((id, us))
}

/// Headers as stored: `[{"name": "value"}, ...]` (a value that is not
/// UTF-8 is stored lossily; a valueless header as `null`).
fn headers_json(headers: &[(String, Option<Vec<u8>>)]) -> String {
    let list: Vec<serde_json::Value> = headers
        .iter()
        .map(|(k, v)| {
            let value = match v {
                Some(b) => serde_json::Value::String(String::from_utf8_lossy(b).into_owned()),
                None => serde_json::Value::Null,
            };
            let mut o = serde_json::Map::new();
            o.insert(k.clone(), value);
            serde_json::Value::Object(o)
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

fn parse_headers_json(text: &str) -> Vec<(String, Option<Vec<u8>>)> {
    let Ok(serde_json::Value::Array(list)) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for item in list {
        if let serde_json::Value::Object(o) = item {
            for (k, v) in o {
                let value = match v {
                    serde_json::Value::String(s) => Some(s.into_bytes()),
                    serde_json::Value::Null => None,
                    other => Some(other.to_string().into_bytes()),
                };
                out.push((k, value));
            }
        }
    }
    out
}

fn system_time_of(unix_us: i64) -> SystemTime {
    if unix_us >= 0 {
        UNIX_EPOCH + Duration::from_micros(unix_us as u64)
    } else {
        UNIX_EPOCH - Duration::from_micros(unix_us.unsigned_abs())
    }
}

fn unix_us_of(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_micros() as i64,
        Err(e) => -(e.duration().as_micros() as i64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(k: &str, v: &str) -> (String, Option<Vec<u8>>) {
        (k.to_string(), Some(v.as_bytes().to_vec()))
    }

    #[test]
    fn header_validation() {
        let ok = [
            h(HEADER_ID, "m1"),
            h(HEADER_DEADLINE, "1970-01-01T00:00:01Z"),
        ];
        assert_eq!(validate(&ok).unwrap(), ("m1".to_string(), 1_000_000));
        assert!(validate(&[h(HEADER_ID, "m1")]).is_err());
        assert!(validate(&[h(HEADER_DEADLINE, "1970-01-01T00:00:01Z")]).is_err());
        assert!(validate(&[h(HEADER_ID, "m1"), h(HEADER_DEADLINE, "soon")]).is_err());
        let long = "x".repeat(129);
        assert!(validate(&[
            h(HEADER_ID, &long),
            h(HEADER_DEADLINE, "1970-01-01T00:00:01")
        ])
        .is_err());
    }

    #[test]
    fn headers_round_trip_through_json() {
        let list = vec![h("a", "1"), ("b".to_string(), None), h("c\"", "x\ny")];
        assert_eq!(parse_headers_json(&headers_json(&list)), list);
    }

    #[test]
    fn uuid_shape() {
        let u = new_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_ne!(u, new_uuid());
    }

    #[test]
    fn time_conversions() {
        for us in [-1_500_000i64, 0, 1, 1_669_892_941_123_456] {
            assert_eq!(unix_us_of(system_time_of(us)), us);
        }
    }
}
