//! The durable log's recovery at its edges, from a review of issue 21's
//! log (findings F1 to F4): a tag name cut mid character (255 bytes) in a
//! record and in a snapshot, compaction while repeating timers pop and
//! are updated and deleted then `kill -9`, and a `SIGTERM` during
//! `DELETE`s forwarded between shards. Every acknowledged change holds
//! after the restart. The rest of the log's tests are in `durable.rs`.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const LOCAL: &str = "127.0.0.1";
const COMPACT: &str = "segment-bytes = 1048576\ncompact-log-bytes = 1048576\n";

fn dir(name: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!("chronos-review-{name}-{nanos}"));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn config(d: &Path, cores: usize, more: &str) -> String {
    format!(
        "[runtime]\ncores = {cores}\n[storage]\npath = \"{}\"\n{more}",
        d.display()
    )
}

fn start(port: u16, cfg: &str) -> Node {
    let node = Node::start_at(LOCAL, port, cfg);
    node.wait_ready_200(Duration::from_secs(30));
    node
}

/// A tag type of 256 bytes (accepted: "1 to 256 characters") whose 255th
/// byte is inside a two-byte UTF-8 character.
fn split_tag() -> String {
    format!("{}é", "a".repeat(254))
}

fn tagged_body(uri: &str, interval: &str, tag: &str) -> String {
    format!(
        r#"{{"timing":{{"interval":{interval}}},"callback":{{"http":{{"uri":"{uri}","opaque":"x"}}}},"statistics":{{"tag-info":[{{"type":"{tag}","count":1}}]}}}}"#
    )
}

/// F1: record::put cuts a tag name to 255 bytes, mid character; replay's
/// `image()` then refuses the PUT and the acknowledged timer is gone.
#[test]
fn review_tag_cut_mid_utf8_loses_timer_after_restart() {
    let d = dir("tag");
    let sink = Sink::start(Behaviour::Ok);
    let port = free_port();
    let cfg = config(&d, 1, "");
    let node = start(port, &cfg);
    let r = node.request(
        "POST",
        "/timers",
        &tagged_body(&sink.uri("/tagged"), "5", &split_tag()),
    );
    println!("POST tagged: {} {}", r.status, r.text());
    assert_eq!(r.status, 200);
    node.create(&timer_body("5", None, &sink.uri("/plain"), "x"));
    assert!(node.terminate().success());
    let node = start(port, &cfg);
    println!(
        "replayed records: {}",
        node.metric("chronos_storage_replayed_records_total")
    );
    let pops = sink.wait_for(2, Duration::from_secs(12));
    let paths: BTreeSet<String> = pops.iter().map(|p| p.path.clone()).collect();
    println!("popped after restart: {paths:?}");
    drop(node);
    assert!(
        paths.contains("/tagged"),
        "acknowledged tagged timer lost: {paths:?}"
    );
}

/// F1b: the same timer in a snapshot: the snapshot does not read back.
#[test]
fn review_tag_cut_mid_utf8_in_a_snapshot_refuses_the_start() {
    let d = dir("tagsnap");
    let sink = Sink::start(Behaviour::Ok);
    let port = free_port();
    let cfg = config(&d, 1, COMPACT);
    let node = start(port, &cfg);
    let r = node.request(
        "POST",
        "/timers",
        &tagged_body(&sink.uri("/tagged"), "120", &split_tag()),
    );
    assert_eq!(r.status, 200);
    let mut plain = 0;
    let opaque = "z".repeat(1024);
    while node.metric("chronos_storage_snapshots_total") < 1.0 && plain < 5000 {
        node.create(&timer_body(
            "120",
            None,
            &sink.uri(&format!("/p/{plain}")),
            &opaque,
        ));
        plain += 1;
    }
    println!(
        "{plain} plain timers, snapshots {}",
        node.metric("chronos_storage_snapshots_total")
    );
    assert!(node.terminate().success());
    let mut again = Node::spawn_in(None, LOCAL, port, &cfg, &[]);
    let exited = again.wait_exit(Duration::from_secs(15));
    let log = again.log_text();
    let tail: Vec<&str> = log.lines().rev().take(3).collect();
    println!("restart exited: {exited:?}; log tail: {tail:?}");
    assert!(exited.is_none(), "the restart refused to start: {tail:?}");
}

