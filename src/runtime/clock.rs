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

/// Wall-clock µs since the Unix epoch (0 before it). `CLOCK_REALTIME`
/// read directly, as `SystemTime::now` reads it: its `duration_since`
/// and `as_micros` in `u128` cost a create ~120 instructions more.
pub fn unix_us() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid `timespec` to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut t) };
    if rc != 0 || t.tv_sec < 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1000
}

static UNIX_OFFSET_US: OnceLock<i64> = OnceLock::new();

/// Wall-clock µs minus engine µs, fixed at first use: what the timer log
/// stores times by (engine time means nothing to another process). Taken
/// in µs, not as the difference of two whole-ms readings: those were up
/// to 1 ms off each, so a timer logged by one process could pop up to
/// 2 ms early in the next.
fn unix_offset_us() -> i64 {
    *UNIX_OFFSET_US.get_or_init(|| {
        let engine_us = ORIGIN_MS as i128 * 1000 + base().elapsed().as_micros() as i128;
        (unix_us() as i128 - engine_us) as i64
    })
}

/// `ms` moved by `offset_us`, rounded up to the ms (never before the
/// exact time); 0 for a time before 0.
fn shift_ceil_ms(ms: u64, offset_us: i64) -> u64 {
    let us = ms as i128 * 1000 + offset_us as i128;
    if us <= 0 {
        return 0;
    }
    ((us + 999) / 1000).min(u64::MAX as i128) as u64
}

/// The wall-clock ms of an engine time, rounded up: converted back (here
/// or in another process) it is never earlier than it was, at most 2 ms
/// later.
pub fn engine_to_unix(ms: u64) -> u64 {
    shift_ceil_ms(ms, unix_offset_us())
}

/// The engine time of a wall-clock ms, rounded up (0 before engine time
/// began).
pub fn unix_to_engine(ms: u64) -> u64 {
    shift_ceil_ms(ms, -unix_offset_us())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A time logged by one process and read back by another (each with
    /// its own sub-ms offset to the same wall clock) is never earlier,
    /// and at most 2 ms later.
    #[test]
    fn a_time_through_the_log_is_never_earlier() {
        let wall_us: i64 = 1_795_000_000_123_456;
        for engine1_us in [
            8_589_934_592_000i64,
            8_589_934_592_001,
            8_589_934_592_999,
            8_589_934_593_500,
        ] {
            for engine2_us in [8_589_934_592_000i64, 8_589_934_592_400, 8_589_934_599_999] {
                let (off1, off2) = (wall_us - engine1_us, wall_us - engine2_us);
                for e1 in [ORIGIN_MS, ORIGIN_MS + 1, ORIGIN_MS + 12_345] {
                    let exact_us = e1 as i64 * 1000 + off1 - off2;
                    let e2 = shift_ceil_ms(shift_ceil_ms(e1, off1), -off2) as i64 * 1000;
                    assert!(e2 >= exact_us, "{e1}: {e2} µs before {exact_us} µs");
                    assert!(
                        e2 < exact_us + 2000,
                        "{e1}: {e2} µs, 2 ms after {exact_us} µs"
                    );
                }
            }
        }
    }

    #[test]
    fn a_time_before_zero_is_zero() {
        assert_eq!(shift_ceil_ms(0, -1), 0);
        assert_eq!(shift_ceil_ms(5, -5_000), 0);
        assert_eq!(shift_ceil_ms(5, -4_001), 1);
        assert_eq!(shift_ceil_ms(5, 1), 6);
        assert_eq!(shift_ceil_ms(5, 0), 5);
    }
}
