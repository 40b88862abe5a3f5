//! Admission of client requests (`[throttling]`): the shard's share of
//! the configured token bucket ([`crate::runtime::throttle`]), what it
//! admits, and the latencies it steers by: a client request's, and a
//! pop's lateness. `None` when `[throttling]` is off; then no clock is
//! read for it.
//!
//! It stays in `shard`, not `api`, because the pop loop feeds it too.

use crate::config::Resolved;
use crate::runtime::throttle::{Throttle, ThrottleConfig};
use crate::stats::ShardStats;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A shard's token bucket, `None` when `[throttling]` is off.
pub struct Admission {
    throttle: Option<Throttle>,
}

impl Admission {
    /// The configured bucket split evenly between the shards (each admits
    /// the requests it takes).
    pub(super) fn new(resolved: &Resolved) -> Admission {
        Admission {
            throttle: throttle(resolved),
        }
    }

    /// Admit a client request (`false`: refuse it with 503); `stats` are
    /// this shard's.
    pub fn admit(&self, stats: &ShardStats) -> bool {
        let Some(t) = &self.throttle else {
            return true;
        };
        let admitted = t.admit(Instant::now());
        stats
            .throttle_tokens
            .store(t.tokens() as i64, Ordering::Relaxed);
        stats
            .throttle_rate
            .store(t.rate() as i64, Ordering::Relaxed);
        if !admitted {
            ShardStats::add(&stats.throttled, 1);
        }
        admitted
    }

    /// A latency the bucket steers by: a client request's, or a pop's
    /// lateness (what a timer service promises).
    pub fn record_latency(&self, latency_us: u64) {
        if let Some(t) = &self.throttle {
            t.record(latency_us, Instant::now());
        }
    }

    /// The start of a client operation whose latency the throttle takes;
    /// `None` without a throttle (`[throttling]` off), so that no clock
    /// is read for a latency nothing uses (two reads per `POST`).
    pub fn latency_start(&self) -> Option<Instant> {
        self.throttle.as_ref().map(|_| Instant::now())
    }

    /// The throttle takes the latency since `started`
    /// ([`Admission::latency_start`]), with one clock read for both the
    /// latency and its time.
    pub fn record_latency_since(&self, started: Option<Instant>) {
        if let (Some(t), Some(started)) = (&self.throttle, started) {
            let now = Instant::now();
            let latency_us = now.saturating_duration_since(started).as_micros() as u64;
            t.record(latency_us, now);
        }
    }
}

/// A shard's token bucket (with `[throttling]`): the configured bucket
/// split evenly between the shards (each admits the requests it takes).
fn throttle(resolved: &Resolved) -> Option<Throttle> {
    let t = resolved.config.throttling.as_ref()?;
    let n = resolved.shards as f64;
    let per = |v: u64| (v as f64 / n).max(1.0);
    let max_rate = match t.max_token_rate {
        0 => f64::INFINITY,
        m => per(m),
    };
    let cfg = ThrottleConfig {
        target_latency_us: t.target_latency,
        max_tokens: per(t.max_tokens),
        initial_rate: per(t.initial_token_rate),
        min_rate: per(t.min_token_rate).min(max_rate),
        max_rate,
    };
    Some(Throttle::new(cfg, Instant::now()))
}
