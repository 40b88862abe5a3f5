//! Issue 38: storage faults are loud. A node whose timer log cannot write
//! (a segment made immutable with `chattr +i`, standing in for EIO; a full
//! tmpfs at the next segment) pops nothing and acknowledges nothing more,
//! says so, and exits non-zero; every change it answered survives, no
//! deleted timer pops, and no live timer pops twice.
//!
//! Needs root (`chattr`, `mount -t tmpfs`), as the net split tests do.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A fresh directory under the temp dir; its files made mutable again and
/// removed when dropped (kept if the test failed).
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "chronos-faults-{}-{name}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = Command::new("chattr")
            .arg("-R")
            .arg("-i")
            .arg(&self.0)
            .status();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn wal_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            wal_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "wal") {
            out.push(path);
        }
    }
}

/// Run `cmd` with `args`; fail unless it exits 0.
fn run_ok(cmd: &str, args: &[&str]) {
    let status = Command::new(cmd).args(args).status().unwrap();
    assert!(status.success(), "{cmd} {args:?}: {status:?}");
}

/// A timer body for the path `path` of `sink`.
fn sink_body(interval: u64, path: &str, sink: &Sink, opaque: &str) -> String {
    timer_body(&interval.to_string(), None, &sink.uri(path), opaque)
}

/// Reproduction 1: B's segments are made unwritable and B is restarted.
/// B must not run on from memory (it answered `/ready` 200, popped the
/// timers deleted through A, and popped the others again): it stops,
/// non-zero, naming the file, the operation and the OS error.
#[test]
fn a_node_whose_log_cannot_be_written_stops_and_pops_nothing() {
    let port = cluster_port(2);
    let dirs = [Dir::new("a"), Dir::new("b")];
    let config = |i: usize| {
        let storage = format!("[storage]\npath = \"{}\"\n", dirs[i - 1].0.display());
        cluster_config(2, i, port, 1, &storage)
    };
    let a = Node::start_at("127.0.0.1", port, &config(1));
    let b = Node::start_at("127.0.0.2", port, &config(2));
    let sink = Sink::start(Behaviour::Ok);
    let ids: Vec<String> = (0..20)
        .map(|i| a.create(&sink_body(8, &format!("/t/{i}"), &sink, "x")))
        .collect();
    let created = Instant::now();
    a.wait_replication_settled(Duration::from_secs(10));
    assert!(b.terminate().success());
    let mut wals = Vec::new();
    wal_files(&dirs[1].0, &mut wals);
    assert!(!wals.is_empty(), "B has log segments");
    for wal in &wals {
        run_ok("chattr", &["+i", wal.to_str().unwrap()]);
    }
    let mut b = Node::spawn_in(None, "127.0.0.2", port, &config(2), &[]);
    let status = b.wait_exit(Duration::from_secs(20));
    let log = b.log_text();
    let status = status.unwrap_or_else(|| panic!("B runs on with a failed log:\n{log}"));
    assert!(!status.success(), "B exits non-zero: {status:?}");
    assert!(log.contains("the timer log failed"), "{log}");
    assert!(log.contains(".wal"), "the file is named:\n{log}");
    assert!(
        log.contains("Operation not permitted"),
        "the OS error:\n{log}"
    );
    for id in &ids[..10] {
        let r = a.request("DELETE", &format!("/timers/{id}"), "");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(
        created.elapsed() < Duration::from_secs(8),
        "deleted before due"
    );
    wait_pops_done(&[&a], Duration::from_secs(30));
    let pops = sink.pops();
    let deleted: Vec<&Pop> = pops
        .iter()
        .filter(|p| p.path[3..].parse::<usize>().unwrap() < 10)
        .collect();
    assert!(deleted.is_empty(), "deleted timers popped: {deleted:?}");
    for i in 10..20 {
        let n = pops.iter().filter(|p| p.path == format!("/t/{i}")).count();
        assert_eq!(n, 1, "/t/{i} pops once (by A)");
    }
}

/// A small tmpfs mounted at a fresh directory; unmounted when dropped.
struct Tmpfs(Dir);

impl Tmpfs {
    fn mount(name: &str, bytes: u64) -> Tmpfs {
        let dir = Dir::new(name);
        let size = format!("size={bytes}");
        run_ok(
            "mount",
            &["-t", "tmpfs", "-o", &size, "tmpfs", dir.0.to_str().unwrap()],
        );
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0 .0).status();
    }
}

