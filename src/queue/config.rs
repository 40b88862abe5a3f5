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
        Ok(())
    }
}
