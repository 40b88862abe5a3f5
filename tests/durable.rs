//! Issue 21 item 5: the durable per-shard log (`[storage]`), tried with
//! real processes, real sockets and real files. Each test was written
//! before the log and seen failing (the node refused `[storage]`).
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
//! - three nodes (rf 2) killed at once and restarted: every timer pops,
//!   duplicates at most 1 %;
//! - compaction under load: the log shrinks, a restart loses nothing;
//! - a crash between a snapshot's rename and the deletion of the segments
//!   it covers (`CHRONOS_TEST_FAULT=after-snapshot-rename`) loses nothing.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const READY_WITHIN: Duration = Duration::from_secs(20);
const IDLE_WITHIN: Duration = Duration::from_secs(20);
/// Lateness allowed on top of a schedule on a loaded 2-core machine
/// (the tests of this file run in parallel, some of them under load).
const MARGIN: Duration = Duration::from_millis(1500);
/// Write batches start on this boundary (the log's block).
const BLOCK: usize = 4096;
/// Small segments and an early snapshot, so that a load of a few MiB
/// compacts several times.
const COMPACT: &str = "segment-bytes = 1048576\ncompact-log-bytes = 1048576\n";
const LOCAL: &str = "127.0.0.1";

/// A fresh storage directory under the temp dir; removed when dropped,
/// unless the test failed (kept to be looked at; its path is printed).
struct Store {
    dir: PathBuf,
}

impl Store {
    fn new(name: &str) -> Store {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "chronos-durable-{}-{name}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Store { dir }
    }

    /// `[storage]` with this directory and `more` keys of that section.
    fn section(&self, more: &str) -> String {
        format!("[storage]\npath = \"{}\"\n{more}", self.dir.display())
    }

    /// A single node's config: `cores` shards, the log here.
    fn config(&self, cores: usize, more: &str) -> String {
        format!("[runtime]\ncores = {cores}\n{}", self.section(more))
    }

    /// Every `*.wal` file under the directory, sorted by path.
    fn files(&self, suffix: &str) -> Vec<PathBuf> {
        let mut out = Vec::new();
        walk(&self.dir, suffix, &mut out);
        out.sort();
        out
    }

    fn wal_files(&self) -> Vec<PathBuf> {
        self.files(".wal")
    }

    /// The total size of the `.wal` files (nothing else counted).
    fn wal_bytes(&self) -> u64 {
        self.wal_files()
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("storage kept for a look: {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn walk(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, suffix, out);
        } else if path.to_string_lossy().ends_with(suffix) {
            out.push(path);
        }
    }
}

/// Where the written part of a log file ends: the block boundary after
/// its last non-zero byte (0 if the file is all zeros). Batches are
/// written in whole blocks, so a record's own trailing zeros are inside.
fn written_end(bytes: &[u8]) -> usize {
    match bytes.iter().rposition(|&b| b != 0) {
        Some(last) => (last + 1).next_multiple_of(BLOCK).min(bytes.len()),
        None => 0,
    }
}

/// `n` pseudo-random bytes, none of them zero.
fn garbage(n: usize) -> Vec<u8> {
    let mut x = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x as u8) | 1
        })
        .collect()
}

/// Start (or restart: same port, same config) a node and wait until it
/// answers `/ready` with 200; when it did.
fn start_ready(port: u16, config: &str) -> (Node, Instant) {
    let node = Node::start_at(LOCAL, port, config);
    let ready = node.wait_ready_200(READY_WITHIN);
    (node, ready)
}

fn sample<T: std::fmt::Debug>(items: &[T]) -> String {
    format!("{:?}", &items[..items.len().min(5)])
}

/// What the client knows of each timer (by callback path).
#[derive(Default, Debug)]
struct Ledger {
    /// Acknowledged creates with no delete sent: each must pop.
    live: BTreeSet<String>,
    /// Acknowledged deletes: none may pop.
    deleted: BTreeSet<String>,
    /// A request the kill cut, or refused: may pop or not.
    unsure: BTreeSet<String>,
}

