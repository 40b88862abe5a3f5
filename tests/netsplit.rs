//! A real net split (issue 13): three nodes in three network namespaces,
//! joined by veth pairs to a bridge in the test's namespace, where the
//! callback target listens. Node 3 is cut off from nodes 1 and 2 for 10 s
//! (blackhole routes on both sides; the target stays reachable), then
//! healed. During the split both sides pop; duplicates carry the same
//! `X-Sequence-Number` (seed 002), so a client can tell them apart; after
//! the heal single pops resume; no pop is lost.
//!
//! Needs root (CI runs as root) and `ip` (iproute2). It fails, rather than
//! skips, without them. Everything it creates is named after its process
//! ID and removed on drop.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

const NODES: usize = 3;
const PORT: u16 = 7253;
/// How long node 3 stays cut off: the scenario itself, not a wait for
/// anything. Both sides pop every 1 s timer alone from one skew after the
/// cut, so this is several pops on both sides, and longer than a
/// replication timeout plus the longest reconnect backoff.
const SPLIT: Duration = Duration::from_secs(10);
/// The replica skew (the default).
const SKEW: Duration = Duration::from_secs(2);
/// After the heal, a pop may still be duplicated until every queue has
/// reconnected (at most the longest backoff) and the skewed copies have
/// heard of the pops (one skew), plus a margin for a loaded machine.
const HEAL_SETTLES_WITHIN: Duration = Duration::from_millis(
    chronos::cluster::replicate::BACKOFF_MS_MAX + SKEW.as_millis() as u64 + 1000,
);

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {} (this test needs root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespaces, veths and bridge of one test run.
struct Net {
    tag: u32,
    subnet: String,
}

impl Net {
    fn new() -> Net {
        let tag = std::process::id() % 100_000;
        let subnet = format!("10.213.{}", tag % 250);
        let net = Net { tag, subnet };
        let br = net.bridge();
        ip(&["link", "add", &br, "type", "bridge"]);
        ip(&["addr", "add", &format!("{}.254/24", net.subnet), "dev", &br]);
        ip(&["link", "set", &br, "up"]);
        for i in 1..=NODES {
            let (ns, outer, inner) = (
                net.ns(i),
                format!("co{}-{i}", net.tag),
                format!("ci{}-{i}", net.tag),
            );
            ip(&["netns", "add", &ns]);
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ]);
            ip(&["link", "set", &inner, "netns", &ns]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", net.addr(i)),
                "dev",
                &inner,
            ]);
            ip(&["-n", &ns, "link", "set", &inner, "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&["link", "set", &outer, "master", &br]);
            ip(&["link", "set", &outer, "up"]);
        }
        net
    }

    fn bridge(&self) -> String {
        format!("cbr{}", self.tag)
    }

    fn ns(&self, i: usize) -> String {
        format!("chronos-{}-{i}", self.tag)
    }

    fn addr(&self, i: usize) -> String {
        format!("{}.{i}", self.subnet)
    }

    /// Cut (`add`) or heal (`del`) node `k` from every other node, both
    /// ways, with blackhole routes. The bridge address stays reachable.
    fn split(&self, k: usize, action: &str) {
        for i in (1..=NODES).filter(|&i| i != k) {
            ip(&[
                "-n",
                &self.ns(k),
                "route",
                action,
                "blackhole",
                &format!("{}/32", self.addr(i)),
            ]);
            ip(&[
                "-n",
                &self.ns(i),
                "route",
                action,
                "blackhole",
                &format!("{}/32", self.addr(k)),
            ]);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 1..=NODES {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(i)])
                .output();
            let _ = Command::new("ip")
                .args(["link", "del", &format!("co{}-{i}", self.tag)])
                .output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge()])
            .output();
    }
}

/// Node `i` of the cluster, one per namespace.
fn start_nodes(net: &Net) -> Vec<Node> {
    let members: Vec<String> = (1..=NODES)
        .map(|i| format!("\"{}:{PORT}\"", net.addr(i)))
        .collect();
    (1..=NODES)
        .map(|i| {
            let config = format!(
                "[runtime]\ncores = 1\n[cluster]\nlocalhost = \"{}:{PORT}\"\nnode = [{}]\n",
                net.addr(i),
                members.join(", ")
            );
            Node::start_in(Some(&net.ns(i)), &net.addr(i), PORT, &config)
        })
        .collect()
}

const TIMERS: usize = 12;
const INTERVAL_S: u64 = 1;
const REPEAT_S: u64 = 26;

