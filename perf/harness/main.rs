//! `chronos-perf`: the latency-jitter and throughput harness.
//!
//! ```text
//! chronos-perf http  [--target ip:port,...] [--nodes 1] [--cores 1] [--connections 16]
//!                    [--count 20000] [--rate 0] [--interval-ms 1000|500-1500] [--pops 1]
//!                    [--preload 0] [--replication-factor 2] [--name NAME] [--out-dir perf/results]
//!                    [--due-lead-ms 0 --due-window-ms 1000]   (a burst: all due in one window)
//!                    [--callback-to ip:port]   (callbacks to an outside target, e.g. nginx)
//!                    [--callback-scheme http|https]   (https: the target speaks TLS; give the
//!                     nodes its CA with --extra-config, `[timers] callback-ca-file`)
//! chronos-perf queue [--brokers host:port] [--postgres-url URL] [--rate 5000]
//!                    [--duration-s 10] [--delay-ms 3000] [--partitions 2] [--cores 2] [--name NAME]
//!                    [--grace-s 60]   (wait this long past the last deadline; arrivals after
//!                     the first 60 s are reported as late, not lost)
//!                    [--keep 1]   (keep the table, and leave the broker running with the topics)
//! chronos-perf floor <epoll|uring> <ip:port> [seconds]   (the least a server can do
//!                     per request: floor.rs; perf/http-bench.sh's FLOOR=1 rows)
//! chronos-perf soak  [--duration-s 60] [--rate 200] [--seed N] [--cores 1]
//!                    [--no-storage] [--keep] [--loopback]   (the fault soak: soak.rs)
//! ```
//!
//! Without `--target`/`--brokers` it starts what it needs itself: chronos
//! nodes (the `chronos` binary next to this one) on 127.0.0.1.. with one
//! port, and, for `queue`, a tansu broker. It prints a table and writes
//! `<name>.json` and `<name>.svg` (a lateness CDF) under the output folder.
//! Every run is bounded in time and count.

mod account;
mod floor;
mod report;
mod soak;
mod stages;

use report::{svg_cdf, tally, Arrival, Dist, Schedule, Tally};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Longest a run may take beyond its schedule.
const GRACE_MAX: Duration = Duration::from_secs(60);
/// Connections the harness opens to chronos.
const CONNECTIONS_MAX: usize = 256;

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// µs since the harness started (the clock every due time uses).
fn now_us() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

struct Args {
    mode: String,
    flags: HashMap<String, String>,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let mut it = std::env::args().skip(1);
        let mode = it
            .next()
            .ok_or("usage: chronos-perf http|queue|soak [--flag value ...]")?;
        let mut flags = HashMap::new();
        while let Some(k) = it.next() {
            let name = k
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {k}"))?;
            let v = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
            flags.insert(name.to_string(), v);
        }
        Ok(Args { mode, flags })
    }

    fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.flags.get(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("--{name} {v:?} is invalid")),
        }
    }

    fn str(&self, name: &str, default: &str) -> String {
        self.flags
            .get(name)
            .cloned()
            .unwrap_or_else(|| default.to_string())
    }
}

fn main() {
    EPOCH.get_or_init(Instant::now);
    if std::env::args().nth(1).as_deref() == Some("floor") {
        std::process::exit(floor::main(&std::env::args().skip(2).collect::<Vec<_>>()));
    }
    if std::env::args().nth(1).as_deref() == Some("soak") {
        std::process::exit(soak::main(&std::env::args().skip(2).collect::<Vec<_>>()));
    }
    let result = Args::parse().and_then(|a| match a.mode.as_str() {
        "http" => http_mode(&a),
        "queue" => queue_mode(&a),

        other => Err(format!("unknown mode {other}; use http, queue or soak")),
    });
    if let Err(e) = result {
        eprintln!("chronos-perf: {e}");
        std::process::exit(2);
    }
}

// ---- shared pieces ----

/// The machine's own timer noise: oversleep of a 1 ms sleep, sampled on a
/// thread for as long as the run lasts.
struct Noise {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Dist>,
}

impl Noise {
    fn start() -> Noise {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut d = Dist::default();
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                std::thread::sleep(Duration::from_millis(1));
                let over = t.elapsed().saturating_sub(Duration::from_millis(1));
                d.record_us(over.as_micros() as u64);
            }
            d
        });
        Noise { stop, thread }
    }

    fn finish(self) -> Dist {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("noise thread")
    }
}

fn free_port(ips: usize) -> u16 {
    'search: loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        for i in 2..=ips {
            if TcpListener::bind(format!("127.0.0.{i}:{port}")).is_err() {
                continue 'search;
            }
        }
        return port;
    }
}

