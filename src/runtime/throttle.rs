//! Overload control: the reference's token bucket, its rate tuned to a
//! target latency as Welsh and Culler propose ("Adaptive overload control
//! for busy internet servers", 2003).
//!
//! A request takes a token or is refused. The bucket holds at most
//! `max_tokens` and refills at `rate` tokens/s. Every `ADJUST_EVERY`
//! latency samples the rate is re-tuned from the smoothed latency (an
//! exponential average, 7/8 old): over the target it is divided by
//! `DECREASE_FACTOR`; under it by more than `INCREASE_THRESHOLD`, and with
//! the demand of the last window above half the rate, it grows by
//! `INCREASE_FACTOR × max_tokens` times the relative error. It stays within
//! `[min_rate, max_rate]`. One bucket per shard; no lock, no allocation.

use std::cell::Cell;
use std::time::Instant;

/// Samples between two adjustments of the rate.
pub const ADJUST_EVERY: u32 = 20;
/// The rate is divided by this while the latency is over the target.
pub const DECREASE_FACTOR: f64 = 1.2;
/// How much of `max_tokens` a full relative error adds to the rate.
pub const INCREASE_FACTOR: f64 = 0.5;
/// The relative error below which the rate may grow.
pub const INCREASE_THRESHOLD: f64 = -0.005;

/// A bucket's settings (per shard).
#[derive(Clone, Copy, Debug)]
pub struct ThrottleConfig {
    pub target_latency_us: u64,
    pub max_tokens: f64,
    pub initial_rate: f64,
    pub min_rate: f64,
    /// `f64::INFINITY`: no maximum.
    pub max_rate: f64,
}

pub struct Throttle {
    cfg: ThrottleConfig,
    tokens: Cell<f64>,
    rate: Cell<f64>,
    refilled: Cell<Instant>,
    smoothed_us: Cell<f64>,
    samples: Cell<u32>,
    /// Requests (admitted or refused) since `window`.
    demand: Cell<u32>,
    window: Cell<Instant>,
}

impl Throttle {
    pub fn new(cfg: ThrottleConfig, now: Instant) -> Throttle {
        assert!(
            cfg.max_tokens >= 1.0 && cfg.min_rate > 0.0 && cfg.min_rate <= cfg.max_rate,
            "the configuration's checks keep a bucket of at least one token and 0 < min-rate <= max-rate"
        );
        Throttle {
            cfg,
            tokens: Cell::new(cfg.max_tokens),
            rate: Cell::new(cfg.initial_rate.clamp(cfg.min_rate, cfg.max_rate)),
            refilled: Cell::new(now),
            smoothed_us: Cell::new(0.0),
            samples: Cell::new(0),
            demand: Cell::new(0),
            window: Cell::new(now),
        }
    }

    /// Take a token for a request: `false` means refuse it.
    pub fn admit(&self, now: Instant) -> bool {
        let elapsed = now
            .saturating_duration_since(self.refilled.get())
            .as_secs_f64();
        let tokens = (self.tokens.get() + elapsed * self.rate.get()).min(self.cfg.max_tokens);
        self.refilled.set(now);
        self.demand.set(self.demand.get().saturating_add(1));
        let admitted = tokens >= 1.0;
        self.tokens
            .set(if admitted { tokens - 1.0 } else { tokens });
        admitted
    }

    /// A latency sample (a request's, or a pop's lateness).
    pub fn record(&self, latency_us: u64, now: Instant) {
        let smoothed = (7.0 * self.smoothed_us.get() + latency_us as f64) / 8.0;
        self.smoothed_us.set(smoothed);
        self.samples.set(self.samples.get() + 1);
        if self.samples.get().is_multiple_of(ADJUST_EVERY) {
            self.adjust(now);
        }
    }

    fn adjust(&self, now: Instant) {
        let target = self.cfg.target_latency_us as f64;
        let err = (self.smoothed_us.get() - target) / target;
        let secs = now
            .saturating_duration_since(self.window.get())
            .as_secs_f64()
            .max(1e-3);
        let demand_rate = self.demand.get() as f64 / secs;
        let mut rate = self.rate.get();
        if err > 0.0 {
            rate /= DECREASE_FACTOR;
        } else if err < INCREASE_THRESHOLD && demand_rate > rate / 2.0 {
            rate += -err * self.cfg.max_tokens * INCREASE_FACTOR;
        }
        self.rate
            .set(rate.clamp(self.cfg.min_rate, self.cfg.max_rate));
        self.demand.set(0);
        self.window.set(now);
    }

    pub fn rate(&self) -> f64 {
        self.rate.get()
    }

    pub fn tokens(&self) -> f64 {
        self.tokens.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cfg() -> ThrottleConfig {
        ThrottleConfig {
            target_latency_us: 500_000,
            max_tokens: 100.0,
            initial_rate: 50.0,
            min_rate: 10.0,
            max_rate: f64::INFINITY,
        }
    }

    #[test]
    fn a_full_bucket_admits_max_tokens_then_refills_at_the_rate() {
        let t0 = Instant::now();
        let t = Throttle::new(cfg(), t0);
        let admitted = (0..150).filter(|_| t.admit(t0)).count();
        assert_eq!(admitted, 100);
        // One second later: 50 more tokens.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!((0..100).filter(|_| t.admit(t1)).count(), 50);
    }

    #[test]
    fn latency_over_target_divides_the_rate_and_under_it_raises_it() {
        let t0 = Instant::now();
        let t = Throttle::new(cfg(), t0);
        // Slow: every adjustment divides by 1.2, down to the minimum.
        for i in 0..400u32 {
            let now = t0 + Duration::from_millis(i as u64);
            t.admit(now);
            t.record(2_000_000, now);
        }
        assert_eq!(t.rate(), 10.0, "clamped to min_rate");
        // Fast, with demand above half the rate: it grows.
        let t = Throttle::new(cfg(), t0);
        for i in 0..40u32 {
            let now = t0 + Duration::from_millis(i as u64);
            t.admit(now);
            t.record(1_000, now);
        }
        assert!(
            t.rate() > 50.0 + 2.0 * 0.99 * 100.0 * 0.5 - 1.0,
            "{}",
            t.rate()
        );
        // Fast but idle (demand far below half the rate): it stays.
        let t = Throttle::new(cfg(), t0);
        for i in 0..40u32 {
            t.record(1_000, t0 + Duration::from_secs(i as u64));
        }
        assert_eq!(t.rate(), 50.0);
    }
}
