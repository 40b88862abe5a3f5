//! Review of item 5 (per-target callback admission, src/shard/pop.rs
//! `pop_wait`): the share bounds each target, but the reserve (a quarter
//! of `callback-in-flight-max`) is open to every target under its share,
//! so hanging targets that are each under their share when the spare
//! slots run out take the reserve too; at `in_flight == max` the pop loop
//! stops for everyone. `tests/races.rs` uses 4 hanging targets (each is
//! over its share by then, so the reserve survives); a tenant that picks
//! 10 ports needs no more timers.

mod common;

use common::*;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn body(interval: &str, uri: &str) -> String {
    format!(
        r#"{{"timing":{{"interval":{interval}}},"callback":{{"http":{{"uri":"{uri}","opaque":"x"}}}},"reliability":{{"replication-factor":1}}}}"#
    )
}

fn post_all(addr: std::net::SocketAddr, bodies: &[String]) {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    for chunk in bodies.chunks(256) {
        let mut bytes = Vec::new();
        for b in chunk {
            bytes.extend_from_slice(
                format!(
                    "POST /timers HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{b}",
                    b.len()
                )
                .as_bytes(),
            );
        }
        w.write_all(&bytes).unwrap();
        for _ in chunk {
            assert_eq!(read_response(&mut r).unwrap().status, 200);
        }
    }
}

fn healthy_p99_behind(targets: usize, timers: usize) -> Duration {
    let node = Node::start("[runtime]\ncores = 1\n");
    let hanging: Vec<Sink> = (0..targets).map(|_| Sink::start(Behaviour::Hang)).collect();
    let healthy = Sink::start(Behaviour::Ok);
    let bodies: Vec<String> = (0..timers)
        .map(|i| body("1", &hanging[i % targets].uri(&format!("/h/{i}"))))
        .collect();
    post_all(node.addr, &bodies);
    std::thread::sleep(Duration::from_millis(1500));
    let mut due = Vec::new();
    for i in 0..200 {
        node.create(&body("0.5", &healthy.uri(&format!("/ok/{i}"))));
        due.push(Instant::now() + Duration::from_millis(500));
    }
    let pops = healthy.wait_for(200, Duration::from_secs(60));
    assert_eq!(pops.len(), 200, "every healthy timer pops");
    p99_late(&pops, &due)
}

/// 10 hanging targets, 800 timers each.
#[test]
fn review_ten_hanging_targets_do_not_delay_other_targets_pops() {
    let p99 = healthy_p99_behind(10, 8000);
    eprintln!("10 hanging targets: healthy p99 {p99:?} late");
    assert!(
        p99 < Duration::from_millis(1000),
        "healthy pops p99 {p99:?} late behind 10 hanging targets"
    );
}

/// The control: the same 8000 timers over 4 hanging targets (as in
/// `tests/races.rs`): each is over its share when the spare slots run out,
/// so the reserve stays free for the healthy target.
#[test]
fn review_control_four_hanging_targets() {
    let p99 = healthy_p99_behind(4, 8000);
    eprintln!("4 hanging targets: healthy p99 {p99:?} late");
    assert!(
        p99 < Duration::from_millis(1000),
        "healthy pops p99 {p99:?} late behind 4 hanging targets"
    );
}
