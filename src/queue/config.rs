//! `[queue]`: the delay queue's settings, with seed 004's defaults. The
//! configuration loader embeds this section and calls [`QueueConfig::check`].

use serde::Deserialize;

/// `[queue]`: the Kafka delay queue (seed 004). Its presence turns it on.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct QueueConfig {
    /// librdkafka `bootstrap.servers`.
    pub kafka_brokers: String,
    pub input_topic: String,
    pub output_topic: String,
    #[serde(default = "QueueConfig::default_group")]
    pub consumer_group: String,
    /// e.g. `postgres://postgres@127.0.0.1:5432/test` (TCP hosts only).
    pub postgres_url: String,
    #[serde(default = "QueueConfig::default_table")]
    pub table: String,
    /// Messages are published this long before their deadline.
    #[serde(default = "QueueConfig::default_timing_advance_ms")]
    pub timing_advance_ms: u64,
    /// A readied message not fired within this is reset by failure detection.
    #[serde(default = "QueueConfig::default_hold_time_ms")]
    pub hold_time_ms: u64,
    #[serde(default = "QueueConfig::default_poll_interval_ms")]
    pub poll_interval_ms: u64,
    #[serde(default = "QueueConfig::default_failure_detection_interval_ms")]
    pub failure_detection_interval_ms: u64,
    /// A node of this Postgres role with no session at all for this long
    /// is dead: its claimed rows are reset at once, not after the hold
    /// time (`takeover.rs`). 0 leaves it to the hold time.
    #[serde(default = "QueueConfig::default_takeover_after_ms")]
    pub takeover_after_ms: u64,
    /// How far ahead of its deadline a message is claimed and held in the
    /// shard's wheel. Must stay below `hold-time-ms - poll-interval-ms`.
    #[serde(default = "QueueConfig::default_look_ahead_ms")]
    pub look_ahead_ms: u64,
    /// Rows claimed per ready statement.
    #[serde(default = "QueueConfig::default_batch_max")]
    pub claim_batch_max: usize,
    /// Messages per insert statement.
    #[serde(default = "QueueConfig::default_batch_max")]
    pub insert_batch_max: usize,
    /// Bytes (keys, values, headers) per insert statement; a larger
    /// batch is split (Postgres refuses a message over 1 GB).
    #[serde(default = "QueueConfig::default_batch_bytes_max")]
    pub insert_batch_bytes_max: usize,
    /// Bytes (keys, values, headers) per claim statement (at least one
    /// row is claimed, however large).
    #[serde(default = "QueueConfig::default_batch_bytes_max")]
    pub claim_batch_bytes_max: usize,
    /// A Postgres statement (or a connection's handshake) not answered
    /// within this is given up: the connection is replaced and the
    /// statement retried (Postgres's own `statement_timeout` is set too).
    #[serde(default = "QueueConfig::default_statement_timeout_ms")]
    pub statement_timeout_ms: u64,
    /// TCP keepalive idle time and probe interval of the Postgres
    /// connections (3 probes).
    #[serde(default = "QueueConfig::default_postgres_keepalive_ms")]
    pub postgres_keepalive_ms: u64,
    /// Postgres unusable on a shard for longer than this: the node leaves
    /// the consumer group (another node takes its partitions) until it is
    /// usable again.
    #[serde(default = "QueueConfig::default_postgres_stall_leave_ms")]
    pub postgres_stall_leave_ms: u64,
    /// Bytes (keys, values, headers) of the messages waiting per shard
    /// between the consumer thread and the shard; beyond it the consumer
    /// pauses the shard's partitions (one message is always let through).
    #[serde(default = "QueueConfig::default_inbox_bytes_max")]
    pub inbox_bytes_max: usize,
    /// How long the consumer thread waits (not polling) for room in a
    /// shard's inbox before it pauses that shard's partitions and polls
    /// on for the other shards; 0 pauses at once. A resumed partition is
    /// fetched from inside a record batch, which tansu answers without the
    /// rest of that batch (the gap guard then fetches it again: a seek
    /// that throws away what librdkafka had fetched), so waiting out a
    /// short wait costs less than a pause.
    #[serde(default = "QueueConfig::default_pause_after_ms")]
    pub pause_after_ms: u64,
    /// Bytes of the claimed messages a shard holds, publishes or has yet to
    /// delete; beyond it the shard claims no more.
    #[serde(default = "QueueConfig::default_in_hand_bytes_max")]
    pub in_hand_bytes_max: usize,
    /// The node vacuums the table itself (`VACUUM`, shard
    /// 0, a connection of its own) once Postgres reports this many dead
    /// rows more than its last vacuum left; 0 leaves it to Postgres's autovacuum (src/queue/vacuum.rs).
    #[serde(default = "QueueConfig::default_vacuum_dead_rows")]
    pub vacuum_dead_rows: u64,
    /// How often the dead rows are looked up.
    #[serde(default = "QueueConfig::default_vacuum_check_ms")]
    pub vacuum_check_ms: u64,
    /// librdkafka consumer properties, passed through.
    #[serde(default)]
    pub consumer: std::collections::BTreeMap<String, toml::Value>,
    /// librdkafka producer properties, passed through.
    #[serde(default)]
    pub producer: std::collections::BTreeMap<String, toml::Value>,
}

