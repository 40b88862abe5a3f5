//! Test support: start the real `chronos` binary on a free loopback port,
//! talk to it over plain TCP, and receive its callbacks on a real sink.
//! The helpers more than one test file needs live here and beside it, by
//! concern: `cli.rs` (the binary run as a command), `cluster.rs` (loopback
//! clusters, reloads, idleness), `durable.rs` (the durable log's tests),
//! `metrics.rs` (what `/metrics` says), `proxy.rs` (a TCP proxy of the
//! test's own), `queue.rs` (the delay queue's broker, topics and table),
//! `tls.rs` (a test CA, requests over TLS). A helper one file alone uses
//! stays in that file.
#![allow(dead_code)]

pub mod cli;
pub mod cluster;
pub mod durable;
pub mod metrics;
pub mod proxy;
pub mod queue;
pub mod target;
pub mod tls;

// Not every test file uses every part of the harness.
#[allow(unused_imports)]
pub use cli::*;
#[allow(unused_imports)]
pub use cluster::*;
#[allow(unused_imports)]
pub use metrics::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A loopback port free when checked, below the kernel's ephemeral range
/// (32768 and up by default): every outbound connection of the tests and
/// their nodes takes its source port from that range, so a port freed
/// there could be taken by one before the process meant to bind it does.
/// Unique within this test process (test binaries run one at a time).
pub fn free_port() -> u16 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    const FIRST: usize = 10_000;
    const SPAN: usize = 22_000;
    // A start unrelated to the stride: processes with near pids (two test
    // runs at once) walk far apart, not one step behind each other.
    let start = (std::process::id() as usize).wrapping_mul(2_654_435_761) % SPAN;
    loop {
        // 7,919 is prime, so the walk visits every port of the span.
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free port left below the ephemeral range");
        let port = (FIRST + (start + n * 7_919) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A running chronos process; killed when dropped.
pub struct Node {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: std::path::PathBuf,
    /// The `[cluster] shared-secret` the harness's own reads (`/metrics`,
    /// `/cluster`: [`Node::get`]) carry; `None` for a node without one.
    pub secret: Option<String>,
}

impl Node {
    /// Start with `--bind-port` set and an optional config file body.
    pub fn start(config: &str) -> Node {
        let port = free_port();
        Self::start_at("127.0.0.1", port, config)
    }

    pub fn start_at(ip: &str, port: u16, config: &str) -> Node {
        Self::start_in(None, ip, port, config)
    }

    /// Start inside network namespace `netns` (`ip netns exec`), if given.
    pub fn start_in(netns: Option<&str>, ip: &str, port: u16, config: &str) -> Node {
        let mut node = Self::spawn_in(netns, ip, port, config, &[]);
        node.wait_ready();
        node
    }

    /// As `start_at`, with extra environment variables (a fault hook).
    pub fn start_env(ip: &str, port: u16, config: &str, env: &[(&str, &str)]) -> Node {
        let mut node = Self::spawn_in(None, ip, port, config, env);
        node.wait_ready();
        node
    }

    /// Start the process and return at once, without waiting for it to
    /// answer (for a start that is expected to fail: `wait_exit`). The
    /// same `ip` and `port` reuse the same config file and log file (the
    /// log is truncated), so a second start with one config is a restart.
    pub fn spawn_in(
        netns: Option<&str>,
        ip: &str,
        port: u16,
        config: &str,
        env: &[(&str, &str)],
    ) -> Node {
        let dir =
            std::env::temp_dir().join(format!("chronos-test-{}-{ip}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config_path = dir.join("chronos.toml");
        std::fs::write(&config_path, config).unwrap();
        let log = dir.join("chronos.log");
        let mut command = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_chronos")]);
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_chronos")),
        };
        let child = command
            .arg("--config")
            .arg(&config_path)
            .args(["--bind-address", ip, "--bind-port", &port.to_string()])
            .env("CHRONOS_LOG_LEVEL", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start chronos");
        Node {
            child,
            addr: format!("{ip}:{port}").parse().unwrap(),
            log,
            secret: None,
        }
    }

    /// Wait until the node answers `/ping`; fail at once if it exits.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(r) = try_request(self.addr, "GET", "/ping", &[], b"") {
                if r.status == 200 {
                    return;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "chronos exited ({status}) at start; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("chronos did not answer /ping; log:\n{}", self.log_text());
    }

    /// Wait until `GET /ready` answers 200, and return when it did; fail
    /// after `timeout` with its last answer.
    pub fn wait_ready_200(&self, timeout: Duration) -> Instant {
        wait_until("/ready to answer 200", timeout, || {
            match try_request(self.addr, "GET", "/ready", &[], b"") {
                Ok(r) if r.status == 200 => Ok(Instant::now()),
                Ok(r) => Err(format!("{} {}", r.status, r.text())),
                Err(e) => Err(e.to_string()),
            }
        })
    }

    /// Wait until the process exits by itself; its status, or `None` if it
    /// still runs after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The config file the node was started with (rewrite it, then SIGHUP).
    pub fn config_path(&self) -> std::path::PathBuf {
        self.log.with_file_name("chronos.toml")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn request(&self, method: &str, path: &str, body: &str) -> Response {
        request(self.addr, method, path, &[], body.as_bytes())
    }

    /// The same node, its admin routes read with `secret` from now on (a
    /// node started with `[cluster] shared-secret`).
    pub fn with_secret(mut self, secret: &str) -> Node {
        self.secret = Some(secret.to_string());
        self
    }

    /// `GET path` as the harness reads the node: with its secret, if it
    /// has one ([`Node::with_secret`]). A test's own requests, with or
    /// without a secret, use [`Node::request`] or [`request`].
    pub fn get(&self, path: &str) -> Response {
        let bearer = self.secret.as_ref().map(|s| format!("Bearer {s}"));
        let auth: Vec<(&str, &str)> = bearer
            .iter()
            .map(|b| ("Authorization", b.as_str()))
            .collect();
        request(self.addr, "GET", path, &auth, b"")
    }

    /// Create a timer; returns its ID.
    pub fn create(&self, body: &str) -> String {
        let r = self.request("POST", "/timers", body);
        assert_eq!(r.status, 200, "POST failed: {}", r.text());
        r.location_id()
    }

    /// Send a signal (SIGKILL, SIGSTOP, SIGCONT, ...). A SIGSTOP returns
    /// once every thread of the process is stopped: `kill` only queues it,
    /// and a node went on answering replication for a few milliseconds
    /// after it (CI, 2026-11-28: a test's "stopped" peer took what the
    /// test needed queued).
    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.child.id() as i32, sig) };
        if sig == libc::SIGSTOP {
            wait_stopped(self.child.id(), Duration::from_secs(10));
        }
    }

    /// `kill -9`, and wait for the process to be gone and its port free.
    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
        wait_port_free(self.addr);
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                wait_port_free(self.addr);
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "chronos did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A parsed HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The timer ID from `Location: /timers/<id>`, checked for shape.
    pub fn location_id(&self) -> String {
        let loc = self.header("Location").expect("Location header");
        let id = loc
            .strip_prefix("/timers/")
            .expect("Location is /timers/<id>");
        assert_eq!(id.len(), 32, "ID {id:?} is 32 hex digits");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{id:?}"
        );
        id.to_string()
    }
}

/// Read one response from a buffered stream.
pub fn read_response(reader: &mut impl BufRead) -> std::io::Result<Response> {
    read_response_to(reader, "GET")
}

/// Read one response to a `method` request: an answer to `HEAD` has no
/// body, whatever its `Content-Length` says.
pub fn read_response_to(reader: &mut impl BufRead, method: &str) -> std::io::Result<Response> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "closed",
        ));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':').unwrap();
        headers.push((n.trim().to_string(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().unwrap())
        .filter(|_| method != "HEAD")
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    Ok(Response {
        status,
        headers,
        body,
    })
}

pub fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    s.write_all(&bytes)?;
    read_response_to(&mut BufReader::new(s), method)
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    try_request(addr, method, path, headers, body).expect("request")
}

