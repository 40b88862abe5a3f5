//! `Idempotency-Key` on `POST /timers` (issue 42, item 4): the same key
//! and body give the same `Location` and change nothing; the same key
//! with another body is `422`; a `POST` retried after its connection was
//! cut creates one timer; the key works through any node of a cluster.

mod common;

use common::*;
use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

/// `POST /timers` with `Idempotency-Key: key`.
fn post_keyed(node: &Node, key: &str, body: &str) -> Response {
    request(
        node.addr,
        "POST",
        "/timers",
        &[("Idempotency-Key", key)],
        body.as_bytes(),
    )
}

/// Wait until a single node's one-shot timer is gone after its pop (it
/// keeps no tombstone without peers).
fn wait_gone(node: &Node) {
    wait_until(
        "the one-shot timer gone after its pop",
        Duration::from_secs(10),
        || {
            let pending = node.metric("chronos_timers_pending");
            match pending > 0.0 {
                false => Ok(()),
                true => Err(format!("{pending} pending")),
            }
        },
    );
}

#[test]
fn one_key_one_timer_and_another_body_is_422() {
    let node = Node::start("[runtime]\ncores = 2\n");
    let sink = Sink::start(Behaviour::Ok);
    let body = timer_body("2", None, &sink.uri("/once"), "first");
    let first = post_keyed(&node, "order-42", &body);
    assert_eq!(first.status, 200, "{}", first.text());
    let again = post_keyed(&node, "order-42", &body);
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(
        again.header("Location"),
        first.header("Location"),
        "the same timer"
    );
    let other = timer_body("2", None, &sink.uri("/once"), "second");
    let refused = post_keyed(&node, "order-42", &other);
    assert_eq!(refused.status, 422, "{}", refused.text());
    assert!(
        refused.text().contains("Idempotency-Key"),
        "{}",
        refused.text()
    );
    let bad = post_keyed(&node, "has space", &body);
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert_eq!(node.metric("chronos_timers_pending"), 1.0, "one timer");
    let pops = sink.wait_for(1, Duration::from_secs(10));
    assert_eq!(pops[0].body, "first", "the first body, unchanged");
    wait_gone(&node);
    assert_eq!(sink.pops().len(), 1, "it popped once");
}

#[test]
fn a_post_retried_after_its_connection_was_cut_creates_one_timer() {
    let node = Node::start("");
    let sink = Sink::start(Behaviour::Ok);
    let body = timer_body("2", None, &sink.uri("/cut"), "o");
    let mut cut = TcpStream::connect(node.addr).expect("connect");
    let head = format!(
        "POST /timers HTTP/1.1\r\nHost: chronos\r\nIdempotency-Key: cut-1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    cut.write_all(head.as_bytes()).expect("send");
    drop(cut);
    wait_until(
        "the first POST taken",
        Duration::from_secs(5),
        || match node.metric("chronos_timers_pending") {
            n if n >= 1.0 => Ok(()),
            n => Err(format!("{n} pending")),
        },
    );
    let retry = post_keyed(&node, "cut-1", &body);
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(
        node.metric("chronos_timers_pending"),
        1.0,
        "still one timer"
    );
    sink.wait_for(1, Duration::from_secs(10));
    wait_gone(&node);
    assert_eq!(sink.pops().len(), 1, "one pop");
}

#[test]
fn a_key_works_through_any_node_of_a_cluster() {
    let nodes = start_cluster(3, 1, "[timers]\ndefault-replication-factor = 2\n");
    let sink = Sink::start(Behaviour::Ok);
    let body = timer_body("600", None, &sink.uri("/c"), "c");
    let first = post_keyed(&nodes[0], "cluster-7", &body);
    assert_eq!(first.status, 200, "{}", first.text());
    let location = first.header("Location").expect("Location").to_string();
    for n in &nodes {
        wait_until(
            "the same Location from every node",
            Duration::from_secs(10),
            || {
                let r = post_keyed(n, "cluster-7", &body);
                match (r.status, r.header("Location")) {
                    (200, Some(l)) if l == location => Ok(()),
                    (s, l) => Err(format!("{}: {s} {l:?} {}", n.addr, r.text())),
                }
            },
        );
        let other = timer_body("600", None, &sink.uri("/c"), "other");
        assert_eq!(post_keyed(n, "cluster-7", &other).status, 422, "{}", n.addr);
    }
    // Live copies: what the wheels hold less the tombstones (the node that
    // took the first request keeps one where it is not a replica).
    let live: f64 = nodes
        .iter()
        .map(|n| n.metric("chronos_timers_pending") - n.metric("chronos_tombstones"))
        .sum();
    assert_eq!(live, 2.0, "one timer, on its two replicas");
}