/// F3 probe: snapshots while repeating timers pop (slow callbacks, so
/// pops are in flight and held), updated and deleted; then kill -9. Every
/// repeating timer must reach its last sequence; no deleted/updated-away
/// path may pop after the restart.
#[test]
fn review_compaction_during_pops_updates_deletes_then_kill9() {
    let d = dir("compact-pops");
    let sink = Sink::start(Behaviour::Slow(Duration::from_millis(300)));
    let port = free_port();
    let cfg = config(&d, 1, COMPACT);
    let mut node = start(port, &cfg);
    let n = 300;
    let pops_each = 25u32;
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(node.create(&timer_body(
            "1",
            Some(&pops_each.to_string()),
            &sink.uri(&format!("/rep/{i}")),
            "rep",
        )));
    }
    // Filler load: far-future timers with 1 KiB bodies (snapshots).
    let stop = Arc::new(AtomicBool::new(false));
    let filler = {
        let (addr, uri, stop) = (node.addr, sink.uri("/fill"), stop.clone());
        std::thread::spawn(move || {
            let opaque = "f".repeat(1024);
            let mut k = 0;
            while !stop.load(Ordering::Relaxed) {
                let _ = try_request(
                    addr,
                    "POST",
                    "/timers",
                    &[],
                    timer_body("600", None, &format!("{uri}/{k}"), &opaque).as_bytes(),
                );
                k += 1;
            }
        })
    };
    let mut gone: BTreeMap<String, Instant> = BTreeMap::new();
    let mut want: BTreeSet<String> = (0..n).map(|i| format!("/rep/{i}")).collect();
    let t0 = Instant::now();
    let mut i = 0;
    while t0.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(100));
        let victim = i * 7 % n;
        i += 1;
        let old = format!("/rep/{victim}");
        if !want.contains(&old) {
            continue;
        }
        if i % 2 == 0 {
            let r = node.request("DELETE", &format!("/timers/{}", ids[victim]), "");
            if r.status == 200 {
                want.remove(&old);
                gone.insert(old, Instant::now());
            }
        } else {
            let new = format!("/upd/{victim}");
            let body = timer_body("1", Some(&pops_each.to_string()), &sink.uri(&new), "upd");
            let r = node.request("PUT", &format!("/timers/{}", ids[victim]), &body);
            if r.status == 200 {
                want.remove(&old);
                gone.insert(old, Instant::now());
                want.insert(new);
            }
        }
    }
    let snaps = node.metric("chronos_storage_snapshots_total");
    node.kill9();
    stop.store(true, Ordering::Relaxed);
    let _ = filler.join();
    let killed = Instant::now();
    println!(
        "snapshots before the kill: {snaps}; {} live, {} gone",
        want.len(),
        gone.len()
    );
    let node = start(port, &cfg);
    // At least 10 s (a deleted timer brought back pops within them), then
    // until every live timer reached its last pop: a loaded machine drains
    // the restart's overdue pops slower than they fell due.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(pops_each as u64 + 60);
    let all_done = || {
        let pops = sink.pops();
        want.iter()
            .all(|w| pops.iter().any(|p| &p.path == w && p.sequence >= pops_each))
    };
    while started.elapsed() < Duration::from_secs(10) || !all_done() {
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let pops = sink.pops();
    let mut last: BTreeMap<String, u32> = BTreeMap::new();
    let mut undone = Vec::new();
    for p in &pops {
        if p.path.starts_with("/fill") {
            continue;
        }
        let e = last.entry(p.path.clone()).or_default();
        *e = (*e).max(p.sequence);
        if let Some(at) = gone.get(&p.path) {
            if p.at > killed + Duration::from_millis(1) && p.at > *at {
                undone.push((p.path.clone(), p.sequence));
            }
        }
    }
    let short: Vec<(String, u32)> = want
        .iter()
        .filter(|p| last.get(*p).copied().unwrap_or(0) < pops_each)
        .map(|p| (p.clone(), last.get(p).copied().unwrap_or(0)))
        .collect();
    println!(
        "never reached seq {pops_each}: {} e.g. {:?}",
        short.len(),
        &short[..short.len().min(8)]
    );
    println!(
        "undone after restart: {} e.g. {:?}",
        undone.len(),
        &undone[..undone.len().min(8)]
    );
    drop(node);
    assert!(short.is_empty() && undone.is_empty());
}

/// F4 probe: SIGTERM during forwarded DELETEs (each DELETE on a fresh
/// connection, so about half land on the non-owner shard and go over the
/// mesh). An acknowledged DELETE must not pop after the restart.
#[test]
fn review_sigterm_during_forwarded_deletes() {
    let d = dir("sigterm-fwd");
    let sink = Sink::start(Behaviour::Ok);
    let port = free_port();
    let cfg = config(&d, 2, "");
    for round in 0..3 {
        let node = start(port, &cfg);
        let addr = node.addr;
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..16)
            .map(|t| {
                let (stop, uri) = (stop.clone(), sink.uri(""));
                std::thread::spawn(move || {
                    let mut deleted = Vec::new();
                    let mut k = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let path = format!("/r{round}/t{t}/{k}");
                        k += 1;
                        let Ok(r) = try_request(
                            addr,
                            "POST",
                            "/timers",
                            &[],
                            timer_body("10", None, &format!("{uri}{path}"), "x").as_bytes(),
                        ) else {
                            break;
                        };
                        if r.status != 200 {
                            continue;
                        }
                        let id = r.location_id();
                        match try_request(addr, "DELETE", &format!("/timers/{id}"), &[], b"") {
                            Ok(r) if r.status == 200 => deleted.push(path),
                            Ok(_) => {}
                            Err(_) => break,
                        }
                    }
                    deleted
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1500));
        node.signal(libc::SIGTERM);
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        let deleted: BTreeSet<String> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let mut node = node;
        let _ = node.wait_exit(Duration::from_secs(15));
        println!("round {round}: {} acknowledged deletes", deleted.len());
        let node = start(port, &cfg);
        std::thread::sleep(Duration::from_secs(12));
        let undone: Vec<String> = sink
            .pops()
            .into_iter()
            .map(|p| p.path)
            .filter(|p| deleted.contains(p))
            .collect();
        println!(
            "round {round}: undone deletes {} e.g. {:?}",
            undone.len(),
            &undone[..undone.len().min(5)]
        );
        assert!(undone.is_empty());
        assert!(node.terminate().success());
    }
}
