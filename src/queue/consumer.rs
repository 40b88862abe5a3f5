//! The consumer thread: one librdkafka consumer per node, polled by a plain
//! thread, which hands each message to the shard owning its partition over
//! a bounded awaitable channel. When the shard is behind (its inbox full in
//! messages or in bytes), the message waits in the thread, and the thread
//! stops polling until the shard makes room (librdkafka's own fetch queue,
//! bounded by `queued.max.messages.kbytes`, then stops fetching). Only when
//! the wait outlasts `pause-after-ms` does it pause that shard's partitions
//! and poll on for the others (so the group's rebalances and
//! `max.poll.interval.ms` are served), hand what waits over in order as the
//! shard makes room, and then resume the partitions. Each message passes
//! the gap guard first (`gaps.rs`): where the broker skipped records after
//! an assignment or a resume, as tansu does inside a record batch, the
//! partition is fetched again. The guard learns of assignments from the
//! group's rebalance callback ([`Group`]).

use super::gaps::{Gaps, Verdict};
use super::headers::HeaderList;
use super::producer::{deliveries_max, DeliveryRouter};
use super::{new_uuid, QueueConfig, QueueShared, INBOX_CAPACITY};
use crate::runtime::loglimit::{log_due, LogLimit};
use crate::stats::ShardStats;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the consumer thread checks that the broker answers.
const KAFKA_PROBE_EVERY: Duration = Duration::from_secs(2);
/// The consumer's poll timeout; shorter while messages wait for room.
const POLL: Duration = Duration::from_millis(100);
const POLL_WAITING: Duration = Duration::from_millis(10);
/// While a shard has no room for what waits (and for less than
/// `pause-after-ms`), the thread looks again after this long.
const ROOM_NAP: Duration = Duration::from_millis(1);
/// How often the gap guard's silent partitions are looked for (each look
/// scans every partition it knows).
const SILENT_EVERY: Duration = Duration::from_millis(50);
/// The gap guard's look-up of the committed offsets, and its seek, each
/// wait at most this long.
const COMMITTED_TIMEOUT: Duration = Duration::from_secs(5);
const SEEK_TIMEOUT: Duration = Duration::from_secs(5);
/// A failed committed-offset look-up is tried again after this long (the
/// partitions wait, paused, meanwhile).
const LOOKUP_RETRY: Duration = Duration::from_secs(1);
/// ... doubling while it keeps failing, up to this.
const LOOKUP_RETRY_MAX: Duration = Duration::from_secs(8);

/// The consumer's context: records the group's assignments and
/// revocations (librdkafka calls it from inside `poll`, on the consumer
/// thread) for the thread to pass to the gap guard after the poll.
#[derive(Default)]
pub struct Group {
    /// In order; at most a few entries (one per rebalance, taken after
    /// every poll).
    changes: Mutex<Vec<Change>>,
}

/// One rebalance: the input partitions assigned (`true`) or revoked.
type Change = (bool, Vec<i32>);

impl rdkafka::ClientContext for Group {}

impl ConsumerContext for Group {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let (assigned, tpl) = match rebalance {
            Rebalance::Assign(tpl) => (true, tpl),
            Rebalance::Revoke(tpl) => (false, tpl),
            Rebalance::Error(_) => return,
        };
        let partitions = tpl.elements().iter().map(|e| e.partition()).collect();
        if let Ok(mut changes) = self.changes.lock() {
            changes.push((assigned, partitions));
        }
    }
}

impl Group {
    fn take(&self) -> Vec<Change> {
        self.changes
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default()
    }
}

/// A message from the input topic, owned, on its way to a shard.
pub struct Inbound {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: HeaderList,
    /// When the consumer thread polled it (the `inbox` and `stored`
    /// stages count from here).
    pub polled: Instant,
    /// Its producer timestamp until it was polled, ms (0 without one).
    pub broker_ms: u64,
    /// Its share of the shard's inbox bytes, given back when this is
    /// dropped (handled, published, skipped: however it ends).
    pub charge: Charge,
}

impl Inbound {
    /// The bytes it takes in the inbox bound.
    pub fn bytes(&self) -> usize {
        super::message_bytes("", &self.key, &self.value, &self.headers)
    }
}

/// A message's share of its shard's inbox bytes (none until handed over).
#[derive(Default)]
pub struct Charge(Option<(Arc<AtomicUsize>, usize)>);