impl QueueConfig {
    fn default_group() -> String {
        "chronos".into()
    }
    fn default_table() -> String {
        "chronos_messages".into()
    }
    fn default_timing_advance_ms() -> u64 {
        50
    }
    fn default_hold_time_ms() -> u64 {
        5000
    }
    fn default_poll_interval_ms() -> u64 {
        100
    }
    fn default_failure_detection_interval_ms() -> u64 {
        500
    }
    fn default_takeover_after_ms() -> u64 {
        300
    }
    fn default_look_ahead_ms() -> u64 {
        1000
    }
    fn default_batch_max() -> usize {
        2000
    }
    fn default_batch_bytes_max() -> usize {
        16 << 20
    }
    fn default_statement_timeout_ms() -> u64 {
        10_000
    }
    fn default_postgres_keepalive_ms() -> u64 {
        5_000
    }
    fn default_postgres_stall_leave_ms() -> u64 {
        20_000
    }
    fn default_pause_after_ms() -> u64 {
        500
    }
    fn default_vacuum_dead_rows() -> u64 {
        20_000
    }
    fn default_vacuum_check_ms() -> u64 {
        1_000
    }

    /// A pass-through property as librdkafka wants it (a string).
    pub fn property(value: &toml::Value) -> String {
        match value {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }

    /// Validate (called by the configuration loader); `Err` names the key.
    pub fn check(&self) -> Result<(), String> {
        let t = &self.table;
        let ident = !t.is_empty()
            && t.len() <= 63
            && t.bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ident {
            return Err(format!(
                "[queue] table {t:?} must be a plain SQL identifier (letters, digits, _; at most 63)"
            ));
        }
        for (name, v) in [
            ("kafka-brokers", &self.kafka_brokers),
            ("input-topic", &self.input_topic),
            ("output-topic", &self.output_topic),
            ("consumer-group", &self.consumer_group),
        ] {
            if v.trim().is_empty() {
                return Err(format!("[queue] {name} must not be empty"));
            }
        }
        if self.input_topic == self.output_topic {
            return Err("[queue] input-topic and output-topic must differ".into());
        }
        if self.poll_interval_ms == 0
            || self.failure_detection_interval_ms == 0
            || self.hold_time_ms == 0
            || self.claim_batch_max == 0
            || self.insert_batch_max == 0
            || self.insert_batch_bytes_max == 0
            || self.claim_batch_bytes_max == 0
            || self.statement_timeout_ms == 0
            || self.postgres_keepalive_ms < 1000
            || self.postgres_stall_leave_ms == 0
        {
            return Err("[queue] intervals, hold-time-ms, timeouts and batch sizes must be positive (postgres-keepalive-ms at least 1000)".into());
        }
        if self.look_ahead_ms + self.poll_interval_ms >= self.hold_time_ms {
            return Err(format!(
                "[queue] look-ahead-ms ({}) + poll-interval-ms ({}) must stay below hold-time-ms ({}): a held message must fire before failure detection takes it over",
                self.look_ahead_ms, self.poll_interval_ms, self.hold_time_ms
            ));
        }
        let pg: tokio_postgres::Config = self
            .postgres_url
            .parse()
            .map_err(|e| format!("[queue] postgres-url: {e}"))?;
        let tcp = pg
            .get_hosts()
            .iter()
            .any(|h| matches!(h, tokio_postgres::config::Host::Tcp(_)));
        if !tcp {
            return Err("[queue] postgres-url must name a TCP host (host:port)".into());
        }
        self.check_periods()?;
        self.check_memory()?;
        self.check_overrides()
    }

    fn check_periods(&self) -> Result<(), String> {
        if self.vacuum_check_ms < VACUUM_CHECK_MS_MIN {
            return Err(format!(
                "[queue] vacuum-check-ms ({}) must be at least {VACUUM_CHECK_MS_MIN}",
                self.vacuum_check_ms
            ));
        }
        if self.takeover_after_ms != 0 && self.takeover_after_ms < TAKEOVER_AFTER_MS_MIN {
            return Err(format!(
                "[queue] takeover-after-ms ({}) must be 0 (off) or at least {TAKEOVER_AFTER_MS_MIN}: a node's absence must be seen in several looks",
                self.takeover_after_ms
            ));
        }
        if self.pause_after_ms > PAUSE_AFTER_MS_MAX {
            return Err(format!(
                "[queue] pause-after-ms ({}) must be at most {PAUSE_AFTER_MS_MAX}: the consumer thread does not poll meanwhile",
                self.pause_after_ms
            ));
        }
        Ok(())
    }
}

/// The longest wait for room before pausing: the consumer thread does not
/// poll meanwhile (no rebalance is served), and librdkafka's
/// `max.poll.interval.ms` (300 s by default) must stay far away.
const PAUSE_AFTER_MS_MAX: u64 = 10_000;

/// The shortest takeover-after-ms but 0: a few looks (every 50 ms) at least.
const TAKEOVER_AFTER_MS_MIN: u64 = 150;

/// The shortest dead-row look-up period: each look-up is a statement on
/// Postgres, and its statistics change about once a second anyway.
const VACUUM_CHECK_MS_MIN: u64 = 100;

/// What a byte bound must at least be: a bound given in KiB or MiB by
/// mistake is refused rather than taken as bytes.
const BYTES_MAX_MIN: usize = 1 << 20;

/// Consumer properties chronos sets itself for at least once, refused in
/// `[queue.consumer]`: with the offset store automatic, librdkafka would
/// commit an offset as soon as the message was polled, before the insert
/// or publish (a crash then loses it).
const CONSUMER_REFUSED: [&str; 1] = ["enable.auto.offset.store"];
/// Producer properties whose value `0` is refused in `[queue.producer]`:
/// with `acks=0` a delivery report claims success without any broker
/// acknowledgement, and the row is deleted all the same.
const PRODUCER_ACKS: [&str; 2] = ["acks", "request.required.acks"];

impl QueueConfig {
    fn default_inbox_bytes_max() -> usize {
        32 << 20
    }
    fn default_in_hand_bytes_max() -> usize {
        64 << 20
    }

