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

#[test]
fn a_node_cut_off_for_ten_seconds_pops_on_both_sides_and_loses_nothing() {
    let net = Net::new();
    let members: Vec<String> = (1..=NODES)
        .map(|i| format!("\"{}:{PORT}\"", net.addr(i)))
        .collect();
    let nodes: Vec<Node> = (1..=NODES)
        .map(|i| {
            let config = format!(
                "[runtime]\ncores = 1\n[cluster]\nlocalhost = \"{}:{PORT}\"\nnode = [{}]\n",
                net.addr(i),
                members.join(", ")
            );
            Node::start_in(Some(&net.ns(i)), &net.addr(i), PORT, &config)
        })
        .collect();
    let sink = Sink::start_on(&format!("{}.254", net.subnet), Behaviour::Ok);
    // Repeating timers on every replica pair: node 3 is primary of some,
    // backup of others, and uninvolved in the rest.
    let (timers, interval_s, repeat_s) = (12, 1, 26);
    for t in 0..timers {
        let body = format!(
            r#"{{"timing":{{"interval":{interval_s},"repeat-for":{repeat_s}}},"callback":{{"http":{{"uri":"{}","opaque":"x"}}}},"reliability":{{"replication-factor":2}}}}"#,
            sink.uri(&format!("/t{t}"))
        );
        nodes[t % 2].create(&body);
    }
    sink.wait_for(timers, Duration::from_secs(5));
    net.split(3, "add");
    let cut_at = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    net.split(3, "del");
    let healed_at = Instant::now();
    // Let the retried replication catch up (backoff at most 2 s), then
    // watch the pops that follow.
    std::thread::sleep(Duration::from_secs(5));
    let settled = Instant::now();
    let end = Instant::now() + Duration::from_secs(repeat_s as u64) + Duration::from_secs(6);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
    }
    let pops = sink.pops();
    let mut by_timer: BTreeMap<&str, BTreeMap<u32, Vec<Instant>>> = BTreeMap::new();
    for p in &pops {
        by_timer
            .entry(&p.path)
            .or_default()
            .entry(p.sequence)
            .or_default()
            .push(p.at);
    }
    assert_eq!(by_timer.len(), timers, "every timer popped");
    let mut doubled_in_split = 0;
    for (path, seqs) in &by_timer {
        // Nothing lost, no sequence number invented: exactly 1..=26.
        let seen: BTreeSet<u32> = seqs.keys().copied().collect();
        let want: BTreeSet<u32> = (1..=(repeat_s / interval_s) as u32).collect();
        assert_eq!(seen, want, "{path}: sequences");
        for (seq, ats) in seqs {
            if ats.len() > 1
                && ats
                    .iter()
                    .all(|&a| a >= cut_at && a <= healed_at + Duration::from_secs(3))
            {
                doubled_in_split += 1;
            }
            let after: Vec<_> = ats.iter().filter(|&&a| a >= settled).collect();
            assert!(
                after.len() <= 1,
                "{path} sequence {seq} popped {} times after the heal",
                after.len()
            );
            assert!(
                ats.len() <= 2,
                "{path} sequence {seq} popped {} times",
                ats.len()
            );
        }
    }
    assert!(
        doubled_in_split > 0,
        "both sides popped during the split: {pops:?}"
    );
    for node in &nodes {
        assert_eq!(node.metric("chronos_callbacks_failed_total"), 0.0);
    }
}
