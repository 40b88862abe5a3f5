//! Counters. Each shard writes only its own cache-line-aligned block of
//! relaxed atomics; `/metrics` sums the blocks at scrape time. No lock is
//! taken on the hot path.

mod delivery;
mod queue;

pub use delivery::{DELIVERY_TAGS_MAX, DELIVERY_TAG_OTHER, RETRY_DELAY_BOUNDS_US};

pub use queue::{Reject, Stage};
use std::fmt::Write;
use std::sync::atomic::{
    AtomicI64, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

/// Bounds (µs) of the latency histograms that are not an operator's
/// first look (callback latency, the delay queue, storage): 1 ms to 5 s,
/// about what a callback, a Postgres statement or an fdatasync takes.
pub const LATENCY_BOUNDS_US: [u64; 12] = [
    1_000, 2_000, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_000_000,
    5_000_000,
];

/// Remote site slots counted per shard (at least `cluster::sites::SITES_MAX - 1`).
pub const SITE_SLOTS: usize = 8;
/// What `ShardStats::site_counts` counts, by index.
pub const SITE_COUNTS: [&str; 5] = ["enqueued", "sent", "failed", "dropped", "retried"];

/// `ShardStats::resync_state` values, by index.
pub const RESYNC_STATES: [&str; 4] = ["idle", "running", "complete", "failed"];
pub const RESYNC_IDLE: i64 = 0;
pub const RESYNC_RUNNING: i64 = 1;
pub const RESYNC_COMPLETE: i64 = 2;
pub const RESYNC_FAILED: i64 = 3;

/// Postgres connections per shard of the delay queue: the input's
/// (inserts, durable commits), the claims' and the deletes' (asynchronous
/// commits).
pub const PG_CONNECTIONS: usize = 3;

/// Bucket bounds a [`Histogram`] may have; one bucket more counts what is
/// above the last bound.
pub const HIST_BOUNDS_MAX: usize = 15;

/// `chronos_pop_lateness_seconds` bounds (µs): a healthy pop goes out
/// within a millisecond of its due time (the wheel's resolution), a busy
/// one within tens of ms; seconds mean pops wait for callback slots or
/// connections, or the shard stalled. Sub-ms to 10 s.
pub const POP_LATENESS_BOUNDS_US: [u64; 15] = [
    250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000,
];

/// `chronos_http_request_duration_seconds` bounds (µs): a `/ping` or an
/// in-memory `POST` takes tens of µs; a durable one (`sync = "batch"`)
/// an fdatasync, ms; a resync page or `/metrics` with many tags, more.
pub const REQUEST_BOUNDS_US: [u64; 15] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    1_000_000, 5_000_000,
];

/// `chronos_replication_lag_seconds` bounds (µs): queued (engine ms, so
/// 1 ms is the finest bound worth having) until the peer's 2xx; a LAN
/// round trip is about a ms, a retried message seconds, up to
/// `replication-deliver-within-ms` (30 s) and a site's 300 s.
pub const REPLICATION_LAG_BOUNDS_US: [u64; 15] = [
    1_000, 2_000, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000, 30_000_000, 60_000_000,
];

/// The `route` label of `chronos_http_request_duration_seconds`: a fixed
/// set (the API's routes by method; everything else, 404s and 405s
/// included, is `other`), so the series stay bounded.
pub const ROUTES: [&str; 16] = [
    "timers_post",
    "timers_get",
    "timers_put",
    "timers_delete",
    "resync_get",
    "references_delete",
    "replicate",
    "site_replicate",
    "ping",
    "ready",
    "metrics",
    "cluster",
    "resync_post",
    "handoff",
    "openapi",
    "other",
];

/// The `path` label of `chronos_replication_lag_seconds`: to a peer of
/// this site, or to another site (GR).
pub const LAG_PATHS: [&str; 2] = ["cluster", "site"];

