//! Issue 21 item 5: the durable per-shard log (`[storage]`) of one node,
//! tried with real processes, real sockets and real files. Each test was
//! written before the log and seen failing (the node refused `[storage]`).
//! Three nodes with a log each are in `durable_cluster.rs`; the support
//! both use (`Store`, the load and its ledger, `settle`) in
//! `common/durable.rs`.
//!
//! - creates, updates, deletes and repeating timers, SIGTERM and a start:
//!   every live timer pops once, with its body and sequence numbers;
//! - `kill -9` in the middle of a concurrent create/delete load: every
//!   acknowledged create pops, no acknowledged delete is undone;
//! - timers due during a 4 s downtime pop at once after the start, a
//!   repeating timer's missed sequence numbers each once, in order;
//! - garbage written after the end of every log file: cut, counted,
//!   nothing lost;
//! - a corrupted record in the middle of a log: the start stops naming
//!   the file and offset; with `on-corruption = "skip"` the rest recovers;
//! - a start with 1 core instead of 2: every timer pops, and a delete
//!   sent after the restart reaches it;
//! - compaction under load: the log shrinks, a restart loses nothing,
//!   each shard keeps its next segment ready, and garbage in it is never
//!   taken for the log;
//! - a crash between a snapshot's rename and the deletion of the segments
//!   it covers (`CHRONOS_TEST_FAULT=after-snapshot-rename`) loses nothing.

mod common;

use common::durable::*;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Item 5, first case. The repeating timers pop once before the stop
/// (2 s) and three times after; the others are due 6-7 s after their
/// create, after the restart. A recovery that rebased due times on the
/// restart would be seconds late; one that lost the pop record of
/// sequence 1 would pop it again.
#[test]
fn sigterm_and_start_pops_every_live_timer_once_with_its_body() {
    let store = Store::new("sigterm");
    let sink = Sink::start(Behaviour::Ok);
    let port = free_port();
    let config = store.config(2, "");
    let (node, _) = start_ready(port, &config);
    let before = Instant::now();
    let (want, gone) = create_mixed(&node, &sink);
    let after = Instant::now();
    wait_until(
        "the repeating timers' first pops, answered",
        MARGIN * 4,
        || match node.metric("chronos_callbacks_succeeded_total") {
            n if n >= 5.0 => Ok(()),
            n => Err(format!("{n} callbacks succeeded")),
        },
    );
    assert!(node.metric("chronos_storage_records_total") >= 46.0);
    assert!(node.metric("chronos_storage_syncs_total") >= 1.0);
    assert!(node.metric("chronos_storage_sync_seconds_count") >= 1.0);
    assert!(node.metric("chronos_storage_log_bytes") > 0.0);
    assert!(node.terminate().success(), "a clean stop");
    let (node, _) = start_ready(port, &config);
    let ledger = Ledger {
        live: want.keys().cloned().collect(),
        deleted: gone,
        unsure: BTreeSet::new(),
    };
    let pops = settle(&sink, &[&node], &ledger, Duration::from_secs(15));
    check_exact(&pops, &want, before, after);
}

/// Item 5, second case. Four clients create timers due 8 s later and
/// delete a third of them; the node is killed after 1,500 acknowledged
/// creates (or 4 s), long before anything is due, so a delete acknowledged
/// before the kill can only be undone by the restart.
#[test]
fn kill9_during_a_create_delete_load_keeps_every_acknowledged_change() {
    let store = Store::new("kill9");
    let sink = Sink::start(Behaviour::Ok);
    let port = free_port();
    let config = store.config(2, "");
    let (mut node, _) = start_ready(port, &config);
    let load = Load {
        creates: 1500,
        ..Load::new(&node, &sink, Due::After(8.0))
    };
    let control = Control::default();
    let started = Instant::now();
    let handles = load.spawn(&control);
    while control.acked.load(Ordering::Relaxed) < 1500 && started.elapsed() < Duration::from_secs(4)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    node.kill9();
    control.stop.store(true, Ordering::Relaxed);
    assert!(sink.pops().is_empty(), "nothing was due before the kill");
    let ledger = ledger_of(handles);
    assert!(
        ledger.live.len() >= 100 && ledger.deleted.len() >= 30,
        "the load did something before the kill: {} live, {} deleted",
        ledger.live.len(),
        ledger.deleted.len()
    );
    let (node, _) = start_ready(port, &config);
    let replayed = node.metric("chronos_storage_replayed_records_total");
    assert!(
        replayed >= ledger.live.len() as f64,
        "{replayed} records replayed"
    );
    settle(&sink, &[&node], &ledger, Duration::from_secs(20));
}

