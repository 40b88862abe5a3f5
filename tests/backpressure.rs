//! Backpressure on the HTTP server (issue 20, items 4 and 8), against the
//! real binary over loopback: a client that never reads its responses
//! holds a bounded amount of memory and loses its connection after
//! `[http] write-timeout-ms` (on both socket drivers), and a connection
//! full of pipelined requests lets the shard's other connections in every
//! half millisecond.

mod common;

use common::*;
use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connections that never read, all from one source address.
const STUCK: usize = 6;
/// The node's `[http] write-timeout-ms` in the stuck-reader test.
const WRITE_TIMEOUT: Duration = Duration::from_millis(1500);
/// Growth of the node's resident memory allowed for all [`STUCK`]
/// connections together: 8 MiB each (each may hold about 1 MiB of answers,
/// its input, and the ring's queue; 2-11 MiB in all was measured, 112-228
/// MiB before answers were bounded).
const RSS_GROWTH_MAX_KIB: u64 = STUCK as u64 * 8 * 1024;
/// Where the stuck connections come from (the per-source count is checked).
const STUCK_SOURCE: &str = "127.0.0.2";

/// The process's open file descriptors.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// The process's resident memory (`VmRSS`), in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// A `POST /timers` whose JSON body is padded with spaces to `bytes`: it
/// grows the connection's input buffer to hold the pipelined requests
/// that follow in one read.
fn padded_post(bytes: usize) -> Vec<u8> {
    let json = r#"{"timing":{"interval":3600},"callback":{"http":{"uri":"http://127.0.0.1:9/p","opaque":"x"}}}"#;
    let body = format!("{json}{}", " ".repeat(bytes.saturating_sub(json.len())));
    let mut req = format!(
        "POST /timers HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body.as_bytes());
    req
}

/// `bytes` worth of pipelined `GET /metrics` (each answer is kilobytes).
fn pipelined_metrics(bytes: usize) -> Vec<u8> {
    let one = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    one.iter()
        .copied()
        .cycle()
        .take(bytes / one.len() * one.len())
        .collect()
}

/// One `GET /ping` on `s`; the status, or `None` if the server closed.
fn ping_on(s: &mut TcpStream) -> Option<u16> {
    s.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    read_response(&mut BufReader::new(s.try_clone().unwrap()))
        .ok()
        .map(|r| r.status)
}

/// Read `s` until the server's close shows: `true` at end of stream or a
/// reset, `false` if it stays open (reads time out).
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// [`STUCK`] connections each send a padded POST and 270 KB of pipelined
/// `GET /metrics` and never read: the node's memory grows by a bounded
/// amount, it keeps answering `/ping`, and after the write timeout it
/// closes them and gives their slots and per-source counts back.
fn stuck_readers_are_bounded_and_closed(driver: &str, net_ring: bool) {
    let node = Node::start(&format!(
        "[runtime]\ncores = 1\n[http]\nnet-ring = {net_ring}\nconnections-per-source-max = {STUCK}\nwrite-timeout-ms = {}\n",
        WRITE_TIMEOUT.as_millis()
    ));
    let pid = node.child.id();
    let baseline_open = node.metric("chronos_connections_open");
    let rss_before = rss_kib(pid);
    let fds_before = fds(pid);
    let mut load = padded_post(200 * 1024);
    load.extend_from_slice(&pipelined_metrics(270 * 1024));
    let load = Arc::new(load);
    let mut stuck = Vec::new();
    let mut writers = Vec::new();
    for _ in 0..STUCK {
        let s = connect_from(STUCK_SOURCE, node.addr);
        s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
        let (mut w, load) = (s.try_clone().unwrap(), load.clone());
        // The server may stop reading before all of it is in: never mind.
        writers.push(std::thread::spawn(move || {
            let _ = w.write_all(&load);
        }));
        stuck.push(s);
    }
    let sent = Instant::now();
    // The source's count is held while they are open.
    let mut extra = connect_from(STUCK_SOURCE, node.addr);
    assert_eq!(ping_on(&mut extra), Some(503), "{driver}: per-source count");
    let deadline = sent + WRITE_TIMEOUT + Duration::from_secs(25);
    let mut rss_max = rss_before;
    let closed_at = loop {
        rss_max = rss_max.max(rss_kib(pid));
        let r = try_request(node.addr, "GET", "/ping", &[], b"");
        assert_eq!(
            r.map(|r| r.status).ok(),
            Some(200),
            "{driver}: /ping while stuck"
        );
        if node.metric("chronos_connections_open") <= baseline_open {
            break sent.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "{driver}: the stuck connections were not closed within {:?} (RSS grew by {} MiB)",
            deadline - sent,
            (rss_max - rss_before) / 1024
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    rss_max = rss_max.max(rss_kib(pid));
    let growth = rss_max - rss_before;
    eprintln!(
        "{driver}: closed after {closed_at:?}; RSS grew by {} MiB",
        growth / 1024
    );
    assert!(
        growth < RSS_GROWTH_MAX_KIB,
        "{driver}: RSS grew by {} MiB for {STUCK} stuck connections (bound {} MiB)",
        growth / 1024,
        RSS_GROWTH_MAX_KIB / 1024
    );
    assert!(
        closed_at >= WRITE_TIMEOUT,
        "{driver}: closed after {closed_at:?}, before the write timeout"
    );
    for (i, s) in stuck.iter_mut().enumerate() {
        assert!(
            closed_by_server(s),
            "{driver}: stuck connection {i} still open"
        );
    }
    for w in writers {
        w.join().unwrap();
    }
    // Their sockets are closed (on the ring: their slots are released).
    let deadline = Instant::now() + Duration::from_secs(10);
    while fds(pid) > fds_before {
        assert!(
            Instant::now() < deadline,
            "{driver}: {} fds open, {fds_before} before",
            fds(pid)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Their per-source counts are given back: as many again fit at once.
    let _held: Vec<TcpStream> = (0..STUCK)
        .map(|i| {
            let mut s = connect_from(STUCK_SOURCE, node.addr);
            assert_eq!(ping_on(&mut s), Some(200), "{driver}: connection {i} after");
            s
        })
        .collect();
}

#[test]
fn a_client_that_never_reads_is_bounded_and_closed_on_the_ring() {
    stuck_readers_are_bounded_and_closed("ring", true);
}

#[test]
fn a_client_that_never_reads_is_bounded_and_closed_on_glommio_sockets() {
    stuck_readers_are_bounded_and_closed("glommio", false);
}

/// `count` pipelined `POST /timers` of a 60-minute timer.
fn pipelined_posts(count: usize) -> Vec<u8> {
    let body = timer_body("3600", None, "http://127.0.0.1:9/f", "x");
    let one = format!(
        "POST /timers HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    one.repeat(count).into_bytes()
}

/// Pings on their own connection until `stop`; the latencies.
fn ping_latencies(addr: SocketAddr, stop: Arc<AtomicBool>) -> Vec<Duration> {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut took = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        w.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        assert_eq!(read_response(&mut r).unwrap().status, 200);
        took.push(t.elapsed());
        std::thread::sleep(Duration::from_micros(200));
    }
    took
}

/// One shard; a connection whose input buffer holds thousands of pipelined
/// `POST`s at a time (grown by a padded POST) must let another
/// connection's `/ping` through between them (a breath every 0.5 ms),
/// not after the whole buffer.
#[test]
fn pipelined_posts_let_a_ping_on_the_same_shard_through() {
    const ROUNDS: usize = 6;
    const POSTS: usize = 12_000;
    let node = Node::start("[runtime]\ncores = 1\n[http]\nbody-bytes-max = 4194304\n");
    let flood = TcpStream::connect(node.addr).unwrap();
    flood
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut w = flood.try_clone().unwrap();
    let mut reader = BufReader::new(flood);
    // Grow the flood connection's input buffer to ~4 MiB.
    w.write_all(&padded_post(3 << 20)).unwrap();
    assert_eq!(read_response(&mut reader).unwrap().status, 200);
    let posts = Arc::new(pipelined_posts(POSTS));
    let stop = Arc::new(AtomicBool::new(false));
    let pinger = {
        let (addr, stop) = (node.addr, stop.clone());
        std::thread::spawn(move || ping_latencies(addr, stop))
    };
    let started = Instant::now();
    for round in 0..ROUNDS {
        let (mut w, posts) = (w.try_clone().unwrap(), posts.clone());
        let writer = std::thread::spawn(move || w.write_all(&posts).unwrap());
        for i in 0..POSTS {
            let r = read_response(&mut reader).unwrap_or_else(|e| panic!("{round}/{i}: {e}"));
            assert_eq!(r.status, 200, "{round}/{i}: {}", r.text());
        }
        writer.join().unwrap();
    }
    let flood_took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut took = pinger.join().unwrap();
    took.sort_unstable();
    let pct = |p: usize| took[(took.len() * p / 100).min(took.len() - 1)];
    eprintln!(
        "{} pings during {ROUNDS}×{POSTS} POSTs ({flood_took:?}): p50 {:?} p90 {:?} p99 {:?} max {:?}",
        took.len(),
        pct(50),
        pct(90),
        pct(99),
        took[took.len() - 1]
    );
    assert!(took.len() >= 20, "only {} pings answered", took.len());
    // Before the breath, a whole buffer (~1 s of POSTs in a debug build)
    // ran in one go: p99 0.4-0.7 s. With it: 6-13 ms, and up to 85 ms
    // while two compilers shared this 2-core VM. The bound keeps room for
    // a loaded CI machine and stays below the unfixed figures.
    assert!(
        pct(99) < Duration::from_millis(250),
        "p99 ping latency {:?} during pipelined POSTs",
        pct(99)
    );
}
