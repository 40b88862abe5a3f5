//! `chronos-perf soak`: the fault soak (issue 21 item 6, issue 37 item 5).
//!
//! ```text
//! chronos-perf soak [--duration-s 60] [--rate 200] [--seed N] [--cores 1]
//!                   [--no-storage] [--keep] [--loopback] [--no-resize]
//!                   [--replication-factor 2]
//! ```
//!
//! Three chronos nodes (`default-replication-factor` 2, or
//! `--replication-factor`), each with `[storage] path` (unless
//! `--no-storage`) and `[cluster] replication-timeout-ms = 1000`,
//! `replication-deliver-within-ms = 2000` (short, so that a node stays
//! down past the delivery window within seconds), take a steady load for
//! `--duration-s`: creates of one-shot timers due 2-6 s ahead, deletes of
//! a quarter of the acknowledged ones and updates of 15 % others (a `PUT`
//! with a new interval of 2-6 s and a new callback path, version 1), each
//! sent at least 1 s before its timer is due, at `--rate` requests/s in
//! all, to a random member, each timer calling back into a sink in this
//! process. A nemesis makes one fault at a time and waits for recovery
//! before the next (every node `/ready` 200, a restarted node's start-up
//! resync finished, at most 50 replication messages outstanding per
//! node): kill -9 and restart one node; a long down (kill -9 of a member,
//! down 3-5 s, past `replication-deliver-within-ms`, while the load goes
//! on through the others, then a restart on its store); a net split (one
//! node cut off from the others for 4-8 s, in network namespaces;
//! skipped, loudly, where they cannot be made); a grow to four nodes and
//! later a shrink back (seed 001's steps, by SIGHUP and resync) whose
//! reloads are rolling: one node reloads alone for a window while deletes
//! and updates go to every member, so some through nodes not yet reloaded
//! (counted in the fault's line), then the others one at a time; and once
//! per run kill -9 of every node and a restart of all. `--no-resize`
//! leaves out the grow and the shrink.
//!
//! When the load stops it drains (every timer due, plus a skew, and every
//! node idle), then checks: every acknowledged create whose delete and
//! update were never sent pops, and every acknowledged update pops its new
//! version; no pop comes before its version's due time (20 ms margin); no
//! pop arrives after an acknowledged delete, and no pop of the old version
//! after an acknowledged update (one that arrives between the change's
//! send and its answer was in flight; one while a split was open, or
//! within 2.5 s of the answer, is counted apart); no pop names a timer or
//! a version never sent; duplicates are counted. A failed invariant
//! prints the timer's history and the faults around it, and the run
//! exits 1.
//!
//! The nodes run in network namespaces `csoak-<pid>-<i>` on
//! `10.214.N.<i>:7253`, joined by a bridge to this process on
//! `10.214.N.254`; without root or `ip` (or with `--loopback`) they run on
//! `127.0.0.<i>` and the split is skipped. Nodes are killed, namespaces
//! removed and storage removed (unless `--keep`) on every exit path: the
//! end of the run, an error, a panic, SIGINT/SIGTERM and the run's time
//! bound; nodes also die with this process (`PR_SET_PDEATHSIG`).

use super::{chronos_binary, counter, free_port, now_us, read_headers, seconds};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: chronos-perf soak [--duration-s 60] [--rate 200] [--seed N] [--cores 1] [--no-storage] [--keep] [--loopback] [--no-resize] [--replication-factor 2]";
/// The cluster; a grow adds one node.
const NODES: usize = 3;
const NODES_MAX: usize = NODES + 1;
const RATE_MAX: f64 = 2000.0;
const DURATION_MAX_S: u64 = 3600;
/// Load threads, each with one keep-alive connection per node.
const WORKERS: usize = 16;
/// A timer is due this many ms after its create is sent.
const DUE_MS: (u64, u64) = (2000, 6000);
/// Share of acknowledged creates deleted.
const DELETE_SHARE: f64 = 0.25;
/// Share of acknowledged creates updated (`PUT`: a new interval from the
/// update's send and a new callback path, version 1), none of them
/// deleted.
const UPDATE_SHARE: f64 = 0.15;
/// A delete or update is sent at least this long before its timer is due.
const DELETE_LEAD_US: u64 = 1_000_000;
/// The nodes' `[cluster] replication-timeout-ms` and
/// `replication-deliver-within-ms`: short, so that the long-down fault
/// outlasts the delivery window within seconds.
const REPLICATION_TIMEOUT_MS: u64 = 1000;
const DELIVER_WITHIN_MS: u64 = 2000;
/// A long-down node stays down `DELIVER_WITHIN_MS` plus this (ms).
const LONG_DOWN_EXTRA_MS: (u64, u64) = (1000, 3000);
/// A rolling reload: once the first node has reloaded, the others wait
/// this long (ms; the first reload of a grow or shrink, then the last),
/// and at least until this many deletes were acknowledged through them
/// (unless the load has ended), for at most `ROLLING_WINDOW_MAX`; then
/// they reload one at a time, `ROLLING_GAP_MS` apart.
const ROLLING_WINDOW_MS: (u64, u64) = (1000, 2000);
const ROLLING_WINDOW_LAST_MS: (u64, u64) = (500, 1000);
const ROLLING_DELETES_MIN: u64 = 10;
const ROLLING_WINDOW_MAX: Duration = Duration::from_secs(6);
const ROLLING_GAP_MS: (u64, u64) = (200, 600);
/// A pop this much before its due time is early.
const EARLY_MARGIN_US: u64 = 20_000;
/// The replica skew (the default): the backup pops this much later.
const SKEW_US: u64 = 2_000_000;
/// Load before the first fault, and between faults after recovery.
const WARMUP: Duration = Duration::from_secs(3);
const GAP: Duration = Duration::from_secs(1);
/// No fault starts this close to the end of the load.
const FAULT_LEAD_US: u64 = 5_000_000;
const RECOVERY_MAX: Duration = Duration::from_secs(60);
/// Replication messages queued and not yet answered, per node, that count
/// as caught up under load.
const BACKLOG_SETTLED: f64 = 50.0;
/// Longest drain after the last timer is due.
const DRAIN_MAX_US: u64 = 90_000_000;
/// Faults this close to a timer's history are printed with it.
const AROUND_US: u64 = 3_000_000;
const NETNS_PORT: u16 = 7253;
/// Histories printed per failed invariant.
const SHOWN_MAX: usize = 10;

struct Opts {
    duration_s: u64,
    rate: f64,
    seed: u64,
    cores: usize,
    storage: bool,
    keep: bool,
    loopback: bool,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        duration_s: 60,
        rate: 200.0,
        seed: super::unix_us() ^ u64::from(std::process::id()) << 40,
        cores: 1,
        storage: true,
        keep: false,
        loopback: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--no-storage" => o.storage = false,
            "--keep" => o.keep = true,
            "--loopback" => o.loopback = true,
            "--no-resize" => NO_RESIZE.store(true, std::sync::atomic::Ordering::Relaxed),
            "--replication-factor" => {
                let v = it.next().ok_or("--replication-factor needs a value")?;
                match v.parse::<usize>() {
                    Ok(f @ 1..=NODES_MAX) => FACTOR.store(f, std::sync::atomic::Ordering::Relaxed),
                    _ => return Err(format!("--replication-factor {v:?}: 1..={NODES_MAX}")),
                }
            }
            "--duration-s" | "--rate" | "--seed" | "--cores" => {
                let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
                let bad = || format!("{a} {v:?} is invalid");
                match a.as_str() {
                    "--duration-s" => o.duration_s = v.parse().map_err(|_| bad())?,
                    "--rate" => o.rate = v.parse().map_err(|_| bad())?,
                    "--seed" => o.seed = v.parse().map_err(|_| bad())?,
                    _ => o.cores = v.parse().map_err(|_| bad())?,
                }
            }
            _ => return Err(format!("unexpected argument {a}\n{USAGE}")),
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !(10..=DURATION_MAX_S).contains(&o.duration_s)
        || !(1.0..=RATE_MAX).contains(&o.rate)
        || !(1..=cores).contains(&o.cores)
    {
        return Err(format!(
            "--duration-s must be 10..={DURATION_MAX_S}, --rate 1..={RATE_MAX}, --cores 1..={cores}"
        ));
    }
    Ok(o)
}

/// The soak; the process's exit status (0 all invariants held, 1 one
/// failed, 2 the run could not be made).
pub fn main(args: &[String]) -> i32 {
    let o = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("chronos-perf soak: {e}");
            return 2;
        }
    };
    match run(&o) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("chronos-perf soak: {e}");
            2
        }
    }
}

// ---- randomness (no crate: splitmix64) ----

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.next() as usize % v.len()]
    }
}

// ---- every exit path: kill the nodes, remove the namespaces ----

/// What must not outlive the run, for the exit paths that do not unwind
/// (a panic under `panic = "abort"`, a signal, the time bound).
struct Registry {
    pids: Vec<u32>,
    net: Option<Net>,
    dir: Option<PathBuf>,
    keep: bool,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    pids: Vec::new(),
    net: None,
    dir: None,
    keep: false,
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Kill every node still running, remove the namespaces, and (unless
/// `--keep`) the nodes' storage; node logs and configs stay. Idempotent.
fn cleanup() {
    let mut r = registry();
    for pid in r.pids.drain(..) {
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    if let Some(net) = r.net.take() {
        net.destroy();
    }
    if let (Some(dir), false) = (&r.dir, r.keep) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Runs `cleanup` when the run ends by returning or unwinding.
struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        cleanup();
    }
}

/// A panic (in any thread), SIGINT/SIGTERM, and the run's time bound all
/// clean up and exit.
fn install_exit_paths(bound: Duration) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        cleanup();
        eprintln!("chronos-perf soak: panicked; nodes killed, namespaces removed");
        std::process::exit(101);
    }));
    match signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM]) {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    eprintln!("chronos-perf soak: signal {sig}: killing the nodes, removing the namespaces");
                    cleanup();
                    std::process::exit(128 + sig);
                }
            });
        }
        Err(e) => eprintln!("chronos-perf soak: no signal handler ({e})"),
    }
    std::thread::spawn(move || {
        std::thread::sleep(bound);
        cleanup();
        eprintln!(
            "chronos-perf soak: FAILED: the run exceeded its time bound of {} s; nodes killed",
            bound.as_secs()
        );
        std::process::exit(3);
    });
}

