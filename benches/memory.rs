//! Resident memory per pending timer: fills one shard store (wheel + ID
//! index) with 1 M timers and reads RSS from /proc before and after. Each
//! case runs in a child process of its own (freed memory is not given back
//! to the system, so cases in one process would disturb each other):
//!
//! - `shared`: every timer calls one URI (a 29-byte one) with 32 bytes of
//!   opaque data;
//! - `distinct`: every timer calls a URI of its own (37 bytes), 32 bytes
//!   of opaque data (the first `INTERNED_MAX` interned, the rest not);
//!
//! and, for each, the part left after subtracting the callback bytes
//! themselves: the opaque data (inline in the record) and the URI's bytes
//! divided among the timers that share them. What holding them costs
//! beyond their bytes (an interned URI's allocations and table slot) stays
//! in that part.
//!
//! `cargo bench --bench memory`

use chronos::shard::Store;
use chronos::timer::callback::INTERNED_MAX;
use chronos::timer::{Timer, TimerHead, TimerId};
use std::fmt::Write;

const URI: &str = "http://10.0.0.1:8080/callback";
const OPAQUE: &str = "0123456789abcdef0123456789abcdef";
/// The case a child process runs.
const CASE_VAR: &str = "CHRONOS_MEMORY_CASE";

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn head(unique: u64) -> TimerHead {
    TimerHead {
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
    }
}

/// Fill a store with `n` timers; prints `B/timer in all` and the URI bytes
/// the fill holds per timer (one 8-byte-aligned copy per distinct URI).
fn fill(n: usize, distinct: bool) {
    let mut uri = String::with_capacity(64);
    let before = rss_bytes();
    let mut store = Store::new(0, 1, 1, 0);
    let mut ids = chronos::timer::IdGenerator::new(1, 0, 1);
    for i in 0..n {
        let unique = ids.next(chronos::timer::id::ID_EPOCH_UNIX_MS + 1_000_000 + i as u64 / 4096);
        uri.clear();
        uri.push_str(URI);
        if distinct {
            write!(uri, "/{i:07}").unwrap();
        }
        let t = Timer::new(head(unique), &uri, OPAQUE, &[]);
        store.insert(1 + (i as u64 * 7919) % 3_600_000, t, None);
    }
    let after = rss_bytes();
    assert_eq!(store.len(), n);
    let interned = chronos::timer::callback::interned_count();
    assert_eq!(interned, if distinct { n.min(INTERNED_MAX) } else { 1 });
    let uris = if distinct { n } else { 1 };
    let per_timer = (after - before) as f64 / n as f64;
    println!("{per_timer:.1} {}", uri.len() * uris);
    std::hint::black_box(&store);
}

/// Run one case in a child process: (B/timer in all, URI bytes held).
fn run(case: &str, quick: bool) -> (f64, f64) {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    if !quick {
        child.arg("--bench");
    }
    let out = child.env(CASE_VAR, case).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut words = text.split_whitespace().map(|w| w.parse::<f64>().unwrap());
    (words.next().unwrap(), words.next().unwrap())
}

fn main() {
    // Under `cargo test --benches` this runs as a quick smoke check.
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: usize = if quick { 10_000 } else { 1_000_000 };
    match std::env::var(CASE_VAR).as_deref() {
        Ok("shared") => return fill(n, false),
        Ok("distinct") => return fill(n, true),
        _ => {}
    }
    for case in ["shared", "distinct"] {
        let (per_timer, uri_bytes) = run(case, quick);
        let data = OPAQUE.len() as f64 + uri_bytes / n as f64;
        println!(
            "memory: {n} timers, {case} URI: {per_timer:.1} B/timer in all, {:.1} B/timer excluding callback data ({data:.1} B each: {} B opaque inline, URI bytes / timers)",
            per_timer - data,
            OPAQUE.len(),
        );
    }
    println!(
        "memory: timer record {} B, wheel entry {} B",
        std::mem::size_of::<Timer>(),
        chronos::wheel::Wheel::<Timer>::entry_size()
    );
}