/// Wait until every live timer of `ledger` popped, then until the nodes
/// can pop nothing more; check that no deleted timer popped and no pop
/// came for a path never sent. The pops, by path.
fn settle(
    sink: &Sink,
    nodes: &[&Node],
    ledger: &Ledger,
    within: Duration,
) -> BTreeMap<String, Vec<Pop>> {
    wait_until("every acknowledged live timer to pop", within, || {
        let seen = by_path(&sink.pops());
        let missing: Vec<&String> = ledger
            .live
            .iter()
            .filter(|p| !seen.contains_key(*p))
            .collect();
        match missing.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "{} of {} not popped, e.g. {}",
                missing.len(),
                ledger.live.len(),
                sample(&missing)
            )),
        }
    });
    wait_idle(nodes, IDLE_WITHIN);
    let pops = by_path(&sink.pops());
    let undone: Vec<&String> = ledger
        .deleted
        .iter()
        .filter(|p| pops.contains_key(*p))
        .collect();
    assert!(
        undone.is_empty(),
        "{} acknowledged deletes undone (they popped), e.g. {}",
        undone.len(),
        sample(&undone)
    );
    let known = |p: &String| {
        ledger.live.contains(p) || ledger.deleted.contains(p) || ledger.unsure.contains(p)
    };
    let strange: Vec<&String> = pops.keys().filter(|p| !known(p)).collect();
    assert!(strange.is_empty(), "pops never asked for: {strange:?}");
    pops
}

/// A keep-alive client connection.
struct Conn {
    addr: SocketAddr,
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Option<Conn> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        Some(Conn {
            addr,
            writer: s.try_clone().ok()?,
            reader: BufReader::new(s),
        })
    }

    fn send(&mut self, method: &str, path: &str, body: &str) -> std::io::Result<Response> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        self.writer.write_all(format!("{head}{body}").as_bytes())?;
        read_response(&mut self.reader)
    }
}

/// When a load's timers are due.
#[derive(Clone, Copy)]
enum Due {
    /// This many seconds after each create.
    After(f64),
    /// All at this instant (at least 0.5 s after the create).
    At(Instant),
}