/// Send raw bytes, read everything until the server closes (or times out).
pub fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// One callback as the sink saw it.
#[derive(Clone, Debug)]
pub struct Pop {
    pub at: Instant,
    /// Whether the sink answered 2xx.
    pub ok: bool,
    pub path: String,
    pub sequence: u32,
    pub content_type: String,
    pub body: String,
    /// Every header as read (names in lower case), in order.
    pub headers: Vec<(String, String)>,
}

impl Pop {
    /// A header's value (`name` in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// How the sink answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    Ok,
    /// 500 for every request.
    Fail,
    /// Accept, read, never answer.
    Hang,
    /// 500 for the first request to each path, 200 afterwards.
    FailFirst,
    /// 200, after this long.
    Slow(Duration),
}

/// A real HTTP callback target on a loopback port.
pub struct Sink {
    pub addr: SocketAddr,
    pops: Arc<(Mutex<Vec<Pop>>, Condvar)>,
    stop: Arc<AtomicBool>,
    pub connections: Arc<AtomicUsize>,
}

impl Sink {
    pub fn start(behaviour: Behaviour) -> Sink {
        Self::start_on("127.0.0.1", behaviour)
    }

    /// A sink listening on `ip` (any free port).
    pub fn start_on(ip: &str, behaviour: Behaviour) -> Sink {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let pops: Arc<(Mutex<Vec<Pop>>, Condvar)> = Default::default();
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let (p, st, c) = (pops.clone(), stop.clone(), connections.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if st.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                c.fetch_add(1, Ordering::Relaxed);
                let p = p.clone();
                std::thread::spawn(move || serve_sink(stream, p, behaviour));
            }
        });
        Sink {
            addr,
            pops,
            stop,
            connections,
        }
    }

    pub fn uri(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn pops(&self) -> Vec<Pop> {
        self.pops.0.lock().unwrap().clone()
    }

    /// Wait until at least `n` pops arrived, or the timeout passed.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Pop> {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.pops;
        let mut pops = lock.lock().unwrap();
        while pops.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            pops = cv.wait_timeout(pops, left).unwrap().0;
        }
        pops.clone()
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve_sink(stream: TcpStream, pops: Arc<(Mutex<Vec<Pop>>, Condvar)>, behaviour: Behaviour) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let Some((path, headers, body)) = read_request(&mut reader) else {
            return;
        };
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map_or("", |(_, v)| v.as_str())
        };
        let sequence: u32 = header("x-sequence-number").parse().unwrap_or(0);
        let content_type = header("content-type").to_string();
        let ok = match behaviour {
            Behaviour::Ok | Behaviour::Slow(_) => true,
            Behaviour::Fail | Behaviour::Hang => false,
            Behaviour::FailFirst => {
                let seen = pops.0.lock().unwrap().iter().any(|p| p.path == path);
                seen
            }
        };
        let pop = Pop {
            at: Instant::now(),
            ok,
            path,
            sequence,
            content_type,
            body: String::from_utf8_lossy(&body).into_owned(),
            headers: headers.clone(),
        };
        {
            let (lock, cv) = &*pops;
            lock.lock().unwrap().push(pop);
            cv.notify_all();
        }
        let answer: &[u8] = match behaviour {
            Behaviour::Ok => b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            Behaviour::Slow(d) => {
                std::thread::sleep(d);
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
            }
            Behaviour::FailFirst if ok => b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            Behaviour::Fail | Behaviour::FailFirst => {
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nnope"
            }
            Behaviour::Hang => {
                std::thread::sleep(Duration::from_secs(30));
                return;
            }
        };
        if writer.write_all(answer).is_err() {
            return;
        }
    }
}

