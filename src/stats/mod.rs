//! Counters. Each shard writes only its own cache-line-aligned block of
//! relaxed atomics; `/metrics` sums the blocks at scrape time. No lock is
//! taken on the hot path.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Upper bounds (ms) of the callback latency histogram buckets.
pub const LATENCY_BUCKETS_MS: [u64; 12] = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2000, 5000];

macro_rules! counters {
    ($($name:ident: $help:literal,)*) => {
        /// One shard's counters.
        #[repr(align(128))]
        #[derive(Default)]
        pub struct ShardStats {
            $(#[doc = $help] pub $name: AtomicU64,)*
            /// Timers pending in this shard's wheel.
            pub timers_pending: AtomicI64,
            /// Tombstones among them.
            pub tombstones: AtomicI64,
            /// Open HTTP connections.
            pub connections_open: AtomicI64,
            /// Callback latency histogram (cumulative buckets are built at render).
            pub callback_latency: [AtomicU64; LATENCY_BUCKETS_MS.len() + 1],
            pub callback_latency_sum_us: AtomicU64,
        }

        const COUNTER_HELP: &[(&str, &str)] = &[$((stringify!($name), $help),)*];

        fn counter_values(s: &ShardStats) -> Vec<u64> {
            vec![$(s.$name.load(Relaxed),)*]
        }
    };
}

counters! {
    timers_created: "Timers created by POST or by a PUT to an unknown ID.",
    timers_updated: "Timers replaced by a client PUT.",
    timers_deleted: "Timers removed by a client DELETE.",
    timers_popped: "Timer pops (callbacks attempted).",
    callbacks_succeeded: "Callbacks answered with a 2xx status.",
    callbacks_failed: "Callbacks that failed (non-2xx, timeout, connection error).",
    callbacks_dropped: "Pops not called back because the in-flight bound was reached.",
    http_requests: "HTTP requests handled.",
    http_errors: "HTTP requests answered with a 4xx or 5xx status.",
    connections_rejected: "Connections refused with 503 at the connection bound.",
    mesh_forwarded: "Requests forwarded to the owning shard over the cross-core mesh.",
    replication_enqueued: "Replication messages queued for a peer.",
    replication_sent: "Replication messages a peer answered with 2xx.",
    replication_failed: "Replication messages lost to a timeout, connection error or non-2xx answer.",
    replication_dropped: "Replication messages dropped because the peer's queue was full.",
    replication_received: "Replication messages applied from other nodes.",
    replication_stale: "Replication messages ignored by the conflict rules (an older version).",
    tombstones_expired: "Tombstones that lived out their interval.",
}

impl ShardStats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub fn record_callback_latency(&self, us: u64) {
        let ms = us / 1000;
        let bucket = LATENCY_BUCKETS_MS
            .iter()
            .position(|b| ms < *b)
            .unwrap_or(LATENCY_BUCKETS_MS.len());
        self.callback_latency[bucket].fetch_add(1, Relaxed);
        self.callback_latency_sum_us.fetch_add(us, Relaxed);
    }
}

/// Render every shard's counters (summed) in Prometheus text format.
/// `tags` are the per-tag gauges, already merged across shards.
pub fn render(shards: &[ShardStats], tags: &[(String, i64)], out: &mut String) {
    let mut sums = vec![0u64; COUNTER_HELP.len()];
    for s in shards {
        for (sum, v) in sums.iter_mut().zip(counter_values(s)) {
            *sum += v;
        }
    }
    for ((name, help), value) in COUNTER_HELP.iter().zip(sums) {
        let _ = writeln!(out, "# HELP chronos_{name}_total {help}\n# TYPE chronos_{name}_total counter\nchronos_{name}_total {value}");
    }
    let pending: i64 = shards.iter().map(|s| s.timers_pending.load(Relaxed)).sum();
    let _ = writeln!(out, "# HELP chronos_timers_pending Timers (and tombstones) held in the wheels.\n# TYPE chronos_timers_pending gauge\nchronos_timers_pending {pending}");
    let tombstones: i64 = shards.iter().map(|s| s.tombstones.load(Relaxed)).sum();
    let _ = writeln!(out, "# HELP chronos_tombstones Tombstones held (deleted or finished timers kept one more interval).\n# TYPE chronos_tombstones gauge\nchronos_tombstones {tombstones}");
    let open: i64 = shards
        .iter()
        .map(|s| s.connections_open.load(Relaxed))
        .sum();
    let _ = writeln!(out, "# HELP chronos_connections_open Open HTTP server connections.\n# TYPE chronos_connections_open gauge\nchronos_connections_open {open}");
    let _ = writeln!(out, "# HELP chronos_callback_latency_seconds Time from sending a callback to its answer.\n# TYPE chronos_callback_latency_seconds histogram");
    let mut cumulative = 0u64;
    for (i, bound) in LATENCY_BUCKETS_MS.iter().enumerate() {
        cumulative += shards
            .iter()
            .map(|s| s.callback_latency[i].load(Relaxed))
            .sum::<u64>();
        let _ = writeln!(
            out,
            "chronos_callback_latency_seconds_bucket{{le=\"{}\"}} {cumulative}",
            *bound as f64 / 1000.0
        );
    }
    cumulative += shards
        .iter()
        .map(|s| s.callback_latency[LATENCY_BUCKETS_MS.len()].load(Relaxed))
        .sum::<u64>();
    let sum_us: u64 = shards
        .iter()
        .map(|s| s.callback_latency_sum_us.load(Relaxed))
        .sum();
    let _ = writeln!(out, "chronos_callback_latency_seconds_bucket{{le=\"+Inf\"}} {cumulative}\nchronos_callback_latency_seconds_sum {}\nchronos_callback_latency_seconds_count {cumulative}", sum_us as f64 / 1e6);
    let _ = writeln!(out, "# HELP chronos_tag_count Live timers per statistics tag, times the tag's count.\n# TYPE chronos_tag_count gauge");
    for (tag, value) in tags {
        let escaped = tag
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = writeln!(out, "chronos_tag_count{{tag=\"{escaped}\"}} {value}");
    }
}
