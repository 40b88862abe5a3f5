//! The consumer thread: one librdkafka consumer per node, polled by a plain
//! thread, which hands each message to the shard owning its partition over
//! a bounded awaitable channel (it blocks when the shard is behind:
//! backpressure onto the consumer).

use super::headers::HeaderList;
use super::producer::{deliveries_max, DeliveryRouter};
use super::{new_uuid, QueueConfig, QueueShared, INBOX_CAPACITY};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, DefaultConsumerContext};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::ThreadedProducer;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the consumer thread checks that the broker answers.
const KAFKA_PROBE_EVERY: Duration = Duration::from_secs(2);

/// A message from the input topic, owned, on its way to a shard.
pub struct Inbound {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: HeaderList,
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
            pg_health: Arc::new(super::pg::Health::new(shards)),
            stopped: AtomicBool::new(false),
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
/// when the queue is stopped (dropping the senders ends the shards'
/// enqueue tasks).
fn consume_thread(shared: Arc<QueueShared>, inboxes: Vec<async_channel::Sender<Inbound>>) {
    let shards = inboxes.len();
    let mut stall = super::failure::StallWatch::default();
    let mut last_error_log: Option<Instant> = None;
    let mut last_probe: Option<Instant> = None;
    while !shared.stopped.load(Ordering::Relaxed) {
        stall.check(&shared);
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
        assert!(shard < inboxes.len());
        // Waits when the shard is behind: backpressure onto the consumer
        // (and a Postgres stall is watched meanwhile).
        if !stall.hand_over(&shared, &inboxes[shard], inbound) {
            return;
        }
    }
}
