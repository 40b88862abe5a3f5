//! Sleeps on reused timers. A glommio `Timer` is a fresh `Rc` each time
//! (`glommio::timer::sleep` makes one per call); on the hot paths (a
//! connection's breath, a pipelined batch's deadline, a callback's wait
//! for a connection) that was an allocation per request. [`sleep`] lends
//! a timer from the shard's spare list and takes it back however the
//! sleep ends (elapsed, or dropped because something else came first).
//!
//! Bound: at most [`SPARE_TIMERS_MAX`] idle timers per shard; a sleep
//! beyond what is spare makes its own, kept afterwards if there is room.

use glommio::timer::Timer;
use std::cell::RefCell;
use std::time::Duration;

/// Idle timers kept per shard (one per task sleeping at once, beyond it
/// a sleep's timer is dropped when it ends).
pub const SPARE_TIMERS_MAX: usize = 1024;

thread_local! {
    /// This shard's idle timers (a shard is a thread), and the executor
    /// they belong to: a timer refers to its executor's reactor, so the
    /// list is emptied when another executor runs on the thread (tests
    /// run several one after another).
    static SPARE: RefCell<(usize, Vec<Timer>)> = const { RefCell::new((usize::MAX, Vec::new())) };
}

/// Sleep for `dur` on a reused timer. Must run on a glommio executor.
pub async fn sleep(dur: Duration) {
    let executor = glommio::executor().id();
    let spare = SPARE.with(|s| {
        let mut s = s.borrow_mut();
        if s.0 != executor {
            *s = (executor, Vec::new());
        }
        s.1.pop()
    });
    let mut lent = Lent {
        timer: spare,
        executor,
    };
    let timer = lent.timer.get_or_insert_with(|| Timer::new(dur));
    timer.reset(dur);
    timer.await;
}

/// A lent timer, given back to the spare list when its sleep ends. It
/// is given back as it is (perhaps still armed: a wake-up it causes later
/// is spurious, and harmless); the next sleep resets it.
struct Lent {
    timer: Option<Timer>,
    executor: usize,
}

impl Drop for Lent {
    fn drop(&mut self) {
        let Some(timer) = self.timer.take() else {
            return;
        };
        let _ = SPARE.try_with(|s| {
            let mut s = s.borrow_mut();
            if s.0 == self.executor && s.1.len() < SPARE_TIMERS_MAX {
                s.1.push(timer);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    #[test]
    fn sleeps_at_least_as_asked_and_reuses_its_timer() {
        // Twice: the second executor does not use the first one's timers.
        for _ in 0..2 {
            sleeps_once();
        }
    }

    fn sleeps_once() {
        glommio::LocalExecutor::default().run(async {
            for ms in [3u64, 1, 2] {
                let start = Instant::now();
                super::sleep(Duration::from_millis(ms)).await;
                assert!(start.elapsed() >= Duration::from_millis(ms));
            }
            // A sleep dropped before it ends gives its timer back too.
            let early = futures_lite::future::or(super::sleep(Duration::from_secs(60)), async {});
            early.await;
            assert_eq!(super::SPARE.with(|s| s.borrow().1.len()), 1);
        });
    }
}