// ---- network namespaces ----

/// Namespaces `csoak-<tag>-<i>`, each with a veth onto bridge `csb<tag>`
/// (10.214.N.254, this process's side).
#[derive(Clone)]
struct Net {
    tag: u32,
    subnet: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip (iproute2): {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

impl Net {
    fn ns(&self, i: usize) -> String {
        format!("csoak-{}-{i}", self.tag)
    }

    fn bridge(&self) -> String {
        format!("csb{}", self.tag)
    }

    fn outer(&self, i: usize) -> String {
        format!("cso{}-{i}", self.tag)
    }

    fn addr(&self, i: usize) -> String {
        format!("{}.{i}", self.subnet)
    }

    fn host(&self) -> String {
        format!("{}.254", self.subnet)
    }

    /// The namespaces, or why they cannot be made here (what was made is
    /// removed).
    fn create() -> Result<Net, String> {
        remove_stale();
        let tag = std::process::id();
        let net = Net {
            tag,
            subnet: free_subnet(tag)?,
        };
        registry().net = Some(net.clone());
        let built = net.build();
        if built.is_err() {
            net.destroy();
            registry().net = None;
        }
        built.map(|()| net)
    }

    fn build(&self) -> Result<(), String> {
        let br = self.bridge();
        ip(&["link", "add", &br, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{}/24", self.host()), "dev", &br])?;
        ip(&["link", "set", &br, "up"])?;
        for i in 1..=NODES_MAX {
            let (ns, outer, inner) = (self.ns(i), self.outer(i), format!("csi{}-{i}", self.tag));
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            let cidr = format!("{}/24", self.addr(i));
            ip(&["-n", &ns, "addr", "add", &cidr, "dev", &inner])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&["link", "set", &outer, "master", &br])?;
            ip(&["link", "set", &outer, "up"])?;
        }
        Ok(())
    }

    /// Cut (`add`) or heal (`del`) node `k` from `others`, both ways, with
    /// blackhole routes; this process stays reachable from every node.
    fn split(&self, k: usize, others: &[usize], action: &str) -> Result<(), String> {
        for &i in others {
            let (to_i, to_k) = (
                format!("{}/32", self.addr(i)),
                format!("{}/32", self.addr(k)),
            );
            ip(&["-n", &self.ns(k), "route", action, "blackhole", &to_i])?;
            ip(&["-n", &self.ns(i), "route", action, "blackhole", &to_k])?;
        }
        Ok(())
    }

    fn destroy(&self) {
        for i in 1..=NODES_MAX {
            let _ = ip(&["netns", "del", &self.ns(i)]);
            let _ = ip(&["link", "del", &self.outer(i)]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}

/// Remove the namespaces of soaks whose process is gone (one killed with
/// SIGKILL cannot clean up).
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let pid = name
            .strip_prefix("csoak-")
            .and_then(|r| r.split_once('-'))
            .and_then(|(p, _)| p.parse::<u32>().ok());
        if let Some(pid) = pid.filter(|p| !PathBuf::from(format!("/proc/{p}")).exists()) {
            eprintln!(
                "chronos-perf soak: removing {name} and its links (its soak, pid {pid}, is gone)"
            );
            Net {
                tag: pid,
                subnet: String::new(),
            }
            .destroy();
        }
    }
}

/// A `10.214.N` no interface of this namespace uses.
fn free_subnet(tag: u32) -> Result<String, String> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .map_err(|e| format!("ip (iproute2): {e}"))?;
    let used = String::from_utf8_lossy(&out.stdout).into_owned();
    (0..250)
        .map(|k| format!("10.214.{}", (tag + k) % 250))
        .find(|s| !used.contains(&format!(" {s}.")))
        .ok_or_else(|| "every 10.214.N/24 is in use".to_string())
}

/// Where the nodes run.
enum Topo {
    Loopback(u16),
    Netns(Net),
}

impl Topo {
    /// The namespaces if they can be made, else loopback and the reason.
    fn new(o: &Opts) -> (Topo, Option<String>) {
        if o.loopback {
            return (
                Topo::Loopback(free_port(NODES_MAX)),
                Some("--loopback".into()),
            );
        }
        match Net::create() {
            Ok(net) => (Topo::Netns(net), None),
            Err(e) => (Topo::Loopback(free_port(NODES_MAX)), Some(e)),
        }
    }

    fn addr(&self, i: usize) -> SocketAddr {
        let text = match self {
            Topo::Loopback(port) => format!("127.0.0.{i}:{port}"),
            Topo::Netns(net) => format!("{}:{NETNS_PORT}", net.addr(i)),
        };
        text.parse().expect("node address")
    }

    fn sink_ip(&self) -> String {
        match self {
            Topo::Loopback(_) => "127.0.0.1".into(),
            Topo::Netns(net) => net.host(),
        }
    }

    fn command(&self, i: usize) -> Command {
        match self {
            Topo::Loopback(_) => Command::new(chronos_binary()),
            Topo::Netns(net) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &net.ns(i)]).arg(chronos_binary());
                c
            }
        }
    }

    /// The node a callback came from (namespaces only: on loopback every
    /// node calls from 127.0.0.1).
    fn node_of(&self, from: IpAddr) -> Option<usize> {
        match self {
            Topo::Loopback(_) => None,
            Topo::Netns(_) => (1..=NODES_MAX).find(|&i| self.addr(i).ip() == from),
        }
    }
}

// ---- HTTP ----

struct Reply {
    status: u16,
    location: Option<String>,
    body: String,
}

fn read_reply(r: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let (mut len, mut location) = (0usize, None);
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let Some((name, value)) = line.trim_end().split_once(':') else {
            break;
        };
        if name.eq_ignore_ascii_case("content-length") {
            len = value.trim().parse().unwrap_or(0);
        } else if name.eq_ignore_ascii_case("location") {
            location = Some(value.trim().to_string());
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok(Reply {
        status,
        location,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// A one-off control request (`/ready`, `/cluster`, `/metrics`, `/resync`).
fn call(addr: SocketAddr, method: &str, path: &str) -> Result<Reply, String> {
    let what = |e: std::io::Error| format!("{method} {addr}{path}: {e}");
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map_err(what)?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).map_err(what)?;
    read_reply(&mut BufReader::new(s)).map_err(what)
}

fn cluster_json(addr: SocketAddr) -> Result<serde_json::Value, String> {
    let r = call(addr, "GET", "/cluster")?;
    serde_json::from_str(&r.body).map_err(|e| format!("{addr} /cluster {}: {e}", r.status))
}

fn metrics(addr: SocketAddr) -> Result<String, String> {
    let r = call(addr, "GET", "/metrics")?;
    match r.status {
        200 => Ok(r.body),
        s => Err(format!("{addr} /metrics answered {s}")),
    }
}

/// The load's connections, one keep-alive connection per node.
#[derive(Default)]
struct Client {
    conns: HashMap<usize, BufReader<TcpStream>>,
}

impl Client {
    /// One request. `Err((reached, why))`: `reached` false when it never
    /// left (no connection), so it cannot have taken effect.
    fn send(&mut self, node: usize, addr: SocketAddr, req: &[u8]) -> Result<Reply, (bool, String)> {
        let conn = match self.conns.entry(node) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
                    .map_err(|e| (false, format!("connect: {e}")))?;
                let _ = s.set_nodelay(true);
                let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
                let _ = s.set_write_timeout(Some(Duration::from_secs(3)));
                e.insert(BufReader::new(s))
            }
        };
        let result = conn
            .get_mut()
            .write_all(req)
            .and_then(|()| read_reply(conn));
        result.map_err(|e| {
            self.conns.remove(&node);
            (true, e.to_string())
        })
    }
}

// ---- the callback sink ----

#[derive(Clone, Debug)]
struct PopRec {
    item: u64,
    /// 0: the create's callback; 1: the update's.
    version: u32,
    seq: u32,
    at_us: u64,
    from: IpAddr,
}

type Pops = Arc<Mutex<Vec<PopRec>>>;

fn start_sink(ip: &str) -> Result<(SocketAddr, Pops), String> {
    let listener = TcpListener::bind((ip, 0)).map_err(|e| format!("sink on {ip}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let pops: Pops = Default::default();
    let p = pops.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let p = p.clone();
            std::thread::spawn(move || sink_connection(stream, p));
        }
    });
    Ok((addr, pops))
}

/// A callback's item and version: `/s/<item>` (version 0, the create's)
/// or `/s/<item>/<version>`; `u64::MAX` for anything else.
fn callback_path(path: &str) -> (u64, u32) {
    let Some(rest) = path.strip_prefix("/s/") else {
        return (u64::MAX, 0);
    };
    let (item, version) = rest.split_once('/').unwrap_or((rest, "0"));
    match (item.parse(), version.parse()) {
        (Ok(item), Ok(version)) => (item, version),
        _ => (u64::MAX, 0),
    }
}

/// Record every `POST /s/<item>[/<version>]`: item, version,
/// `X-Sequence-Number`, arrival and the caller's address, then answer 200.
fn sink_connection(stream: TcpStream, pops: Pops) {
    let from = stream
        .peer_addr()
        .map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let (mut line, mut body) = (String::new(), Vec::new());
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let at_us = now_us();
        let (item, version) = callback_path(line.split_whitespace().nth(1).unwrap_or(""));
        let Ok(Some((len, seq))) = read_headers(&mut reader, &mut line) else {
            return;
        };
        body.resize(len, 0);
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let pop = PopRec {
            item,
            version,
            seq,
            at_us,
            from,
        };
        pops.lock().unwrap().push(pop);
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}

// ---- the cluster ----

struct Cluster {
    topo: Topo,
    dir: PathBuf,
    storage: bool,
    cores: usize,
    /// Node `i` at `i - 1`; `None` while it is not running.
    children: Vec<Option<Child>>,
    members: Vec<usize>,
    joining: Vec<usize>,
    leaving: Vec<usize>,
    /// Grows so far: each gives the added node a fresh store (a new
    /// machine), so that no store outlives its node's membership.
    grows: u32,
    /// The nodes the load sends to (the members).
    targets: Arc<RwLock<Vec<usize>>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let all = self.running();
        self.kill9(&all);
    }
}

