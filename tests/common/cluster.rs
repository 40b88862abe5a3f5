//! Loopback clusters and the waits around them: a cluster's ports and
//! configs on `127.0.0.1..=n`, a start, a reload on `SIGHUP`, `/cluster`
//! as JSON, `chronos resync --wait`, and idleness (nothing left to pop or
//! to replicate) seen on every node.

use super::{free_port, metric_value, wait_until, Node};
use std::net::TcpListener;
use std::time::Duration;

/// `"127.0.0.i:port"`, quoted, as a config's node list names node `i`.
pub fn member_addr(i: usize, port: u16) -> String {
    format!("\"127.0.0.{i}:{port}\"")
}

/// The quoted addresses of `nodes` (numbers `i` of `127.0.0.i`), comma
/// separated, for a config's `node`, `joining` or `leaving` list.
pub fn member_list(nodes: &[usize], port: u16) -> String {
    nodes
        .iter()
        .map(|&k| member_addr(k, port))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `GET /cluster` (with the node's secret, if it has one), as JSON;
/// fails unless it answers 200.
pub fn cluster_json(node: &Node) -> serde_json::Value {
    let r = node.get("/cluster");
    assert_eq!(r.status, 200, "{}", r.text());
    serde_json::from_slice(&r.body).unwrap()
}

/// The node's cluster view ID, from `/cluster`.
pub fn view_id(node: &Node) -> String {
    cluster_json(node)["cluster-view-id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// How many reloads the node has logged.
pub fn reloads(node: &Node) -> usize {
    node.log_text().matches("cluster reloaded").count()
}

/// Rewrite a node's config file, SIGHUP it, and wait until it logs one
/// more reload than it had before.
pub fn reload_config(node: &Node, config: &str) {
    let before = reloads(node);
    std::fs::write(node.config_path(), config).unwrap();
    node.signal(libc::SIGHUP);
    wait_until("the reload", Duration::from_secs(10), || {
        match reloads(node) > before {
            true => Ok(()),
            false => Err(format!("{before} reloads logged:\n{}", node.log_text())),
        }
    });
}

/// `chronos resync --wait` against `node`; fails unless it exits 0.
pub fn resync_cli(node: &Node) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_chronos"))
        .args(["resync", "--wait", "--address", &node.addr.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chronos resync --wait: {:?}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        node.log_text()
    );
}

/// `Ok` when `node` can pop nothing more: it holds no live timer
/// (tombstones never pop), every callback it started was answered or
/// given up, and every replication message it queued was answered or
/// given up. Otherwise what it is still busy with.
pub fn node_idle(node: &Node) -> Result<(), String> {
    idle_state(node, true)
}

/// As `node_idle`, but the node's replication may still be queued (for a
/// peer that was killed, which it retries for `replication-deliver-within-ms`).
pub fn node_pops_done(node: &Node) -> Result<(), String> {
    idle_state(node, false)
}

fn idle_state(node: &Node, replication: bool) -> Result<(), String> {
    let text = node.metrics()?;
    let value = |name: &str| -> f64 {
        metric_value(&text, name).unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    };
    let live = value("chronos_timers_pending") - value("chronos_tombstones");
    let popped = value("chronos_timers_popped_total");
    let answered = value("chronos_callbacks_succeeded_total")
        + value("chronos_callbacks_failed_total")
        + value("chronos_callbacks_deferred_total")
        + value("chronos_callbacks_withdrawn_total");
    let queued = value("chronos_replication_enqueued_total");
    let settled =
        value("chronos_replication_sent_total") + value("chronos_replication_failed_total");
    if live == 0.0 && answered >= popped && (settled >= queued || !replication) {
        return Ok(());
    }
    Err(format!(
        "{}: {live} live timers, {answered} of {popped} callbacks done, {settled} of {queued} replication messages settled",
        node.addr
    ))
}

/// Wait until no node of `nodes` can pop again (`node_idle`), seen on two
/// polls in a row (so that a message in flight between two of them when
/// the first poll read them has landed); fail after `timeout` with what
/// was still busy.
pub fn wait_idle(nodes: &[&Node], timeout: Duration) {
    wait_all(nodes, timeout, node_idle);
}

/// As `wait_idle` with `node_pops_done`: for the survivors of a kill.
pub fn wait_pops_done(nodes: &[&Node], timeout: Duration) {
    wait_all(nodes, timeout, node_pops_done);
}

pub fn wait_all(nodes: &[&Node], timeout: Duration, state: fn(&Node) -> Result<(), String>) {
    let mut idle_before = false;
    wait_until("every node to be idle", timeout, || {
        let busy: Vec<String> = nodes.iter().filter_map(|n| state(n).err()).collect();
        let idle_twice = busy.is_empty() && idle_before;
        idle_before = busy.is_empty();
        match (idle_twice, busy.is_empty()) {
            (true, _) => Ok(()),
            (false, true) => Err("idle once".into()),
            (false, false) => Err(busy.join("; ")),
        }
    });
}

/// A port free on every loopback address `127.0.0.1..=127.0.0.n`.
pub fn cluster_port(n: usize) -> u16 {
    'search: loop {
        let port = free_port();
        for i in 2..=n {
            if TcpListener::bind(format!("127.0.0.{i}:{port}")).is_err() {
                continue 'search;
            }
        }
        return port;
    }
}

/// The config of node `i` (1-based) of an `n`-node loopback cluster.
pub fn cluster_config(n: usize, i: usize, port: u16, cores: usize, extra: &str) -> String {
    let nodes: Vec<String> = (1..=n).map(|k| format!("\"127.0.0.{k}:{port}\"")).collect();
    format!(
        "[runtime]\ncores = {cores}\n[cluster]\nlocalhost = \"127.0.0.{i}:{port}\"\nnode = [{}]\n{extra}",
        nodes.join(", ")
    )
}

/// Start an `n`-node cluster on `127.0.0.1..=n`, one port.
pub fn start_cluster(n: usize, cores: usize, extra: &str) -> Vec<Node> {
    let port = cluster_port(n);
    (1..=n)
        .map(|i| {
            Node::start_at(
                &format!("127.0.0.{i}"),
                port,
                &cluster_config(n, i, port, cores, extra),
            )
        })
        .collect()
}

/// Rewrite a node's config file, SIGHUP it, and wait until its cluster
/// view ID (`/cluster`) changes: a reload that changes the members.
pub fn reload_view(node: &Node, config: &str) {
    let before = view_id(node);
    std::fs::write(node.config_path(), config).unwrap();
    node.signal(libc::SIGHUP);
    wait_until("a new cluster view", Duration::from_secs(10), || {
        match view_id(node) == before {
            true => Err(format!("still {before}:\n{}", node.log_text())),
            false => Ok(()),
        }
    });
}

/// Start member `i` of a loopback cluster: on `127.0.0.i:port`.
pub fn start_member(i: usize, port: u16, config: &str) -> Node {
    Node::start_at(&format!("127.0.0.{i}"), port, config)
}

/// `GET /timers/<id>` as JSON, asserting a `200`.
pub fn look_up(node: &Node, id: &str) -> serde_json::Value {
    let r = node.request("GET", &format!("/timers/{id}"), "");
    assert_eq!(
        r.status,
        200,
        "GET /timers/{id} on {}: {}",
        node.addr,
        r.text()
    );
    serde_json::from_slice(&r.body).expect("a JSON answer")
}