/// A histogram of durations (relaxed atomics, one per shard), with bounds
/// chosen per metric and passed at each record: no lock, no allocation.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; HIST_BOUNDS_MAX + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    /// One observation of `us` µs; `bounds` ascending, at most
    /// [`HIST_BOUNDS_MAX`] (the same every time for one histogram).
    pub fn record(&self, bounds: &[u64], us: u64) {
        debug_assert!(
            bounds.len() <= HIST_BOUNDS_MAX && bounds.is_sorted(),
            "at most HIST_BOUNDS_MAX bounds, ascending"
        );
        // Prometheus' `le`: a bucket counts what is at most its bound.
        let i = bounds.partition_point(|b| *b < us);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    /// One observation of `took`.
    pub fn record_duration(&self, bounds: &[u64], took: std::time::Duration) {
        self.record(bounds, took.as_micros().min(u64::MAX as u128) as u64);
    }
}

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
            /// The shard is listening (readiness).
            pub up: std::sync::atomic::AtomicBool,
            /// Each of the shard's Postgres connections works (readiness,
            /// with `[queue]`): by [`PG_CONNECTIONS`].
            pub pg_up: [std::sync::atomic::AtomicBool; PG_CONNECTIONS],
            /// Open HTTP connections.
            pub connections_open: AtomicI64,
            /// Resync state (shard 0's): see [`RESYNC_STATES`].
            pub resync_state: AtomicI64,
            /// Resync runs that finished (complete or failed), and that
            /// failed (shard 0's).
            pub resync_finished: AtomicI64,
            pub resync_failed: AtomicI64,
            /// Why the last resync run failed (empty: it did not). Written
            /// once per run, never on the hot path.
            pub resync_error: std::sync::Mutex<String>,
            /// Other nodes the running resync has still to page through.
            pub resync_peers_left: AtomicI64,
            /// Informational timers held.
            pub informational: AtomicI64,
            /// The token bucket's rate (tokens/s) and tokens now.
            pub throttle_rate: AtomicI64,
            pub throttle_tokens: AtomicI64,
            /// Cross-site (GR) replication per remote site slot: queued now,
            /// and messages enqueued, sent, failed, dropped, retried.
            pub site_queued: [AtomicI64; SITE_SLOTS],
            pub site_counts: [[AtomicU64; SITE_SLOTS]; SITE_COUNTS.len()],
            /// Queue input messages rejected (skipped), by [`Reject`].
            pub queue_rejected: [AtomicU64; Reject::ALL.len()],
            /// Shard 0's: the queue's output is blocked by the
            /// configuration or the cluster (a missing output topic, no
            /// right to write it): publishes are retried meanwhile.
            pub queue_output_blocked: std::sync::atomic::AtomicBool,
            /// The delay before each retry of a pop with a delivery policy.
            pub retry_delay: Histogram,
            /// Attempts and given-up pops of timers with a delivery policy,
            /// per statistics tag (at most [`DELIVERY_TAGS_MAX`] names; the
            /// rest under [`DELIVERY_TAG_OTHER`]). Locked only by its shard
            /// after an attempt of such a timer, and by a scrape.
            pub delivery_by_tag: std::sync::Mutex<std::collections::HashMap<String, [u64; 2]>>,
            /// Callback latency ([`LATENCY_BOUNDS_US`], as the ones below).
            pub callback_latency: Histogram,
            /// Queue lateness (publish acknowledged minus deadline) histogram.
            pub queue_lateness: Histogram,
            /// Queue stage histograms, by [`Stage`].
            pub queue_stage: [Histogram; Stage::ALL.len()],
            /// Postgres statement latency histogram (per batch).
            pub pg_batch: Histogram,
            /// `[storage]`: `fdatasync` latency histogram.
            pub storage_sync: Histogram,
            /// `[storage]`: log bytes since the last snapshot.
            pub storage_log_bytes: AtomicI64,
            /// `[storage]`: wall-clock ms of the last snapshot (0: none yet).
            pub storage_snapshot_unix_ms: AtomicI64,
            /// `[storage]`: snapshot duration histogram.
            pub storage_snapshot: Histogram,
            /// `[storage]`: the shard is replaying its log (not ready).
            pub recovering: std::sync::atomic::AtomicBool,
            /// `[storage]`: why the shard's log stopped (a failed write,
            /// sync or segment; empty: it did not). Set once; the node then
            /// pops and acknowledges nothing more, and stops (issue 38).
            pub storage_failure: std::sync::Mutex<String>,
            /// Set with `storage_failure` (read on every change and pop).
            pub storage_failed: std::sync::atomic::AtomicBool,
            /// `[storage]`: bytes free on the log's file system, as last
            /// read, once `storage_free_read`.
            pub storage_free_bytes: AtomicI64,
            pub storage_free_read: std::sync::atomic::AtomicBool,
            /// Shard 0's: the node is taking what its peers owe it before it
            /// pops (`shard/handoff.rs`; not ready).
            pub catching_up: std::sync::atomic::AtomicBool,
            /// A pop's due time until its callback's first byte was
            /// handed to the socket ([`POP_LATENESS_BOUNDS_US`]).
            pub pop_lateness: Histogram,
            /// A request parsed until its answer was queued, by [`ROUTES`].
            pub request_duration: [Histogram; ROUTES.len()],
            /// A replication message queued until its peer's 2xx, by
            /// [`LAG_PATHS`].
            pub replication_lag: [Histogram; LAG_PATHS.len()],
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
    callbacks_deferred: "Pops left to the next replica: no connection to the target came free within callback-wait-ms (or the target's share of callback slots stayed full that long).",
    callbacks_withdrawn: "Callbacks withdrawn unsent: the timer was deleted or replaced while its callback waited for a connection.",
    callbacks_refused: "Callbacks not sent because [timers] callback-allow refuses the address their host resolved to when the pop was sent (the pop fails: the next replica, which applies its own list, pops it).",
    callbacks_held: "Pops held back because their target had its share of the callback slots in flight (callback-in-flight-per-target-max) with three quarters of the slots taken; each comes back when one of its target's callbacks ends.",
    http_requests: "HTTP requests handled.",
    http_errors: "HTTP requests answered with a 4xx or 5xx status.",
    connections_rejected: "Connections refused with 503 at the connection bound.",
    tls_handshakes_failed: "TLS handshakes on the listener that failed or did not finish within header-timeout-ms.",
    mesh_forwarded: "Requests forwarded to another shard over the cross-core mesh: to the timer's owning shard, or a POST to a shard with room (its own was full).",
    replication_enqueued: "Replication messages queued for a peer.",
    replication_sent: "Replication messages a peer answered with 2xx.",
    replication_failed: "Replication messages given up: refused with a 4xx, or (to another site, or a peer that left the cluster) not delivered within the deliver-within bound. To a member nothing is given up.",
    replication_dropped: "Replication messages dropped because the peer's queue was full (a member of the cluster is then repaired: chronos_replication_repaired_total).",
    replication_repaired: "Replication messages queued by a repair: everything a shard holds for a member whose queue overflowed, sent once it answers again.",
    replication_retried: "Replication messages queued again after a failed or refused delivery.",
    replication_resent: "Replication messages queued again at start for the changes logged within the replication window before the node stopped (their queue was in memory).",
    replication_received: "Replication messages applied from other nodes.",
    replication_stale: "Replication messages ignored by the conflict rules (an older version).",
    tombstones_expired: "Tombstones that lived out their interval.",
    tombstones_kept: "Tombstones kept one more life at the end of theirs because a member is still owed their delete (queued for it, owed a repair, or the re-send at start still running). Growing while a member is down; a member that stays down for good should leave the cluster.",
    delivery_attempts: "Callback attempts of timers with a delivery policy (callback.retry or callback.dead-letter), the first included.",
    delivery_retried_delivered: "Pops with a delivery policy delivered after at least one failed attempt.",
    delivery_given_up: "Pops with a delivery policy given up: attempts spent, past give-up-after, or refused by the target (each then goes to its dead-letter target, if it has one).",
    delivery_book_full: "Pops given up at once because the shard's retry book was full (65,536 pops being retried or watched).",
    dead_letters_sent: "Given-up pops their dead-letter target answered with a 2xx.",
    dead_letters_failed: "Given-up pops whose dead-letter POST failed too (logged).",
    throttled: "Client requests refused with 503 by the token bucket ([throttling]).",
    internal_refused: "Internal (replication, cross-site, resync) and admin (/cluster, /resync, /metrics) requests refused with 403 for a missing or wrong shared secret.",
    site_received: "Timers, pops and deletes received from other sites (GR).",
    resync_runs: "Resynchronisations started (SIGUSR1, chronos resync, POST /resync, start-up).",
    resync_received: "Resync: timers received in GET pages from other nodes.",
    resync_added: "Resync: received timers stored here (this node moved down or stayed in the replica list).",
    resync_replicated: "Resync: replication messages sent to higher new replicas.",
    resync_tombstoned: "Resync: tombstones sent to old replicas no longer involved.",
    resync_peer_errors: "Resync: failed requests to other nodes (retried with backoff).",
    resync_served: "Resync: timers served to other nodes' GETs.",
    resync_references: "Resync: timer references marked by DELETE /timers/references.",
    resync_informational: "Resync: informational timers kept (an old-view copy outside the wheel).",
    queue_consumed: "Messages consumed from the input topic.",
    queue_skipped_invalid: "Input messages skipped for a missing or invalid chronos header.",
    queue_enqueued: "Messages inserted into the queue table.",
    queue_late: "Messages already due on arrival, published at once.",
    queue_fired: "Messages published from the table at their deadline.",
    queue_reset: "Readied messages reset after a suspected node failure.",
    queue_paused: "Input partitions paused: their shard's inbox had no room for [queue] pause-after-ms (each resume costs a fetch again; against tansu, a seek back: chronos_queue_refetched_total).",
    queue_refetched: "Input partitions sought back by the gap guard: a record past the expected offset after an assignment, a resume or a seek, or silence there for 500 ms.",
    queue_vacuums: "VACUUMs of the queue table run by this node ([queue] vacuum-dead-rows).",
    storage_records: "Records appended to the timer log ([storage]).",
    storage_bytes: "Bytes written to the timer log, padding included.",
    storage_syncs: "fdatasync calls of the timer log (one per write batch).",
    storage_snapshots: "Snapshots of the timers written (compaction).",
    storage_replayed_records: "Log and snapshot records replayed at start.",
    storage_torn_tails: "Torn log tails (garbage after the last whole write batch) cut at start.",
    storage_corrupt_records: "Bad records before the log's tail skipped at start (on-corruption = \"skip\").",
    queue_producer_errors: "Publishes that failed for a transient reason (each is retried; permanent refusals are chronos_queue_rejected_total{reason=\"unpublishable\"}).",
}