impl Due {
    fn interval(self) -> String {
        match self {
            Due::After(s) => format!("{s}"),
            Due::At(at) => {
                let left = at.saturating_duration_since(Instant::now());
                format!("{:.3}", left.as_secs_f64().max(0.5))
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Live,
    Deleted,
    Unsure,
}

/// A concurrent create/delete load: `threads` clients, each on its own
/// keep-alive connection, each making at most `creates` timers within
/// `within`. After create `k`, create `k - 1` is deleted when
/// `(k - 1) % delete.1 < delete.0`. A client stops at its limits, when
/// told to, or when the node no longer takes connections.
#[derive(Clone)]
struct Load {
    addr: SocketAddr,
    uri: String,
    threads: usize,
    creates: usize,
    within: Duration,
    delete: (usize, usize),
    opaque: usize,
    due: Due,
}

/// A load's shared counter of acknowledged creates and its stop flag.
#[derive(Clone, Default)]
struct Control {
    acked: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

type Outcomes = Vec<(String, State)>;

impl Load {
    fn new(node: &Node, sink: &Sink, due: Due) -> Load {
        Load {
            addr: node.addr,
            uri: sink.uri(""),
            threads: 4,
            creates: 1000,
            within: Duration::from_secs(10),
            delete: (1, 3),
            opaque: 16,
            due,
        }
    }

    fn spawn(&self, control: &Control) -> Vec<JoinHandle<Outcomes>> {
        (0..self.threads)
            .map(|t| {
                let (load, control) = (self.clone(), control.clone());
                std::thread::spawn(move || load.client(t, &control))
            })
            .collect()
    }

    fn client(&self, t: usize, control: &Control) -> Outcomes {
        let deadline = Instant::now() + self.within;
        let mut conn: Option<Conn> = None;
        let mut out: Vec<(String, State, Option<String>)> = Vec::new();
        for k in 0..self.creates {
            if control.stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                break;
            }
            let path = format!("/t{t}/{k}");
            let opaque = format!("{k:08}{}", "x".repeat(self.opaque.saturating_sub(8)));
            let body = timer_body(
                &self.due.interval(),
                None,
                &format!("{}{path}", self.uri),
                &opaque,
            );
            let Some(r) = exchange(&mut conn, self.addr, "POST", "/timers", &body) else {
                out.push((path, State::Unsure, None));
                break;
            };
            match r {
                Ok(r) if r.status == 200 => {
                    control.acked.fetch_add(1, Ordering::Relaxed);
                    out.push((path, State::Live, Some(r.location_id())));
                }
                _ => out.push((path, State::Unsure, None)),
            }
            if k >= 1 && (k - 1) % self.delete.1 < self.delete.0 {
                self.delete_one(&mut conn, &mut out[k - 1]);
            }
        }
        out.into_iter().map(|(p, s, _)| (p, s)).collect()
    }

    fn delete_one(&self, conn: &mut Option<Conn>, entry: &mut (String, State, Option<String>)) {
        let (State::Live, Some(id)) = (entry.1, &entry.2) else {
            return;
        };
        let path = format!("/timers/{id}");
        entry.1 = match exchange(conn, self.addr, "DELETE", &path, "") {
            None => State::Live,
            Some(Ok(r)) if r.status == 200 => State::Deleted,
            Some(_) => State::Unsure,
        };
    }
}

/// One request on `conn`, opened first if need be: `None` when no
/// connection could be opened (nothing was sent); `Some(Err)` when the
/// request was sent (or partly) and no answer came.
fn exchange(
    conn: &mut Option<Conn>,
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Option<std::io::Result<Response>> {
    if conn.is_none() {
        *conn = Some(Conn::open(addr)?);
    }
    let result = conn.as_mut()?.send(method, path, body);
    let close = match &result {
        Ok(r) => r.header("Connection") == Some("close"),
        Err(_) => true,
    };
    if close {
        *conn = None;
    }
    Some(result)
}

fn ledger_of(handles: Vec<JoinHandle<Outcomes>>) -> Ledger {
    let mut ledger = Ledger::default();
    for h in handles {
        for (path, state) in h.join().unwrap() {
            match state {
                State::Live => ledger.live.insert(path),
                State::Deleted => ledger.deleted.insert(path),
                State::Unsure => ledger.unsure.insert(path),
            };
        }
    }
    ledger
}

/// `n` one-shot timers (`/<prefix>/<i>`, body `<prefix>-<i>`) created one
/// request at a time (so each is its own write batch), due `interval`
/// seconds after its create; the IDs.
fn create_each(node: &Node, sink: &Sink, prefix: &str, n: usize, interval: &str) -> Vec<String> {
    (0..n)
        .map(|i| {
            let uri = sink.uri(&format!("/{prefix}/{i}"));
            node.create(&timer_body(interval, None, &uri, &format!("{prefix}-{i}")))
        })
        .collect()
}

fn delete(node: &Node, id: &str) {
    let r = node.request("DELETE", &format!("/timers/{id}"), "");
    assert_eq!(r.status, 200, "DELETE {id}: {}", r.text());
}

/// What a path must receive: this body, sequences 1..=pops, pop n due
/// `n × interval` after its create.
struct Expected {
    body: String,
    interval: Duration,
    pops: u32,
}

/// Test 1's timers: one-shots, updated ones (PUT: new path, body and
/// interval), deleted ones, one created by a PUT to a chosen ID, and
/// repeating ones (every 2 s, 4 pops). Returns what must pop, by path,
/// and the paths that must not.
fn create_mixed(node: &Node, sink: &Sink) -> (BTreeMap<String, Expected>, BTreeSet<String>) {
    let mut want = BTreeMap::new();
    let mut gone = BTreeSet::new();
    let mut expect = |path: String, body: String, secs: u64, pops: u32| {
        let interval = Duration::from_secs(secs);
        let e = Expected {
            body,
            interval,
            pops,
        };
        want.insert(path, e);
    };
    for i in 0..5 {
        let body = timer_body("2", Some("8"), &sink.uri(&format!("/rep/{i}")), "rep");
        node.create(&body);
        expect(format!("/rep/{i}"), "rep".into(), 2, 4);
    }
    create_each(node, sink, "one", 20, "6");
    (0..20).for_each(|i| expect(format!("/one/{i}"), format!("one-{i}"), 6, 1));
    for (i, id) in create_each(node, sink, "old", 10, "6").iter().enumerate() {
        let body = timer_body(
            "7",
            None,
            &sink.uri(&format!("/upd/{i}")),
            &format!("new-{i}"),
        );
        let r = node.request("PUT", &format!("/timers/{id}"), &body);
        assert_eq!(r.status, 200, "PUT {id}: {}", r.text());
        expect(format!("/upd/{i}"), format!("new-{i}"), 7, 1);
        gone.insert(format!("/old/{i}"));
    }
    for (i, id) in create_each(node, sink, "del", 10, "6").iter().enumerate() {
        delete(node, id);
        gone.insert(format!("/del/{i}"));
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let own = format!("{:016x}0000000000000000", nanos as u64);
    let body = timer_body("6", None, &sink.uri("/own"), "own");
    let r = node.request("PUT", &format!("/timers/{own}"), &body);
    assert_eq!(r.status, 200, "PUT to a chosen ID: {}", r.text());
    expect("/own".into(), "own".into(), 6, 1);
    (want, gone)
}

/// Each path of `want` popped exactly its sequences, in order, with its
/// body, never early and at most `MARGIN` late (its due counted from
/// `before`/`after`, taken around the creates).
fn check_exact(
    pops: &BTreeMap<String, Vec<Pop>>,
    want: &BTreeMap<String, Expected>,
    before: Instant,
    after: Instant,
) {
    for (path, e) in want {
        let got = &pops[path];
        let seqs: Vec<u32> = got.iter().map(|p| p.sequence).collect();
        let all: Vec<u32> = (1..=e.pops).collect();
        assert_eq!(seqs, all, "{path}: sequences in arrival order");
        for p in got {
            assert_eq!(p.body, e.body, "{path} pop {}: body", p.sequence);
            let due = e.interval * p.sequence;
            let early = (before + due).saturating_duration_since(p.at);
            assert!(
                early.is_zero(),
                "{path} pop {} early by {early:?}",
                p.sequence
            );
            let late = p.at.saturating_duration_since(after + due);
            assert!(late <= MARGIN, "{path} pop {} late by {late:?}", p.sequence);
        }
    }
}

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

/// Write `bytes` at `offset` of `file` (extending it if need be).
fn write_at(file: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.write_all_at(bytes, offset).unwrap();
    f.sync_all().unwrap();
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

/// Flip 16 bytes in the middle of the written part of `file`: in the block
/// there, halfway through its non-zero bytes (inside its records, past
/// the first header, before any zeros that end it), with later blocks
/// after it. The offset flipped.
fn corrupt_middle(file: &Path) -> u64 {
    let bytes = std::fs::read(file).unwrap();
    let end = written_end(&bytes);
    let block = end / 2 / BLOCK * BLOCK;
    assert!(
        block + 4 * BLOCK <= end,
        "later batches after block {block} (end {end})"
    );
    let extent = &bytes[block..block + BLOCK];
    let last = extent
        .iter()
        .rposition(|&b| b != 0)
        .expect("a written block");
    let at = block + (last / 2).max(48);
    let flipped: Vec<u8> = bytes[at..at + 16].iter().map(|b| b ^ 0x5a).collect();
    write_at(file, at as u64, &flipped);
    at as u64
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

/// Spawn the three nodes of `configs` at once, then wait until each
/// answers `/ready` (a node's start-up resync asks the others).
fn start_three(port: u16, configs: &[String]) -> Vec<Node> {
    let mut nodes: Vec<Node> = configs
        .iter()
        .enumerate()
        .map(|(i, c)| Node::spawn_in(None, &format!("127.0.0.{}", i + 1), port, c, &[]))
        .collect();
    for n in &mut nodes {
        n.wait_ready();
    }
    for n in &nodes {
        n.wait_ready_200(READY_WITHIN);
    }
    nodes
}

/// Item 5, seventh case. Three nodes, rf 2, each with its own log; 300
/// timers through all three, replication settled, then all killed at
/// once and started again: every timer pops, at most 1 % twice.
#[test]
fn a_whole_cluster_killed_at_once_pops_every_timer() {
    let stores: Vec<Store> = (1..=3).map(|i| Store::new(&format!("node{i}"))).collect();
    let sink = Sink::start(Behaviour::Ok);
    let port = cluster_port(3);
    let configs: Vec<String> = (1..=3)
        .map(|i| cluster_config(3, i, port, 1, &stores[i - 1].section("")))
        .collect();
    let mut nodes = start_three(port, &configs);
    let mut ledger = Ledger::default();
    for i in 0..300 {
        let path = format!("/r/{i}");
        nodes[i % 3].create(&timer_body("10", None, &sink.uri(&path), "r"));
        ledger.live.insert(path);
    }
    for n in &nodes {
        n.wait_replication_settled(Duration::from_secs(10));
    }
    nodes.iter().for_each(|n| n.signal(libc::SIGKILL));
    nodes.iter_mut().for_each(|n| n.kill9());
    assert!(sink.pops().is_empty(), "nothing was due before the kill");
    drop(nodes);
    let nodes = start_three(port, &configs);
    let refs: Vec<&Node> = nodes.iter().collect();
    let pops = settle(&sink, &refs, &ledger, Duration::from_secs(25));
    let twice = pops.values().map(Vec::len).sum::<usize>() - pops.len();
    assert!(twice <= 3, "{twice} duplicate pops of 300 (at most 1 %)");
}

/// Three nodes on one port, each with its own log, replication factor
/// `rf` (3: every node is a replica of every timer), `timers` more
/// `[timers]` keys: the stores (removed when dropped), the port and the
/// configs.
fn durable_three(name: &str, rf: u8, timers: &str) -> (Vec<Store>, u16, Vec<String>) {
    let stores: Vec<Store> = (1..=3).map(|i| Store::new(&format!("{name}{i}"))).collect();
    let port = cluster_port(3);
    let configs = (1..=3)
        .map(|i| {
            let extra = format!(
                "{}[timers]\ndefault-replication-factor = {rf}\n{timers}",
                stores[i - 1].section("")
            );
            cluster_config(3, i, port, 1, &extra)
        })
        .collect();
    (stores, port, configs)
}

/// The fault soak's finding (seed 9675783058021869): a delete answered by
/// a node killed before its replication reached the other replicas. Here
/// node 3 is down while node 2 answers the deletes (so node 2's messages
/// to it can only wait in node 2's memory), then node 2 is killed -9 and
/// both start again: node 3 must learn of the deletes from node 2's log,
/// not pop the timers. rf 3: every node is a replica of every timer.
#[test]
fn a_delete_answered_just_before_a_kill_reaches_the_other_replicas() {
    let (_stores, port, configs) = durable_three("resend", 3, "");
    let sink = Sink::start(Behaviour::Ok);
    let mut nodes = start_three(port, &configs);
    let ids = create_each(&nodes[0], &sink, "gone", 20, "10");
    nodes[0].wait_replication_settled(Duration::from_secs(10));
    nodes[2].kill9();
    for id in &ids {
        delete(&nodes[1], id);
    }
    nodes[1].kill9();
    let mut restarted = Vec::new();
    for i in [2, 1] {
        let mut n = Node::spawn_in(None, &format!("127.0.0.{}", i + 1), port, &configs[i], &[]);
        n.wait_ready();
        n.wait_ready_200(READY_WITHIN);
        restarted.push(n);
    }
    let all = [&nodes[0], &restarted[0], &restarted[1]];
    // No node holds a live copy any more (a copy popped counts too: a
    // popped one-shot is a tombstone), so nothing can pop after this.
    wait_idle(&all, Duration::from_secs(30));
    let popped: Vec<String> = sink.pops().into_iter().map(|p| p.path).collect();
    assert!(
        popped.is_empty(),
        "{} of 20 timers popped after their delete was answered: {}",
        popped.len(),
        sample(&popped)
    );
}

/// What a start re-sends must not stop the other replicas' pops. A pop
/// this node left to the next replica (it was too late to start it) is
/// logged here as done; re-sent after a restart under the plain conflict
/// rules it won by its sequence, and no replica popped the timer (the
/// fault soak lost timers so). Node 1 is down while 30 timers fall due
/// and starts again once they are over `callback-wait-ms` late, so its
/// pops are left to the next replica; then it is killed and started
/// again: every timer must still pop. The 8 s skew gives node 1's first
/// restart room on a loaded machine before the next replica's turn
/// (due + 8 s).
#[test]
fn a_pop_left_to_the_next_replica_is_not_re_sent_as_done() {
    let (_stores, port, configs) = durable_three("left", 3, "replica-skew-ms = 8000\n");
    let sink = Sink::start(Behaviour::Ok);
    let mut nodes = start_three(port, &configs);
    let created = Instant::now();
    create_each(&nodes[1], &sink, "left", 30, "2");
    nodes[1].wait_replication_settled(Duration::from_secs(10));
    let restart = |node: &mut Node, at: Instant| {
        node.kill9();
        sleep_until(at);
        *node = Node::spawn_in(None, "127.0.0.1", port, &configs[0], &[]);
        node.wait_ready();
        node.wait_ready_200(READY_WITHIN);
    };
    // Due at 2 s; `callback-wait-ms` is 250 ms.
    restart(&mut nodes[0], created + Duration::from_millis(3000));
    wait_until(
        "node 1 to leave a late pop to the next replica",
        Duration::from_secs(15),
        || match nodes[0].metric("chronos_callbacks_deferred_total") {
            n if n >= 1.0 => Ok(()),
            n => Err(format!("{n} pops left")),
        },
    );
    restart(&mut nodes[0], Instant::now());
    let ledger = Ledger {
        live: (0..30).map(|i| format!("/left/{i}")).collect(),
        ..Ledger::default()
    };
    let refs: Vec<&Node> = nodes.iter().collect();
    settle(&sink, &refs, &ledger, Duration::from_secs(30));
}

/// A client's update answered by a node that is not one of the timer's
/// replicas leaves a tombstone of the new version there (the replicas get
/// the timer). Re-sent after a crash as it stands, it would delete the
/// timer on its replicas. rf 1: nodes 1 and 2 hold the timers they are
/// the replica of and are down while node 3 answers the updates (so the
/// updates wait in node 3's memory), then node 3 is killed -9 and all
/// three start again: the updates are lost with node 3's memory, but
/// every timer must still pop (its old incarnation or its new one). Since
/// issue 37 node 3 answers such an update only once a replica took it, so
/// here (no replica up) with 503 after twice `replication-timeout-ms`
/// (200 ms here); its tombstone is left all the same.
#[test]
fn an_update_answered_by_a_non_replica_is_not_re_sent_as_a_delete() {
    let (_stores, port, configs) = durable_three("update", 1, "");
    // A `[cluster]` key: before the `[storage]` table that follows it.
    let configs: Vec<String> = configs
        .iter()
        .map(|c| {
            c.replacen(
                "\n[storage]",
                "\nreplication-timeout-ms = 200\n[storage]",
                1,
            )
        })
        .collect();
    let sink = Sink::start(Behaviour::Ok);
    let mut nodes = start_three(port, &configs);
    let ids = create_each(&nodes[0], &sink, "old", 30, "8");
    nodes[0].wait_replication_settled(Duration::from_secs(10));
    nodes[0].kill9();
    nodes[1].kill9();
    for (i, id) in ids.iter().enumerate() {
        let body = timer_body("8", None, &sink.uri(&format!("/new/{i}")), "new");
        let r = nodes[2].request("PUT", &format!("/timers/{id}"), &body);
        assert!([200, 503].contains(&r.status), "PUT {id}: {}", r.text());
    }
    nodes[2].kill9();
    drop(nodes);
    let nodes = start_three(port, &configs);
    let refs: Vec<&Node> = nodes.iter().collect();
    wait_idle(&refs, Duration::from_secs(30));
    let popped: BTreeSet<String> = sink
        .pops()
        .into_iter()
        .map(|p| p.path.replace("/new/", "/").replace("/old/", "/"))
        .collect();
    let missing: Vec<usize> = (0..30)
        .filter(|i| !popped.contains(&format!("/{i}")))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of 30 timers never popped: {missing:?}",
        missing.len()
    );
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

/// Issue 38 item 5: a bad record skipped while the log is re-sharded for a
/// new core count is counted, and the node resyncs what it held from its
/// peers, as it does for one skipped at an ordinary start (the count was
/// lost with the old generation, and with `resync-at-start = false`
/// nothing was asked for: the timer stayed one replica short).
#[test]
fn a_record_skipped_while_re_sharding_is_resynced_from_the_peers() {
    let stores = [Store::new("reshard1"), Store::new("reshard2")];
    let port = cluster_port(2);
    let config = |i: usize, cores: usize, more: &str| {
        let extra = format!("resync-at-start = false\n{}", stores[i - 1].section(more));
        cluster_config(2, i, port, cores, &extra)
    };
    let mut nodes = start_three(port, &[config(1, 2, ""), config(2, 1, "")]);
    let sink = Sink::start(Behaviour::Ok);
    create_each(&nodes[0], &sink, "r", 200, "600");
    nodes[0].wait_replication_settled(Duration::from_secs(10));
    let first = nodes.remove(0);
    assert!(first.terminate().success());
    let wal = stores[0]
        .wal_files()
        .into_iter()
        .max_by_key(|f| std::fs::metadata(f).unwrap().len())
        .unwrap();
    corrupt_middle(&wal);
    let skip = "on-corruption = \"skip\"\n";
    let node = Node::spawn_in(None, "127.0.0.1", port, &config(1, 1, skip), &[]);
    node.wait_ready_200(READY_WITHIN);
    assert!(
        node.metric("chronos_storage_corrupt_records_total") >= 1.0,
        "the record skipped while re-sharding is counted"
    );
    wait_until(
        "the resync to restore the skipped timer",
        Duration::from_secs(30),
        || {
            let live = node.metric("chronos_timers_pending") - node.metric("chronos_tombstones");
            match live {
                l if l >= 200.0 => Ok(()),
                l => Err(format!("{l} of 200 timers")),
            }
        },
    );
}
