//! Protection (issue 16) against the real binary: a closed internal API
//! (`[cluster] shared-secret`), overload control (`[throttling]`, the
//! reference's token bucket) and per-source connection caps.

mod common;

use common::*;
use std::time::{Duration, Instant};

const SECRET: &str = "s3cret-of-this-cluster-0123456789";

fn live(node: &Node) -> f64 {
    node.metric("chronos_timers_pending") - node.metric("chronos_tombstones")
}

/// With a shared secret, forged replication, cross-site and resync
/// requests get 403 and change nothing, while client requests work and
/// the cluster replicates and survives a kill.
#[test]
fn a_shared_secret_closes_the_internal_api_and_the_cluster_still_works() {
    let extra = format!("shared-secret = \"{SECRET}\"\n");
    let mut nodes = start_cluster(3, 1, &extra);
    let port = nodes[0].addr.port();
    let sink = Sink::start(Behaviour::Ok);
    let id = "0123456789abcdef0000000000000007";
    let replicas = format!("\"127.0.0.1:{port}\",\"127.0.0.2:{port}\"");
    let forged = [
        (
            "PUT",
            format!("/timers/{id}"),
            format!(r#"{{"timing":{{"interval":1}},"callback":{{"http":{{"uri":"{}","opaque":"x"}}}},"reliability":{{"replicas":[{replicas}]}}}}"#, sink.uri("/forged")),
        ),
        (
            "PUT",
            format!("/timers/{id}"),
            format!(r#"{{"timing":{{"interval":1}},"callback":{{"http":{{"uri":"{}","opaque":"x"}}}},"reliability":{{"sites":["elsewhere"]}}}}"#, sink.uri("/forged")),
        ),
        (
            "GET",
            format!("/timers?node-for-replicas=127.0.0.1:{port}&cluster-view-id=1"),
            String::new(),
        ),
        (
            "DELETE",
            "/timers/references".to_string(),
            format!(r#"{{"IDs":[{{"ID":"{id}","ReplicaIndex":0}}]}}"#),
        ),
    ];
    for (method, path, body) in &forged {
        for auth in [None, Some("Bearer wrong-secret-of-the-same-size-012"), Some(SECRET)] {
            let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
            let r = request(nodes[0].addr, method, path, &headers, body.as_bytes());
            assert_eq!(r.status, 403, "{method} {path} with {auth:?}: {}", r.text());
        }
    }
    assert_eq!(nodes[0].metric("chronos_internal_refused_total"), 12.0);
    assert_eq!(nodes[0].metric("chronos_timers_pending"), 0.0, "nothing forged was stored");
    // Client requests need no secret; replication carries it.
    let created = Instant::now();
    for i in 0..20 {
        nodes[0].create(&timer_body("3", None, &sink.uri(&format!("/t/{i}")), "x"));
    }
    for node in &nodes {
        node.wait_replication_settled(Duration::from_secs(5));
    }
    assert_eq!(nodes.iter().map(live).sum::<f64>(), 40.0, "two replicas of each");
    nodes[0].kill9();
    let pops = sink.wait_for(20, (created + Duration::from_secs(9)).saturating_duration_since(Instant::now()));
    let mut paths: Vec<&str> = pops.iter().map(|p| p.path.as_str()).collect();
    paths.sort_unstable();
    paths.dedup();
    assert_eq!(paths.len(), 20, "{} of 20 popped after the kill", paths.len());
    assert!(pops.iter().all(|p| !p.path.starts_with("/forged")));
    assert!(!nodes[1].log_text().contains(SECRET) && !nodes[2].log_text().contains(SECRET));
}