impl Cluster {
    fn start(topo: Topo, o: &Opts, dir: PathBuf) -> Result<Cluster, String> {
        let mut c = Cluster {
            topo,
            dir,
            storage: o.storage,
            cores: o.cores,
            children: (0..NODES_MAX).map(|_| None).collect(),
            members: (1..=NODES).collect(),
            joining: Vec::new(),
            leaving: Vec::new(),
            grows: 0,
            targets: Arc::new(RwLock::new((1..=NODES).collect())),
        };
        for i in 1..=NODES {
            c.spawn(i)?;
        }
        for i in 1..=NODES {
            c.wait_ready(i)?;
        }
        Ok(c)
    }

    fn addr(&self, i: usize) -> SocketAddr {
        self.topo.addr(i)
    }

    fn running(&self) -> Vec<usize> {
        (1..=NODES_MAX)
            .filter(|&i| self.children[i - 1].is_some())
            .collect()
    }

    fn store(&self, i: usize) -> PathBuf {
        match i <= NODES {
            true => self.dir.join(format!("node-{i}")),
            false => self.dir.join(format!("node-{i}-grow-{}", self.grows)),
        }
    }

    fn log(&self, i: usize) -> PathBuf {
        self.dir.join(format!("node-{i}.log"))
    }

    fn config(&self, i: usize) -> String {
        let list = |l: &[usize]| {
            l.iter()
                .map(|&k| format!("\"{}\"", self.addr(k)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let a = self.addr(i);
        let mut text = format!(
            "[http]\nbind-address = \"{}\"\nbind-port = {}\n[runtime]\ncores = {}\n[cluster]\nlocalhost = \"{a}\"\nnode = [{}]\njoining = [{}]\nleaving = [{}]\nreplication-timeout-ms = {REPLICATION_TIMEOUT_MS}\nreplication-deliver-within-ms = {DELIVER_WITHIN_MS}\n[timers]\ndefault-replication-factor = {}\n[log]\nlevel = \"info\"\n",
            a.ip(),
            a.port(),
            self.cores,
            list(&self.members),
            list(&self.joining),
            list(&self.leaving),
            FACTOR.load(std::sync::atomic::Ordering::Relaxed),
        );
        if self.storage {
            text += &format!("[storage]\npath = \"{}\"\n", self.store(i).display());
        }
        text
    }

    fn write_config(&self, i: usize) -> Result<PathBuf, String> {
        let path = self.dir.join(format!("node-{i}.toml"));
        std::fs::write(&path, self.config(i)).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    /// Start node `i` with its current config and wait until it answers
    /// HTTP (`/ready` may still say it is recovering). A start refused
    /// because the port is still held by the killed process is retried.
    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let config = self.write_config(i)?;
        std::fs::create_dir_all(self.store(i)).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut child = self.launch(i, &config)?;
            registry().pids.push(child.id());
            match self.wait_up(i, &mut child, deadline) {
                Ok(true) => {
                    self.children[i - 1] = Some(child);
                    return Ok(());
                }
                Ok(false) => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e);
                }
            }
        }
    }