impl Charge {
    fn take(counter: &Arc<AtomicUsize>, bytes: usize) -> Charge {
        counter.fetch_add(bytes, Ordering::Relaxed);
        Charge(Some((counter.clone(), bytes)))
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some((counter, bytes)) = self.0.take() {
            counter.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

impl QueueShared {
    /// Create the Kafka clients and start the consumer thread.
    pub fn start(
        config: &QueueConfig,
        stats: Arc<[ShardStats]>,
    ) -> Result<Arc<QueueShared>, String> {
        let shards = stats.len();
        let mut inbox_tx = Vec::new();
        let mut inboxes = Vec::new();
        let mut delivery_tx = Vec::new();
        let mut deliveries = Vec::new();
        for _ in 0..shards {
            let (tx, rx) = async_channel::bounded(INBOX_CAPACITY);
            inbox_tx.push(tx);
            inboxes.push(rx);
            let (tx, rx) = async_channel::bounded(deliveries_max(config));
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
                senders: delivery_tx.clone(),
            })
            .map_err(|e| format!("[queue.producer]: {e}"))?;
        // One message per batch, sent at once: a refusal of its batch is
        // about that message.
        pc.set("batch.num.messages", "1").set("linger.ms", "0");
        let solo: ThreadedProducer<DeliveryRouter> = pc
            .create_with_context(DeliveryRouter {
                senders: delivery_tx,
            })
            .map_err(|e| format!("[queue.producer]: {e}"))?;
        let consumer = group_consumer(config)?;
        let shared = Arc::new(QueueShared {
            config: config.clone(),
            node_id: new_uuid(),
            producer,
            solo,
            consumer: Arc::new(consumer),
            inboxes,
            inbox_bytes: (0..shards).map(|_| Arc::default()).collect(),
            deliveries,
            kafka_up: AtomicBool::new(false),
            output: super::output::Output::new(&config.output_topic),
            pg_health: Arc::new(super::pg::Health::new(
                shards * crate::stats::PG_CONNECTIONS,
            )),
            stopped: AtomicBool::new(false),
        });
        tracing::info!(target: "chronos::queue", node_id = %shared.node_id, "delay queue node started");
        let s = shared.clone();
        std::thread::Builder::new()
            .name("chronos-consumer".into())
            .spawn(move || consume_thread(s, inbox_tx, stats))
            .map_err(|e| format!("cannot start the consumer thread: {e}"))?;
        Ok(shared)
    }
}

/// The input topic's consumer, subscribed.
fn group_consumer(config: &QueueConfig) -> Result<BaseConsumer<Group>, String> {
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
    let consumer: BaseConsumer<Group> = cc
        .create_with_context(Group::default())
        .map_err(|e| format!("[queue.consumer]: {e}"))?;
    consumer
        .subscribe(&[config.input_topic.as_str()])
        .map_err(|e| format!("subscribe to {}: {e}", config.input_topic))?;
    Ok(consumer)
}

/// Poll the consumer and hand each message to its partition's shard. Ends
/// when the queue is stopped (dropping the senders ends the shards'
/// enqueue tasks).
fn consume_thread(
    shared: Arc<QueueShared>,
    inboxes: Vec<async_channel::Sender<Inbound>>,
    stats: Arc<[ShardStats]>,
) {
    let mut h = Handoff::new(&shared, inboxes, stats);
    let mut last_error_log: Option<Instant> = None;
    let mut last_probe: Option<Instant> = None;
    while !shared.stopped.load(Ordering::Relaxed) {
        if h.stall.check(&shared) {
            // Out of the group: what waits is dropped (see StallWatch), and
            // must be let through again when it is fetched again.
            h.waiting.iter_mut().for_each(Waiting::clear);
            h.gaps.reset();
            for p in std::mem::take(&mut h.held) {
                h.pause_resume(p, false);
            }
        }
        // Readiness: can the broker be reached? (An idle topic yields no
        // messages, so ask for metadata now and then.)
        if last_probe.is_none_or(|t| t.elapsed() >= KAFKA_PROBE_EVERY) {
            last_probe = Some(Instant::now());
            let up = shared
                .consumer
                .fetch_metadata(Some(&shared.config.input_topic), Duration::from_secs(1))
                .is_ok();
            shared.kafka_up.store(up, Ordering::Relaxed);
            if up {
                let output = probe_output(shared.producer.client(), &shared.config.output_topic);
                shared.output.probed(output, &h.stats[0]);
            }
        }
        if !h.drain() {
            return;
        }
        if h.blocked(Instant::now()) {
            std::thread::sleep(ROOM_NAP);
            continue;
        }
        h.seek_silent();
        let timeout = if h.any_waiting() { POLL_WAITING } else { POLL };
        let polled = shared.consumer.poll(timeout);
        h.rebalanced();
        let m = match polled {
            None => continue,
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                if last_error_log.is_none_or(|t| t.elapsed() > Duration::from_secs(30)) {
                    tracing::warn!(target: "chronos::queue", "Kafka consumer: {e}");
                    last_error_log = Some(Instant::now());
                }
                continue;
            }
        };
        shared.kafka_up.store(true, Ordering::Relaxed);
        if !h.offer(inbound_of(&m)) {
            return;
        }
    }
}

/// Whether the output topic can be used: its metadata, asked with the
/// producer's own client (its credentials, its rights), names it without
/// an error and with at least one partition (`Err`: why not). A broker
/// that does not answer in time is not counted (readiness says so).
fn probe_output<C: rdkafka::ClientContext>(
    producer: &rdkafka::client::Client<C>,
    topic: &str,
) -> Result<(), String> {
    let Ok(metadata) = producer.fetch_metadata(Some(topic), Duration::from_secs(1)) else {
        return Ok(());
    };
    let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Err("not in the broker's metadata".to_string());
    };
    if let Some(e) = t.error() {
        let code = rdkafka::error::RDKafkaErrorCode::from(e);
        return Err(format!("{code}"));
    }
    if t.partitions().is_empty() {
        return Err("the topic has no partitions".to_string());
    }
    Ok(())
}