impl ShardStats {
    /// The first shard whose timer log failed, and why (fail-stop: see
    /// `storage_failure`).
    pub fn storage_failure(shards: &[ShardStats]) -> Option<(usize, String)> {
        let (index, s) = shards
            .iter()
            .enumerate()
            .find(|(_, s)| s.storage_failed.load(std::sync::atomic::Ordering::Acquire))?;
        let why = s
            .storage_failure
            .lock()
            .map(|w| w.clone())
            .unwrap_or_default();
        Some((index, why))
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// A resync run starts (shard 0): counted, then marked running.
    pub fn resync_begin(&self) {
        self.resync_runs.fetch_add(1, Relaxed);
        self.resync_state.store(RESYNC_RUNNING, Release);
    }

    /// A resync run ends in `state`: marked, then counted as finished.
    pub fn resync_end(&self, state: i64) {
        assert!(
            state == RESYNC_COMPLETE || state == RESYNC_FAILED,
            "a run ends complete or failed, not in state {state}"
        );
        self.resync_state.store(state, Release);
        self.resync_finished.fetch_add(1, Release);
    }

    /// `(state, started, finished)` of the resync runs, read from another
    /// thread (`GET /cluster` is answered on any shard) so that they agree:
    /// finished first, then the state, then started. Once `finished`
    /// reaches `started`, `state` is the last run's outcome, never a stale
    /// "running" (the runs' `resync_end` stores the state before counting).
    pub fn resync_progress(&self) -> (usize, u64, u64) {
        let finished = self.resync_finished.load(Acquire).max(0) as u64;
        let state = self.resync_state.load(Acquire).clamp(0, 3) as usize;
        let started = self.resync_runs.load(Relaxed);
        (state, started, finished)
    }

    pub fn record_callback_latency(&self, us: u64) {
        self.callback_latency.record(&LATENCY_BOUNDS_US, us);
    }

    /// Lateness of a fired queue message (early counts as 0).
    pub fn record_queue_lateness(&self, us: i64) {
        self.queue_lateness
            .record(&LATENCY_BOUNDS_US, us.max(0) as u64);
    }

    pub fn record_storage_sync(&self, took: std::time::Duration) {
        self.storage_sync.record_duration(&LATENCY_BOUNDS_US, took);
    }

    pub fn record_storage_snapshot(&self, took: std::time::Duration) {
        self.storage_snapshot
            .record_duration(&LATENCY_BOUNDS_US, took);
    }

    /// One observation of queue stage `stage`.
    pub fn record_queue_stage(&self, stage: Stage, took: std::time::Duration) {
        self.queue_stage[stage as usize].record_duration(&LATENCY_BOUNDS_US, took);
    }

    /// One queue input message rejected (logged and skipped) for `why`.
    pub fn queue_reject(&self, why: Reject) {
        Self::add(&self.queue_rejected[why as usize], 1);
    }

    pub fn record_pg_batch(&self, took: std::time::Duration) {
        self.pg_batch.record_duration(&LATENCY_BOUNDS_US, took);
    }
}

/// One gauge with a `shard` label per shard.
fn per_shard_gauge(
    out: &mut String,
    shards: &[ShardStats],
    name: &str,
    help: &str,
    value: impl Fn(&ShardStats) -> i64,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
    for (i, s) in shards.iter().enumerate() {
        let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", value(s));
    }
}

/// `chronos_queue_rejected_total{reason}`, summed over the shards.
fn rejected(out: &mut String, shards: &[ShardStats]) {
    let name = "chronos_queue_rejected_total";
    let _ = writeln!(out, "# HELP {name} Queue input messages logged and skipped (their offsets committed), by reason.\n# TYPE {name} counter");
    for reason in Reject::ALL {
        let n: u64 = shards
            .iter()
            .map(|s| s.queue_rejected[reason as usize].load(Relaxed))
            .sum();
        let _ = writeln!(out, "{name}{{reason=\"{}\"}} {n}", reason.label());
    }
}

/// Render every shard's counters (summed) in Prometheus text format.
/// `tags` are the per-tag gauges, already merged across shards.
/// The resync gauges (only shard 0 runs a resync; the others hold 0).
/// `(state, started, finished)` summed over the shards, each shard's read
/// in `resync_progress`'s order, before anything else in the scrape: the
/// `resync_runs` counter, the state and the finished runs then agree (once
/// finished reaches started, the state is the last run's outcome).
fn resync_progress(shards: &[ShardStats]) -> (usize, u64, u64) {
    shards
        .iter()
        .fold((0, 0, 0), |(state, started, finished), s| {
            let (s_state, s_started, s_finished) = s.resync_progress();
            (state + s_state, started + s_started, finished + s_finished)
        })
}

fn resync_gauges(out: &mut String, shards: &[ShardStats], progress: (usize, u64, u64)) {
    let sum = |f: fn(&ShardStats) -> i64| -> i64 { shards.iter().map(f).sum() };
    let (state, _, done) = progress;
    let _ = writeln!(out, "# HELP chronos_resync_state Resync state: 0 idle, 1 running, 2 complete, 3 failed (the last run).\n# TYPE chronos_resync_state gauge\nchronos_resync_state {state}");
    let left = sum(|s| s.resync_peers_left.load(Relaxed));
    let _ = writeln!(out, "# HELP chronos_resync_peers_left Other nodes the running resync has still to query.\n# TYPE chronos_resync_peers_left gauge\nchronos_resync_peers_left {left}");
    let _ = writeln!(out, "# HELP chronos_resync_finished_runs Resync runs that finished (complete or failed).\n# TYPE chronos_resync_finished_runs gauge\nchronos_resync_finished_runs {done}");
    let failed = sum(|s| s.resync_failed.load(Relaxed));
    let _ = writeln!(out, "# HELP chronos_resync_failed_runs Resync runs that failed (a node stayed unreachable, or the view changed).\n# TYPE chronos_resync_failed_runs gauge\nchronos_resync_failed_runs {failed}");
    let info = sum(|s| s.informational.load(Relaxed));
    let _ = writeln!(out, "# HELP chronos_informational_timers Old-view timer copies kept outside the wheel for a resync.\n# TYPE chronos_informational_timers gauge\nchronos_informational_timers {info}");
}

/// Per remote site (`sites[k]` is slot `k`'s name): cross-site messages by
/// outcome, and the queue depth now.
fn site_metrics(out: &mut String, shards: &[ShardStats], sites: &[String]) {
    assert!(sites.len() <= SITE_SLOTS, "a slot per site");
    if sites.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP chronos_site_replication_total Cross-site (GR) replication messages per remote site and outcome.\n# TYPE chronos_site_replication_total counter");
    for (k, site) in sites.iter().enumerate() {
        for (c, what) in SITE_COUNTS.iter().enumerate() {
            let v: u64 = shards
                .iter()
                .map(|s| s.site_counts[c][k].load(Relaxed))
                .sum();
            let _ = writeln!(
                out,
                "chronos_site_replication_total{{site=\"{site}\",outcome=\"{what}\"}} {v}"
            );
        }
    }
    let _ = writeln!(out, "# HELP chronos_site_queue Cross-site messages waiting per remote site.\n# TYPE chronos_site_queue gauge");
    for (k, site) in sites.iter().enumerate() {
        let v: i64 = shards.iter().map(|s| s.site_queued[k].load(Relaxed)).sum();
        let _ = writeln!(out, "chronos_site_queue{{site=\"{site}\"}} {v}");
    }
}

/// The token buckets' rate and tokens, per node: summed over the shards.
fn throttle_gauges(out: &mut String, shards: &[ShardStats]) {
    let rate: i64 = shards.iter().map(|s| s.throttle_rate.load(Relaxed)).sum();
    let tokens: i64 = shards.iter().map(|s| s.throttle_tokens.load(Relaxed)).sum();
    let _ = writeln!(out, "# HELP chronos_throttle_rate Client requests per second this node admits ([throttling]): the sum over its shards of their token buckets' rates (per shard: an even share of the configured rate, at least 1/s, so a configured rate below the shard count shows as the shard count); rounded down.\n# TYPE chronos_throttle_rate gauge\nchronos_throttle_rate {rate}\n# HELP chronos_throttle_tokens Tokens in this node's buckets now (the sum over its shards).\n# TYPE chronos_throttle_tokens gauge\nchronos_throttle_tokens {tokens}");
}

pub fn render(shards: &[ShardStats], tags: &[(String, i64)], sites: &[String], out: &mut String) {
    let progress = resync_progress(shards);
    let mut sums = vec![0u64; COUNTER_HELP.len()];
    for s in shards {
        for (sum, v) in sums.iter_mut().zip(counter_values(s)) {
            *sum += v;
        }
    }
    for ((name, help), mut value) in COUNTER_HELP.iter().zip(sums) {
        if *name == "resync_runs" {
            value = progress.1;
        }
        let _ = writeln!(out, "# HELP chronos_{name}_total {help}\n# TYPE chronos_{name}_total counter\nchronos_{name}_total {value}");
    }
    rejected(out, shards);
    let pending: i64 = shards.iter().map(|s| s.timers_pending.load(Relaxed)).sum();
    let _ = writeln!(out, "# HELP chronos_timers_pending Timers (and tombstones) held in the wheels.\n# TYPE chronos_timers_pending gauge\nchronos_timers_pending {pending}");
    let tombstones: i64 = shards.iter().map(|s| s.tombstones.load(Relaxed)).sum();
    let _ = writeln!(out, "# HELP chronos_tombstones Tombstones held (deleted or finished timers kept one more interval).\n# TYPE chronos_tombstones gauge\nchronos_tombstones {tombstones}");
    resync_gauges(out, shards, progress);
    throttle_gauges(out, shards);
    site_metrics(out, shards, sites);
    let open: i64 = shards
        .iter()
        .map(|s| s.connections_open.load(Relaxed))
        .sum();
    let _ = writeln!(out, "# HELP chronos_connections_open Open HTTP server connections.\n# TYPE chronos_connections_open gauge\nchronos_connections_open {open}");
    // Per shard: how `[http] accept-steering` spread the connections, and
    // where the timers live.
    per_shard_gauge(
        out,
        shards,
        "chronos_shard_connections_open",
        "Open HTTP server connections per shard.",
        |s| s.connections_open.load(Relaxed),
    );
    per_shard_gauge(
        out,
        shards,
        "chronos_shard_timers_pending",
        "Timers (and tombstones) held per shard.",
        |s| s.timers_pending.load(Relaxed),
    );
    histogram(
        out,
        shards,
        "chronos_callback_latency_seconds",
        "Time from sending a callback to its answer.",
        |s| &s.callback_latency,
    );
    histogram(
        out,
        shards,
        "chronos_queue_lateness_seconds",
        "Queue messages: publish acknowledged minus deadline.",
        |s| &s.queue_lateness,
    );
    queue_stages(out, shards);
    storage_metrics(out, shards);
    operator_metrics(out, shards);
    tag_gauges(out, tags);
    delivery::render(out, shards);
}

/// `chronos_tag_count`, one series per tag.
fn tag_gauges(out: &mut String, tags: &[(String, i64)]) {
    let _ = writeln!(out, "# HELP chronos_tag_count Live timers per statistics tag, times the tag's count.\n# TYPE chronos_tag_count gauge");
    for (tag, value) in tags {
        let escaped = escape_label(tag);
        let _ = writeln!(out, "chronos_tag_count{{tag=\"{escaped}\"}} {value}");
    }
}

/// A label value as Prometheus's text format writes it.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The histograms an operator watches first, and what is running.
fn operator_metrics(out: &mut String, shards: &[ShardStats]) {
    let name = "chronos_pop_lateness_seconds";
    let _ = writeln!(out, "# HELP {name} Per shard: a pop's due time until the first byte of its callback request was handed to the socket (pops that waited for a connection or a slot included).\n# TYPE {name} histogram");
    for (i, s) in shards.iter().enumerate() {
        let label = format!("shard=\"{i}\"");
        series(
            out,
            name,
            &label,
            &POP_LATENESS_BOUNDS_US,
            [&s.pop_lateness],
        );
    }
    let name = "chronos_http_request_duration_seconds";
    let _ = writeln!(out, "# HELP {name} A request parsed until its answer was queued for the connection, by route.\n# TYPE {name} histogram");
    for (k, route) in ROUTES.iter().enumerate() {
        let label = format!("route=\"{route}\"");
        let each = shards.iter().map(|s| &s.request_duration[k]);
        series(out, name, &label, &REQUEST_BOUNDS_US, each);
    }
    let name = "chronos_replication_lag_seconds";
    let _ = writeln!(out, "# HELP {name} A replication message queued until its peer answered 2xx (retries included), to a peer of this site (path=cluster) or another site (path=site).\n# TYPE {name} histogram");
    for (k, path) in LAG_PATHS.iter().enumerate() {
        let label = format!("path=\"{path}\"");
        let each = shards.iter().map(|s| &s.replication_lag[k]);
        series(out, name, &label, &REPLICATION_LAG_BOUNDS_US, each);
    }
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let _ = writeln!(out, "# HELP chronos_build_info The running build: its version, and whether it is a debug or release build.\n# TYPE chronos_build_info gauge\nchronos_build_info{{version=\"{}\",profile=\"{profile}\"}} 1", env!("CARGO_PKG_VERSION"));
}

/// One labelled histogram series: `hists` summed, buckets cumulative.
fn series<'a>(
    out: &mut String,
    name: &str,
    label: &str,
    bounds: &[u64],
    hists: impl IntoIterator<Item = &'a Histogram>,
) {
    let mut counts = [0u64; HIST_BOUNDS_MAX + 1];
    let mut sum_us = 0u64;
    for h in hists {
        for (c, a) in counts.iter_mut().zip(&h.counts) {
            *c += a.load(Relaxed);
        }
        sum_us += h.sum_us.load(Relaxed);
    }
    let mut cumulative = 0u64;
    for (i, c) in counts.iter().enumerate().take(bounds.len() + 1) {
        cumulative += c;
        let le = bounds
            .get(i)
            .map_or("+Inf".to_string(), |b| (*b as f64 / 1e6).to_string());
        let sep = if label.is_empty() { "" } else { "," };
        let _ = writeln!(out, "{name}_bucket{{{label}{sep}le=\"{le}\"}} {cumulative}");
    }
    // No braces without a label: `name_sum 1.5`, as Prometheus writes it.
    let label = if label.is_empty() {
        String::new()
    } else {
        format!("{{{label}}}")
    };
    let _ = writeln!(
        out,
        "{name}_sum{label} {}\n{name}_count{label} {cumulative}",
        sum_us as f64 / 1e6
    );
}