/// A timer body for `uri`.
pub fn timer_body(interval: &str, repeat_for: Option<&str>, uri: &str, opaque: &str) -> String {
    let repeat = repeat_for
        .map(|r| format!(",\"repeat-for\":{r}"))
        .unwrap_or_default();
    format!(
        r#"{{"timing":{{"interval":{interval}{repeat}}},"callback":{{"http":{{"uri":"{uri}","opaque":"{opaque}"}}}}}}"#
    )
}

/// A timer body for `uri` with `"reliability": {"replication-factor":
/// factor}`.
pub fn replicated_body(
    interval: &str,
    repeat_for: Option<&str>,
    uri: &str,
    opaque: &str,
    factor: u32,
) -> String {
    let body = timer_body(interval, repeat_for, uri, opaque);
    let body = body.strip_suffix('}').expect("a JSON object");
    format!(r#"{body},"reliability":{{"replication-factor":{factor}}}}}"#)
}

/// A timer body due every `interval_s` seconds for `uri`, with its own
/// replication factor if `factor` is given (else the node's default).
pub fn timer_body_factor(interval_s: u64, uri: &str, opaque: &str, factor: Option<u32>) -> String {
    let interval = interval_s.to_string();
    match factor {
        Some(f) => replicated_body(&interval, None, uri, opaque, f),
        None => timer_body(&interval, None, uri, opaque),
    }
}

/// Pops grouped by the path they were sent to, each path's in the order
/// given.
pub fn by_path(pops: &[Pop]) -> std::collections::BTreeMap<String, Vec<Pop>> {
    let mut m: std::collections::BTreeMap<String, Vec<Pop>> = Default::default();
    for p in pops {
        m.entry(p.path.clone()).or_default().push(p.clone());
    }
    m
}

/// Poll `check` every 20 ms until it returns `Ok`, and return its value;
/// fail once `timeout` has passed, naming `what` and the last state
/// `check` described (its `Err`).
pub fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let state = match check() {
            Ok(value) => return value,
            Err(state) => state,
        };
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}; last seen: {state}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last 40 lines of a node's log, for assertion messages.
pub fn log_tail(node: &Node) -> String {
    let log = node.log_text();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A process's memory figure from `/proc/<pid>/status` (`field` with its
/// colon: `VmRSS:`), bytes.
pub fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    kb * 1024
}

