//! A node is full only when every shard is (issue 43, item 1): a `POST`
//! picks an ID its own shard owns, so the timers of one busy connection
//! all land on one shard; once that shard holds `timers-per-shard-max`,
//! a `POST` is created by a shard of the node with room instead, and a
//! client gets `503` only when every shard is full.

mod common;

use common::*;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Two shards of 10 timers each; every `POST` on one keep-alive
/// connection (so every one taken by the same shard).
const CONFIG: &str = "[runtime]\ncores = 2\n[timers]\ntimers-per-shard-max = 10\n";

/// `POST /timers` on `stream`, keep-alive: the status and body.
fn post(stream: &mut TcpStream, reader: &mut BufReader<TcpStream>, body: &str) -> (u16, String) {
    let request = format!(
        "POST /timers HTTP/1.1\r\nHost: chronos\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("send a POST");
    let response = read_response(reader).expect("an answer on the same connection");
    (response.status, response.text())
}

#[test]
fn one_connection_fills_the_whole_node_before_a_503() {
    let node = Node::start(CONFIG);
    let sink = Sink::start(Behaviour::Ok);
    let mut stream = TcpStream::connect(node.addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let mut reader = BufReader::new(stream.try_clone().expect("a reader"));
    for i in 0..20 {
        let body = timer_body("5", None, &sink.uri(&format!("/t/{i}")), "o");
        let (status, text) = post(&mut stream, &mut reader, &body);
        assert_eq!(
            status, 200,
            "POST {i} of 20 (room left on the node): {text}"
        );
    }
    assert_eq!(
        node.metric("chronos_timers_pending"),
        20.0,
        "every shard holds its 10"
    );
    let body = timer_body("5", None, &sink.uri("/t/over"), "o");
    let (status, text) = post(&mut stream, &mut reader, &body);
    assert_eq!(status, 503, "the 21st POST: the node is full: {text}");
    assert!(
        text.contains("capacity of this node is exhausted"),
        "the reason says the node, not a shard, is full: {text}"
    );
    let pops = sink.wait_for(20, Duration::from_secs(30));
    let paths: std::collections::BTreeSet<String> = pops.iter().map(|p| p.path.clone()).collect();
    assert_eq!(
        paths.len(),
        20,
        "each timer, spilled or not, pops: {paths:?}"
    );
    assert!(!paths.contains("/t/over"), "the refused timer does not pop");
}