    fn check_memory(&self) -> Result<(), String> {
        for (name, v) in [
            ("inbox-bytes-max", self.inbox_bytes_max),
            ("in-hand-bytes-max", self.in_hand_bytes_max),
        ] {
            if v < BYTES_MAX_MIN {
                return Err(format!(
                    "[queue] {name} ({v}) must be at least {BYTES_MAX_MIN} (bytes)"
                ));
            }
        }
        Ok(())
    }

    /// Refuse librdkafka overrides that would break at least once.
    fn check_overrides(&self) -> Result<(), String> {
        let name = |k: &String| k.trim().to_ascii_lowercase();
        if let Some(k) = self
            .consumer
            .keys()
            .find(|k| CONSUMER_REFUSED.contains(&name(k).as_str()))
        {
            return Err(format!(
                "[queue.consumer] {k:?} is set by chronos and may not be overridden: offsets are stored only after a message was inserted or published (at least once)"
            ));
        }
        let acks_zero = |(k, v): &(&String, &toml::Value)| {
            PRODUCER_ACKS.contains(&name(k).as_str()) && Self::property(v).trim() == "0"
        };
        if let Some((k, _)) = self.producer.iter().find(acks_zero) {
            return Err(format!(
                "[queue.producer] {k:?} = 0 is refused: a row is deleted once its publish is acknowledged, so the broker must acknowledge it (at least once)"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<(), String> {
        let text = format!(
            "kafka-brokers = \"b:9092\"\ninput-topic = \"i\"\noutput-topic = \"o\"\npostgres-url = \"postgres://p@127.0.0.1:5432/t\"\n{extra}"
        );
        let c: QueueConfig = toml::from_str(&text).map_err(|e| e.to_string())?;
        c.check()
    }

    #[test]
    fn defaults_pass() {
        assert_eq!(parse(""), Ok(()));
        // As chronos.sample.toml says.
        assert_eq!(QueueConfig::default_inbox_bytes_max(), 33_554_432);
        assert_eq!(QueueConfig::default_in_hand_bytes_max(), 67_108_864);
    }

    #[test]
    fn byte_bounds_are_checked_by_name() {
        let e = parse("inbox-bytes-max = 64").unwrap_err();
        assert!(e.contains("inbox-bytes-max"), "{e}");
        let e = parse("in-hand-bytes-max = 1000").unwrap_err();
        assert!(e.contains("in-hand-bytes-max"), "{e}");
        assert_eq!(
            parse("inbox-bytes-max = 1048576\nin-hand-bytes-max = 1048576"),
            Ok(())
        );
        assert!(parse("inbox-bytes-max = -1").is_err());
        let e = parse("pause-after-ms = 10001").unwrap_err();
        assert!(e.contains("pause-after-ms"), "{e}");
        assert!(parse("pause-after-ms = 0").is_ok());
    }

    #[test]
    fn overrides_that_break_at_least_once_are_refused_by_name() {
        for v in ["true", "false", "\"true\""] {
            let e = parse(&format!("[consumer]\n\"enable.auto.offset.store\" = {v}")).unwrap_err();
            assert!(e.contains("enable.auto.offset.store"), "{e}");
        }
        for (k, v) in [
            ("acks", "0"),
            ("acks", "\"0\""),
            ("request.required.acks", "0"),
        ] {
            let e = parse(&format!("[producer]\n\"{k}\" = {v}")).unwrap_err();
            assert!(e.contains(k) && e.contains("[queue.producer]"), "{e}");
        }
        // Safe by themselves: acks=1 or all, auto-commit off (offsets are
        // then never committed: a restart reads again, duplicates only),
        // no idempotence.
        for (table, k, v) in [
            ("producer", "acks", "1"),
            ("producer", "acks", "\"all\""),
            ("producer", "request.required.acks", "-1"),
            ("producer", "enable.idempotence", "false"),
            ("consumer", "enable.auto.commit", "false"),
            ("consumer", "session.timeout.ms", "6000"),
        ] {
            assert_eq!(parse(&format!("[{table}]\n\"{k}\" = {v}")), Ok(()), "{k}");
        }
    }
}