/// Item 5, third case. A repeating timer (every 1 s, 7 pops) pops once,
/// then the node is killed for 4 s: its pops 2-5 and 40 one-shots (made
/// just before it, due 3-4.5 s after their create) fall in the downtime. After the start
/// each pops at once: within `MARGIN` of `/ready` answering 200 (the
/// issue's 1 s, and 0.5 s for a loaded machine running this file's other
/// tests; a recovery that waited for anything, or rebased the schedule,
/// is late by seconds). Each missed sequence pops once.
#[test]
fn timers_due_during_a_downtime_pop_at_once_after_the_start() {
    let store = Store::new("downtime");
    let sink = Sink::start(Behaviour::Ok);
    let port = free_port();
    let config = store.config(2, "");
    let (mut node, _) = start_ready(port, &config);
    for i in 0..40 {
        let interval = format!("{:.3}", 3.0 + 0.0375 * i as f64);
        node.create(&timer_body(
            &interval,
            None,
            &sink.uri(&format!("/due/{i}")),
            "due",
        ));
    }
    node.create(&timer_body("1", Some("7"), &sink.uri("/rep"), "rep"));
    assert_eq!(sink.wait_for(1, MARGIN * 2).len(), 1, "the first pop");
    node.kill9();
    assert_eq!(sink.pops().len(), 1, "only the first pop before the kill");
    std::thread::sleep(Duration::from_secs(4));
    let (node, ready) = start_ready(port, &config);
    let ledger = Ledger {
        live: (0..40)
            .map(|i| format!("/due/{i}"))
            .chain(["/rep".into()])
            .collect(),
        ..Ledger::default()
    };
    let pops = settle(&sink, &[&node], &ledger, Duration::from_secs(10));
    for (path, list) in &pops {
        if path != "/rep" {
            assert_eq!(list.len(), 1, "{path} pops once");
            let late = list[0].at.saturating_duration_since(ready);
            assert!(late <= MARGIN, "{path} popped {late:?} after /ready");
        }
    }
    check_missed_sequences(&pops["/rep"], ready);
}

/// The repeating timer of the downtime test: sequence 1 at least once
/// (its pop record may not have been durable at the kill), then 2..=7
/// each once, in order; 2..=5 (missed) within `MARGIN` of `/ready`.
/// The missed pops are sent at once, each on its own callback, so they
/// may arrive in any order among themselves (a re-sent 1 among them).
fn check_missed_sequences(rep: &[Pop], ready: Instant) {
    let seqs: Vec<u32> = rep.iter().map(|p| p.sequence).collect();
    let ones = seqs.iter().filter(|&&s| s == 1).count();
    assert!(
        (1..=2).contains(&ones),
        "sequence 1 once or twice: {seqs:?}"
    );
    assert_eq!(seqs[0], 1, "sequence 1 popped before the kill: {seqs:?}");
    let mut rest: Vec<u32> = seqs.iter().copied().filter(|&s| s != 1).collect();
    rest.sort_unstable();
    assert_eq!(
        rest,
        [2, 3, 4, 5, 6, 7],
        "each missed sequence once: {seqs:?}"
    );
    for p in rep.iter().filter(|p| (2..=5).contains(&p.sequence)) {
        let late = p.at.saturating_duration_since(ready);
        assert!(
            late <= MARGIN,
            "missed pop {} came {late:?} after /ready",
            p.sequence
        );
    }
}

/// 200 one-shots due `interval` s after their create, each its own
/// request (its own batch); a quarter of them deleted.
fn create_some(node: &Node, sink: &Sink, interval: &str) -> Ledger {
    let ids = create_each(node, sink, "k", 200, interval);
    let mut ledger = Ledger::default();
    for (i, id) in ids.iter().enumerate() {
        let path = format!("/k/{i}");
        if i % 4 == 3 {
            delete(node, id);
            ledger.deleted.insert(path);
        } else {
            ledger.live.insert(path);
        }
    }
    ledger
}

/// Item 5, fourth case. After a `kill -9`, 4 KiB of garbage right after
/// the written end of every log file (the zeros of the preallocated
/// segment, or the file's end). The load is far below a segment, so each
/// file is its shard's last segment: the garbage is a torn tail.
#[test]
fn garbage_after_the_end_of_every_log_is_cut_and_nothing_is_lost() {
    let store = Store::new("torn");
    let sink = Sink::start(Behaviour::Ok);
    let port = free_port();
    let config = store.config(2, "");
    let (mut node, _) = start_ready(port, &config);
    let ledger = create_some(&node, &sink, "8");
    node.kill9();
    let files = store.wal_files();
    assert!(!files.is_empty(), "log files under {:?}", store.dir);
    let mut written_per_dir: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for f in &files {
        let end = written_end(&std::fs::read(f).unwrap());
        *written_per_dir
            .entry(f.parent().unwrap().into())
            .or_default() += (end > 0) as usize;
        write_at(f, end as u64, &garbage(4096));
    }
    assert!(
        written_per_dir.values().all(|&n| n <= 1),
        "premise: one written segment per shard: {written_per_dir:?}"
    );
    let (node, _) = start_ready(port, &config);
    assert!(node.metric("chronos_storage_torn_tails_total") >= 1.0);
    assert_eq!(node.metric("chronos_storage_corrupt_records_total"), 0.0);
    let pops = settle(&sink, &[&node], &ledger, Duration::from_secs(15));
    assert!(pops.values().all(|l| l.len() == 1), "each pops once");
}

