//! Recovery of a log segment: a valid log built from the input's first
//! half, damaged by its second half (byte flips at chosen offsets), read
//! back with `on-corruption = "skip"` and `"stop"`. Never a panic; an
//! undamaged log recovers exactly the model.
#![no_main]
use chronos::storage::record::{self, Image};
use chronos::storage::{read, OnCorruption};
use chronos::timer::{TimerHead, TimerId};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;

fn head(unique: u64) -> TimerHead {
    TimerHead {
        id: TimerId { unique, bloom: 1 },
        start_ms: 1_000,
        version: unique,
        interval_ms: 10,
        repeat_for_ms: 0,
        sequence: 0,
        view: 0,
        replica_index: 0,
        replication_factor: 1,
        factor_requested: 1,
        site_index: 0,
        sites: u32::MAX,
    }
}

/// Batches of PUTs and REMOVEs from `ops`; the model of what is live.
fn build(ops: &[u8]) -> (Vec<u8>, BTreeMap<u64, u64>) {
    let (mut file, mut model, mut lsn, mut prev) = (Vec::new(), BTreeMap::new(), 1u64, 0u32);
    for chunk in ops.chunks(4) {
        let mut batch = Vec::new();
        for &op in chunk {
            let unique = (op & 0x0f) as u64;
            if op & 0x80 == 0 {
                let due = lsn * 7;
                let mut image = Image::new(due, head(unique), "http://h/x", "o");
                // Bit 0x40: a timer with a delivery policy (format 1), and
                // its pop's attempts (a DELIVERY record); bit 0x10: a
                // calendar timer (extension section 2, issue 42).
                let mut ext = Vec::new();
                if op & 0x10 != 0 {
                    use chronos::timer::extras::{push_timing, TimingKind, TimingRef};
                    let timing = TimingRef {
                        kind: TimingKind::Cron,
                        start_unix_ms: due as i64,
                        text: "*/2 * * * * *",
                        zone: "Europe/Paris",
                    };
                    push_timing(&mut ext, &timing);
                }
                if op & 0x40 != 0 {
                    let retry = chronos::timer::retry::RetryPolicy::default();
                    chronos::timer::extras::push_delivery(&mut ext, &retry, "http://h/dlq");
                }
                image.ext = &ext;
                if op & 0x40 != 0 {
                    let state = chronos::timer::spec::AttemptState {
                        sequence: 1,
                        attempts: 2,
                        first_unix_ms: 5,
                        next_unix_ms: due,
                        last_outcome: 503,
                        done: op & 0x20 != 0,
                    };
                    record::delivery(&mut batch, lsn, &state, true, &image, [("t", 1u32)].into_iter());
                    lsn += 1;
                }
                record::put(&mut batch, lsn, &image, [("t", 1u32)].into_iter());
                model.insert(unique, due);
            } else {
                record::remove(&mut batch, lsn, unique);
                model.remove(&unique);
            }
            lsn += 1;
        }
        let first = record::first_lsn(&batch);
        record::commit(&mut batch, 0, 0);
        prev = record::stamp(&mut batch, prev, first);
        file.extend_from_slice(&batch);
    }
    (file, model)
}

fn recover(dir: &std::path::Path, file: &[u8], mode: OnCorruption) -> Option<BTreeMap<u64, u64>> {
    std::fs::write(dir.join("log-00000000000000000001.wal"), file).unwrap();
    let r = read::recover(dir, mode).ok()?;
    Some(r.images().map(|i| (i.head.id.unique, i.due_unix_ms)).collect())
}

fuzz_target!(|data: &[u8]| {
    let (ops, damage) = data.split_at(data.len() / 2);
    if ops.is_empty() {
        return;
    }
    let (mut file, model) = build(ops);
    let dir = std::env::temp_dir().join(format!("chronos-fuzz-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(recover(&dir, &file, OnCorruption::Stop), Some(model));
    for pair in damage.chunks(3) {
        if let [a, b, x] = pair {
            let at = (u16::from_le_bytes([*a, *b]) as usize) % (file.len() + 64);
            if at >= file.len() {
                file.resize(at + 1, 0);
            }
            file[at] ^= x | 1;
        }
    }
    let _ = recover(&dir, &file, OnCorruption::Skip);
    let _ = recover(&dir, &file, OnCorruption::Stop);
    let _ = std::fs::remove_dir_all(&dir);
});
