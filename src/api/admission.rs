//! Admission of client requests (`[throttling]`): a shard's share of the
//! configured token bucket ([`crate::runtime::throttle`]), what it admits,
//! and the client requests' latencies it steers by. The same bucket also
//! takes the pops' lateness: the composition root hands it to the shard's
//! pop state too. `None` when `[throttling]` is off; then no clock is read
//! for it.

use crate::config::Resolved;
use crate::runtime::throttle::{Throttle, ThrottleConfig};
use crate::stats::ShardStats;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A shard's token bucket, `None` when `[throttling]` is off.
pub struct Admission {
    throttle: Option<Rc<Throttle>>,
}

impl Admission {
    /// Admission by `throttle` ([`throttle`]: the shard's share).
    pub fn new(throttle: Option<Rc<Throttle>>) -> Admission {
        Admission { throttle }
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
pub fn throttle(resolved: &Resolved) -> Option<Rc<Throttle>> {
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
    Some(Rc::new(Throttle::new(cfg, Instant::now())))
}