/// The group's committed offsets of `partitions` of `topic` (`None` for
/// one without): one request for all of them. `Err` when the broker did
/// not say within [`COMMITTED_TIMEOUT`]: the partitions are then held
/// until a look-up succeeds (`gaps.rs`).
fn committed_offsets(
    consumer: &BaseConsumer<Group>,
    topic: &str,
    partitions: &[i32],
) -> Result<Vec<Option<i64>>, String> {
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        tpl.add_partition(topic, p);
    }
    let got = consumer
        .committed_offsets(tpl, COMMITTED_TIMEOUT)
        .map_err(|e| e.to_string())?;
    let mut offsets = Vec::with_capacity(partitions.len());
    for &p in partitions {
        let Some(elem) = got.find_partition(topic, p) else {
            return Err(format!("partition {p} missing from the answer"));
        };
        // An error for one partition is a failed look-up too, not "no
        // committed offset" (which would let its records through).
        elem.error().map_err(|e| format!("partition {p}: {e}"))?;
        offsets.push(match elem.offset() {
            Offset::Offset(n) => Some(n),
            _ => None,
        });
    }
    Ok(offsets)
}

/// An owned copy of a polled message.
fn inbound_of(m: &rdkafka::message::BorrowedMessage<'_>) -> Inbound {
    let mut headers = Vec::new();
    if let Some(h) = m.headers() {
        for i in 0..h.count() {
            let hd = h.get(i);
            headers.push((hd.key.to_string(), hd.value.map(<[u8]>::to_vec)));
        }
    }
    Inbound {
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
        polled: Instant::now(),
        broker_ms: m.timestamp().to_millis().map_or(0, |ts| {
            crate::runtime::clock::unix_ms().saturating_sub(ts.max(0) as u64)
        }),
        charge: Charge::default(),
    }
}

/// Per shard: messages polled but not yet handed over, in order, and the
/// partitions paused meanwhile. Bounded: while messages wait for a shard
/// the thread either polls nothing (up to `pause-after-ms`) or has paused
/// the partitions they came from, so at most what librdkafka had fetched
/// for those partitions when they were paused waits here (a pause drops
/// the rest of its fetched messages; they are fetched again on resume).
#[derive(Default)]
struct Waiting {
    messages: VecDeque<Inbound>,
    /// Since when messages have waited (`None` while none wait).
    since: Option<Instant>,
    /// Whether the shard's partitions are paused as their messages come
    /// (waited past `pause-after-ms`); until the resume.
    pausing: bool,
    paused: Vec<i32>,
}

impl Waiting {
    fn clear(&mut self) {
        self.messages.clear();
        self.since = None;
    }
}

