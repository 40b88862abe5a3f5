//! Rate-limited log lines: a line that an outside party can provoke at
//! will (a refused request, a failing callback target) is written at most
//! once per period per shard, with the count of the events not logged
//! since, so no peer or client can flood the log.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// A rate-limited log line's state: when it was last written, and how
/// many of its events since were not.
pub type LogLimit = Cell<(Option<Instant>, u64)>;

/// Whether a rate-limited line is due at `now` (at most one per
/// `every`): `Some(n)` with the `n` events since the last line that were
/// not logged; `None` counts this one as not logged.
pub fn log_due(state: &LogLimit, now: Instant, every: Duration) -> Option<u64> {
    let (last, quiet) = state.get();
    if last.is_some_and(|at| now.saturating_duration_since(at) < every) {
        state.set((last, quiet + 1));
        return None;
    }
    state.set((Some(now), 0));
    Some(quiet)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_due_once_per_period_with_the_count_since() {
        let every = Duration::from_secs(10);
        let state = Cell::new((None, 0));
        let t0 = Instant::now();
        assert_eq!(log_due(&state, t0, every), Some(0));
        for k in 1..=9 {
            assert_eq!(log_due(&state, t0 + Duration::from_secs(k), every), None);
        }
        assert_eq!(log_due(&state, t0 + every, every), Some(9));
        assert_eq!(log_due(&state, t0 + every, every), None);
    }
}
