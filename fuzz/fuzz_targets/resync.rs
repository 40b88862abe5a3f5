//! The serving side of resync (seed 000): the `GET /timers` query with its
//! `Range`, and the `DELETE /timers/references` body.
#![no_main]
use chronos::cluster::Cluster;
use chronos::shard::resync::query::{parse_query, RANGE_MAX};
use chronos::shard::resync::references::parse_references_now;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let cluster = CLUSTER.get_or_init(|| {
        let nodes = ["10.0.0.1:7253".to_string(), "10.0.0.2:7253".to_string()];
        Cluster::new(&nodes[0], &nodes, &[]).unwrap()
    });
    let _ = parse_references_now(data);
    // The first line is the query, the rest the Range header's value.
    let text = String::from_utf8_lossy(data);
    let (query, range) = text.split_once('\n').unwrap_or((&text, ""));
    let range = (!range.is_empty()).then_some(range.as_bytes());
    if let Ok(q) = parse_query(cluster, query, range) {
        assert!(q.limit >= 1 && q.limit <= RANGE_MAX);
        assert!(q.node < cluster.nodes.len());
    }
});