    fn launch(&self, i: usize, config: &std::path::Path) -> Result<Child, String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(i))
            .map_err(|e| e.to_string())?;
        let mut marker = &log;
        let _ = writeln!(
            marker,
            "--- chronos-perf soak: node {i} starts at t={}",
            t(now_us())
        );
        let mut command = self.topo.command(i);
        command
            .arg("--config")
            .arg(config)
            .stdout(Stdio::null())
            .stderr(log);
        // Spawned from the main thread only, which lives as long as the run.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        command
            .spawn()
            .map_err(|e| format!("start {}: {e}", chronos_binary().display()))
    }

    /// `Ok(true)` once the node answers HTTP; `Ok(false)` if it exited
    /// because its port is still taken (try again).
    fn wait_up(&self, i: usize, child: &mut Child, deadline: Instant) -> Result<bool, String> {
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                unregister(child.id());
                let tail = log_tail(&self.log(i), 12);
                if tail.contains("in use") && Instant::now() < deadline {
                    return Ok(false);
                }
                let hint = match self.storage && tail.contains("storage") {
                    true => "\n(does this chronos know [storage]? --no-storage runs without it)",
                    false => "",
                };
                return Err(format!(
                    "node {i} exited at start ({status}); its log ends:\n{tail}{hint}"
                ));
            }
            if call(self.addr(i), "GET", "/ready").is_ok() {
                return Ok(true);
            }
            if Instant::now() > deadline {
                return Err(format!("node {i} did not answer HTTP within 30 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_ready(&self, i: usize) -> Result<(), String> {
        let deadline = Instant::now() + RECOVERY_MAX;
        loop {
            let why = match call(self.addr(i), "GET", "/ready") {
                Ok(r) if r.status == 200 => return Ok(()),
                Ok(r) => format!("{} {}", r.status, r.body),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(format!("node {i} not ready within {RECOVERY_MAX:?}: {why}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// kill -9 every node of `nodes` at once, then reap them.
    fn kill9(&mut self, nodes: &[usize]) {
        for &i in nodes {
            if let Some(child) = &self.children[i - 1] {
                unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            }
        }
        for &i in nodes {
            if let Some(mut child) = self.children[i - 1].take() {
                unregister(child.id());
                let _ = child.wait();
            }
        }
    }

    /// SIGTERM, and kill -9 if it has not exited within 15 s.
    fn terminate(&mut self, i: usize) {
        let Some(mut child) = self.children[i - 1].take() else {
            return;
        };
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while !matches!(child.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        unregister(child.id());
        let _ = child.wait();
    }

    /// Rewrite node `i`'s config with the current lists, SIGHUP it, and
    /// wait until its `GET /cluster` shows them.
    fn reload(&self, i: usize) -> Result<(), String> {
        self.write_config(i)?;
        let Some(child) = &self.children[i - 1] else {
            return Err(format!("node {i} is not running"));
        };
        unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
        let names =
            |l: &[usize]| -> Vec<String> { l.iter().map(|&k| self.addr(k).to_string()).collect() };
        let want = (
            names(&self.members),
            names(&self.joining),
            names(&self.leaving),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let c = cluster_json(self.addr(i))?;
            let list = |key: &str| -> Vec<String> {
                let items = c[key].as_array().cloned().unwrap_or_default();
                items
                    .iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            };
            if (list("nodes"), list("joining"), list("leaving")) == want {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("node {i} did not reload within 10 s: {c}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `POST /resync` on node `i`, and wait until that run has finished.
    fn resync(&self, i: usize) -> Result<(), String> {
        let r = call(self.addr(i), "POST", "/resync")?;
        let run = serde_json::from_str::<serde_json::Value>(&r.body)
            .ok()
            .and_then(|v| v["run"].as_u64())
            .filter(|_| r.status == 202)
            .ok_or_else(|| format!("node {i} POST /resync: {} {}", r.status, r.body))?;
        let deadline = Instant::now() + RECOVERY_MAX;
        loop {
            let c = cluster_json(self.addr(i))?;
            if c["resync"]["finished-runs"].as_u64().unwrap_or(0) >= run {
                return match c["resync"]["state"].as_str() {
                    Some("complete") => Ok(()),
                    _ => Err(format!("node {i}: resync run {run} ended: {}", c["resync"])),
                };
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "node {i}: resync run {run} not finished: {}",
                    c["resync"]
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn set_targets(&self) {
        *self.targets.write().unwrap() = self.members.clone();
    }

    /// `Ok` once every running node is ready, each of `restarted` has
    /// finished its start-up resync, and no node has more than
    /// `BACKLOG_SETTLED` replication messages outstanding.
    fn recovery_state(&self, restarted: &[usize]) -> Result<(), String> {
        for i in self.running() {
            let a = self.addr(i);
            let r = call(a, "GET", "/ready")?;
            if r.status != 200 {
                return Err(format!("node {i} /ready {}: {}", r.status, r.body.trim()));
            }
            if restarted.contains(&i) {
                let c = cluster_json(a)?;
                if c["resync"]["finished-runs"].as_u64().unwrap_or(0) == 0 {
                    return Err(format!(
                        "node {i}: start-up resync {}",
                        c["resync"]["state"]
                    ));
                }
            }
            let m = metrics(a)?;
            let backlog = counter(&m, "chronos_replication_enqueued_total")
                - counter(&m, "chronos_replication_sent_total")
                - counter(&m, "chronos_replication_failed_total");
            if backlog > BACKLOG_SETTLED {
                return Err(format!(
                    "node {i}: {backlog} replication messages outstanding"
                ));
            }
        }
        Ok(())
    }

    /// Wait for `recovery_state`, seen twice in a row; when it held.
    fn wait_recovered(&self, restarted: &[usize]) -> Result<u64, String> {
        let deadline = Instant::now() + RECOVERY_MAX;
        let mut held_before = false;
        loop {
            match self.recovery_state(restarted) {
                Ok(()) if held_before => return Ok(now_us()),
                Ok(()) => held_before = true,
                Err(why) if Instant::now() > deadline => {
                    return Err(format!("not recovered within {RECOVERY_MAX:?}: {why}"))
                }
                Err(_) => held_before = false,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `Ok` when no running node can pop again: no live timer, every
    /// callback answered, every replication message settled.
    fn idle_state(&self) -> Result<(), String> {
        for i in self.running() {
            let m = metrics(self.addr(i))?;
            let v = |name: &str| counter(&m, name);
            let live = v("chronos_timers_pending") - v("chronos_tombstones");
            let answered = ["succeeded", "failed", "deferred", "withdrawn"]
                .iter()
                .map(|k| v(&format!("chronos_callbacks_{k}_total")))
                .sum::<f64>();
            let popped = v("chronos_timers_popped_total");
            let backlog = v("chronos_replication_enqueued_total")
                - v("chronos_replication_sent_total")
                - v("chronos_replication_failed_total");
            if live > 0.0 || answered < popped || backlog > 0.0 {
                return Err(format!(
                    "node {i}: {live} live timers, {answered} of {popped} callbacks done, {backlog} replication messages outstanding"
                ));
            }
        }
        Ok(())
    }
}

/// Each running node's pop, callback and replication counters, for the
/// output (what became of the pops: a pop left to the next replica, or
/// whose callback failed, is not popped again here).
fn node_counters(c: &Cluster) -> Vec<String> {
    let names = [
        ("popped", "chronos_timers_popped_total"),
        ("callbacks succeeded", "chronos_callbacks_succeeded_total"),
        ("failed", "chronos_callbacks_failed_total"),
        (
            "left to the next replica",
            "chronos_callbacks_deferred_total",
        ),
        ("withdrawn", "chronos_callbacks_withdrawn_total"),
        ("replication dropped", "chronos_replication_dropped_total"),
        ("given up", "chronos_replication_failed_total"),
        ("repaired", "chronos_replication_repaired_total"),
    ];
    c.running()
        .into_iter()
        .map(|i| match metrics(c.addr(i)) {
            Ok(m) => {
                let parts: Vec<String> = names
                    .iter()
                    .map(|(what, name)| format!("{what} {}", counter(&m, name)))
                    .collect();
                format!("node {i} (since its last start): {}", parts.join(", "))
            }
            Err(e) => format!("node {i}: {e}"),
        })
        .collect()
}

fn unregister(pid: u32) {
    registry().pids.retain(|&p| p != pid);
}

fn log_tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Seconds since the harness started, to the ms.
fn t(us: u64) -> String {
    format!("{:.3}", us as f64 / 1e6)
}

// ---- the load ----

#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    /// 200.
    Acked,
    /// Another status.
    Refused(u16, String),
    /// No connection: it cannot have taken effect.
    NotSent(String),
    /// Sent, no answer: it may have taken effect.
    Unknown(String),
}

#[derive(Clone, Debug)]
struct Op {
    node: usize,
    sent_us: u64,
    done_us: u64,
    outcome: Outcome,
}

impl Op {
    /// Whether it may have taken effect (it left this process).
    fn may_apply(&self) -> bool {
        !matches!(self.outcome, Outcome::NotSent(_))
    }
}

/// A `PUT` of a new version: its interval counts from its send.
#[derive(Clone, Debug)]
struct Update {
    op: Op,
    interval_ms: u64,
}

impl Update {
    fn due_us(&self) -> u64 {
        self.op.sent_us + self.interval_ms * 1000
    }
}

#[derive(Clone, Debug)]
struct Timer {
    id: Option<String>,
    interval_ms: u64,
    create: Op,
    delete: Option<Op>,
    update: Option<Update>,
}

impl Timer {
    /// The create's due time (version 0).
    fn due_us(&self) -> u64 {
        self.create.sent_us + self.interval_ms * 1000
    }

    /// The latest due time of any version it may have.
    fn last_due_us(&self) -> u64 {
        let update = self.update.as_ref().map_or(0, Update::due_us);
        self.due_us().max(update)
    }
}

/// A change the load sends to an acknowledged timer (at most one each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Change {
    Delete,
    Update,
}

enum Job {
    Create(u64),
    Change(u64, Change),
}

/// A rolling reload's window: the nodes not yet reloaded while another
/// has, and the deletes and updates acknowledged through them (sent and
/// answered while the node was in the list).
#[derive(Default)]
struct Rolling {
    old: Mutex<Vec<usize>>,
    deletes: std::sync::atomic::AtomicU64,
    updates: std::sync::atomic::AtomicU64,
}

impl Rolling {
    fn is_old(&self, node: usize) -> bool {
        self.old.lock().unwrap().contains(&node)
    }

    fn open(&self, nodes: &[usize]) {
        *self.old.lock().unwrap() = nodes.to_vec();
    }

    /// `node` is about to reload: what goes through it no longer counts.
    fn leave(&self, node: usize) {
        self.old.lock().unwrap().retain(|&n| n != node);
    }

    /// Close the window; the deletes and updates counted in it.
    fn take(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.old.lock().unwrap().clear();
        (self.deletes.swap(0, Relaxed), self.updates.swap(0, Relaxed))
    }

    fn count(&self, change: Change) {
        let counter = match change {
            Change::Delete => &self.deletes,
            Change::Update => &self.updates,
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

struct Load {
    addrs: Vec<SocketAddr>,
    targets: Arc<RwLock<Vec<usize>>>,
    sink: SocketAddr,
    timers: Mutex<HashMap<u64, Timer>>,
    /// `(send at, item, change)`, earliest first.
    changes: Mutex<BinaryHeap<Reverse<(u64, u64, Change)>>>,
    rolling: Rolling,
    end_us: u64,
}

impl Load {
    /// Acknowledged deletes and updates sent at or after `from_us` and
    /// answered by `to_us`, through any node but `except`.
    fn changes_between(&self, from_us: u64, to_us: u64, except: usize) -> (usize, usize) {
        let timers = self.timers.lock().unwrap();
        let acked = |op: &Op| {
            op.outcome == Outcome::Acked
                && op.node != except
                && op.sent_us >= from_us
                && op.done_us <= to_us
        };
        let deletes = timers.values().filter_map(|t| t.delete.as_ref());
        let updates = timers.values().filter_map(|t| t.update.as_ref());
        (
            deletes.filter(|op| acked(op)).count(),
            updates.filter(|u| acked(&u.op)).count(),
        )
    }
}

/// Run the load until `load.end_us` on its own threads; the handle
/// returns the number of requests sent.
fn start_load(load: Arc<Load>, rate: f64, seed: u64) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let (tx, rx) = crossbeam::channel::bounded::<Job>(WORKERS * 2);
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (load, rx) = (load.clone(), rx.clone());
                let mut rng = Rng(seed ^ (w as u64 + 1) << 32);
                std::thread::spawn(move || {
                    let mut client = Client::default();
                    while let Ok(job) = rx.recv() {
                        match job {
                            Job::Create(item) => create(&load, &mut client, &mut rng, item),
                            Job::Change(item, change) => {
                                send_change(&load, &mut client, &mut rng, item, change)
                            }
                        }
                    }
                })
            })
            .collect();
        let sent = dispatch(&load, rate, tx);
        for w in workers {
            let _ = w.join();
        }
        sent
    })
}

/// One request every `1 / rate` s: a delete or update whose time has
/// come, else a create. Behind by over a second, it skips ahead (no
/// catch-up burst).
fn dispatch(load: &Load, rate: f64, tx: crossbeam::channel::Sender<Job>) -> u64 {
    let period_us = (1e6 / rate) as u64;
    let (mut next_us, mut item, mut sent) = (now_us(), 0u64, 0u64);
    while now_us() < load.end_us {
        let now = now_us();
        if next_us > now {
            std::thread::sleep(Duration::from_micros(next_us - now));
        } else if now > next_us + 1_000_000 {
            next_us = now;
        }
        next_us += period_us;
        let due = {
            let mut heap = load.changes.lock().unwrap();
            match heap.peek() {
                Some(Reverse((at, _, _))) if *at <= now_us() => heap.pop(),
                _ => None,
            }
        };
        let job = match due {
            Some(Reverse((_, i, change))) => Job::Change(i, change),
            None => {
                item += 1;
                Job::Create(item)
            }
        };
        if tx.send(job).is_err() {
            break;
        }
        sent += 1;
    }
    sent
}

fn judge(result: Result<Reply, (bool, String)>) -> (Outcome, Option<String>) {
    match result {
        Ok(r) if r.status == 200 => (Outcome::Acked, r.location),
        Ok(r) => (Outcome::Refused(r.status, r.body.trim().to_string()), None),
        Err((false, e)) => (Outcome::NotSent(e), None),
        Err((true, e)) => (Outcome::Unknown(e), None),
    }
}

/// A timer's request: `POST /timers` (`id` `None`) or `PUT /timers/<id>`,
/// calling back `/s/<item>` (version 0) or `/s/<item>/<version>`.
fn timer_request(
    load: &Load,
    addr: SocketAddr,
    id: Option<&str>,
    item: u64,
    interval_ms: u64,
) -> String {
    let path = match id {
        None => format!("{item}"),
        Some(_) => format!("{item}/1"),
    };
    let body = format!(
        r#"{{"timing":{{"interval":{}}},"callback":{{"http":{{"uri":"http://{}/s/{path}","opaque":"{item}"}}}}}}"#,
        seconds(interval_ms),
        load.sink
    );
    let line = match id {
        None => "POST /timers".to_string(),
        Some(id) => format!("PUT /timers/{id}"),
    };
    format!(
        "{line} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn create(load: &Load, client: &mut Client, rng: &mut Rng, item: u64) {
    let interval_ms = rng.range(DUE_MS.0, DUE_MS.1);
    let node = rng.pick(&load.targets.read().unwrap());
    let addr = load.addrs[node - 1];
    let req = timer_request(load, addr, None, item, interval_ms);
    let sent_us = now_us();
    let result = client.send(node, addr, req.as_bytes());
    let done_us = now_us();
    let (outcome, location) = judge(result);
    let id = location.map(|l| l.trim_start_matches("/timers/").to_string());
    let acked = outcome == Outcome::Acked;
    let timer = Timer {
        id,
        interval_ms,
        create: Op {
            node,
            sent_us,
            done_us,
            outcome,
        },
        delete: None,
        update: None,
    };
    let latest_us = timer.due_us().saturating_sub(DELETE_LEAD_US);
    load.timers.lock().unwrap().insert(item, timer);
    if !acked || latest_us <= done_us {
        return;
    }
    let change = match rng.chance(DELETE_SHARE) {
        true => Change::Delete,
        false if rng.chance(UPDATE_SHARE / (1.0 - DELETE_SHARE)) => Change::Update,
        false => return,
    };
    let at = rng.range(done_us, latest_us);
    load.changes
        .lock()
        .unwrap()
        .push(Reverse((at, item, change)));
}

/// A `DELETE` or a `PUT` (a new interval and version) of an acknowledged
/// timer, to a random member; counted if it went through a node not yet
/// reloaded in a rolling reload's window.
fn send_change(load: &Load, client: &mut Client, rng: &mut Rng, item: u64, change: Change) {
    let id = load.timers.lock().unwrap()[&item].id.clone();
    let Some(id) = id else {
        return;
    };
    let node = rng.pick(&load.targets.read().unwrap());
    let addr = load.addrs[node - 1];
    let interval_ms = rng.range(DUE_MS.0, DUE_MS.1);
    let req = match change {
        Change::Delete => {
            format!("DELETE /timers/{id} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\n\r\n")
        }
        Change::Update => timer_request(load, addr, Some(&id), item, interval_ms),
    };
    let old_view = load.rolling.is_old(node);
    let sent_us = now_us();
    let result = client.send(node, addr, req.as_bytes());
    let done_us = now_us();
    let op = Op {
        node,
        sent_us,
        done_us,
        outcome: judge(result).0,
    };
    if op.outcome == Outcome::Acked && old_view && load.rolling.is_old(node) {
        load.rolling.count(change);
    }
    if let Some(t) = load.timers.lock().unwrap().get_mut(&item) {
        match change {
            Change::Delete => t.delete = Some(op),
            Change::Update => t.update = Some(Update { op, interval_ms }),
        }
    }
}

// ---- the nemesis ----

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Kill,
    LongDown,
    Split,
    Grow,
    Shrink,
    KillAll,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill -9 + restart",
            Kind::LongDown => "long down: kill -9, down past deliver-within, restart",
            Kind::Split => "net split",
            Kind::Grow => "grow 3->4 (rolling SIGHUP)",
            Kind::Shrink => "shrink 4->3 (rolling SIGHUP)",
            Kind::KillAll => "kill -9 all + restart",
        }
    }
}

enum End {
    /// When every node had recovered.
    Recovered(u64),
    /// Not made (why).
    Skipped(String),
    /// A step failed, or recovery did not come (why).
    Failed(String),
}

struct Fault {
    kind: Kind,
    nodes: Vec<usize>,
    start_us: u64,
    /// When the fault was over (the restart, the heal, the last reload),
    /// from which recovery is timed.
    acted_us: u64,
    note: String,
    end: End,
}

impl Fault {
    /// The fault's span, to its recovery (or, if it never came, 30 s on);
    /// `None` if it was skipped.
    fn span(&self) -> Option<(u64, u64)> {
        let end = match self.end {
            End::Recovered(at) => at,
            End::Skipped(_) => return None,
            End::Failed(_) => self.acted_us + 30_000_000,
        };
        Some((self.start_us, end))
    }

    /// Whether its span meets `from..=to`.
    fn meets(&self, from: u64, to: u64) -> bool {
        self.span().is_some_and(|(a, b)| a <= to && b >= from)
    }

    fn line(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(|n| format!("node {n}")).collect();
        let what = format!("t={} {}", t(self.start_us), self.kind.name());
        match &self.end {
            End::Recovered(at) => format!(
                "{what} {}: {} (over at t={}), recovered {:.2} s after",
                nodes.join(", "),
                self.note,
                t(self.acted_us),
                at.saturating_sub(self.acted_us) as f64 / 1e6
            ),
            End::Skipped(why) => format!("{what}: SKIPPED: {why}"),
            End::Failed(why) if self.nodes.is_empty() => format!("{what}: FAILED: {why}"),
            End::Failed(why) => format!(
                "{what} {}: {} (over at t={}), FAILED: {why}",
                nodes.join(", "),
                self.note,
                t(self.acted_us)
            ),
        }
    }
}

/// What a fault did: the nodes it hit, when it was over, the nodes it
/// restarted, a note.
struct Acted {
    nodes: Vec<usize>,
    acted_us: u64,
    restarted: Vec<usize>,
    note: String,
}

/// `--no-resize`: no grow or shrink faults (so no rolling reloads).
static NO_RESIZE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `--replication-factor`: the nodes' `default-replication-factor` (2).
/// With 3 on the 3 nodes every node is a replica of every timer; with 2 a
/// third of the requests are answered by a node that is not a replica of
/// the timer (answered once a replica took the change).
static FACTOR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(2);

fn resizing() -> bool {
    !NO_RESIZE.load(std::sync::atomic::Ordering::Relaxed)
}

/// The first round, from the seed: kill, long down, split, grow and
/// shrink (grow first) in some order, with the kill of every node among
/// the first three, so that a 60 s run makes each kind once.
fn first_round(rng: &mut Rng) -> Vec<Kind> {
    let mut kinds = vec![
        Kind::Kill,
        Kind::LongDown,
        Kind::Split,
        Kind::Grow,
        Kind::Shrink,
    ];
    if !resizing() {
        kinds.truncate(3);
    }
    for k in (1..kinds.len()).rev() {
        let j = rng.range(0, k as u64) as usize;
        kinds.swap(k, j);
    }
    let (g, s) = (
        kinds.iter().position(|&k| k == Kind::Grow),
        kinds.iter().position(|&k| k == Kind::Shrink),
    );
    if let (Some(g), Some(s)) = (g, s) {
        if s < g {
            kinds.swap(g, s);
        }
    }
    let at = rng.range(0, 2) as usize;
    kinds.insert(at, Kind::KillAll);
    kinds
}

/// Faults one at a time until the load is near its end; the faults.
fn nemesis(c: &mut Cluster, rng: &mut Rng, load: &Load, split_off: &Option<String>) -> Vec<Fault> {
    let plan = first_round(rng);
    let mut faults: Vec<Fault> = Vec::new();
    let end_us = load.end_us;
    std::thread::sleep(WARMUP);
    while now_us() + FAULT_LEAD_US < end_us {
        let kind = match plan.get(faults.len()) {
            Some(&k) => k,
            None => {
                let resize = if c.members.len() > NODES {
                    Kind::Shrink
                } else {
                    Kind::Grow
                };
                match resizing() {
                    true => rng.pick(&[Kind::Kill, Kind::LongDown, Kind::Split, resize]),
                    false => rng.pick(&[Kind::Kill, Kind::LongDown, Kind::Split]),
                }
            }
        };
        let fault = fault(c, kind, rng, load, split_off);
        println!("fault {}: {}", faults.len() + 1, fault.line());
        let failed = matches!(fault.end, End::Failed(_));
        faults.push(fault);
        if failed {
            println!("the nemesis stops: a fault failed");
            break;
        }
        if now_us() + FAULT_LEAD_US < end_us {
            std::thread::sleep(GAP);
        }
    }
    faults
}

fn fault(
    c: &mut Cluster,
    kind: Kind,
    rng: &mut Rng,
    load: &Load,
    split_off: &Option<String>,
) -> Fault {
    let start_us = now_us();
    let acted = match (kind, split_off) {
        (Kind::Split, Some(why)) => Err(End::Skipped(why.clone())),
        (Kind::Kill, _) => fault_kill(c, rng).map_err(End::Failed),
        (Kind::LongDown, _) => fault_long_down(c, rng, load).map_err(End::Failed),
        (Kind::Split, None) => fault_split(c, rng).map_err(End::Failed),
        (Kind::Grow, _) => fault_grow(c, rng, load).map_err(End::Failed),
        (Kind::Shrink, _) => fault_shrink(c, rng, load).map_err(End::Failed),
        (Kind::KillAll, _) => fault_kill_all(c, rng).map_err(End::Failed),
    };
    match acted {
        Ok(a) => Fault {
            kind,
            end: match c.wait_recovered(&a.restarted) {
                Ok(at) => End::Recovered(at),
                Err(why) => End::Failed(why),
            },
            nodes: a.nodes,
            start_us,
            acted_us: a.acted_us,
            note: a.note,
        },
        Err(end) => Fault {
            kind,
            nodes: Vec::new(),
            start_us,
            acted_us: now_us(),
            note: String::new(),
            end,
        },
    }
}

fn fault_kill(c: &mut Cluster, rng: &mut Rng) -> Result<Acted, String> {
    let i = rng.pick(&c.members.clone());
    c.kill9(&[i]);
    let down_ms = rng.range(500, 3000);
    std::thread::sleep(Duration::from_millis(down_ms));
    let acted_us = now_us();
    c.spawn(i)?;
    Ok(Acted {
        nodes: vec![i],
        acted_us,
        restarted: vec![i],
        note: format!("down {:.1} s", down_ms as f64 / 1000.0),
    })
}

/// kill -9 a member and keep it down past `DELIVER_WITHIN_MS` while the
/// load goes on through the others, then restart it on its store.
fn fault_long_down(c: &mut Cluster, rng: &mut Rng, load: &Load) -> Result<Acted, String> {
    let i = rng.pick(&c.members.clone());
    c.kill9(&[i]);
    let down_from = now_us();
    let down_ms = DELIVER_WITHIN_MS + rng.range(LONG_DOWN_EXTRA_MS.0, LONG_DOWN_EXTRA_MS.1);
    std::thread::sleep(Duration::from_millis(down_ms));
    let acted_us = now_us();
    let (deletes, updates) = load.changes_between(down_from, acted_us, i);
    c.spawn(i)?;
    Ok(Acted {
        nodes: vec![i],
        acted_us,
        restarted: vec![i],
        note: format!(
            "down {:.1} s (replication-deliver-within-ms {DELIVER_WITHIN_MS}), {deletes} deletes and {updates} updates acknowledged by the others meanwhile",
            down_ms as f64 / 1000.0
        ),
    })
}

fn fault_kill_all(c: &mut Cluster, rng: &mut Rng) -> Result<Acted, String> {
    let nodes = c.running();
    c.kill9(&nodes);
    let down_ms = rng.range(1000, 3000);
    std::thread::sleep(Duration::from_millis(down_ms));
    let acted_us = now_us();
    for &i in &nodes {
        c.spawn(i)?;
    }
    Ok(Acted {
        nodes: nodes.clone(),
        acted_us,
        restarted: nodes,
        note: format!("all down {:.1} s", down_ms as f64 / 1000.0),
    })
}

fn fault_split(c: &mut Cluster, rng: &mut Rng) -> Result<Acted, String> {
    let Topo::Netns(net) = &c.topo else {
        return Err("no namespaces".into());
    };
    let k = rng.pick(&c.members.clone());
    let others: Vec<usize> = c.running().into_iter().filter(|&i| i != k).collect();
    net.split(k, &others, "add")?;
    let cut_ms = rng.range(4000, 8000);
    std::thread::sleep(Duration::from_millis(cut_ms));
    net.split(k, &others, "del")?;
    Ok(Acted {
        nodes: vec![k],
        acted_us: now_us(),
        restarted: Vec::new(),
        note: format!(
            "cut off from the others for {:.1} s",
            cut_ms as f64 / 1000.0
        ),
    })
}

/// Reload `nodes` one at a time, in a random order: the first alone for
/// a window (`window_ms`, and while the load runs at least until
/// `ROLLING_DELETES_MIN` deletes went through the others) while the load
/// sends deletes and updates to every member, some through nodes not yet
/// reloaded; then the others, `ROLLING_GAP_MS` apart. What went through
/// them, for the fault's note.
fn rolling_reload(
    c: &Cluster,
    rng: &mut Rng,
    load: &Load,
    nodes: &[usize],
    window_ms: (u64, u64),
) -> Result<String, String> {
    let mut order = nodes.to_vec();
    for k in (1..order.len()).rev() {
        order.swap(k, rng.range(0, k as u64) as usize);
    }
    let (&first, rest) = order.split_first().ok_or("no node to reload")?;
    c.reload(first)?;
    load.rolling.open(rest);
    let opened = Instant::now();
    let window = Duration::from_millis(rng.range(window_ms.0, window_ms.1));
    let enough = || {
        load.rolling
            .deletes
            .load(std::sync::atomic::Ordering::Relaxed)
            >= ROLLING_DELETES_MIN
            || now_us() >= load.end_us
    };
    while opened.elapsed() < window || (!enough() && opened.elapsed() < ROLLING_WINDOW_MAX) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = opened.elapsed();
    let mut result = Ok(());
    for (n, &i) in rest.iter().enumerate() {
        if n > 0 {
            std::thread::sleep(Duration::from_millis(
                rng.range(ROLLING_GAP_MS.0, ROLLING_GAP_MS.1),
            ));
        }
        load.rolling.leave(i);
        result = c.reload(i);
        if result.is_err() {
            break;
        }
    }
    let (deletes, updates) = load.rolling.take();
    result?;
    let rest: Vec<String> = rest.iter().map(|i| i.to_string()).collect();
    Ok(format!(
        "node {first} reloaded {:.1} s before nodes {}: {deletes} deletes and {updates} updates acknowledged through them meanwhile",
        held.as_secs_f64(),
        rest.join(", ")
    ))
}

/// Seed 001's three steps: every member takes node 4 as joining (a
/// rolling reload), node 4 starts (a fresh store), every node resyncs,
/// node 4 becomes a member (a rolling reload of the members; the load
/// sends to it once every node has).
fn fault_grow(c: &mut Cluster, rng: &mut Rng, load: &Load) -> Result<Acted, String> {
    let new = NODES_MAX;
    c.grows += 1;
    c.joining = vec![new];
    let joining = rolling_reload(c, rng, load, &c.members.clone(), ROLLING_WINDOW_MS)?;
    let started = Instant::now();
    c.spawn(new)?;
    c.wait_ready(new)?;
    let ready = started.elapsed();
    for i in c.running() {
        c.resync(i)?;
    }
    let resynced = started.elapsed() - ready;
    c.members.push(new);
    c.joining.clear();
    let member = rolling_reload(c, rng, load, &c.running(), ROLLING_WINDOW_LAST_MS)?;
    c.set_targets();
    Ok(Acted {
        nodes: vec![new],
        acted_us: now_us(),
        restarted: vec![new],
        note: format!(
            "joining: {joining}; node 4 ready in {:.1} s, resynced in {:.1} s; member: {member}",
            ready.as_secs_f64(),
            resynced.as_secs_f64()
        ),
    })
}

/// Node 4 leaves: every node takes it as leaving (a rolling reload; the
/// load no longer sends to node 4), the others resync, it is dropped from
/// the lists and stopped (SIGTERM).
fn fault_shrink(c: &mut Cluster, rng: &mut Rng, load: &Load) -> Result<Acted, String> {
    let gone = NODES_MAX;
    c.members.retain(|&i| i != gone);
    c.leaving = vec![gone];
    c.set_targets();
    let leaving = rolling_reload(c, rng, load, &c.running(), ROLLING_WINDOW_MS)?;
    let started = Instant::now();
    for i in c.members.clone() {
        c.resync(i)?;
    }
    let resynced = started.elapsed();
    c.leaving.clear();
    let dropped = rolling_reload(c, rng, load, &c.members.clone(), ROLLING_WINDOW_LAST_MS)?;
    c.terminate(gone);
    Ok(Acted {
        nodes: vec![gone],
        acted_us: now_us(),
        restarted: Vec::new(),
        note: format!(
            "leaving: {leaving}; resynced in {:.1} s; dropped: {dropped}; stopped",
            resynced.as_secs_f64()
        ),
    })
}

// ---- drain and check ----

/// Wait until every timer is due plus a skew, then until no node can pop
/// again (seen twice), then until no pop has arrived for 2 s; bounded.
fn drain(c: &Cluster, load: &Load, pops: &Pops) -> Result<(), String> {
    let last_due = load
        .timers
        .lock()
        .unwrap()
        .values()
        .map(Timer::last_due_us)
        .max()
        .unwrap_or(0);
    let bound = last_due + DRAIN_MAX_US;
    while now_us() < last_due + SKEW_US + 1_000_000 {
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut idle_before = false;
    loop {
        let state = c.idle_state();
        if state.is_ok() && idle_before {
            break;
        }
        idle_before = state.is_ok();
        if now_us() > bound {
            return Err(format!(
                "the nodes did not drain: {}",
                state.err().unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let last_pop = || {
        pops.lock()
            .unwrap()
            .iter()
            .map(|p| p.at_us)
            .max()
            .unwrap_or(0)
    };
    while now_us() < last_pop() + 2_000_000 && now_us() < bound {
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

#[derive(Default, Debug)]
struct Verdict {
    creates: Outcomes,
    deletes: Outcomes,
    updates: Outcomes,
    pops: usize,
    popped_timers: usize,
    duplicates: usize,
    must_pop: usize,
    /// Pops whose path names no timer the load created, or a version it
    /// never sent.
    strays: usize,
    lost: Vec<u64>,
    early: Vec<u64>,
    after_delete: Vec<u64>,
    /// Timers whose old version popped after an acknowledged update.
    old_version: Vec<u64>,
    /// Pops after a delete or update was sent and before it was answered.
    in_flight: usize,
    /// Pops after an acknowledged delete or update while a split was open.
    during_split: usize,
    /// Pops within [`REPLICATION_LAG_US`] of a delete's or update's
    /// acknowledgement.
    replication_lag: usize,
}

/// A `DELETE` (or `PUT`) is acknowledged before its replication reaches
/// the other replicas (as in the reference): one that has not had it yet
/// may pop (the old version) within a replication retry backoff (2 s) of
/// the answer. Such pops are counted apart; a change undone by a restart
/// pops later than this (the node has to come back first), and
/// tests/durable_cluster.rs checks that case on its own.
const REPLICATION_LAG_US: u64 = 2_500_000;

/// Requests of one kind by outcome.
#[derive(Default, Debug)]
struct Outcomes {
    all: usize,
    acked: usize,
    refused: std::collections::BTreeMap<u16, usize>,
    not_sent: usize,
    unknown: usize,
}

impl Outcomes {
    fn add(&mut self, o: &Outcome) {
        self.all += 1;
        match o {
            Outcome::Acked => self.acked += 1,
            Outcome::Refused(status, _) => *self.refused.entry(*status).or_default() += 1,
            Outcome::NotSent(_) => self.not_sent += 1,
            Outcome::Unknown(_) => self.unknown += 1,
        }
    }

    fn describe(&self) -> String {
        let refused: Vec<String> = self
            .refused
            .iter()
            .map(|(s, n)| format!("{n} answered {s}"))
            .collect();
        let mut parts = vec![format!("{} acknowledged", self.acked)];
        parts.extend(refused);
        parts.push(format!("{} not sent (no connection)", self.not_sent));
        parts.push(format!("{} unanswered", self.unknown));
        format!("{} ({})", self.all, parts.join(", "))
    }
}

impl Verdict {
    fn held(&self) -> bool {
        self.lost.is_empty()
            && self.early.is_empty()
            && self.after_delete.is_empty()
            && self.old_version.is_empty()
            && self.strays == 0
    }
}

fn by_item(pops: &[PopRec]) -> HashMap<u64, Vec<&PopRec>> {
    let mut map: HashMap<u64, Vec<&PopRec>> = HashMap::new();
    for p in pops {
        map.entry(p.item).or_default().push(p);
    }
    map
}

/// The invariants over every timer; `splits` are the spans of the net
/// splits.
fn check(timers: &HashMap<u64, Timer>, pops: &[PopRec], splits: &[(u64, u64)]) -> Verdict {
    let map = by_item(pops);
    let mut v = Verdict {
        pops: pops.len(),
        strays: map
            .iter()
            .filter(|(item, _)| !timers.contains_key(item))
            .map(|(_, l)| l.len())
            .sum(),
        ..Verdict::default()
    };
    for (&item, timer) in timers {
        let mine = map.get(&item).map_or(&[][..], Vec::as_slice);
        check_timer(&mut v, item, timer, mine, splits);
    }
    for list in [
        &mut v.lost,
        &mut v.early,
        &mut v.after_delete,
        &mut v.old_version,
    ] {
        list.sort_unstable();
    }
    v
}

fn acked(op: &Op) -> bool {
    op.outcome == Outcome::Acked
}

fn check_timer(v: &mut Verdict, item: u64, t: &Timer, pops: &[&PopRec], splits: &[(u64, u64)]) {
    v.creates.add(&t.create.outcome);
    if let Some(d) = &t.delete {
        v.deletes.add(&d.outcome);
    }
    if let Some(u) = &t.update {
        v.updates.add(&u.op.outcome);
    }
    if !pops.is_empty() {
        v.popped_timers += 1;
        v.duplicates += pops.len() - 1;
    }
    let update = t.update.as_ref().filter(|u| u.op.may_apply());
    let (old, new): (Vec<&PopRec>, Vec<&PopRec>) = pops.iter().partition(|p| p.version == 0);
    v.strays += new
        .iter()
        .filter(|p| p.version != 1 || update.is_none())
        .count();
    let early =
        |list: &[&PopRec], due_us: u64| list.iter().any(|p| p.at_us + EARLY_MARGIN_US < due_us);
    if early(&old, t.due_us()) || update.is_some_and(|u| early(&new, u.due_us())) {
        v.early.push(item);
    }
    if let Some(version) = must_pop(t) {
        v.must_pop += 1;
        if !pops.iter().any(|p| p.version == version) {
            v.lost.push(item);
        }
    }
    let delete = t.delete.as_ref().filter(|d| acked(d));
    if delete.is_some_and(|d| after_change(v, pops, d, splits)) {
        v.after_delete.push(item);
    }
    let update = t.update.as_ref().filter(|u| acked(&u.op));
    if update.is_some_and(|u| after_change(v, &old, &u.op, splits)) {
        v.old_version.push(item);
    }
}

/// The version an acknowledged create must pop: the create's (0), or the
/// update's (1) once it was acknowledged; `None` when a delete, or an
/// update without an answer, may have taken effect.
fn must_pop(t: &Timer) -> Option<u32> {
    if !acked(&t.create) || t.delete.as_ref().is_some_and(Op::may_apply) {
        return None;
    }
    match &t.update {
        Some(u) if acked(&u.op) => Some(1),
        Some(u) if u.op.may_apply() => None,
        _ => Some(0),
    }
}

/// Sort the pops at or after `op`'s send (which an acknowledged `op`
/// ruled out) into in flight, during a split and within the replication
/// lag; whether any came later than all three.
fn after_change(v: &mut Verdict, pops: &[&PopRec], op: &Op, splits: &[(u64, u64)]) -> bool {
    let mut violated = false;
    for p in pops.iter().filter(|p| p.at_us >= op.sent_us) {
        if p.at_us <= op.done_us {
            v.in_flight += 1;
        } else if splits.iter().any(|&(a, b)| a <= p.at_us && b >= op.sent_us) {
            v.during_split += 1;
        } else if p.at_us <= op.done_us + REPLICATION_LAG_US {
            v.replication_lag += 1;
        } else {
            violated = true;
        }
    }
    violated
}

fn describe_op(what: &str, op: &Op) -> String {
    let outcome = match &op.outcome {
        Outcome::Acked => "acknowledged (200)".to_string(),
        Outcome::Refused(s, body) => format!("refused {s} {body}"),
        Outcome::NotSent(e) => format!("not sent ({e})"),
        Outcome::Unknown(e) => format!("no answer ({e})"),
    };
    format!(
        "    {what:<6} sent t={} to node {}, {outcome} at t={}",
        t(op.sent_us),
        op.node,
        t(op.done_us)
    )
}

/// A timer's life: its create's send to its last pop, or to its backup's
/// due time if later.
fn life(timer: &Timer, pops: &[&PopRec]) -> (u64, u64) {
    let last = pops.iter().map(|p| p.at_us).max().unwrap_or(0);
    (
        timer.create.sent_us,
        last.max(timer.last_due_us() + SKEW_US),
    )
}

/// Its life widened by `AROUND_US` on both sides.
fn around(timer: &Timer, pops: &[&PopRec]) -> (u64, u64) {
    let (from, to) = life(timer, pops);
    (from.saturating_sub(AROUND_US), to + AROUND_US)
}

/// How many of `items` lived through each fault (a timer may count for
/// several), and how many through none.
fn by_fault(
    items: &[u64],
    timers: &HashMap<u64, Timer>,
    map: &HashMap<u64, Vec<&PopRec>>,
    faults: &[Fault],
) -> String {
    let mut counts = vec![0usize; faults.len()];
    let mut none = 0;
    for item in items {
        let mine = map.get(item).map_or(&[][..], Vec::as_slice);
        let (from, to) = life(&timers[item], mine);
        let mut any = false;
        for (n, f) in faults.iter().enumerate() {
            if f.meets(from, to) {
                counts[n] += 1;
                any = true;
            }
        }
        none += usize::from(!any);
    }
    let mut parts: Vec<String> = counts
        .iter()
        .enumerate()
        .filter(|(_, &c)| c > 0)
        .map(|(n, c)| format!("fault {} ({}): {c}", n + 1, faults[n].kind.name()))
        .collect();
    parts.push(format!("no fault: {none}"));
    parts.join("; ")
}

/// One timer's history and the faults around it.
fn print_history(item: u64, timer: &Timer, pops: &[&PopRec], faults: &[Fault], topo: &Topo) {
    let id = timer.id.as_deref().unwrap_or("(no ID: not acknowledged)");
    println!(
        "  timer {item} (ID {id}), interval {} s, due t={}",
        seconds(timer.interval_ms),
        t(timer.due_us())
    );
    println!("{}", describe_op("create", &timer.create));
    match &timer.delete {
        Some(d) => println!("{}", describe_op("delete", d)),
        None => println!("    delete none"),
    }
    if let Some(u) = &timer.update {
        println!(
            "{}; version 1, interval {} s, due t={}",
            describe_op("update", &u.op),
            seconds(u.interval_ms),
            t(u.due_us())
        );
    }
    if pops.is_empty() {
        println!("    pops   none");
    }
    for p in pops {
        let from = match topo.node_of(p.from) {
            Some(n) => format!("node {n}"),
            None => p.from.to_string(),
        };
        let due_us = match (p.version, &timer.update) {
            (1, Some(u)) => u.due_us(),
            _ => timer.due_us(),
        };
        let late = p.at_us as f64 / 1e3 - due_us as f64 / 1e3;
        println!(
            "    pop    t={} version {} seq {} from {from} ({late:+.0} ms after its due time)",
            t(p.at_us),
            p.version,
            p.seq
        );
    }
    let (from, to) = around(timer, pops);
    let near: Vec<&Fault> = faults.iter().filter(|f| f.meets(from, to)).collect();
    if near.is_empty() {
        println!("    faults none from t={} to t={}", t(from), t(to));
    }
    for f in near {
        println!("    fault  {}", f.line());
    }
}

fn report_failures(
    v: &Verdict,
    timers: &HashMap<u64, Timer>,
    pops: &[PopRec],
    faults: &[Fault],
    topo: &Topo,
) {
    let map = by_item(pops);
    let lists = [
        (
            "LOST: acknowledged create, no delete sent, never popped",
            &v.lost,
        ),
        ("EARLY: popped before its due time", &v.early),
        ("POPPED AFTER AN ACKNOWLEDGED DELETE", &v.after_delete),
        (
            "OLD VERSION POPPED AFTER AN ACKNOWLEDGED UPDATE",
            &v.old_version,
        ),
    ];
    for (what, items) in lists {
        if items.is_empty() {
            continue;
        }
        println!(
            "\nINVARIANT FAILED, {what}: {} timer(s){}",
            items.len(),
            match items.len() > SHOWN_MAX {
                true => format!(" (the first {SHOWN_MAX} shown)"),
                false => String::new(),
            }
        );
        println!(
            "  faults they lived through: {}",
            by_fault(items, timers, &map, faults)
        );
        for item in items.iter().take(SHOWN_MAX) {
            let mine = map.get(item).map_or(&[][..], Vec::as_slice);
            print_history(*item, &timers[item], mine, faults, topo);
        }
    }
    let mut doubled: Vec<u64> = map
        .iter()
        .filter(|(item, l)| l.len() > 1 && timers.contains_key(item))
        .map(|(&item, _)| item)
        .collect();
    doubled.sort_unstable();
    if !doubled.is_empty() {
        println!(
            "\n{} timer(s) popped more than once (allowed: at least once); faults they lived through: {}",
            doubled.len(),
            by_fault(&doubled, timers, &map, faults)
        );
    }
    if v.strays > 0 {
        println!(
            "\nINVARIANT FAILED: {} pop(s) for timers (or versions) the load never created",
            v.strays
        );
    }
}

/// How many faults of each kind were made and recovered (and how many
/// were skipped or failed).
fn by_kind(faults: &[Fault]) -> String {
    let kinds = [
        Kind::Kill,
        Kind::LongDown,
        Kind::Split,
        Kind::Grow,
        Kind::Shrink,
        Kind::KillAll,
    ];
    let parts: Vec<String> = kinds
        .iter()
        .map(|&k| {
            let of: Vec<&Fault> = faults.iter().filter(|f| f.kind == k).collect();
            let ok = of
                .iter()
                .filter(|f| matches!(f.end, End::Recovered(_)))
                .count();
            match ok == of.len() {
                true => format!("{} {ok}", k.name()),
                false => format!("{} {ok} (of {})", k.name(), of.len()),
            }
        })
        .collect();
    parts.join("; ")
}

fn pct(n: usize, of: usize) -> f64 {
    100.0 * n as f64 / of.max(1) as f64
}

fn print_summary(o: &Opts, v: &Verdict, sent: u64, faults: &[Fault], split_off: &Option<String>) {
    println!(
        "\nchronos-perf soak: {} s at {} requests/s, seed {}, storage {}, {} core(s) per node",
        o.duration_s,
        o.rate,
        o.seed,
        if o.storage {
            "on (sync batch)"
        } else {
            "OFF (--no-storage)"
        },
        o.cores
    );
    println!(
        "requests {sent}: creates {}; deletes {}; updates {}",
        v.creates.describe(),
        v.deletes.describe(),
        v.updates.describe()
    );
    println!(
        "pops {} for {} timers; duplicates {} ({:.2} % of popped timers); pops (of a deleted timer, or an updated one's old version) in flight during the delete or update {}, after its acknowledgement during a split {}, within the replication lag (2.5 s) after it {}",
        v.pops, v.popped_timers, v.duplicates, pct(v.duplicates, v.popped_timers), v.in_flight, v.during_split, v.replication_lag
    );
    println!(
        "invariants: {} timers had to pop: lost {}; early {}; popped after an acknowledged delete {}; old versions popped after an acknowledged update {}; strays {}",
        v.must_pop, v.lost.len(), v.early.len(), v.after_delete.len(), v.old_version.len(), v.strays
    );
    println!("faults ({}): {}", faults.len(), by_kind(faults));
    for (n, f) in faults.iter().enumerate() {
        println!("  {}. {}", n + 1, f.line());
    }
    if !faults
        .iter()
        .any(|f| f.kind == Kind::KillAll && matches!(f.end, End::Recovered(_)))
    {
        println!("  (no kill of every node was made and recovered: the run was too short or a fault failed)");
    }
    if let Some(why) = split_off {
        println!("!!! the net split fault was SKIPPED: {why}");
    }
}

// ---- the run ----

fn bound(o: &Opts) -> Duration {
    let extra_us = 60_000_000
        + FAULT_LEAD_US
        + 2 * RECOVERY_MAX.as_micros() as u64
        + 2 * DUE_MS.1 * 1000
        + DRAIN_MAX_US
        + 60_000_000;
    Duration::from_secs(o.duration_s) + Duration::from_micros(extra_us)
}

fn run(o: &Opts) -> Result<bool, String> {
    install_exit_paths(bound(o));
    let _guard = Guard;
    let dir = std::env::temp_dir().join(format!("chronos-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    {
        let mut r = registry();
        r.dir = Some(dir.clone());
        r.keep = o.keep;
    }
    let (topo, split_off) = Topo::new(o);
    if let Some(why) = &split_off {
        eprintln!("!!! chronos-perf soak: the net split fault is SKIPPED: network namespaces cannot be used ({why}); the nodes run on 127.0.0.1-{NODES_MAX}");
    }
    let (sink, pops) = start_sink(&topo.sink_ip())?;
    let mut c = Cluster::start(topo, o, dir.clone())?;
    println!(
        "chronos-perf soak: {NODES} nodes at {}, sink {sink}, storage {}, seed {}, logs in {}",
        (1..=NODES)
            .map(|i| c.addr(i).to_string())
            .collect::<Vec<_>>()
            .join(", "),
        if o.storage { "on" } else { "off" },
        o.seed,
        dir.display()
    );
    let load = Arc::new(Load {
        addrs: (1..=NODES_MAX).map(|i| c.addr(i)).collect(),
        targets: c.targets.clone(),
        sink,
        timers: Mutex::new(HashMap::new()),
        changes: Mutex::new(BinaryHeap::new()),
        rolling: Rolling::default(),
        end_us: now_us() + o.duration_s * 1_000_000,
    });
    let mut rng = Rng(o.seed);
    let handle = start_load(load.clone(), o.rate, rng.next());
    let faults = nemesis(&mut c, &mut rng, &load, &split_off);
    let sent = handle.join().map_err(|_| "the load panicked")?;
    println!(
        "load ended at t={} ({sent} requests), the nemesis at t={}; draining",
        t(load.end_us),
        t(now_us())
    );
    let drained = drain(&c, &load, &pops);
    for line in node_counters(&c) {
        println!("{line}");
    }
    let all = c.running();
    c.kill9(&all);
    let results = Results {
        timers: load.timers.lock().unwrap().clone(),
        pops: pops.lock().unwrap().clone(),
        faults,
        sent,
        split_off,
        drained,
    };
    Ok(finish(o, &dir, &c.topo, &results))
}

/// What a run gathered, for the check.
struct Results {
    timers: HashMap<u64, Timer>,
    pops: Vec<PopRec>,
    faults: Vec<Fault>,
    sent: u64,
    split_off: Option<String>,
    drained: Result<(), String>,
}

/// Check, print, and remove the run's files (unless `--keep`; on a
/// failure the node logs stay). Whether everything held.
fn finish(o: &Opts, dir: &std::path::Path, topo: &Topo, r: &Results) -> bool {
    let splits: Vec<(u64, u64)> = r
        .faults
        .iter()
        .filter(|f| f.kind == Kind::Split)
        .filter_map(Fault::span)
        .collect();
    let v = check(&r.timers, &r.pops, &splits);
    report_failures(&v, &r.timers, &r.pops, &r.faults, topo);
    print_summary(o, &v, r.sent, &r.faults, &r.split_off);
    if let Err(e) = &r.drained {
        println!("DRAIN FAILED: {e}");
    }
    let faults_held = !r.faults.iter().any(|f| matches!(f.end, End::Failed(_)));
    let held = v.held() && faults_held && r.drained.is_ok();
    match (held, o.keep) {
        (_, true) => println!("kept {}", dir.display()),
        (true, false) => {
            let _ = std::fs::remove_dir_all(dir);
        }
        (false, false) => println!(
            "node logs and configs kept in {} (storage removed; --keep keeps it)",
            dir.display()
        ),
    }
    println!(
        "{}",
        match held {
            true => "PASS: every invariant held",
            false => "FAIL",
        }
    );
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(sent_us: u64, done_us: u64, outcome: Outcome) -> Op {
        Op {
            node: 1,
            sent_us,
            done_us,
            outcome,
        }
    }

    /// A timer created at 1 s, due at 4 s, with this delete.
    fn timer(create: Outcome, delete: Option<Op>) -> Timer {
        Timer {
            id: Some("0".repeat(32)),
            interval_ms: 3000,
            create: op(1_000_000, 1_001_000, create),
            delete,
            update: None,
        }
    }

    fn pop(item: u64, at_us: u64) -> PopRec {
        PopRec {
            item,
            version: 0,
            seq: 1,
            at_us,
            from: IpAddr::from([127, 0, 0, 1]),
        }
    }

    #[test]
    fn loss_early_pops_and_duplicates_are_found() {
        let timers = HashMap::from([
            (1, timer(Outcome::Acked, None)),
            (2, timer(Outcome::Acked, None)),
            (3, timer(Outcome::Acked, None)),
            (4, timer(Outcome::Unknown("timeout".into()), None)),
        ]);
        // 1 pops twice, 2 never, 3 30 ms early, 4 (unacknowledged) never.
        let pops = [
            pop(1, 4_000_000),
            pop(1, 6_000_000),
            pop(3, 3_970_000),
            pop(9, 5_000_000),
        ];
        let v = check(&timers, &pops, &[]);
        assert_eq!(v.lost, [2]);
        assert_eq!(v.early, [3]);
        assert_eq!((v.duplicates, v.popped_timers, v.must_pop), (1, 2, 3));
        assert_eq!(v.strays, 1);
        assert!(!v.held());
        // 10 ms early is within the margin.
        let v = check(
            &timers,
            &[pop(1, 3_990_000), pop(2, 4_000_000), pop(3, 4_000_000)],
            &[],
        );
        assert!(v.held(), "{v:?}");
    }

    #[test]
    fn a_pop_after_an_acknowledged_delete_fails_unless_in_flight_split_or_lag() {
        let acked = |sent, done| Some(op(sent, done, Outcome::Acked));
        let timers = HashMap::from([
            (1, timer(Outcome::Acked, acked(3_000_000, 3_100_000))),
            (2, timer(Outcome::Acked, acked(3_000_000, 3_100_000))),
            (3, timer(Outcome::Acked, acked(2_000_000, 2_001_000))),
            (4, timer(Outcome::Acked, acked(2_000_000, 2_001_000))),
            (5, timer(Outcome::Acked, acked(2_000_000, 2_001_000))),
        ]);
        let pops = [
            pop(1, 2_900_000), // before the delete: fine
            pop(2, 3_050_000), // while it was answered: in flight
            pop(3, 5_600_000), // after the lag, before the split: fails
            pop(4, 6_500_000), // after, during the split
            pop(5, 3_000_000), // within the replication lag
        ];
        let v = check(&timers, &pops, &[(6_000_000, 7_000_000)]);
        assert_eq!(v.after_delete, [3]);
        assert_eq!((v.in_flight, v.during_split), (1, 1));
        assert_eq!(v.replication_lag, 1);
        assert!(v.lost.is_empty(), "a deleted timer need not pop");
    }

    #[test]
    fn a_delete_that_was_never_sent_leaves_the_timer_due_and_one_unanswered_does_not() {
        let timers = HashMap::from([
            (
                1,
                timer(
                    Outcome::Acked,
                    Some(op(2_000_000, 2_000_100, Outcome::NotSent("refused".into()))),
                ),
            ),
            (
                2,
                timer(
                    Outcome::Acked,
                    Some(op(2_000_000, 5_000_000, Outcome::Unknown("timeout".into()))),
                ),
            ),
        ]);
        let v = check(&timers, &[], &[]);
        assert_eq!(v.lost, [1]);
        assert_eq!(v.must_pop, 1);
    }

    /// A timer created at 1 s (due at 4 s), updated at 3 s to pop 3 s
    /// later (at 6 s), with this outcome.
    fn updated(outcome: Outcome) -> Timer {
        Timer {
            update: Some(Update {
                op: op(3_000_000, 3_100_000, outcome),
                interval_ms: 3000,
            }),
            ..timer(Outcome::Acked, None)
        }
    }

    fn pop_v(item: u64, version: u32, at_us: u64) -> PopRec {
        PopRec {
            version,
            ..pop(item, at_us)
        }
    }

    #[test]
    fn an_acknowledged_update_must_pop_its_version_and_never_the_old_one_after() {
        let timers = HashMap::from([
            (1, updated(Outcome::Acked)),
            (2, updated(Outcome::Acked)),
            (3, updated(Outcome::Acked)),
            (4, updated(Outcome::Acked)),
            (5, updated(Outcome::Unknown("timeout".into()))),
            (6, timer(Outcome::Acked, None)),
        ]);
        let pops = [
            pop_v(1, 1, 6_000_000), // the new version: fine
            pop_v(2, 0, 4_000_000), // the old one, within the lag
            pop_v(2, 1, 6_000_000),
            pop_v(3, 0, 5_700_000), // the old one, after the lag: fails
            pop_v(3, 1, 6_000_000),
            pop_v(4, 1, 5_000_000), // the new version 1 s early; 4 fails
            pop_v(5, 0, 5_700_000), // unanswered: either version, or none
            pop_v(6, 1, 6_000_000), // a version never sent: a stray
        ];
        let v = check(&timers, &pops, &[]);
        assert_eq!(v.old_version, [3]);
        assert_eq!(v.early, [4]);
        assert_eq!(v.lost, [6]);
        assert_eq!((v.replication_lag, v.strays, v.must_pop), (1, 1, 5));
        let v = check(&timers, &[pop_v(1, 0, 4_000_000)], &[]);
        assert_eq!(v.lost, [1, 2, 3, 4, 6], "the old version is not the new");
    }

    #[test]
    fn a_callback_path_names_the_item_and_version() {
        assert_eq!(callback_path("/s/12"), (12, 0));
        assert_eq!(callback_path("/s/12/1"), (12, 1));
        assert_eq!(callback_path("/s/x"), (u64::MAX, 0));
        assert_eq!(callback_path("/t/12"), (u64::MAX, 0));
        assert_eq!(callback_path("/s/12/y"), (u64::MAX, 0));
    }

    #[test]
    fn the_first_round_makes_every_kind_once_grow_before_shrink() {
        for seed in 0..200 {
            let plan = first_round(&mut Rng(seed));
            assert_eq!(plan.len(), 6);
            let at = |k| plan.iter().position(|&x| x == k).expect("every kind");
            assert!(at(Kind::Grow) < at(Kind::Shrink), "{plan:?}");
            assert!(at(Kind::KillAll) <= 2, "{plan:?}");
            at(Kind::Kill);
            at(Kind::LongDown);
            at(Kind::Split);
        }
    }
}