/// Repeating timers on every replica pair: node 3 is primary of some,
/// backup of others, and uninvolved in the rest. Returns once each popped.
fn create_timers(nodes: &[Node], sink: &Sink) {
    let (interval, repeat_for) = (INTERVAL_S.to_string(), REPEAT_S.to_string());
    for t in 0..TIMERS {
        let uri = sink.uri(&format!("/t{t}"));
        let body = replicated_body(&interval, Some(&repeat_for), &uri, "x", 2);
        nodes[t % 2].create(&body);
    }
    wait_until(
        "every timer to pop before the split",
        Duration::from_secs(5),
        || {
            let paths: BTreeSet<String> = sink.pops().into_iter().map(|p| p.path).collect();
            match paths.len() == TIMERS {
                true => Ok(()),
                false => Err(format!("{paths:?}")),
            }
        },
    );
}

/// Sequence numbers of one timer popped twice, both times since `since`.
fn doubled_since(pops: &[Pop], since: Instant) -> usize {
    let mut seen: BTreeMap<(&str, u32), usize> = BTreeMap::new();
    for p in pops.iter().filter(|p| p.at >= since) {
        *seen.entry((&p.path, p.sequence)).or_default() += 1;
    }
    seen.values().filter(|&&n| n > 1).count()
}

/// Cut node 3 off for `SPLIT`, once both sides have popped alone; the
/// instants of the cut and of the heal.
fn split_node_3(net: &Net, sink: &Sink) -> (Instant, Instant) {
    net.split(3, "add");
    let cut_at = Instant::now();
    // The positive control of the cut: both sides pop one sequence number.
    wait_until("a pop on both sides of the split", SPLIT, || {
        match doubled_since(&sink.pops(), cut_at) > 0 {
            true => Ok(()),
            false => Err("no sequence number popped twice yet".into()),
        }
    });
    sleep_until(cut_at + SPLIT);
    net.split(3, "del");
    (cut_at, Instant::now())
}

/// Every sequence number of every timer popped (nothing lost, nothing
/// invented), at most twice, and at most once from `settled` on, where
/// each timer still popped twice or more; the sequence numbers popped by
/// both sides during the split.
fn check_pops(pops: &[Pop], cut_at: Instant, healed_at: Instant, settled: Instant) -> usize {
    let mut by_timer: BTreeMap<&str, BTreeMap<u32, Vec<Instant>>> = BTreeMap::new();
    for p in pops {
        let seqs = by_timer.entry(&p.path).or_default();
        seqs.entry(p.sequence).or_default().push(p.at);
    }
    assert_eq!(by_timer.len(), TIMERS, "every timer popped");
    let want: BTreeSet<u32> = (1..=(REPEAT_S / INTERVAL_S) as u32).collect();
    let in_split = |a: &Instant| *a >= cut_at && *a <= healed_at + Duration::from_secs(3);
    let mut doubled_in_split = 0;
    for (path, seqs) in &by_timer {
        let seen: BTreeSet<u32> = seqs.keys().copied().collect();
        assert_eq!(seen, want, "{path}: sequences");
        let after_heal = seqs
            .values()
            .filter(|ats| ats.iter().any(|&a| a >= settled));
        assert!(
            after_heal.count() >= 2,
            "{path}: too few pops after the heal"
        );
        for (seq, ats) in seqs {
            if ats.len() > 1 && ats.iter().all(in_split) {
                doubled_in_split += 1;
            }
            let after = ats.iter().filter(|&&a| a >= settled).count();
            assert!(
                after <= 1,
                "{path} sequence {seq} popped {after} times after the heal"
            );
            assert!(
                ats.len() <= 2,
                "{path} sequence {seq} popped {} times",
                ats.len()
            );
        }
    }
    doubled_in_split
}

#[test]
fn a_node_cut_off_for_ten_seconds_pops_on_both_sides_and_loses_nothing() {
    let net = Net::new();
    let nodes = start_nodes(&net);
    let sink = Sink::start_on(&format!("{}.254", net.subnet), Behaviour::Ok);
    create_timers(&nodes, &sink);
    let (cut_at, healed_at) = split_node_3(&net, &sink);
    // Pops from `settled` on must be single. The timers run to their end,
    // and then no node holds a live copy.
    let settled = healed_at + HEAL_SETTLES_WITHIN;
    let all: Vec<&Node> = nodes.iter().collect();
    wait_idle(&all, Duration::from_secs(REPEAT_S + 15));
    let pops = sink.pops();
    let doubled_in_split = check_pops(&pops, cut_at, healed_at, settled);
    assert!(
        doubled_in_split > 0,
        "both sides popped during the split: {pops:?}"
    );
    for node in &nodes {
        assert_eq!(node.metric("chronos_callbacks_failed_total"), 0.0);
    }
}