/// A full disk meets the log at its next segment: `fallocate` fails. The
/// node stops there (it ran on from memory before, popping what it could
/// no longer log), and every create it answered is back after a restart.
/// No reserve here (`free-bytes-min = 0`): the disk fills up behind it.
#[test]
fn a_full_disk_stops_the_node_and_loses_no_answered_change() {
    let fs = Tmpfs::mount("full", 6 << 20);
    let store = fs.0 .0.join("store");
    // Room for the first segment (1 MiB) and a little more, not a second.
    let filler = fs.0 .0.join("filler");
    run_ok("fallocate", &["-l", "4608K", filler.to_str().unwrap()]);
    let config = format!(
        "[runtime]\ncores = 1\n[storage]\npath = \"{}\"\nsegment-bytes = 1048576\ncompact-log-bytes = 1073741824\nfree-bytes-min = 0\n",
        store.display()
    );
    let port = free_port();
    let mut node = Node::start_at("127.0.0.1", port, &config);
    let sink = Sink::start(Behaviour::Ok);
    let mut answered = Vec::new();
    let started = Instant::now();
    for i in 0..2000 {
        let Ok(r) = try_request(
            node.addr,
            "POST",
            "/timers",
            &[],
            sink_body(30, &format!("/f/{i}"), &sink, "f").as_bytes(),
        ) else {
            break;
        };
        match r.status {
            200 => answered.push(i),
            503 => {}
            other => panic!("{other}: {}", r.text()),
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no fault within 60 s"
        );
    }
    let status = node.wait_exit(Duration::from_secs(20));
    let log = node.log_text();
    let status = status.unwrap_or_else(|| panic!("the node runs on with a full disk:\n{log}"));
    assert!(!status.success(), "exits non-zero: {status:?}");
    assert!(log.contains("fallocate"), "the operation is named:\n{log}");
    assert!(
        log.contains("No space left on device"),
        "the OS error:\n{log}"
    );
    assert!(answered.len() > 100, "only {} answered", answered.len());
    std::fs::remove_file(&filler).unwrap();
    let node = Node::start_at("127.0.0.1", port, &config);
    node.wait_ready_200(Duration::from_secs(30));
    let pending = node.metric("chronos_timers_pending");
    assert!(
        pending >= answered.len() as f64,
        "{pending} timers after the restart, {} answered",
        answered.len()
    );
}

/// Reproduction 3: `sync = "none"` promises that a crash of the process
/// alone loses nothing answered. The log writes with O_DIRECT from the
/// process's own buffer, so an answer given before the write left the
/// process with it (all 300 lost with `group-commit-us = 1000000`).
#[test]
fn sync_none_loses_nothing_answered_to_a_kill_9() {
    let dir = Dir::new("none");
    let config = format!(
        "[runtime]\ncores = 1\n[storage]\npath = \"{}\"\nsync = \"none\"\ngroup-commit-us = 1000000\n",
        dir.0.display()
    );
    let port = free_port();
    let mut node = Node::start_at("127.0.0.1", port, &config);
    node.wait_ready_200(Duration::from_secs(20));
    let sink = Sink::start(Behaviour::Ok);
    for i in 0..300 {
        node.create(&sink_body(600, &format!("/n/{i}"), &sink, "n"));
    }
    node.kill9();
    let node = Node::start_at("127.0.0.1", port, &config);
    node.wait_ready_200(Duration::from_secs(20));
    assert_eq!(
        node.metric("chronos_timers_pending"),
        300.0,
        "every answered create is back"
    );
}

/// Item 3: a full disk is met before it happens. Below `free-bytes-min`
/// creates and updates get `503 storage full`, while deletes and pops go
/// on and the node stays up; once space comes back, creates are taken.
#[test]
fn below_the_reserve_creates_are_refused_and_deletes_and_pops_go_on() {
    let fs = Tmpfs::mount("reserve", 8 << 20);
    let store = fs.0 .0.join("store");
    let config = format!(
        "[runtime]\ncores = 1\n[storage]\npath = \"{}\"\nsegment-bytes = 1048576\nfree-bytes-min = 3145728\n",
        store.display()
    );
    let port = free_port();
    let node = Node::start_at("127.0.0.1", port, &config);
    node.wait_ready_200(Duration::from_secs(20));
    let sink = Sink::start(Behaviour::Ok);
    let ids: Vec<String> = (0..20)
        .map(|i| node.create(&sink_body(600, &format!("/r/{i}"), &sink, "r")))
        .collect();
    let soon = node.create(&sink_body(3, "/soon", &sink, "s"));
    // Leave about 2 MiB free: below the reserve, above what a write needs.
    let filler = fs.0 .0.join("filler");
    let free = node.metric("chronos_storage_free_bytes") as u64;
    let fill = format!("{}", free.saturating_sub(2 << 20));
    run_ok("fallocate", &["-l", &fill, filler.to_str().unwrap()]);
    let refused = wait_until("a create refused", Duration::from_secs(10), || {
        let r = node.request("POST", "/timers", &sink_body(600, "/x", &sink, "x"));
        match r.status {
            503 => Ok(r.text()),
            s => Err(format!("{s}")),
        }
    });
    assert!(refused.contains("storage full"), "{refused}");
    let r = node.request(
        "PUT",
        &format!("/timers/{}", ids[0]),
        &sink_body(600, "/u", &sink, "u"),
    );
    assert_eq!(r.status, 503, "an update too: {}", r.text());
    for id in &ids[..10] {
        let r = node.request("DELETE", &format!("/timers/{id}"), "");
        assert_eq!(r.status, 200, "a delete goes on: {}", r.text());
    }
    let pops = sink.wait_for(1, Duration::from_secs(10));
    assert_eq!(pops.len(), 1, "a pop goes on");
    assert_eq!(pops[0].path, "/soon", "{soon}");
    std::fs::remove_file(&filler).unwrap();
    wait_until("a create taken again", Duration::from_secs(10), || {
        let r = node.request("POST", "/timers", &sink_body(600, "/y", &sink, "y"));
        match r.status {
            200 => Ok(()),
            s => Err(format!("{s} {}", r.text())),
        }
    });
    assert_eq!(node.metric("chronos_storage_failed"), 0.0, "not a failure");
}