/// The consumer thread's side of the inboxes.
struct Handoff<'a> {
    shared: &'a QueueShared,
    inboxes: Vec<async_channel::Sender<Inbound>>,
    waiting: Vec<Waiting>,
    stall: super::failure::StallWatch,
    gaps: Gaps,
    /// When the gap guard's silent partitions were last looked for.
    silent_looked: Instant,
    /// The gap guard's seek lines: at most one per [`SEEK_LOG_EVERY`]
    /// (an overloaded node against tansu seeks ~10 times a second).
    seek_log: LogLimit,
    /// Counters (pauses, the guard's seeks) go to the partition's shard.
    stats: Arc<[ShardStats]>,
    /// Partitions the gap guard holds paused ([`Gaps::holds`]): a failed
    /// look-up or seek, until it is done again.
    held: Vec<i32>,
    /// When the failed committed-offset look-ups were last tried (the end
    /// of the call), and how long until the next try.
    looked_up: Instant,
    lookup_backoff: Duration,
    pause_after: Duration,
}

/// At most one warning line about the gap guard's seeks per this long.
const SEEK_LOG_EVERY: Duration = Duration::from_secs(10);

impl<'a> Handoff<'a> {
    fn new(
        shared: &'a QueueShared,
        inboxes: Vec<async_channel::Sender<Inbound>>,
        stats: Arc<[ShardStats]>,
    ) -> Self {
        assert_eq!(
            inboxes.len(),
            shared.inbox_bytes.len(),
            "an inbox byte count per shard"
        );
        assert_eq!(inboxes.len(), stats.len(), "a stats block per shard");
        Handoff {
            shared,
            waiting: inboxes.iter().map(|_| Waiting::default()).collect(),
            inboxes,
            stall: Default::default(),
            gaps: Gaps::default(),
            silent_looked: Instant::now(),
            seek_log: LogLimit::default(),
            stats,
            held: Vec::new(),
            looked_up: Instant::now(),
            lookup_backoff: LOOKUP_RETRY,
            pause_after: Duration::from_millis(shared.config.pause_after_ms),
        }
    }

    fn shard_of(&self, partition: i32) -> usize {
        partition.unsigned_abs() as usize % self.inboxes.len()
    }

    fn any_waiting(&self) -> bool {
        self.waiting.iter().any(|w| !w.messages.is_empty())
    }

    /// Whether shard `s`'s inbox takes a message of `bytes` now: a free
    /// slot, and room in bytes (or nothing at all in hand, so that a
    /// message larger than the bound still passes alone).
    fn room(&self, s: usize, bytes: usize) -> bool {
        if self.inboxes[s].is_full() {
            return false;
        }
        let now = self.shared.inbox_bytes[s].load(Ordering::Relaxed);
        now == 0 || now.saturating_add(bytes) <= self.shared.config.inbox_bytes_max
    }

    fn half_empty(&self, s: usize) -> bool {
        let bytes = self.shared.inbox_bytes[s].load(Ordering::Relaxed);
        self.inboxes[s].len() <= INBOX_CAPACITY / 2
            && bytes <= self.shared.config.inbox_bytes_max / 2
    }

    /// Hand `m` to its shard, or keep it behind what already waits for that
    /// shard (pausing its partition once the shard has had no room for
    /// `pause-after-ms`). `false` when the inbox is closed.
    fn offer(&mut self, m: Inbound) -> bool {
        if self.stall.is_out() || !self.guard(&m) {
            return true;
        }
        let s = self.shard_of(m.partition);
        if self.waiting[s].messages.is_empty() && self.room(s, m.bytes()) {
            return self.send(s, m);
        }
        let now = Instant::now();
        let partition = m.partition;
        let w = &mut self.waiting[s];
        w.since.get_or_insert(now);
        w.messages.push_back(m);
        if w.pausing {
            self.pause(s, partition);
        } else {
            self.start_pausing(s, now);
        }
        true
    }

    /// Whether the thread should wait for room rather than poll: messages
    /// wait for some shard, for less than `pause-after-ms`. A shard that
    /// waited longer has its partitions paused here.
    fn blocked(&mut self, now: Instant) -> bool {
        let mut blocked = false;
        for s in 0..self.waiting.len() {
            let w = &self.waiting[s];
            if w.messages.is_empty() || w.pausing {
                continue;
            }
            blocked |= !self.start_pausing(s, now);
        }
        blocked
    }

    /// Once shard `s`'s messages have waited `pause-after-ms`, pause the
    /// partitions they came from (and, from now on until the resume, each
    /// partition as its messages come): `true` if so.
    fn start_pausing(&mut self, s: usize, now: Instant) -> bool {
        let since = self.waiting[s].since.unwrap_or(now);
        if now.saturating_duration_since(since) < self.pause_after {
            return false;
        }
        self.waiting[s].pausing = true;
        let mut partitions: Vec<i32> = self.waiting[s]
            .messages
            .iter()
            .map(|m| m.partition)
            .collect();
        partitions.sort_unstable();
        partitions.dedup();
        for p in partitions {
            self.pause(s, p);
        }
        true
    }

