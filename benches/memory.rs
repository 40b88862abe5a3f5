//! Resident memory per pending timer: fills one shard store (wheel + ID
//! index) with 1 M timers and reads RSS from /proc before and after.
//! Reports the total and the part left after subtracting the callback URI
//! and opaque bytes (and their allocation's header).
//!
//! `cargo bench --bench memory`

use chronos::shard::Store;
use chronos::timer::{Timer, TimerHead, TimerId};

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn main() {
    // Under `cargo test --benches` this runs as a quick smoke check.
    let n: usize = if std::env::args().any(|a| a == "--bench") {
        1_000_000
    } else {
        10_000
    };
    let uri = "http://10.0.0.1:8080/callback";
    let opaque = "0123456789abcdef0123456789abcdef";
    let before = rss_bytes();
    let mut store = Store::new(0, 1, 1, 0);
    let mut ids = chronos::timer::IdGenerator::new(1, 0, 1);
    for i in 0..n {
        let unique = ids.next(chronos::timer::id::ID_EPOCH_UNIX_MS + 1_000_000 + i as u64 / 4096);
        let head = TimerHead {
            id: TimerId { unique, bloom: 0 },
            start_ms: 0,
            version: 0,
            interval_ms: 3_600_000,
            repeat_for_ms: 3_600_000,
            sequence: 0,
            view: 0,
            replica_index: 0,
            replication_factor: 2,
            factor_requested: 2,
            site_index: 0,
            sites: u32::MAX,
        };
        let t = Timer::new(head, uri, opaque, &[]);
        store.insert(1 + (i as u64 * 7919) % 3_600_000, t);
    }
    let after = rss_bytes();
    assert_eq!(store.len(), n);
    let per_timer = (after - before) as f64 / n as f64;
    // Rc<[u8]> allocation: two counters (16 B) plus the bytes, rounded to malloc's 16 B.
    let data = (16 + uri.len() + opaque.len()).div_ceil(16) * 16 + 8;
    println!(
        "memory: {n} timers, RSS +{:.1} MiB, {per_timer:.1} B/timer in all, {:.1} B/timer excluding callback data (~{data} B each incl. malloc header); wheel entry {} B",
        (after - before) as f64 / (1 << 20) as f64,
        per_timer - data as f64,
        chronos::wheel::Wheel::<Timer>::entry_size()
    );
    std::hint::black_box(&store);
}