/// `[storage]` gauges and the sync histogram.
fn storage_metrics(out: &mut String, shards: &[ShardStats]) {
    histogram(
        out,
        shards,
        "chronos_storage_sync_seconds",
        "Timer log: latency of one fdatasync (a write batch).",
        |s| &s.storage_sync,
    );
    let log: i64 = shards
        .iter()
        .map(|s| s.storage_log_bytes.load(Relaxed))
        .sum();
    let _ = writeln!(out, "# HELP chronos_storage_log_bytes Timer log bytes since each shard's last snapshot.\n# TYPE chronos_storage_log_bytes gauge\nchronos_storage_log_bytes {log}");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let oldest = shards
        .iter()
        .map(|s| s.storage_snapshot_unix_ms.load(Relaxed))
        .filter(|ms| *ms > 0)
        .min();
    let age = oldest.map_or(-1.0, |ms| (now_ms - ms).max(0) as f64 / 1000.0);
    let _ = writeln!(out, "# HELP chronos_storage_snapshot_age_seconds Age of the oldest shard's last snapshot (-1: none yet).\n# TYPE chronos_storage_snapshot_age_seconds gauge\nchronos_storage_snapshot_age_seconds {age}");
    let free = shards
        .iter()
        .filter(|s| s.storage_free_read.load(Relaxed))
        .map(|s| s.storage_free_bytes.load(Relaxed))
        .min()
        .unwrap_or(-1);
    let _ = writeln!(out, "# HELP chronos_storage_free_bytes Bytes free on the timer log's file system (the least any shard read; -1: not read). Below [storage] free-bytes-min, creates and updates get 503.\n# TYPE chronos_storage_free_bytes gauge\nchronos_storage_free_bytes {free}");
    let failed = shards
        .iter()
        .filter(|s| s.storage_failed.load(Relaxed))
        .count();
    let _ = writeln!(out, "# HELP chronos_storage_failed Shards whose timer log failed (a write, sync or new segment): the node pops and acknowledges nothing more, and stops.\n# TYPE chronos_storage_failed gauge\nchronos_storage_failed {failed}");
    histogram(
        out,
        shards,
        "chronos_storage_snapshot_duration_seconds",
        "Timer log: how long a snapshot took to write (compaction).",
        |s| &s.storage_snapshot,
    );
}

