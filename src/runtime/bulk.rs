//! Bulk work on a shard without holding up its pops: a resync moves a
//! million timers on the same core that pops them.
//!
//! A task that only yields stays runnable, and glommio polls its reactor
//! (timers, sockets) only when no task is runnable or its 100 ms preemption
//! quantum has passed, so due pops would wait that long. Bulk work is cut
//! into chunks of well under a millisecond with a [`breathe`] between them.

use std::time::Duration;

/// Elements a sort or merge step handles between breaths (about 0.5 ms).
pub const CHUNK: usize = 32_768;

/// Let the reactor run: a sleep parks the task, the other runnable tasks
/// run, then the reactor. On a reused timer: a connection breathes every
/// half millisecond under load.
pub async fn breathe() {
    super::sleep::sleep(Duration::from_micros(1)).await;
}

/// Sort `v` in chunks of at most [`CHUNK`] element moves between breaths:
/// runs of `CHUNK` are sorted, then merged pairwise, level by level, each
/// merge resumable. `O(n log n)`; one buffer of `n` elements.
pub async fn sort<T: Ord + Copy + Default>(mut v: Vec<T>) -> Vec<T> {
    let n = v.len();
    for run in v.chunks_mut(CHUNK) {
        run.sort_unstable();
        breathe().await;
    }
    let mut buf = vec![T::default(); n];
    let mut width = CHUNK;
    while width < n {
        let mut moved = 0;
        for start in (0..n).step_by(2 * width) {
            let mid = (start + width).min(n);
            let end = (start + 2 * width).min(n);
            let (mut i, mut j, mut o) = (start, mid, start);
            while o < end {
                let take_left = j >= end || (i < mid && v[i] <= v[j]);
                buf[o] = if take_left { v[i] } else { v[j] };
                if take_left {
                    i += 1;
                } else {
                    j += 1;
                }
                o += 1;
                moved += 1;
                if moved % CHUNK == 0 {
                    breathe().await;
                }
            }
        }
        std::mem::swap(&mut v, &mut buf);
        width *= 2;
    }
    debug_assert!(v.windows(2).all(|w| w[0] <= w[1]), "sorted");
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn sorts_like_the_standard_sort() {
        for n in [
            0usize,
            1,
            7,
            super::CHUNK - 1,
            super::CHUNK,
            3 * super::CHUNK + 5,
        ] {
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let v: Vec<u64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % 1000
                })
                .collect();
            let mut want = v.clone();
            want.sort_unstable();
            let got = glommio::LocalExecutor::default().run(super::sort(v));
            assert_eq!(got, want, "n = {n}");
        }
    }
}
