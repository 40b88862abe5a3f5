//! The sockets layer under the HTTP server, against the real binary over
//! loopback: the network ring (the default) and glommio's sockets
//! (`[http] net-ring = false`) must behave alike.

mod common;
use common::*;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Both socket drivers, one shard each (so every connection of a test
/// lands on the same shard and its limits).
const DRIVERS: [(&str, &str); 2] = [
    ("ring", "[runtime]\ncores = 1\n[http]\nnet-ring = true\n"),
    (
        "glommio",
        "[runtime]\ncores = 1\n[http]\nnet-ring = false\n",
    ),
];

/// `n` pings down one connection from a writer thread while this thread
/// reads the answers: far more than either side's buffers, so the server
/// must pause reading while its output backs up, and resume.
fn flood(node: &Node, n: usize) {
    let s = TcpStream::connect(node.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let req = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut batch = Vec::with_capacity(req.len() * 100);
        for _ in 0..100 {
            batch.extend_from_slice(req);
        }
        for _ in 0..n / 100 {
            w.write_all(&batch).unwrap();
        }
    });
    let mut reader = BufReader::new(s);
    for i in 0..n {
        let r = read_response(&mut reader).unwrap_or_else(|e| panic!("response {i}: {e}"));
        assert_eq!((r.status, r.text().as_str()), (200, "OK"), "response {i}");
    }
    writer.join().unwrap();
}

#[test]
fn pipelined_flood_is_answered_in_full_by_both_drivers() {
    for (name, cfg) in DRIVERS {
        // Small bounds: the ring's input high mark is header + body max.
        let node = Node::start(&format!(
            "{cfg}header-bytes-max = 1024\nbody-bytes-max = 1024\n"
        ));
        flood(&node, 50_000);
        // The node still serves others afterwards.
        let r = node.request("GET", "/ping", "");
        assert_eq!(r.status, 200, "{name}");
    }
}

#[test]
fn both_drivers_serve_the_api_and_its_errors() {
    for (name, cfg) in DRIVERS {
        let node = Node::start(cfg);
        let sink = Sink::start(Behaviour::Ok);
        let id = node.create(&timer_body("0.2", None, &sink.uri("/d"), "x"));
        assert_eq!(id.len(), 32, "{name}");
        let out = raw_exchange(node.addr, b"GET /ping HTTP/1.1\r\nHost\r\n\r\n");
        assert!(out.starts_with(b"HTTP/1.1 400"), "{name}");
        let mut big = b"GET /ping HTTP/1.1\r\nX-Big: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', 20_000));
        big.extend_from_slice(b"\r\n\r\n");
        let out = raw_exchange(node.addr, &big);
        assert!(out.starts_with(b"HTTP/1.1 431"), "{name}");
        let pops = sink.wait_for(1, Duration::from_secs(5));
        assert_eq!(pops.len(), 1, "{name}");
        assert_eq!(pops[0].body, "x", "{name}");
        assert!(node.terminate().success(), "{name}");
    }
}

#[test]
fn connections_beyond_the_limit_get_503_and_the_rest_are_unharmed() {
    for (name, cfg) in DRIVERS {
        let node = Node::start(&format!("{cfg}connections-max = 4\n"));
        let ping = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n";
        // Four kept-alive connections, each proven accepted by an answer.
        let mut held: Vec<BufReader<TcpStream>> = (0..4)
            .map(|_| {
                let mut s = TcpStream::connect(node.addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s.write_all(ping).unwrap();
                let mut r = BufReader::new(s);
                assert_eq!(read_response(&mut r).unwrap().status, 200, "{name}");
                r
            })
            .collect();
        let out = String::from_utf8_lossy(&raw_exchange(node.addr, ping)).to_string();
        assert!(out.starts_with("HTTP/1.1 503"), "{name}: {out}");
        assert!(out.contains("too many connections"), "{name}: {out}");
        // The held connections still work.
        for r in &mut held {
            r.get_mut().write_all(ping).unwrap();
            assert_eq!(read_response(r).unwrap().status, 200, "{name}");
        }
        // Closing one makes room again (once the server has seen the close).
        drop(held.pop());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = raw_exchange(
                node.addr,
                b"GET /ping HTTP/1.1\r\nConnection: close\r\n\r\n",
            );
            if out.starts_with(b"HTTP/1.1 200") {
                break;
            }
            assert!(Instant::now() < deadline, "{name}: no room after a close");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn idle_connections_are_closed_after_the_timeout_not_before() {
    for (name, cfg) in DRIVERS {
        let node = Node::start(&format!("{cfg}idle-timeout-ms = 700\n"));
        let mut s = TcpStream::connect(node.addr).unwrap();
        s.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        assert_eq!(read_response(&mut r).unwrap().status, 200, "{name}");
        let idle_from = Instant::now();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rest = Vec::new();
        // The server closes: EOF (or a reset), well within the read timeout.
        let _ = r.read_to_end(&mut rest);
        let idle = idle_from.elapsed();
        assert!(rest.is_empty(), "{name}: unexpected bytes {rest:?}");
        assert!(
            idle >= Duration::from_millis(700),
            "{name}: closed after {idle:?}"
        );
        assert!(
            idle < Duration::from_secs(5),
            "{name}: closed after {idle:?}"
        );
    }
}
