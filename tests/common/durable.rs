//! The durable log's test support (`[storage]`), for `durable.rs` (one
//! node) and `durable_cluster.rs` (three): a fresh storage directory
//! (`Store`), a node started and ready, the concurrent create and delete
//! load (`Load`) and the ledger of what was acknowledged (`Ledger`),
//! `settle` (every acknowledged live timer popped, no acknowledged delete
//! undone), three nodes with a log each, and a record corrupted in the
//! middle of a log file.

use super::*;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const READY_WITHIN: Duration = Duration::from_secs(20);
pub const IDLE_WITHIN: Duration = Duration::from_secs(20);
/// Lateness allowed on top of a schedule on a loaded 2-core machine
/// (the tests of this file run in parallel, some of them under load).
pub const MARGIN: Duration = Duration::from_millis(1500);
/// Write batches start on this boundary (the log's block).
pub const BLOCK: usize = 4096;
/// Small segments and an early snapshot, so that a load of a few MiB
/// compacts several times.
pub const COMPACT: &str = "segment-bytes = 1048576\ncompact-log-bytes = 1048576\n";
pub const LOCAL: &str = "127.0.0.1";

/// A fresh storage directory under the temp dir; removed when dropped,
/// unless the test failed (kept to be looked at; its path is printed).
pub struct Store {
    pub dir: PathBuf,
}

impl Store {
    pub fn new(name: &str) -> Store {
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
    pub fn section(&self, more: &str) -> String {
        format!("[storage]\npath = \"{}\"\n{more}", self.dir.display())
    }

    /// A single node's config: `cores` shards, the log here.
    pub fn config(&self, cores: usize, more: &str) -> String {
        format!("[runtime]\ncores = {cores}\n{}", self.section(more))
    }

    /// Every `*.wal` file under the directory, sorted by path.
    pub fn files(&self, suffix: &str) -> Vec<PathBuf> {
        let mut out = Vec::new();
        walk(&self.dir, suffix, &mut out);
        out.sort();
        out
    }

    pub fn wal_files(&self) -> Vec<PathBuf> {
        self.files(".wal")
    }

    /// The total size of the `.wal` files (nothing else counted).
    pub fn wal_bytes(&self) -> u64 {
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

pub fn walk(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
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
pub fn written_end(bytes: &[u8]) -> usize {
    match bytes.iter().rposition(|&b| b != 0) {
        Some(last) => (last + 1).next_multiple_of(BLOCK).min(bytes.len()),
        None => 0,
    }
}

/// `n` pseudo-random bytes, none of them zero.
pub fn garbage(n: usize) -> Vec<u8> {
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
pub fn start_ready(port: u16, config: &str) -> (Node, Instant) {
    let node = Node::start_at(LOCAL, port, config);
    let ready = node.wait_ready_200(READY_WITHIN);
    (node, ready)
}

pub fn sample<T: std::fmt::Debug>(items: &[T]) -> String {
    format!("{:?}", &items[..items.len().min(5)])
}

/// What the client knows of each timer (by callback path).
#[derive(Default, Debug)]
pub struct Ledger {
    /// Acknowledged creates with no delete sent: each must pop.
    pub live: BTreeSet<String>,
    /// Acknowledged deletes: none may pop.
    pub deleted: BTreeSet<String>,
    /// A request the kill cut, or refused: may pop or not.
    pub unsure: BTreeSet<String>,
}

/// Wait until every live timer of `ledger` popped, then until the nodes
/// can pop nothing more; check that no deleted timer popped and no pop
/// came for a path never sent. The pops, by path.
pub fn settle(
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
pub struct Conn {
    pub addr: SocketAddr,
    pub writer: TcpStream,
    pub reader: BufReader<TcpStream>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Option<Conn> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        Some(Conn {
            addr,
            writer: s.try_clone().ok()?,
            reader: BufReader::new(s),
        })
    }

    pub fn send(&mut self, method: &str, path: &str, body: &str) -> std::io::Result<Response> {
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
pub enum Due {
    /// This many seconds after each create.
    After(f64),
    /// All at this instant (at least 0.5 s after the create).
    At(Instant),
}

impl Due {
    pub fn interval(self) -> String {
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
pub enum State {
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
pub struct Load {
    pub addr: SocketAddr,
    pub uri: String,
    pub threads: usize,
    pub creates: usize,
    pub within: Duration,
    pub delete: (usize, usize),
    pub opaque: usize,
    pub due: Due,
}

/// A load's shared counter of acknowledged creates and its stop flag.
#[derive(Clone, Default)]
pub struct Control {
    pub acked: Arc<AtomicUsize>,
    pub stop: Arc<AtomicBool>,
}

pub type Outcomes = Vec<(String, State)>;

impl Load {
    pub fn new(node: &Node, sink: &Sink, due: Due) -> Load {
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

    pub fn spawn(&self, control: &Control) -> Vec<JoinHandle<Outcomes>> {
        (0..self.threads)
            .map(|t| {
                let (load, control) = (self.clone(), control.clone());
                std::thread::spawn(move || load.client(t, &control))
            })
            .collect()
    }

    pub fn client(&self, t: usize, control: &Control) -> Outcomes {
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

    pub fn delete_one(&self, conn: &mut Option<Conn>, entry: &mut (String, State, Option<String>)) {
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
pub fn exchange(
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

pub fn ledger_of(handles: Vec<JoinHandle<Outcomes>>) -> Ledger {
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
pub fn create_each(
    node: &Node,
    sink: &Sink,
    prefix: &str,
    n: usize,
    interval: &str,
) -> Vec<String> {
    (0..n)
        .map(|i| {
            let uri = sink.uri(&format!("/{prefix}/{i}"));
            node.create(&timer_body(interval, None, &uri, &format!("{prefix}-{i}")))
        })
        .collect()
}

pub fn delete(node: &Node, id: &str) {
    let r = node.request("DELETE", &format!("/timers/{id}"), "");
    assert_eq!(r.status, 200, "DELETE {id}: {}", r.text());
}

/// What a path must receive: this body, sequences 1..=pops, pop n due
/// `n × interval` after its create.
pub struct Expected {
    pub body: String,
    pub interval: Duration,
    pub pops: u32,
}

/// Test 1's timers: one-shots, updated ones (PUT: new path, body and
/// interval), deleted ones, one created by a PUT to a chosen ID, and
/// repeating ones (every 2 s, 4 pops). Returns what must pop, by path,
/// and the paths that must not.
pub fn create_mixed(node: &Node, sink: &Sink) -> (BTreeMap<String, Expected>, BTreeSet<String>) {
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
pub fn check_exact(
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

/// Flip 16 bytes in the middle of the written part of `file`: in the block
/// there, halfway through its non-zero bytes (inside its records, past
/// the first header, before any zeros that end it), with later blocks
/// after it. The offset flipped.
pub fn corrupt_middle(file: &Path) -> u64 {
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

/// Spawn the three nodes of `configs` at once, then wait until each
/// answers `/ready` (a node's start-up resync asks the others).
pub fn start_three(port: u16, configs: &[String]) -> Vec<Node> {
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

/// Three nodes on one port, each with its own log, replication factor
/// `rf` (3: every node is a replica of every timer), `timers` more
/// `[timers]` keys: the stores (removed when dropped), the port and the
/// configs.
pub fn durable_three(name: &str, rf: u8, timers: &str) -> (Vec<Store>, u16, Vec<String>) {
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

/// Write `bytes` at `offset` of `file` (extending it if need be).
pub fn write_at(file: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.write_all_at(bytes, offset).unwrap();
    f.sync_all().unwrap();
}
