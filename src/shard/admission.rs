//! Admission of client requests (`[throttling]`): the shard's share of
//! the configured token bucket ([`crate::runtime::throttle`]), what it
//! admits, and the latencies it steers by: a client request's, and a
//! pop's lateness. `None` when `[throttling]` is off; then no clock is
//! read for it.
//!
//! It stays in `shard`, not `api`, because the pop loop feeds it too.

use crate::config::Resolved;
use crate::runtime::throttle::{Throttle, ThrottleConfig};
use std::time::Instant;

/// A shard's token bucket, `None` when `[throttling]` is off.
pub struct Admission {
    pub(super) throttle: Option<Throttle>,
}

impl Admission {
    /// The configured bucket split evenly between the shards (each admits
    /// the requests it takes).
    pub(super) fn new(resolved: &Resolved) -> Admission {
        Admission {
            throttle: throttle(resolved),
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