/// The Postgres statement histogram, and `chronos_queue_stage_seconds{stage}`:
/// one histogram per queue stage.
fn queue_stages(out: &mut String, shards: &[ShardStats]) {
    histogram(
        out,
        shards,
        "chronos_queue_pg_batch_seconds",
        "Queue: latency of one batched Postgres statement.",
        |s| &s.pg_batch,
    );
    let blocked = shards.iter().any(|s| s.queue_output_blocked.load(Relaxed));
    let _ = writeln!(out, "# HELP chronos_queue_output_blocked 1 while the delay queue cannot publish for a reason of the configuration or the cluster (the output topic missing, no right to write it, failed authentication): messages are retried, never skipped; /ready says why.\n# TYPE chronos_queue_output_blocked gauge\nchronos_queue_output_blocked {}", u8::from(blocked));
    let name = "chronos_queue_stage_seconds";
    let _ = writeln!(out, "# HELP {name} Queue: time per stage (see tuning.md, the delay queue).\n# TYPE {name} histogram");
    for stage in Stage::ALL {
        let label = format!("stage=\"{}\"", stage.label());
        let each = shards.iter().map(|s| &s.queue_stage[stage as usize]);
        series(out, name, &label, &LATENCY_BOUNDS_US, each);
    }
}

/// An unlabelled histogram over [`LATENCY_BOUNDS_US`], summed over the shards.
fn histogram(
    out: &mut String,
    shards: &[ShardStats],
    name: &str,
    help: &str,
    pick: impl Fn(&ShardStats) -> &Histogram,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    series(out, name, "", &LATENCY_BOUNDS_US, shards.iter().map(pick));
}

#[cfg(test)]
mod tests;
