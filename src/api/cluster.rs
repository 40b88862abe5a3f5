//! `GET /cluster`'s report: this node's cluster view, its sites, and the
//! resync's state and counters (shard 0's, where the resync runs), as
//! JSON. It only reads what the shard and the stats already hold.

use crate::cluster::Node;
use crate::runtime::bulk;
use crate::shard::Shard;
use crate::stats;
use std::sync::atomic::Ordering::Relaxed;

/// `GET /cluster`: this node's view and the resync's state, as JSON.
pub fn cluster_report(shard: &Shard) -> String {
    let c = shard.timers.cluster();
    let names = |l: &[Node]| l.iter().map(|n| n.address.clone()).collect::<Vec<_>>();
    let members = c.nodes.len() - c.joining;
    let s = &shard.base.stats[0];
    let (state, started_runs, finished_runs) = s.resync_progress();
    let count = |f: &std::sync::atomic::AtomicU64| f.load(Relaxed);
    let (stretch_us_max, stretch_wall_us_max, stretch_counts) = bulk::stretches();
    serde_json::json!({
        "localhost": c.local_address,
        "cluster-view-id": c.view_id_string(),
        "nodes": names(&c.nodes[..members]),
        "joining": names(&c.nodes[members..]),
        "leaving": names(&c.leaving),
        "instance-id": shard.timers.store.borrow().ids.instance(),
        "sites": {
            "local_site": shard.base.resolved.sites.local,
            "remote_site": shard.base.resolved.sites.remote.iter().map(|r| format!("{}={}", r.name, r.address)).collect::<Vec<_>>(),
            "replicate_timers_across_sites": shard.base.resolved.sites.across,
        },
        "resync": {
            "state": stats::RESYNC_STATES[state],
            "started-runs": started_runs,
            "finished-runs": finished_runs,
            "failed-runs": s.resync_failed.load(Relaxed),
            "peers-left": s.resync_peers_left.load(Relaxed),
            "received": count(&s.resync_received),
            "added": count(&s.resync_added),
            "replicated": count(&s.resync_replicated),
            "tombstoned": count(&s.resync_tombstoned),
            "peer-errors": count(&s.resync_peer_errors),
            // This node's longest stretch of bulk work (resync runs,
            // pages served, references marked) without a breath, in
            // thread CPU time and in wall-clock time (preemptions by
            // the kernel included), and the stretches per bucket (CPU
            // µs, up to each bound).
            "stretch-us-max": stretch_us_max,
            "stretch-wall-us-max": stretch_wall_us_max,
            "stretch-us-bounds": bulk::STRETCH_BOUNDS_US,
            "stretch-counts": stretch_counts,
            "last-error": *s.resync_error.lock().expect("not poisoned"),
        },
    })
    .to_string()
}