/// Item 5, fifth case. 200 timers, each its own batch, on one shard;
/// after a `kill -9` a record in the middle of the log is damaged. The
/// start must stop, naming the file and the offset, and keep the log as
/// it is; with `on-corruption = "skip"` it starts and recovers the
/// batches after the damage too, not only those before it (a recovery
/// that stopped at the damage would keep about half: at least 3/4 must
/// pop).
#[test]
fn a_corrupt_record_in_the_middle_stops_the_start_or_is_skipped() {
    let store = Store::new("corrupt");
    let sink = Sink::start(Behaviour::Ok);
    let port = free_port();
    let config = store.config(1, "");
    let (mut node, _) = start_ready(port, &config);
    let long = "y".repeat(200);
    for i in 0..200 {
        node.create(&timer_body(
            "12",
            None,
            &sink.uri(&format!("/c/{i}")),
            &long,
        ));
    }
    node.kill9();
    let file = store
        .wal_files()
        .into_iter()
        .max_by_key(|f| written_end(&std::fs::read(f).unwrap()))
        .expect("a log file");
    let offset = corrupt_middle(&file);
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    let mut bad = Node::spawn_in(None, LOCAL, port, &config, &[]);
    let status = wait_until("the start to stop", READY_WITHIN, || {
        if let Some(status) = bad.child.try_wait().unwrap() {
            return Ok(status);
        }
        match try_request(bad.addr, "GET", "/ready", &[], b"") {
            Ok(r) if r.status == 200 => panic!("ready on {name} damaged at {offset}"),
            _ => Err("running".to_string()),
        }
    });
    let log = bad.log_text();
    assert!(!status.success(), "a failed start exits non-zero:\n{log}");
    assert!(
        log.contains(&name) && log.contains("offset"),
        "names {name} and the offset:\n{log}"
    );
    drop(bad);
    let skip = store.config(1, "on-corruption = \"skip\"\n");
    let (node, _) = start_ready(port, &skip);
    assert!(node.metric("chronos_storage_corrupt_records_total") >= 1.0);
    let ledger = Ledger {
        unsure: (0..200).map(|i| format!("/c/{i}")).collect(),
        ..Ledger::default()
    };
    wait_until(
        "the recovered timers to pop",
        Duration::from_secs(20),
        || match by_path(&sink.pops()).len() {
            n if n >= 150 => Ok(()),
            n => Err(format!("{n} of 200 popped")),
        },
    );
    let pops = settle(&sink, &[&node], &ledger, IDLE_WITHIN);
    assert!(
        pops.values().all(|l| l.iter().all(|p| p.body == long)),
        "bodies intact"
    );
}

/// Item 5, sixth case. 100 timers on 2 shards; a clean stop; a start with
/// 1 shard; 30 of them deleted after it, by the IDs answered before.
#[test]
fn a_start_with_fewer_cores_keeps_every_timer_and_its_deletes() {
    let store = Store::new("cores");
    let sink = Sink::start(Behaviour::Ok);
    let port = free_port();
    let (node, _) = start_ready(port, &store.config(2, ""));
    let ids = create_each(&node, &sink, "s", 100, "8");
    assert!(node.terminate().success(), "a clean stop");
    let (node, _) = start_ready(port, &store.config(1, ""));
    let mut ledger = Ledger::default();
    for (i, id) in ids.iter().enumerate() {
        let path = format!("/s/{i}");
        if i % 10 < 3 {
            delete(&node, id);
            ledger.deleted.insert(path);
        } else {
            ledger.live.insert(path);
        }
    }
    let pops = settle(&sink, &[&node], &ledger, Duration::from_secs(15));
    assert!(pops.values().all(|l| l.len() == 1), "each pops once");
}