    /// Pause `partition` (of shard `s`) unless it is paused already.
    fn pause(&mut self, s: usize, partition: i32) {
        if self.waiting[s].paused.contains(&partition) {
            return;
        }
        self.waiting[s].paused.push(partition);
        self.pause_resume(partition, true);
        ShardStats::add(&self.stats[s].queue_paused, 1);
    }

    /// Pass the group's assignments and revocations since the last poll to
    /// the gap guard (one committed-offset look-up per assignment).
    fn rebalanced(&mut self) {
        for (assigned, partitions) in self.shared.consumer.context().take() {
            if !assigned {
                for &p in &partitions {
                    self.gaps.revoked(p);
                    self.release(p);
                }
                continue;
            }
            let topic = self.shared.config.input_topic.as_str();
            match committed_offsets(&self.shared.consumer, topic, &partitions) {
                Ok(committed) => {
                    tracing::info!(target: "chronos::queue", "input partitions assigned: {partitions:?}, committed offsets {committed:?}");
                    self.known(&partitions, committed);
                }
                Err(e) => {
                    tracing::warn!(target: "chronos::queue", "input partitions assigned: {partitions:?}; their committed offsets could not be had ({e}): held paused, nothing let through, until a look-up succeeds");
                    for &p in &partitions {
                        self.gaps.assigned_unknown(p);
                        self.hold(p);
                    }
                    self.looked_up = Instant::now();
                }
            }
        }
    }

    /// The committed offsets of assigned `partitions` are known: the guard
    /// checks from them (and lets go of a partition it held for them).
    fn known(&mut self, partitions: &[i32], committed: Vec<Option<i64>>) {
        assert_eq!(partitions.len(), committed.len(), "one offset each");
        let now = Instant::now();
        for (&p, c) in partitions.iter().zip(committed) {
            // Still paused here (a shard full across the rebalance):
            // the check waits for the resume.
            if self.waiting.iter().any(|w| w.paused.contains(&p)) {
                self.gaps.assigned_paused(p, c);
            } else {
                self.gaps.assigned(p, c, now);
            }
            self.release(p);
        }
    }

    /// Look the committed offsets of the partitions the guard holds for
    /// them up again, at most every [`LOOKUP_RETRY`].
    fn look_up_again(&mut self) {
        if self.looked_up.elapsed() < self.lookup_backoff {
            return;
        }
        let partitions = self.gaps.unknown();
        if partitions.is_empty() {
            self.lookup_backoff = LOOKUP_RETRY;
            return;
        }
        let topic = self.shared.config.input_topic.as_str();
        let result = committed_offsets(&self.shared.consumer, topic, &partitions);
        // Counted from the end of the call, which may block up to its
        // timeout: the thread keeps polling the other partitions between.
        self.looked_up = Instant::now();
        match result {
            Ok(committed) => {
                tracing::info!(target: "chronos::queue", "committed offsets of {partitions:?} had at last: {committed:?}");
                self.lookup_backoff = LOOKUP_RETRY;
                self.known(&partitions, committed);
            }
            Err(e) => {
                self.lookup_backoff = (self.lookup_backoff * 2).min(LOOKUP_RETRY_MAX);
                tracing::debug!(target: "chronos::queue", "committed offsets of {partitions:?} still not had: {e}")
            }
        }
    }

    /// The guard holds `partition`: paused until [`Handoff::release`].
    fn hold(&mut self, partition: i32) {
        if !self.held.contains(&partition) {
            self.held.push(partition);
            self.pause_resume(partition, true);
        }
    }

    /// The guard lets go of `partition`: resumed, unless its shard's
    /// waiting messages keep it paused.
    fn release(&mut self, partition: i32) {
        assert!(
            !self.gaps.holds(partition),
            "a partition is let go only once the guard no longer holds it"
        );
        let Some(i) = self.held.iter().position(|&p| p == partition) else {
            return;
        };
        self.held.swap_remove(i);
        if !self.waiting.iter().any(|w| w.paused.contains(&partition)) {
            self.pause_resume(partition, false);
        }
    }

