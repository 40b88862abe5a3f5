//! `GET /timers/<id>` (issue 42, item 1): a timer as a client would write
//! it, with its next pop, pops done, replicas and sites; from a node that
//! holds a copy, from a shard that does not own it, and from a node that
//! holds none (it asks a replica); `404` for a deleted or unknown timer.

mod common;

use common::*;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn a_timer_reads_back_as_written_with_its_next_pop_and_pops_done() {
    let node = Node::start("[runtime]\ncores = 2\n");
    let sink = Sink::start(Behaviour::Ok);
    let uri = sink.uri("/cb");
    let body = format!(
        r#"{{"timing":{{"interval":1.5,"repeat-for":30}},"callback":{{"http":{{"uri":"{uri}","opaque":"hello \"there\""}}}},"statistics":{{"tag-info":[{{"type":"CALL","count":2}}]}}}}"#
    );
    let before_ms = unix_ms_now();
    let id = node.create(&body);
    let t = look_up(&node, &id);
    assert_eq!(t["id"], id.as_str());
    assert_eq!(t["timing"]["interval"], 1.5);
    assert_eq!(t["timing"]["repeat-for"], 30);
    assert_eq!(t["callback"]["http"]["uri"], uri.as_str());
    assert_eq!(t["callback"]["http"]["opaque"], "hello \"there\"");
    assert_eq!(t["statistics"]["tag-info"][0]["type"], "CALL");
    assert_eq!(t["statistics"]["tag-info"][0]["count"], 2);
    assert_eq!(t["pops-done"], 0);
    assert_eq!(t["next-pop"]["sequence"], 1);
    let due = t["next-pop"]["unix-ms"].as_u64().expect("unix-ms");
    assert!(
        due >= before_ms + 1500 && due <= unix_ms_now() + 1500 + 5,
        "the first pop is due 1.5 s after the create: {due} (created after {before_ms})"
    );
    let at = t["next-pop"]["at"].as_str().expect("at");
    let at_ms = at
        .parse::<jiff::Timestamp>()
        .expect("RFC 3339")
        .as_millisecond() as u64;
    assert_eq!(at_ms, due, "at and unix-ms are one instant: {at}");
    sink.wait_for(1, Duration::from_secs(10));
    wait_until("pop 1 counted", Duration::from_secs(5), || {
        let t = look_up(&node, &id);
        match t["pops-done"].as_u64() {
            Some(n) if n >= 1 && t["next-pop"]["sequence"].as_u64() == Some(n + 1) => Ok(()),
            _ => Err(t.to_string()),
        }
    });
    assert_eq!(
        node.request("DELETE", &format!("/timers/{id}"), "").status,
        200
    );
    let gone = node.request("GET", &format!("/timers/{id}"), "");
    assert_eq!(gone.status, 404, "a deleted timer: {}", gone.text());
    let unknown = node.request("GET", "/timers/0aa0ce5a919a80000400011000a00040", "");
    assert_eq!(unknown.status, 404, "an unknown timer: {}", unknown.text());
    let bad = node.request("GET", "/timers/not-an-id", "");
    assert_eq!(bad.status, 404, "not an ID: {}", bad.text());
    let references = node.request("GET", "/timers/references", "");
    assert_eq!(references.status, 405, "the resync route keeps its methods");
}

#[test]
fn a_node_without_a_copy_asks_a_replica() {
    let nodes = start_cluster(3, 1, "[timers]\ndefault-replication-factor = 2\n");
    let sink = Sink::start(Behaviour::Ok);
    let body = timer_body("600", None, &sink.uri("/r"), "across");
    let id = nodes[0].create(&body);
    let t = look_up(&nodes[0], &id);
    let replicas: Vec<String> = t["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    assert_eq!(replicas.len(), 2, "{t}");
    let outsider = nodes
        .iter()
        .find(|n| !replicas.contains(&n.addr.to_string()))
        .expect("a node that is not a replica");
    wait_until(
        "the replicas hold it",
        Duration::from_secs(10),
        || match replicas.iter().all(|r| {
            let n = nodes.iter().find(|n| &n.addr.to_string() == r).unwrap();
            n.request("GET", &format!("/timers/{id}"), "").status == 200
        }) {
            true => Ok(()),
            false => Err("a replica has no copy yet".to_string()),
        },
    );
    let via = look_up(outsider, &id);
    assert_eq!(via["callback"]["http"]["opaque"], "across");
    assert_eq!(via["replicas"], t["replicas"], "the same timer");
    let local = request(
        outsider.addr,
        "GET",
        &format!("/timers/{id}"),
        &[("X-Chronos-Local-Only", "1")],
        b"",
    );
    assert_eq!(
        local.status,
        404,
        "its own store holds no copy: {}",
        local.text()
    );
    assert_eq!(
        outsider
            .request("DELETE", &format!("/timers/{id}"), "")
            .status,
        200
    );
    for n in &nodes {
        wait_until("the delete everywhere", Duration::from_secs(10), || match n
            .request("GET", &format!("/timers/{id}"), "")
            .status
        {
            404 => Ok(()),
            s => Err(format!("{}: {s}", n.addr)),
        });
    }
}
