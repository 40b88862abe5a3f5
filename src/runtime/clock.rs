//! Clocks. Pop times use `CLOCK_MONOTONIC` (via `Instant`) in whole ms since
//! one process-wide base, so every shard agrees; IDs use the wall clock.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

static BASE: OnceLock<Instant> = OnceLock::new();

/// The instant that engine time 0 stands for.
pub fn base() -> Instant {
    *BASE.get_or_init(Instant::now)
}

/// Engine time now, rounded down to the ms: use it to decide what is due.
pub fn now_ms() -> u64 {
    base().elapsed().as_millis() as u64
}

/// Engine time now, rounded up to the ms: use it as a start time, so that
/// `start + interval` is never before the real `now + interval`.
pub fn now_ms_ceil() -> u64 {
    let e = base().elapsed();
    let ms = e.as_millis() as u64;
    if e.subsec_nanos().is_multiple_of(1_000_000) {
        ms
    } else {
        ms + 1
    }
}

/// The `Instant` of an engine time.
pub fn instant_of(ms: u64) -> Instant {
    base() + Duration::from_millis(ms)
}

/// Wall-clock ms since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Wall-clock µs since the Unix epoch.
pub fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