    /// The gap guard (`gaps.rs`): `false` when `m` is dropped (handed over
    /// before, or to be fetched again after a seek back).
    fn guard(&mut self, m: &Inbound) -> bool {
        let from = match self.gaps.check(m.partition, m.offset, Instant::now()) {
            Verdict::Accept => return true,
            Verdict::Drop => return false,
            Verdict::Seek(from) => from,
        };
        let why = format!("offset {} came where an earlier one was due", m.offset);
        if !self.seek_back(m.partition, from, &why, true) {
            self.gaps.seek_failed(m.partition, Instant::now());
            self.hold(m.partition);
        }
        false
    }

    /// Seek `partition` back to `from` (the gap guard's verdict, for
    /// `why`; logged as a warning when `loud`, else at debug level: a
    /// partition silent after its assignment or resume is the common case
    /// with any broker); `false` if the seek failed.
    fn seek_back(&self, partition: i32, from: i64, why: &str, loud: bool) -> bool {
        let topic = self.shared.config.input_topic.as_str();
        let offset = Offset::Offset(from);
        match self
            .shared
            .consumer
            .seek(topic, partition, offset, SEEK_TIMEOUT)
        {
            Ok(()) => {
                ShardStats::add(&self.stats[self.shard_of(partition)].queue_refetched, 1);
                let quiet = log_due(&self.seek_log, Instant::now(), SEEK_LOG_EVERY);
                match quiet {
                    Some(quiet) if loud => {
                        tracing::warn!(target: "chronos::queue", partition, "input {why}: fetching the partition again from {from} (a broker that skips the rest of a record batch on a fetch from inside it, as tansu 0.6 does; or records compacted away); {quiet} more such seeks since the last line")
                    }
                    _ => {
                        tracing::debug!(target: "chronos::queue", partition, "input {why}: fetching the partition again from {from}")
                    }
                }
                true
            }
            Err(e) => {
                tracing::warn!(target: "chronos::queue", partition, "input {why}, and the seek back to {from} failed ({e}): the partition is held paused, nothing let through, and the seek tried again");
                false
            }
        }
    }

    /// Seek back the partitions silent since an assignment, a resume or a
    /// seek back (looked for at most every [`SILENT_EVERY`]).
    fn seek_silent(&mut self) {
        let now = Instant::now();
        if now.saturating_duration_since(self.silent_looked) < SILENT_EVERY {
            return;
        }
        self.silent_looked = now;
        self.look_up_again();
        for (partition, from) in self.gaps.silent(now) {
            let why = "partition silent after an assignment or a resume, or held";
            if self.seek_back(partition, from, why, false) {
                self.release(partition);
            } else {
                self.gaps.seek_failed(partition, Instant::now());
                self.hold(partition);
            }
        }
    }

    /// Hand over what waits, in order, as far as there is room; resume a
    /// shard's partitions once nothing waits for it and its inbox is at
    /// most half full (so that each resume, which costs a fetch, brings
    /// many messages, not one). `false` when an inbox is closed.
    fn drain(&mut self) -> bool {
        for s in 0..self.waiting.len() {
            while let Some(bytes) = self.waiting[s].messages.front().map(Inbound::bytes) {
                if !self.room(s, bytes) {
                    break;
                }
                let Some(m) = self.waiting[s].messages.pop_front() else {
                    break;
                };
                if !self.send(s, m) {
                    return false;
                }
            }
            let w = &mut self.waiting[s];
            if w.messages.is_empty() {
                w.since = None;
            }
            if w.messages.is_empty() && self.half_empty(s) {
                self.waiting[s].pausing = false;
                for p in std::mem::take(&mut self.waiting[s].paused) {
                    // One the guard holds stays paused until it lets go.
                    if !self.held.contains(&p) {
                        self.pause_resume(p, false);
                        self.gaps.resumed(p, Instant::now());
                    }
                }
            }
        }
        true
    }

    /// There is room (checked): `m` goes at once (or is dropped while the
    /// node is out of the group after a Postgres stall).
    fn send(&mut self, s: usize, mut m: Inbound) -> bool {
        m.charge = Charge::take(&self.shared.inbox_bytes[s], m.bytes());
        self.stall.hand_over(&self.inboxes[s], m)
    }

    fn pause_resume(&self, partition: i32, pause: bool) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.shared.config.input_topic, partition);
        let done = if pause {
            self.shared.consumer.pause(&tpl)
        } else {
            self.shared.consumer.resume(&tpl)
        };
        if let Err(e) = done {
            // Not assigned (any more): nothing is fetched for it here.
            tracing::debug!(target: "chronos::queue", "pause {pause} partition {partition}: {e}");
        }
    }
}
