//! Clocks. Pop times use `CLOCK_MONOTONIC` (via `Instant`) in whole ms since
//! one process-wide base, so every shard agrees; IDs use the wall clock.
//!
//! Engine time starts at `ORIGIN_MS`, not 0: a timer another node started
//! before this process did (replication or resync right after a start)
//! has a start before the base, and engine time must be able to say so.
//! Starting at 0 clamped such starts to 0, and those timers popped as
//! late as the process was young (150 ms in `perf/resync-bench.sh`).

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

static BASE: OnceLock<Instant> = OnceLock::new();

/// Engine time at the base: 2^33 ms (99 days) of room before it, more
/// than a live timer's `repeat-for` can reach back (u32 ms, 49.7 days).
pub const ORIGIN_MS: u64 = 1 << 33;

/// The instant that engine time 0 stands for.
pub fn base() -> Instant {
    *BASE.get_or_init(Instant::now)
}

/// Engine time now, rounded down to the ms: use it to decide what is due.
pub fn now_ms() -> u64 {
    ORIGIN_MS + base().elapsed().as_millis() as u64
}

/// Engine time now, rounded up to the ms: use it as a start time, so that
/// `start + interval` is never before the real `now + interval`.
pub fn now_ms_ceil() -> u64 {
    let e = base().elapsed();
    let ms = ORIGIN_MS + e.as_millis() as u64;
    if e.subsec_nanos().is_multiple_of(1_000_000) {
        ms
    } else {
        ms + 1
    }
}

/// The `Instant` of an engine time (the base for a time before it).
pub fn instant_of(ms: u64) -> Instant {
    base() + Duration::from_millis(ms.saturating_sub(ORIGIN_MS))
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

static UNIX_OFFSET_MS: OnceLock<i64> = OnceLock::new();

/// Wall-clock ms minus engine ms, fixed at first use: what the timer log
/// stores times by (engine time means nothing to another process).
fn unix_offset_ms() -> i64 {
    *UNIX_OFFSET_MS.get_or_init(|| unix_ms() as i64 - now_ms() as i64)
}

/// The wall-clock ms of an engine time.
pub fn engine_to_unix(ms: u64) -> u64 {
    (ms as i64).saturating_add(unix_offset_ms()).max(0) as u64
}

/// The engine time of a wall-clock ms (0 before engine time began).
pub fn unix_to_engine(ms: u64) -> u64 {
    (ms as i64).saturating_sub(unix_offset_ms()).max(0) as u64
}
