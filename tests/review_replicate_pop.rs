//! Review: `Shard::send_pop` (src/shard/replication.rs) replicates the
//! *stored* copy when its sequence equals the pop's, "a final pop's
//! tombstone included". If the stored copy became a tombstone of the same
//! incarnation while a non-final pop's callback was in flight (a resync
//! tombstones old replicas with the listed version and sequence), the
//! pop's success replicates that tombstone to the timer's replicas, where
//! it beats their live copy at the tie: a repeating timer with pops to go
//! is deleted cluster-wide. Here the resync's tombstone is played by a
//! `PUT` of the node's own listing entry with an empty callback, exactly
//! as `tests/races.rs` does.

mod common;

use common::*;
use std::time::{Duration, Instant};

#[test]
fn review_a_non_final_pop_never_replicates_a_tombstone() {
    tombstone_during_pop_1(true);
}

/// The control: the same tombstone after pop 1's callback ended (its
/// replication carried the live copy); the backup goes on popping.
#[test]
fn review_control_tombstone_after_the_callback() {
    tombstone_during_pop_1(false);
}

fn tombstone_during_pop_1(in_flight: bool) {
    let nodes = start_cluster(2, 1, "");
    let port = nodes[0].addr.port();
    let sink = Sink::start(Behaviour::Slow(Duration::from_millis(1000)));
    let body = format!(
        r#"{{"timing":{{"interval":3,"repeat-for":60}},"callback":{{"http":{{"uri":"{}","opaque":"x"}}}},"reliability":{{"replication-factor":2}}}}"#,
        sink.uri("/t")
    );
    let t0 = Instant::now();
    let id = nodes[0].create(&body);
    let view =
        serde_json::from_slice::<serde_json::Value>(&nodes[0].request("GET", "/cluster", "").body)
            .unwrap()["cluster-view-id"]
            .as_str()
            .unwrap()
            .to_string();
    // The timer's entry as node `from` lists it for node `to`.
    let entry = |from: usize, to: usize| -> serde_json::Value {
        let list = format!(
            "/timers?node-for-replicas=127.0.0.{}:{port}&cluster-view-id={view}&all-views=true",
            to + 1
        );
        let r = nodes[from].request("GET", &list, "");
        assert!(r.status == 200 || r.status == 206, "{}", r.text());
        let page: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        page["timers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["TimerID"].as_str().unwrap()[..16] == id[..16])
            .cloned()
            .expect("the timer is listed")
    };
    let replicas = entry(0, 1)["Timer"]["reliability"]["replicas"].clone();
    let primary = if replicas[0].as_str().unwrap().starts_with("127.0.0.1:") {
        0
    } else {
        1
    };
    // Pop 1 (3 s) is on the wire for 1 s: the primary's copy now has
    // sequence 1. A tombstone of that incarnation arrives meanwhile.
    let pops = sink.wait_for(1, Duration::from_secs(10));
    assert_eq!(pops.len(), 1);
    if !in_flight {
        std::thread::sleep(Duration::from_millis(1500));
    }
    let e = entry(primary, 1 - primary);
    assert_eq!(
        e["Timer"]["timing"]["sequence-number"].as_u64(),
        Some(1),
        "{e}"
    );
    let mut tomb = e["Timer"].clone();
    tomb["callback"] = serde_json::json!({});
    let path = format!("/timers/{}", e["TimerID"].as_str().unwrap());
    let r = nodes[primary].request("PUT", &path, &tomb.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        !in_flight || pops[0].at.elapsed() < Duration::from_millis(900),
        "the tombstone arrived while pop 1's callback was in flight"
    );
    // Pops 2 and 3 are due at 6 s and 9 s (+2 s from the backup).
    sleep_until(t0 + Duration::from_secs(14));
    let seqs: Vec<u32> = sink.pops().iter().map(|p| p.sequence).collect();
    assert!(
        seqs.contains(&2) && seqs.contains(&3),
        "the repeating timer stopped after pop 1: sequences {seqs:?}"
    );
}
