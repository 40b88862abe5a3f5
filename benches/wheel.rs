//! The timing wheel against its baselines, in one run:
//! `BinaryHeap` (lazy cancel), `BTreeMap`, tokio-util's `DelayQueue`, and
//! `nexus-timer`'s wheel.
//!
//! - `insert_cancel/<impl>/<pending>`: with `pending` timers already held
//!   (deadlines spread over an hour), insert one timer and cancel it.
//! - `expire/<impl>/<n>`: `n` timers due over the next `n / 1000` ms; time
//!   per expired timer of polling them all out. Every routine returns its
//!   structure, so freeing it is not timed.
//!
//! `cargo bench --bench wheel`; results are recorded in `perf/README.md`.

use chronos::wheel::Wheel;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::hint::black_box;
use std::time::{Duration, Instant};

const SIZES: [usize; 3] = [1_000, 100_000, 1_000_000];
const HOUR_MS: u64 = 3_600_000;

/// A small deterministic generator (xorshift) so every impl sees the same deadlines.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn due(&mut self) -> u64 {
        1000 + self.next() % HOUR_MS
    }
}

/// Binary heap with lazy cancellation: the usual heap-based timer.
struct Heap {
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    cancelled: Vec<bool>,
    free: Vec<u32>,
}
impl Heap {
    fn new() -> Self {
        Heap {
            heap: BinaryHeap::new(),
            cancelled: Vec::new(),
            free: Vec::new(),
        }
    }
    fn insert(&mut self, due: u64) -> u32 {
        let id = self.free.pop().unwrap_or_else(|| {
            self.cancelled.push(false);
            (self.cancelled.len() - 1) as u32
        });
        self.cancelled[id as usize] = false;
        self.heap.push(Reverse((due, id)));
        id
    }
    fn cancel(&mut self, id: u32) {
        self.cancelled[id as usize] = true;
    }
    fn expire(&mut self, now: u64) -> usize {
        let mut n = 0;
        while let Some(Reverse((due, id))) = self.heap.peek().copied() {
            if due > now {
                break;
            }
            self.heap.pop();
            if !std::mem::replace(&mut self.cancelled[id as usize], true) {
                n += 1;
            }
            self.free.push(id);
        }
        n
    }
}

fn insert_cancel(c: &mut Criterion) {
    let mut g = c.benchmark_group("insert_cancel");
    g.sample_size(30)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    for &n in &SIZES {
        g.throughput(Throughput::Elements(1));
        {
            let mut rng = Rng(0x9e37_79b9);
            let mut w: Wheel<u64> = Wheel::with_capacity(0, n + 1);
            for i in 0..n {
                w.insert(rng.due(), i as u64);
            }
            g.bench_function(BenchmarkId::new("chronos_wheel", n), |b| {
                b.iter(|| {
                    let k = w.insert(rng.due(), 7);
                    black_box(w.cancel(k));
                })
            });
        }
        {
            let mut rng = Rng(0x9e37_79b9);
            let mut h = Heap::new();
            for _ in 0..n {
                h.insert(rng.due());
            }
            g.bench_function(BenchmarkId::new("binary_heap", n), |b| {
                b.iter(|| {
                    let id = h.insert(rng.due());
                    h.cancel(black_box(id));
                    // Keep the heap from growing without bound: lazily
                    // cancelled entries are reclaimed like a real user would.
                    if h.heap.len() > 2 * n + 1024 {
                        h.heap.retain(|Reverse((_, i))| !h.cancelled[*i as usize]);
                    }
                })
            });
        }
        {
            let mut rng = Rng(0x9e37_79b9);
            let mut t: BTreeMap<(u64, u64), u64> = BTreeMap::new();
            for i in 0..n {
                t.insert((rng.due(), i as u64), 0);
            }
            let mut seq = n as u64;
            g.bench_function(BenchmarkId::new("btree_map", n), |b| {
                b.iter(|| {
                    seq += 1;
                    let k = (rng.due(), seq);
                    t.insert(k, 7);
                    black_box(t.remove(&k));
                })
            });
        }
        {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            let _guard = rt.enter();
            let mut rng = Rng(0x9e37_79b9);
            let mut q = tokio_util::time::DelayQueue::with_capacity(n + 1);
            let start = tokio::time::Instant::now();
            for i in 0..n {
                q.insert_at(i as u64, start + Duration::from_millis(rng.due()));
            }
            g.bench_function(BenchmarkId::new("tokio_delay_queue", n), |b| {
                b.iter(|| {
                    let k = q.insert_at(7, start + Duration::from_millis(rng.due()));
                    black_box(q.remove(&k));
                })
            });
        }
        {
            let mut rng = Rng(0x9e37_79b9);
            let start = Instant::now();
            let mut w: nexus_timer::Wheel<u64> = nexus_timer::Wheel::unbounded(64 * 1024, start);
            for i in 0..n {
                w.schedule_forget(start + Duration::from_millis(rng.due()), i as u64);
            }
            g.bench_function(BenchmarkId::new("nexus_timer", n), |b| {
                b.iter(|| {
                    let h = w.schedule(start + Duration::from_millis(rng.due()), 7);
                    black_box(w.cancel(h));
                })
            });
        }
    }
    g.finish();
}