/// Chronos processes started by the harness; killed when dropped.
struct Nodes {
    children: Vec<Child>,
    addrs: Vec<SocketAddr>,
    _dir: std::path::PathBuf,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The `chronos` binary next to this one, or `CHRONOS_BIN` (e.g. an older
/// build to compare against in the same run).
fn chronos_binary() -> std::path::PathBuf {
    if let Some(bin) = std::env::var_os("CHRONOS_BIN") {
        return bin.into();
    }
    let me = std::env::current_exe().expect("current exe");
    me.parent().expect("exe dir").join("chronos")
}

fn start_nodes(n: usize, cores: usize, extra: &str) -> Result<Nodes, String> {
    let port = free_port(n);
    let dir = std::env::temp_dir().join(format!("chronos-perf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let list: Vec<String> = (1..=n).map(|i| format!("\"127.0.0.{i}:{port}\"")).collect();
    let mut children = Vec::new();
    let mut addrs = Vec::new();
    for i in 1..=n {
        // `{node}` in the extra config is the node's number (a storage
        // path of its own).
        let extra = extra.replace("{node}", &i.to_string());
        let cfg = format!(
            "[http]\nbind-address = \"127.0.0.{i}\"\nbind-port = {port}\n[runtime]\ncores = {cores}\n[cluster]\nlocalhost = \"127.0.0.{i}:{port}\"\nnode = [{}]\n[log]\nlevel = \"warn\"\n{extra}",
            list.join(", ")
        );
        let path = dir.join(format!("node{i}.toml"));
        std::fs::write(&path, cfg).map_err(|e| e.to_string())?;
        let child = Command::new(chronos_binary())
            .env_remove("CHRONOS_BIN")
            .arg("--config")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("start {}: {e}", chronos_binary().display()))?;
        children.push(child);
        addrs.push(format!("127.0.0.{i}:{port}").parse().unwrap());
    }
    let nodes = Nodes {
        children,
        addrs,
        _dir: dir,
    };
    for a in &nodes.addrs {
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(a).is_err() {
            if Instant::now() > deadline {
                return Err(format!("chronos at {a} did not start"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(nodes)
}

fn write_results(
    out_dir: &str,
    name: &str,
    json: &serde_json::Value,
    svg: &str,
) -> Result<(), String> {
    std::fs::create_dir_all(out_dir).map_err(|e| format!("{out_dir}: {e}"))?;
    let j = format!("{out_dir}/{name}.json");
    std::fs::write(&j, serde_json::to_string_pretty(json).unwrap() + "\n")
        .map_err(|e| format!("{j}: {e}"))?;
    let s = format!("{out_dir}/{name}.svg");
    std::fs::write(&s, svg).map_err(|e| format!("{s}: {e}"))?;
    println!("wrote {j} and {s}");
    Ok(())
}

fn machine() -> serde_json::Value {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    serde_json::json!({ "cores": cores, "kernel": kernel.trim() })
}

fn print_header() {
    println!(
        "{:<18} {:>9} {:>9} {:>6} {:>5} {:>5} {:>9} {:>9} {:>9} {:>9}",
        "",
        "expected",
        "delivered",
        "lost",
        "dups",
        "early",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms"
    );
}

/// A distribution alone (no counts), under the same columns.
fn print_summary(label: &str, s: &report::Summary) {
    println!(
        "{label:<18} {:>46} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
        "", s.p50_ms, s.p99_ms, s.p999_ms, s.max_ms
    );
}

fn print_row(label: &str, t: &Tally) {
    let s = t.lateness.summary();
    println!(
        "{label:<18} {:>9} {:>9} {:>6} {:>5} {:>5} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
        t.expected,
        t.delivered,
        t.lost,
        t.duplicates,
        t.early,
        s.p50_ms,
        s.p99_ms,
        s.p999_ms,
        s.max_ms
    );
}

fn tally_json(t: &Tally) -> serde_json::Value {
    serde_json::json!({
        "expected": t.expected, "delivered": t.delivered, "lost": t.lost,
        "duplicates": t.duplicates, "early": t.early, "unexpected": t.unexpected,
        "lateness": t.lateness.summary().json(),
    })
}

// ---- http mode ----

/// A callback sink: records `(item, sequence, arrival)` for `POST /p/<item>`.
struct Sink {
    addr: SocketAddr,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    count: Arc<AtomicU64>,
}

impl Sink {
    fn start(capacity: usize) -> Sink {
        let listener = TcpListener::bind("127.0.0.1:0").expect("sink bind");
        let addr = listener.local_addr().unwrap();
        let arrivals = Arc::new(Mutex::new(Vec::with_capacity(capacity)));
        let count = Arc::new(AtomicU64::new(0));
        let (a, c) = (arrivals.clone(), count.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (a, c) = (a.clone(), c.clone());
                std::thread::spawn(move || sink_connection(stream, a, c));
            }
        });
        Sink {
            addr,
            arrivals,
            count,
        }
    }
}

fn sink_connection(stream: TcpStream, arrivals: Arc<Mutex<Vec<Arrival>>>, count: Arc<AtomicU64>) {
    let _ = stream.set_nodelay(true);
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let mut line = String::new();
    let mut body = Vec::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let at_us = now_us();
        let item: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.rsplit('/').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(u64::MAX);
        let Ok(Some((len, sequence))) = read_headers(&mut reader, &mut line) else {
            return;
        };
        body.resize(len, 0);
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        arrivals.lock().unwrap().push(Arrival {
            item,
            sequence,
            at_us,
        });
        count.fetch_add(1, Ordering::Relaxed);
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}

/// `a` or `a-b` milliseconds.
fn interval_range(text: &str) -> Result<(u64, u64), String> {
    let bad = || format!("--interval-ms {text:?}: use N or A-B");
    match text.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            if a > b || a == 0 {
                return Err(bad());
            }
            Ok((a, b))
        }
        None => {
            let a = text.parse().map_err(|_| bad())?;
            if a == 0 {
                return Err(bad());
            }
            Ok((a, a))
        }
    }
}

fn seconds(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// Read header lines up to the blank line that ends them. Returns
/// `Content-Length` and `X-Sequence-Number` (0 when absent), or `None` when
/// the stream ends first.
fn read_headers(
    reader: &mut impl BufRead,
    line: &mut String,
) -> std::io::Result<Option<(usize, u32)>> {
    let (mut len, mut sequence) = (0usize, 0u32);
    loop {
        line.clear();
        if reader.read_line(line)? == 0 {
            return Ok(None);
        }
        let h = line.trim_end();
        if h.is_empty() {
            return Ok(Some((len, sequence)));
        }
        if let Some((n, v)) = h.split_once(':') {
            if n.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            } else if n.eq_ignore_ascii_case("x-sequence-number") {
                sequence = v.trim().parse().unwrap_or(0);
            }
        }
    }
}

fn read_response(reader: &mut BufReader<TcpStream>, line: &mut String) -> Result<u16, String> {
    line.clear();
    reader.read_line(line).map_err(|e| e.to_string())?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {line:?}"))?;
    let (len, _) = read_headers(reader, line)
        .map_err(|e| e.to_string())?
        .ok_or("connection closed in the response head")?;
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).map_err(|e| e.to_string())?;
    Ok(status)
}

fn post(
    scheme: &str,
    item: u64,
    interval_ms: u64,
    pops: u64,
    rf: u32,
    sink: SocketAddr,
    host: SocketAddr,
) -> Vec<u8> {
    let body = format!(
        r#"{{"timing":{{"interval":{},"repeat-for":{}}},"callback":{{"http":{{"uri":"{scheme}://{sink}/p/{item}","opaque":"perf"}}}},"reliability":{{"replication-factor":{rf}}}}}"#,
        seconds(interval_ms),
        seconds(interval_ms * pops)
    );
    format!(
        "POST /timers HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn http_mode(a: &Args) -> Result<(), String> {
    let count: u64 = a.get("count", 20_000)?;
    let connections: usize = a.get("connections", 16)?;
    let rate: f64 = a.get("rate", 0.0)?;
    let (lo, hi) = interval_range(&a.str("interval-ms", "1000"))?;
    let pops: u64 = a.get("pops", 1)?;
    let preload: u64 = a.get("preload", 0)?;
    let rf: u32 = a.get("replication-factor", 2)?;
    let n_nodes: usize = a.get("nodes", 1)?;
    let cores: usize = a.get("cores", 1)?;
    // A burst: every timer due within `due-window-ms`, starting
    // `due-lead-ms` after the run starts (0: intervals from --interval-ms).
    let due_lead_ms: u64 = a.get("due-lead-ms", 0)?;
    let due_window_ms: u64 = a.get("due-window-ms", 1000)?;
    let name = a.str("name", "http");
    let out_dir = a.str("out-dir", "perf/results");
    if connections == 0 || connections > CONNECTIONS_MAX || pops == 0 || count == 0 {
        return Err(format!(
            "--connections must be 1..={CONNECTIONS_MAX}; --count and --pops positive"
        ));
    }
    let (_nodes, targets) = match a.flags.get("target") {
        Some(t) => {
            let list: Result<Vec<SocketAddr>, _> = t.split(',').map(str::parse).collect();
            (
                None,
                list.map_err(|_| format!("--target {t:?}: ip:port[,ip:port]"))?,
            )
        }
        None => {
            // `--extra-config FILE`: TOML appended to each node's config
            // (an A/B of any setting; `{node}` stands for the node's
            // number, e.g. in a `[storage] path`).
            let extra = match a.flags.get("extra-config") {
                Some(path) => std::fs::read_to_string(path)
                    .map_err(|e| format!("--extra-config {path}: {e}"))?,
                None => String::new(),
            };
            let nodes = start_nodes(n_nodes, cores, &extra)?;
            let addrs = nodes.addrs.clone();
            (Some(nodes), addrs)
        }
    };
    let sink = Sink::start((count * pops) as usize);
    // `--callback-to ip:port`: callbacks go to an outside target (nginx);
    // loss and throughput are then read from the node's counters.
    let callback_to: Option<SocketAddr> = match a.flags.get("callback-to") {
        Some(t) => Some(
            t.parse()
                .map_err(|_| format!("--callback-to {t:?}: ip:port"))?,
        ),
        None => None,
    };
    let sink_addr = callback_to.unwrap_or(sink.addr);
    let scheme: &'static str = match a.str("callback-scheme", "http").as_str() {
        "http" => "http",
        "https" if callback_to.is_some() => "https",
        other => {
            return Err(format!(
                "--callback-scheme {other:?}: http, or https with --callback-to"
            ))
        }
    };
    let noise = Noise::start();
    // Preload: long timers that stay pending through the run.
    if preload > 0 {
        let started = Instant::now();
        let per = preload.div_ceil(connections as u64);
        let threads: Vec<_> = (0..connections)
            .map(|c| {
                let target = targets[c % targets.len()];
                let sink = sink.addr;
                std::thread::spawn(move || -> Result<(), String> {
                    let s = TcpStream::connect(target).map_err(|e| e.to_string())?;
                    let _ = s.set_nodelay(true);
                    let mut w = s.try_clone().unwrap();
                    let mut r = BufReader::new(s);
                    let mut line = String::new();
                    let mut done = 0;
                    while done < per {
                        let batch = (per - done).min(64);
                        let mut buf = Vec::new();
                        for _ in 0..batch {
                            buf.extend(post(scheme, u64::MAX - 1, 3_600_000, 1, rf, sink, target));
                        }
                        w.write_all(&buf).map_err(|e| e.to_string())?;
                        for _ in 0..batch {
                            read_response(&mut r, &mut line)?;
                        }
                        done += batch;
                    }
                    Ok(())
                })
            })
            .collect();
        for t in threads {
            t.join().map_err(|_| "preload thread panicked")??;
        }
        println!(
            "preloaded {preload} pending timers in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    // The measured run.
    let schedule = Arc::new(Mutex::new(Schedule::default()));
    let req_lat = Arc::new(Mutex::new(Dist::default()));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let started_us = now_us();
    let threads: Vec<_> = (0..connections)
        .map(|c| {
            let target = targets[c % targets.len()];
            let (schedule, req_lat, errors, sink) =
                (schedule.clone(), req_lat.clone(), errors.clone(), sink_addr);
            std::thread::spawn(move || -> Result<(), String> {
                let s = TcpStream::connect(target).map_err(|e| e.to_string())?;
                let _ = s.set_nodelay(true);
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                let mut line = String::new();
                let mut local = Schedule::default();
                let mut lat = Dist::default();
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ c as u64;
                let per_thread_rate = rate / connections as f64;
                let mut k = 0u64;
                loop {
                    let item = c as u64 + k * connections as u64;
                    if item >= count {
                        break;
                    }
                    if per_thread_rate > 0.0 {
                        let at = started + Duration::from_secs_f64(k as f64 / per_thread_rate);
                        let now = Instant::now();
                        if at > now {
                            std::thread::sleep(at - now);
                        }
                    }
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let mut interval = lo + rng % (hi - lo + 1);
                    if due_lead_ms > 0 {
                        let due_us =
                            started_us + due_lead_ms * 1000 + item * due_window_ms * 1000 / count;
                        interval = (due_us.saturating_sub(now_us()) / 1000).max(1);
                    }
                    let req = post(scheme, item, interval, pops, 1.max(rf), sink, target);
                    let sent = now_us();
                    w.write_all(&req).map_err(|e| e.to_string())?;
                    let status = read_response(&mut r, &mut line)?;
                    lat.record_us(now_us() - sent);
                    if status != 200 {
                        errors.fetch_add(1, Ordering::Relaxed);
                        k += 1;
                        continue;
                    }
                    local.due_us.insert(
                        item,
                        (1..=pops).map(|n| sent + n * interval * 1000).collect(),
                    );
                    k += 1;
                }
                schedule.lock().unwrap().due_us.extend(local.due_us);
                req_lat.lock().unwrap().hist.add(&lat.hist).unwrap();
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "load thread panicked")??;
    }
    let send_secs = started.elapsed().as_secs_f64();
    let schedule = Arc::try_unwrap(schedule)
        .ok()
        .unwrap()
        .into_inner()
        .unwrap();
    let expected: u64 = schedule.due_us.values().map(|v| v.len() as u64).sum();
    let last_due = schedule
        .due_us
        .values()
        .flatten()
        .copied()
        .max()
        .unwrap_or(0);
    // Wait for every pop, and past every backup's skew for duplicates.
    let skew_us = 2_000_000 * (rf.max(1) as u64 - 1).min(n_nodes as u64);
    let wait_until = last_due + skew_us + 1_500_000;
    let hard_stop =
        Instant::now() + GRACE_MAX + Duration::from_micros(wait_until.saturating_sub(now_us()));
    if callback_to.is_some() {
        let first_due = schedule
            .due_us
            .values()
            .flatten()
            .copied()
            .min()
            .unwrap_or(0);
        return wait_external(targets[0], expected, first_due, last_due, hard_stop);
    }
    while now_us() < wait_until && Instant::now() < hard_stop {
        std::thread::sleep(Duration::from_millis(50));
    }
    while sink.count.load(Ordering::Relaxed) < expected && Instant::now() < hard_stop {
        std::thread::sleep(Duration::from_millis(50));
    }
    let noise = noise.finish();
    let arrivals = sink.arrivals.lock().unwrap().clone();
    let t = tally(&schedule, &arrivals);
    let req = Arc::try_unwrap(req_lat).ok().unwrap().into_inner().unwrap();
    let throughput = expected.min(count) as f64 / send_secs;
    println!(
        "\nchronos-perf http: {} node(s) x {cores} core(s), {connections} connections, {count} timers, interval {lo}-{hi} ms, {pops} pop(s) each, rf {rf}, preload {preload}",
        targets.len()
    );
    println!(
        "POST throughput {throughput:.0} req/s over {send_secs:.2} s; {} errors",
        errors.load(Ordering::Relaxed)
    );
    print_header();
    print_row("pop lateness", &t);
    let r = req.summary();
    print_summary("request latency", &r);
    let ns = noise.summary();
    print_summary("1 ms sleep noise", &ns);
    let json = serde_json::json!({
        "mode": "http", "name": name, "unix_ms": unix_us() / 1000, "machine": machine(),
        "params": { "nodes": targets.len(), "cores": cores, "connections": connections, "count": count,
                    "rate": rate, "interval_ms": [lo, hi], "pops": pops, "preload": preload, "replication_factor": rf },
        "post_throughput_per_s": throughput, "errors": errors.load(Ordering::Relaxed),
        "request_latency": r.json(), "pops": tally_json(&t), "noise_1ms_sleep": ns.json(),
    });
    let svg = svg_cdf(
        &format!("{name}: pop lateness and machine noise"),
        &[
            ("pop lateness", &t.lateness),
            ("1 ms sleep oversleep", &noise),
        ],
    );
    write_results(&out_dir, &name, &json, &svg)?;
    if t.lost > 0 || t.early > 0 {
        return Err(format!("{} pops lost, {} early", t.lost, t.early));
    }
    Ok(())
}

/// A node's `/metrics` text (empty if it cannot be read).
fn metrics_text(addr: SocketAddr) -> String {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

/// One unlabelled counter in a `/metrics` text (0 if absent).
fn counter(metrics: &str, metric: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(metric)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// With an outside callback target: wait until the node has finished every
/// callback (succeeded, failed or deferred), then report from its counters.
fn wait_external(
    node: SocketAddr,
    expected: u64,
    first_due_us: u64,
    last_due_us: u64,
    hard_stop: Instant,
) -> Result<(), String> {
    // (succeeded, failed, deferred), from one scrape.
    let outcomes = || {
        let text = metrics_text(node);
        let n = |m: &str| counter(&text, &format!("chronos_callbacks_{m}_total"));
        (n("succeeded"), n("failed"), n("deferred"))
    };
    let mut finished_us = now_us();
    let mut seen = outcomes();
    while Instant::now() < hard_stop {
        finished_us = now_us();
        if seen.0 + seen.1 + seen.2 >= expected as f64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        seen = outcomes();
    }
    let (ok, failed, deferred) = seen;
    let span_s = finished_us.saturating_sub(first_due_us) as f64 / 1e6;
    println!(
        "callbacks to the outside target: {ok} succeeded, {failed} failed, {deferred} deferred of {expected}; due over {:.2} s, all done {:.2} s after the first was due: {:.0} callbacks/s",
        last_due_us.saturating_sub(first_due_us) as f64 / 1e6,
        span_s,
        ok / span_s.max(1e-3)
    );
    if ok < expected as f64 {
        return Err(format!(
            "{} callbacks did not succeed",
            expected as f64 - ok
        ));
    }
    Ok(())
}

/// `(le, cumulative count)` of one histogram from a node's `/metrics`.
fn scrape(addr: SocketAddr, metric: &str) -> Vec<(String, u64)> {
    metrics_text(addr)
        .lines()
        .filter_map(|l| l.strip_prefix(metric))
        .filter_map(|rest| {
            let le = rest.split('"').nth(1)?.to_string();
            let n = rest.rsplit(' ').next()?.parse().ok()?;
            Some((le, n))
        })
        .collect()
}

// ---- queue mode ----

fn tansu_path() -> String {
    std::env::var("CHRONOS_TANSU").unwrap_or_else(|_| {
        format!(
            "{}/.cache/chronos-ci/tansu/bin/tansu",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into())
        )
    })
}

struct Tansu(Child);

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn iso_utc(unix_ms: u64) -> String {
    format!(
        "{}Z",
        chronos::queue::deadline::format_utc_ms(unix_ms as i64)
    )
}

fn queue_mode(a: &Args) -> Result<(), String> {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Header, Message, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let rate: f64 = a.get("rate", 5000.0)?;
    let duration_s: f64 = a.get("duration-s", 10.0)?;
    let delay_ms: u64 = a.get("delay-ms", 3000)?;
    let partitions: u32 = a.get("partitions", 2)?;
    let advance_ms: u64 = a.get("advance-ms", 50)?;
    let cores: usize = a.get("cores", 2)?;
    let grace = Duration::from_secs(a.get("grace-s", GRACE_MAX.as_secs())?);
    let keep = a.get("keep", 0u8)? != 0;
    let pg_url = a.str("postgres-url", "postgres://postgres@127.0.0.1:5432/test");
    let name = a.str("name", "queue");
    let out_dir = a.str("out-dir", "perf/results");
    let total = (rate * duration_s) as u64;
    if rate <= 0.0 || total == 0 || total > 10_000_000 {
        return Err("--rate × --duration-s must be 1..=10,000,000 messages".into());
    }
    let (tansu, brokers) = match a.flags.get("brokers") {
        Some(b) => (None, b.clone()),
        None => {
            let port = free_port(1);
            let url = format!("tcp://127.0.0.1:{port}");
            let child = Command::new(tansu_path())
                .args([
                    "broker",
                    "--listener-url",
                    &url,
                    "--advertised-listener-url",
                    &url,
                    "--storage-engine",
                    "memory://tansu/",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("start tansu ({}): {e}", tansu_path()))?;
            let deadline = Instant::now() + Duration::from_secs(20);
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                if Instant::now() > deadline {
                    return Err("tansu did not start".into());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (Some(Tansu(child)), format!("127.0.0.1:{port}"))
        }
    };
    let tag = format!("{}_{}", std::process::id(), unix_us() % 1_000_000_000);
    let (input, output, table) = (
        format!("perf_in_{tag}"),
        format!("perf_out_{tag}"),
        format!("perf_q_{tag}"),
    );
    for t in [&input, &output] {
        let out = Command::new(tansu_path())
            .args([
                "topic",
                "create",
                "--broker",
                &format!("tcp://{brokers}"),
                "--partitions",
                &partitions.to_string(),
                t,
            ])
            .output()
            .map_err(|e| format!("tansu topic create: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "topic {t}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    let extra = format!(
        "[queue]\nkafka-brokers = \"{brokers}\"\ninput-topic = \"{input}\"\noutput-topic = \"{output}\"\nconsumer-group = \"{table}\"\npostgres-url = \"{pg_url}\"\ntable = \"{table}\"\ntiming-advance-ms = {advance_ms}\n[queue.consumer]\n\"session.timeout.ms\" = 6000\n[queue.producer]\n\"linger.ms\" = 2\n"
    );
    let nodes = start_nodes(1, cores, &extra)?;
    let noise = Noise::start();
    // The reader: from the beginning of the output topic.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", format!("perf_reader_{tag}"))
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("fetch.wait.max.ms", "10")
        .create()
        .map_err(|e| e.to_string())?;
    consumer
        .subscribe(&[output.as_str()])
        .map_err(|e| e.to_string())?;
    let arrivals = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let stop = Arc::new(AtomicBool::new(false));
    // Distinct keys of the run seen so far.
    let distinct = Arc::new(AtomicU64::new(0));
    let reader = {
        let (arrivals, stop, distinct) = (arrivals.clone(), stop.clone(), distinct.clone());
        std::thread::spawn(move || {
            let mut seen = vec![false; total as usize];
            while !stop.load(Ordering::Relaxed) {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(20)) {
                    let at_us = unix_us();
                    let item = account::key_of(m.key());
                    if let Some(s) = seen.get_mut(item as usize) {
                        if !*s {
                            *s = true;
                            distinct.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    arrivals.lock().unwrap().push(Arrival {
                        item,
                        sequence: 1,
                        at_us,
                    });
                }
            }
        })
    };
    // Let the node's and the reader's group joins settle (tansu: ~half the
    // session timeout), so the first deadlines are not measured against it.
    std::thread::sleep(Duration::from_secs(4));
    // Every delivery report is kept: a message the broker never took is
    // the harness's failure, not the node's.
    let producer: BaseProducer<account::Acks> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create_with_context(account::Acks::default())
        .map_err(|e| e.to_string())?;
    let mut schedule = Schedule::default();
    let mut pids = vec![("chronos", nodes.children[0].id())];
    if let Some(t) = &tansu {
        pids.push(("tansu", t.0.id()));
    }
    let cpu = stages::CpuWindow::start(pids);
    let started = Instant::now();
    for i in 0..total {
        let at = started + Duration::from_secs_f64(i as f64 / rate);
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        let deadline_us = unix_us() + delay_ms * 1000;
        let deadline = iso_utc(deadline_us / 1000);
        // The deadline as written has ms resolution. Lateness counts from
        // the intended publish time, deadline - timing advance: arrival minus
        // deadline is this minus the advance (so the figures are conservative).
        schedule
            .due_us
            .insert(i, vec![deadline_us / 1000 * 1000 - advance_ms * 1000]);
        let key = i.to_string();
        let id = format!("{tag}-{i}");
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "chronosMessageId",
                value: Some(id.as_bytes()),
            })
            .insert(Header {
                key: "chronosDeadline",
                value: Some(deadline.as_bytes()),
            });
        let mut rec = Some(
            BaseRecord::<str, str>::to(&input)
                .key(&key)
                .payload("perf")
                .headers(headers),
        );
        while let Some(r) = rec.take() {
            if let Err((_, r)) = producer.send(r) {
                producer.poll(Duration::from_millis(1));
                rec = Some(r);
            }
        }
        if i % 1024 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    producer
        .flush(Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    let produce_secs = started.elapsed().as_secs_f64();
    let last_due = unix_us() + delay_ms * 1000;
    let produced_at = Instant::now();
    let standard_stop = produced_at + Duration::from_millis(delay_ms) + GRACE_MAX;
    let standard_stop_unix_us = unix_us() + (delay_ms * 1000) + GRACE_MAX.as_micros() as u64;
    let hard_stop = produced_at + Duration::from_millis(delay_ms) + grace;
    // Arrivals by the standard wait's end (all of them, if all came first).
    let mut at_standard: Option<u64> = None;
    // The CPU window ends with the last arrival or the standard wait, not
    // with a longer `--grace-s`.
    let mut cpu = Some(cpu);
    let mut cores_used = Vec::new();
    loop {
        let got = distinct.load(Ordering::Relaxed);
        let now = Instant::now();
        if at_standard.is_none() && (now >= standard_stop || got >= total) {
            at_standard = Some(got);
            cores_used = cpu
                .take()
                .map(stages::CpuWindow::finish)
                .unwrap_or_default();
        }
        if got >= total || now >= hard_stop {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(c) = cpu.take() {
        cores_used = c.finish();
    }
    // A little longer, for duplicates.
    while unix_us() < last_due + 1_000_000 && Instant::now() < hard_stop {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = reader.join();
    let noise = noise.finish();
    // The engine's own view: publish acknowledged minus deadline.
    let engine = scrape(nodes.addrs[0], "chronos_queue_lateness_seconds_bucket");
    let stage_list = stages::scrape_stages(nodes.addrs[0]);
    let counters = queue_counters(nodes.addrs[0]);
    // Stopped before the accounting, so that nothing moves under it (a
    // kill: up to a second of stored offsets is not committed, which can
    // only make a message look not yet taken, never lost).
    drop(nodes);
    let arrivals = arrivals.lock().unwrap().clone();
    let t = tally(&schedule, &arrivals);
    let late_past_standard = arrivals_after(&arrivals, standard_stop_unix_us);
    let missing = missing_keys(total, &arrivals);
    let id_of = |k: u64| format!("{tag}-{k}");
    let accounting = if missing.is_empty() {
        None
    } else {
        let places = account::Places {
            brokers: &brokers,
            input: &input,
            output: &output,
            group: &table,
            table: &table,
            partitions,
            id_of: &id_of,
        };
        Some(account::account(
            &places,
            total,
            &missing,
            producer.context(),
        )?)
    };
    let first = arrivals.iter().map(|a| a.at_us).min().unwrap_or(0);
    let last = arrivals.iter().map(|a| a.at_us).max().unwrap_or(0);
    let out_rate = if last > first {
        arrivals.len() as f64 / ((last - first) as f64 / 1e6)
    } else {
        0.0
    };
    println!("\nchronos-perf queue: {cores} core(s), offered {rate:.0} msg/s for {duration_s} s ({total} messages), delay {delay_ms} ms");
    println!(
        "produced at {:.0} msg/s; delivered at {out_rate:.0} msg/s",
        total as f64 / produce_secs
    );
    print_header();
    print_row("queue lateness", &t);
    let ns = noise.summary();
    print_summary("1 ms sleep noise", &ns);
    let buckets: Vec<String> = engine.iter().map(|(le, n)| format!("≤{le}s:{n}")).collect();
    println!(
        "engine (publish acknowledged - deadline), cumulative: {}",
        buckets.join(" ")
    );
    stages::print_stages(&stage_list);
    let acked = producer.context().acked.load(Ordering::Relaxed);
    let produce_failed = producer.context().failed.lock().unwrap().len();
    println!("harness produce: {acked} acknowledged by the broker, {produce_failed} failed");
    let c: Vec<String> = counters.iter().map(|(n, v)| format!("{n} {v}")).collect();
    println!("node counters: {}", c.join(", "));
    println!(
        "arrived within the first {} s past the last deadline: {}; arrived later (late, not lost): {late_past_standard}; never arrived within {} s: {}",
        GRACE_MAX.as_secs(),
        at_standard.map_or("(the wait ended first)".to_string(), |n| n.to_string()),
        grace.as_secs(),
        missing.len()
    );
    if let Some(acc) = &accounting {
        acc.print();
    }
    let used: Vec<String> = cores_used
        .iter()
        .map(|(n, c)| format!("{n} {c:.2}"))
        .collect();
    println!(
        "cores used, produce start to last arrival: {}",
        used.join(", ")
    );
    let json = serde_json::json!({
        "engine_ack_lateness_buckets": engine.iter().map(|(le, n)| serde_json::json!({"le_s": le, "count": n})).collect::<Vec<_>>(),
        "mode": "queue", "name": name, "unix_ms": unix_us() / 1000, "machine": machine(),
        "params": { "rate": rate, "duration_s": duration_s, "delay_ms": delay_ms, "partitions": partitions, "cores": cores },
        "produced_per_s": total as f64 / produce_secs, "delivered_per_s": out_rate,
        "messages": tally_json(&t), "noise_1ms_sleep": ns.json(),
        "lateness_from": "deadline - advance_ms (the intended publish time), measured at the harness's own consumer; arrival - deadline = lateness - advance_ms",
        "advance_ms": advance_ms,
        "stages": stages::stages_json(&stage_list),
        "cores_used": cores_used.iter().map(|(n, c)| serde_json::json!({"process": n, "cores": c})).collect::<Vec<_>>(),
        "chronos_binary": chronos_binary().display().to_string(),
        "grace_s": grace.as_secs(), "arrived_within_standard_grace": at_standard,
        "arrived_after_standard_grace": late_past_standard, "never_arrived": missing.len(),
        "produce_acked": acked, "produce_failed": produce_failed,
        "node_counters": counters.iter().map(|(n, v)| (n.clone(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
        "accounting": accounting.as_ref().map(account::Accounting::json),
    });
    let svg = svg_cdf(
        &format!("{name}: queue lateness (consumer arrival - (deadline - {advance_ms} ms))"),
        &[
            ("queue lateness", &t.lateness),
            ("1 ms sleep oversleep", &noise),
        ],
    );
    write_results(&out_dir, &name, &json, &svg)?;
    if keep {
        println!("kept: table {table}, group {table}, topics {input} -> {output} on {brokers}");
        // The broker (memory storage) is left running with the topics.
        std::mem::forget(tansu);
    } else {
        let _ = account::psql(&format!("DROP TABLE IF EXISTS {table}"));
    }
    let lost = accounting
        .as_ref()
        .and_then(|a| a.fates.get(&account::Fate::Lost))
        .map_or(0, Vec::len);
    if lost > 0 {
        return Err(format!(
            "{lost} messages lost by the node (committed, not stored, not published)"
        ));
    }
    if t.lost > 0 {
        return Err(format!(
            "{} messages not delivered within {} s",
            t.lost,
            grace.as_secs()
        ));
    }
    Ok(())
}

/// The node's queue counters (`chronos_queue_*_total`, unlabelled, and the
/// rejections by reason).
fn queue_counters(addr: SocketAddr) -> Vec<(String, f64)> {
    metrics_text(addr)
        .lines()
        .filter(|l| {
            l.starts_with("chronos_queue_")
                && !l.contains("_bucket")
                && !l.contains("_sum")
                && !l.contains("_count")
        })
        .filter_map(|l| {
            let (name, v) = l.rsplit_once(' ')?;
            Some((name.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Distinct keys whose first arrival came after `unix_us`.
fn arrivals_after(arrivals: &[Arrival], unix_us: u64) -> u64 {
    let mut first: HashMap<u64, u64> = HashMap::new();
    for a in arrivals {
        let e = first.entry(a.item).or_insert(a.at_us);
        *e = (*e).min(a.at_us);
    }
    first.values().filter(|&&at| at > unix_us).count() as u64
}

/// The run's keys `0..total` that never arrived.
fn missing_keys(total: u64, arrivals: &[Arrival]) -> Vec<u64> {
    let seen: std::collections::HashSet<u64> = arrivals.iter().map(|a| a.item).collect();
    (0..total).filter(|k| !seen.contains(k)).collect()
}