/// The compaction load: 4 clients, up to 20,000 creates with a 1 KiB body
/// in 12 s, 9 of 10 deleted; all due at `due`. The ledger, and the largest
/// total size of the `.wal` files seen while it ran.
fn compaction_load(node: &Node, sink: &Sink, store: &Store, due: Instant) -> (Ledger, u64) {
    let load = Load {
        creates: 5000,
        within: Duration::from_secs(12),
        delete: (9, 10),
        opaque: 1024,
        ..Load::new(node, sink, Due::At(due))
    };
    let control = Control::default();
    let handles = load.spawn(&control);
    let mut peak = 0;
    while !handles.iter().all(|h| h.is_finished()) {
        peak = peak.max(store.wal_bytes());
        std::thread::sleep(Duration::from_millis(20));
    }
    let acked = control.acked.load(Ordering::Relaxed);
    let ledger = ledger_of(handles);
    println!(
        "compaction load: {acked} creates acknowledged, {} live",
        ledger.live.len()
    );
    (ledger, peak)
}

/// Item 5, eighth case. 1 MiB segments and compaction from 1 MiB: a load
/// of several MiB snapshots and deletes covered segments, so the `.wal`
/// files hold far less than the log wrote; a clean restart then loses
/// nothing.
#[test]
fn compaction_under_load_shrinks_the_log_and_loses_nothing() {
    let store = Store::new("compact");
    let sink = Sink::start(Behaviour::Ok);
    let port = free_port();
    let config = store.config(2, COMPACT);
    let (node, _) = start_ready(port, &config);
    let due = Instant::now() + Duration::from_secs(24);
    let (ledger, peak) = compaction_load(&node, &sink, &store, due);
    let written = (ledger.live.len() + ledger.deleted.len()) * 1024;
    assert!(
        written >= 3 << 20,
        "the load wrote several MiB: {written} bytes of bodies"
    );
    // Compaction may keep pace with the load (the files never grow past a
    // few segments), so "smaller" is against what the log has written:
    // without deletion the `.wal` files would hold all of it.
    wait_until(
        "a snapshot and a log smaller than what it wrote",
        Duration::from_secs(20),
        || {
            let snapshots = node.metric("chronos_storage_snapshots_total");
            let written = node.metric("chronos_storage_bytes_total") as u64;
            let now = store.wal_bytes();
            match snapshots >= 1.0 && now * 2 < written && now <= peak {
                true => Ok(()),
                false => Err(format!(
                    "{snapshots} snapshots, .wal {now} bytes (peak {peak}), {written} bytes written"
                )),
            }
        },
    );
    assert!(!store.files(".snap").is_empty(), "a snapshot file");
    assert!(node.metric("chronos_storage_snapshot_duration_seconds_count") >= 1.0);
    assert!(node.terminate().success(), "a clean stop");
    // Every rotation took a segment made ahead; the next is there, one per
    // shard, allocated whole. A spare left with garbage (a crash while it
    // was filled) never enters the log.
    let spares = store.files("log-spare.tmp");
    assert_eq!(spares.len(), 2, "a spare per shard: {spares:?}");
    for spare in &spares {
        assert_eq!(std::fs::metadata(spare).unwrap().len(), 1 << 20);
        write_at(spare, 0, &garbage(1 << 20));
    }
    let (node, _) = start_ready(port, &config);
    let left = due.saturating_duration_since(Instant::now());
    settle(&sink, &[&node], &ledger, left + Duration::from_secs(15));
}

/// Item 5, ninth case. As the compaction test, with the fault hook: the
/// node exits by itself right after its first snapshot is renamed into
/// place (and the directory synced), before it deletes the segments the
/// snapshot covers. A start without the hook loses nothing acknowledged
/// and brings back no acknowledged delete.
#[test]
fn a_crash_between_snapshot_and_segment_deletion_loses_nothing() {
    let store = Store::new("fault");
    let sink = Sink::start(Behaviour::Ok);
    let port = free_port();
    let config = store.config(2, COMPACT);
    let fault = [("CHRONOS_TEST_FAULT", "after-snapshot-rename")];
    let mut node = Node::start_env(LOCAL, port, &config, &fault);
    node.wait_ready_200(Duration::from_secs(20));
    let due = Instant::now() + Duration::from_secs(20);
    let load = Load {
        creates: 5000,
        within: Duration::from_secs(12),
        delete: (9, 10),
        opaque: 1024,
        ..Load::new(&node, &sink, Due::At(due))
    };
    let control = Control::default();
    let handles = load.spawn(&control);
    let exited = node.wait_exit(Duration::from_secs(20));
    control.stop.store(true, Ordering::Relaxed);
    let ledger = ledger_of(handles);
    assert!(
        exited.is_some(),
        "the node stopped at its first snapshot:\n{}",
        node.log_text()
    );
    assert!(!store.files(".snap").is_empty(), "the snapshot is in place");
    assert!(sink.pops().is_empty(), "nothing was due before the crash");
    drop(node);
    let (node, _) = start_ready(port, &config);
    let left = due.saturating_duration_since(Instant::now());
    settle(&sink, &[&node], &ledger, left + Duration::from_secs(15));
}