/// The resident memory of a process, bytes.
pub fn rss(pid: u32) -> u64 {
    proc_status_bytes(pid, "VmRSS:")
}

/// The peak resident memory of a process, bytes.
pub fn peak_rss(pid: u32) -> u64 {
    proc_status_bytes(pid, "VmHWM:")
}

/// As [`wait_until`], for a condition that has nothing to say but
/// whether it holds.
pub fn wait_until_true(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    wait_until(what, timeout, || match cond() {
        true => Ok(()),
        false => Err("not yet".into()),
    });
}

/// Sleep until `at` (not at all if it has passed).
pub fn sleep_until(at: Instant) {
    std::thread::sleep(at.saturating_duration_since(Instant::now()));
}

/// A TCP connection to `to` from the local address `from` (port 0).
pub fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert!(fd >= 0);
    let sockaddr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    };
    let SocketAddr::V4(to) = to else {
        panic!("IPv4 only")
    };
    let local = sockaddr(from.parse().unwrap(), 0);
    let remote = sockaddr(*to.ip(), to.port());
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    unsafe {
        assert_eq!(
            libc::bind(fd, &local as *const _ as *const libc::sockaddr, len),
            0
        );
        assert_eq!(
            libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len),
            0
        );
        std::os::fd::FromRawFd::from_raw_fd(fd)
    }
}

/// A request as a test server reads it: path, headers (names in lower
/// case), body.
pub type ReadRequest = (String, Vec<(String, String)>, Vec<u8>);

/// One HTTP/1.1 request read from `reader`; `None` at end of stream or on
/// a malformed head.
pub fn read_request(reader: &mut impl BufRead) -> Option<ReadRequest> {
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return None;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some((path, headers, body))
}

/// The p99 lateness of `pops`, each path ending in `/<i>` and due at
/// `due[i]`.
pub fn p99_late(pops: &[Pop], due: &[Instant]) -> Duration {
    let mut late: Vec<Duration> = pops
        .iter()
        .map(|p| {
            let i: usize = p.path.rsplit('/').next().unwrap().parse().unwrap();
            p.at.saturating_duration_since(due[i])
        })
        .collect();
    late.sort();
    late[late.len() * 99 / 100 - 1]
}

/// Wait until every thread of process `pid` is in the stopped state (`T`,
/// or `t` if traced, in `/proc/<pid>/task/<tid>/stat`), or panic after
/// `timeout` or at once if it exited.
pub fn wait_stopped(pid: u32, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let stopped = || -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        tasks.flatten().all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // The state follows the command name's closing parenthesis.
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            assert!(
                !matches!(state, Some('Z' | 'X')),
                "process {pid} exited instead of stopping"
            );
            matches!(state, Some('T' | 't'))
        })
    };
    while !stopped() {
        assert!(
            Instant::now() < deadline,
            "process {pid} did not stop within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Wait until `addr` can be listened on again (10 s at most): the kernel
/// tears a process's io_uring down after the process is reaped, and its
/// listening sockets with it, so a node restarted at once on the same
/// address could find it taken and refuse to start. Only "in use" waits:
/// an address of another network namespace is not this one's to probe.
pub fn wait_port_free(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = TcpListener::bind(addr) {
        if e.kind() != std::io::ErrorKind::AddrInUse {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{addr} stays taken after its node exited"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