fn expire(c: &mut Criterion) {
    let mut g = c.benchmark_group("expire");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    for &n in &SIZES {
        let span_ms = (n as u64 / 1000).max(1);
        let dues: Vec<u64> = {
            let mut rng = Rng(0xdead_beef);
            (0..n).map(|_| 1 + rng.next() % span_ms).collect()
        };
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::new("chronos_wheel", n), |b| {
            b.iter_batched(
                || {
                    let mut w: Wheel<u64> = Wheel::with_capacity(0, n);
                    for (i, d) in dues.iter().enumerate() {
                        w.insert(*d, i as u64);
                    }
                    w
                },
                |mut w| {
                    let mut count = 0usize;
                    let mut now = 0;
                    while !w.is_empty() {
                        now += 1;
                        count += w.poll(now, usize::MAX, |_, _, v| {
                            black_box(v);
                        });
                    }
                    assert_eq!(count, n);
                    w
                },
                BatchSize::PerIteration,
            )
        });
        g.bench_function(BenchmarkId::new("binary_heap", n), |b| {
            b.iter_batched(
                || {
                    let mut h = Heap::new();
                    for d in &dues {
                        h.insert(*d);
                    }
                    h
                },
                |mut h| {
                    let mut count = 0;
                    let mut now = 0;
                    while count < n {
                        now += 1;
                        count += h.expire(now);
                    }
                    h
                },
                BatchSize::PerIteration,
            )
        });
        g.bench_function(BenchmarkId::new("btree_map", n), |b| {
            b.iter_batched(
                || {
                    dues.iter()
                        .enumerate()
                        .map(|(i, d)| ((*d, i as u64), 0u64))
                        .collect::<BTreeMap<_, _>>()
                },
                |mut t| {
                    let mut now = 0;
                    while !t.is_empty() {
                        now += 1;
                        while let Some(e) = t.first_entry() {
                            if e.key().0 > now {
                                break;
                            }
                            black_box(e.remove());
                        }
                    }
                    t
                },
                BatchSize::PerIteration,
            )
        });
        g.bench_function(BenchmarkId::new("nexus_timer", n), |b| {
            let start = Instant::now();
            b.iter_batched(
                || {
                    let mut w: nexus_timer::Wheel<u64> =
                        nexus_timer::Wheel::unbounded(64 * 1024, start);
                    for (i, d) in dues.iter().enumerate() {
                        w.schedule_forget(start + Duration::from_millis(*d), i as u64);
                    }
                    (w, Vec::with_capacity(n))
                },
                |(mut w, mut buf)| {
                    let mut count = 0;
                    let mut now = 0;
                    while count < n {
                        now += 1;
                        buf.clear();
                        count += w.poll(start + Duration::from_millis(now), &mut buf);
                    }
                    (w, buf)
                },
                BatchSize::PerIteration,
            )
        });
        if n <= 100_000 {
            g.bench_function(BenchmarkId::new("tokio_delay_queue", n), |b| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .start_paused(true)
                    .build()
                    .unwrap();
                b.iter_batched(
                    || {
                        let _guard = rt.enter();
                        let start = tokio::time::Instant::now();
                        let mut q = tokio_util::time::DelayQueue::with_capacity(n);
                        for (i, d) in dues.iter().enumerate() {
                            q.insert_at(i as u64, start + Duration::from_millis(*d));
                        }
                        q
                    },
                    |mut q| {
                        rt.block_on(async {
                            use futures_util::StreamExt;
                            tokio::time::advance(Duration::from_millis(span_ms + 1)).await;
                            let mut count = 0;
                            while let Some(e) = q.next().await {
                                black_box(e);
                                count += 1;
                            }
                            assert_eq!(count, n);
                        });
                        q
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
    g.finish();
}

criterion_group!(benches, insert_cancel, expire);
criterion_main!(benches);
