//! Geographic redundancy (`[sites]`, seed 002's GR replicator) with real
//! processes on loopback, mirroring the reference's GR FV scenarios. Each
//! site is its own cluster; a site's `remote_site` entries name one node of
//! each other site. Timers use the default replication factor 2, so site
//! `s` pops `s × 2 × 2 s` after the first site.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const INTERVAL_S: u64 = 5;
/// One site's delay behind the one before it: factor 2 × skew 2 s.
const SITE_SKEW: Duration = Duration::from_secs(4);
const MARGIN: Duration = Duration::from_secs(3);

/// The config of node `ip` in site `name`, whose nodes are `members`;
/// `remote` lists the other sites as `(name, ip)`.
fn config(
    ip: &str,
    port: u16,
    name: &str,
    members: &[&str],
    remote: &[(&str, &str)],
    across: bool,
) -> String {
    let nodes: Vec<String> = members.iter().map(|m| format!("\"{m}:{port}\"")).collect();
    let sites: Vec<String> = remote
        .iter()
        .map(|(n, a)| format!("\"{n}={a}:{port}\""))
        .collect();
    format!(
        "[runtime]\ncores = 1\n[cluster]\nlocalhost = \"{ip}:{port}\"\nnode = [{}]\n[sites]\nlocal_site = \"{name}\"\nremote_site = [{}]\nreplicate_timers_across_sites = {across}\n",
        nodes.join(", "),
        sites.join(", ")
    )
}

/// Single-node sites `S1..Sn` on 127.0.0.1..n.
fn single_node_sites(n: usize, across: bool) -> Vec<Node> {
    let port = cluster_port(n);
    let ips: Vec<String> = (1..=n).map(|i| format!("127.0.0.{i}")).collect();
    let names: Vec<String> = (1..=n).map(|i| format!("S{i}")).collect();
    (0..n)
        .map(|i| {
            let remote: Vec<(&str, &str)> = (0..n)
                .filter(|&k| k != i)
                .map(|k| (names[k].as_str(), ips[k].as_str()))
                .collect();
            let cfg = config(&ips[i], port, &names[i], &[&ips[i]], &remote, across);
            Node::start_at(&ips[i], port, &cfg)
        })
        .collect()
}

fn timer(uri: &str) -> String {
    timer_body(&INTERVAL_S.to_string(), None, uri, "g")
}

fn create(node: &Node, sink: &Sink, path: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| node.create(&timer(&sink.uri(&format!("{path}/{i}")))))
        .collect()
}

/// Successful pops per path.
fn per_path(sink: &Sink) -> BTreeMap<String, usize> {
    let mut per = BTreeMap::new();
    for p in sink.pops().into_iter().filter(|p| p.ok) {
        *per.entry(p.path).or_default() += 1;
    }
    per
}

/// Cross-site messages of `node` by outcome, summed over sites.
fn site_messages(node: &Node, outcome: &str) -> f64 {
    let text = node.request("GET", "/metrics", "").text();
    text.lines()
        .filter(|l| {
            l.starts_with("chronos_site_replication_total")
                && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `Ok` when `node` has handed every cross-site message it queued to its
/// site (or given up on it); `at_least`: and queued more than that.
fn sites_settled(node: &Node, at_least: f64) -> Result<(), String> {
    let queued = site_messages(node, "enqueued");
    let done = ["sent", "failed", "dropped"]
        .iter()
        .map(|o| site_messages(node, o))
        .sum::<f64>();
    match queued > at_least && done >= queued {
        true => Ok(()),
        false => Err(format!(
            "{}: {done} of {queued} cross-site messages done",
            node.addr
        )),
    }
}

/// `Ok` when `node` can pop nothing more and has handed every cross-site
/// message it queued to its site (or given up on it).
fn site_node_idle(node: &Node) -> Result<(), String> {
    node_idle(node)?;
    sites_settled(node, -1.0)
}

/// Wait until no node of `nodes` can pop again, seen on two polls in a
/// row (a message in flight between sites has landed by then).
fn wait_sites_idle(nodes: &[&Node]) {
    wait_all(nodes, Duration::from_secs(30), site_node_idle);
}

/// Wait until `node` has handed every cross-site message to its site.
fn wait_sites_settled(node: &Node) {
    wait_until(
        "cross-site replication to settle",
        Duration::from_secs(10),
        || sites_settled(node, 0.0),
    );
}

/// Two sites of two nodes each, no failure: every timer pops exactly once
/// (the second site's copies learn each pop before their turn).
#[test]
fn two_sites_without_failure_pop_every_timer_once() {
    let port = cluster_port(4);
    let (a, b) = (["127.0.0.1", "127.0.0.2"], ["127.0.0.3", "127.0.0.4"]);
    let nodes: Vec<Node> =
        a.iter()
            .map(|ip| Node::start_at(ip, port, &config(ip, port, "A", &a, &[("B", b[0])], true)))
            .chain(b.iter().map(|ip| {
                Node::start_at(ip, port, &config(ip, port, "B", &b, &[("A", a[0])], true))
            }))
            .collect();
    let sink = Sink::start(Behaviour::Ok);
    let created = Instant::now();
    create(&nodes[0], &sink, "/t", 100);
    wait_sites_settled(&nodes[0]);
    // Site B holds a copy of each timer, placed among its own nodes.
    let live = |n: &Node| n.metric("chronos_timers_pending") - n.metric("chronos_tombstones");
    assert_eq!(
        live(&nodes[2]) + live(&nodes[3]),
        200.0,
        "site B holds two replicas of each"
    );
    let wait = Duration::from_secs(INTERVAL_S) + SITE_SKEW + MARGIN;
    sink.wait_for(100, wait.saturating_sub(created.elapsed()));
    // No live copy left at either site: no duplicate can follow.
    wait_sites_idle(&nodes.iter().collect::<Vec<_>>());
    let per = per_path(&sink);
    assert_eq!(per.len(), 100, "{} of 100 popped", per.len());
    let twice: Vec<_> = per.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "popped more than once: {twice:?}");
}

/// The site that took the requests is killed: the other pops every timer.
#[test]
fn the_other_site_pops_every_timer_when_the_first_is_killed() {
    let mut nodes = single_node_sites(2, true);
    let sink = Sink::start(Behaviour::Ok);
    let created = Instant::now();
    create(&nodes[0], &sink, "/t", 100);
    wait_sites_settled(&nodes[0]);
    nodes[0].kill9();
    let due = Duration::from_secs(INTERVAL_S) + SITE_SKEW;
    sink.wait_for(100, (due + MARGIN).saturating_sub(created.elapsed()));
    let per = per_path(&sink);
    assert_eq!(per.len(), 100, "{} of 100 popped", per.len());
    for p in sink.pops() {
        assert!(p.at >= created + due, "site 2 popped before its turn");
    }
}

/// Four sites of one node, 25 timers created at each, three sites killed:
/// the survivor pops all 100 within 19 s of creation (the last site's
/// delay is 3 × 2 × 2 s after the 5 s interval).
#[test]
fn four_sites_three_killed_the_survivor_pops_all_within_19_s() {
    let mut nodes = single_node_sites(4, true);
    let sink = Sink::start(Behaviour::Ok);
    for (i, node) in nodes.iter().enumerate() {
        create(node, &sink, &format!("/s{i}"), 25);
    }
    // Within 19 s of the last creation: the creates' own time on a loaded
    // machine is not the survivor's.
    let created = Instant::now();
    for node in &nodes {
        wait_sites_settled(node);
    }
    for i in [0, 1, 3] {
        nodes[i].kill9();
    }
    let left = (created + Duration::from_secs(19)).saturating_duration_since(Instant::now());
    sink.wait_for(100, left);
    let per = per_path(&sink);
    if per.len() < 100 {
        // Say whether the missing ones were late or lost.
        sink.wait_for(100, Duration::from_secs(20));
        let missing: Vec<String> = (0..4)
            .flat_map(|i| (0..25).map(move |n| format!("/s{i}/{n}")))
            .filter(|path| !per.contains_key(path))
            .collect();
        let late = per_path(&sink).len() - per.len();
        panic!(
            "{} of 100 popped within 19 s; of the missing {missing:?}, {late} popped within 20 s more",
            per.len()
        );
    }
}

/// Timers created at both sites and deleted at the other one: no pops,
/// while a timer created with them at each site and not deleted (the
/// positive control) pops once.
#[test]
fn timers_deleted_at_the_other_site_pop_nowhere() {
    let nodes = single_node_sites(2, true);
    let sink = Sink::start(Behaviour::Ok);
    let created = Instant::now();
    let ids_a = create(&nodes[0], &sink, "/a", 50);
    create(&nodes[0], &sink, "/kept-a", 1);
    let ids_b = create(&nodes[1], &sink, "/b", 50);
    create(&nodes[1], &sink, "/kept-b", 1);
    wait_sites_settled(&nodes[0]);
    wait_sites_settled(&nodes[1]);
    for (ids, other) in [(&ids_a, &nodes[1]), (&ids_b, &nodes[0])] {
        for id in ids {
            assert_eq!(
                other.request("DELETE", &format!("/timers/{id}"), "").status,
                200
            );
        }
    }
    let due = Duration::from_secs(INTERVAL_S) + MARGIN;
    sink.wait_for(2, due.saturating_sub(created.elapsed()));
    // Then neither site holds a live copy: no deleted timer can pop.
    wait_sites_idle(&[&nodes[0], &nodes[1]]);
    let per = per_path(&sink);
    let kept: Vec<(&str, usize)> = per.iter().map(|(p, n)| (p.as_str(), *n)).collect();
    assert_eq!(
        kept,
        [("/kept-a/0", 1), ("/kept-b/0", 1)],
        "only the kept timers popped, once each"
    );
}

/// Replication across sites off: each site pops only its own timers, and
/// killing one site loses its timers only.
#[test]
fn without_replication_across_sites_each_site_pops_its_own() {
    let mut nodes = single_node_sites(2, false);
    let sink = Sink::start(Behaviour::Ok);
    let created = Instant::now();
    create(&nodes[0], &sink, "/a", 25);
    create(&nodes[1], &sink, "/b", 25);
    nodes[1].kill9();
    let due = Duration::from_secs(INTERVAL_S) + MARGIN;
    sink.wait_for(25, due.saturating_sub(created.elapsed()));
    // Then site 1 holds nothing more that could pop (site 2 is dead).
    wait_sites_idle(&[&nodes[0]]);
    let per = per_path(&sink);
    assert_eq!(per.len(), 25, "{per:?}");
    assert!(per.keys().all(|p| p.starts_with("/a/")), "{per:?}");
    assert!(per.values().all(|n| *n == 1));
    let text = nodes[0].request("GET", "/metrics", "").text();
    assert!(
        text.contains("chronos_site_replication_total{site=\"S2\",outcome=\"enqueued\"} 0"),
        "{text}"
    );
}

/// A malformed `remote_site` entry is refused at start, naming it; a node
/// shows its sites in `GET /cluster`.
#[test]
fn malformed_sites_are_refused_and_good_ones_reported() {
    let dir = std::env::temp_dir().join(format!("chronos-sites-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for bad in [
        "\"nameless\"",
        "\"B=no-such-host.invalid\"",
        "\"B=1.2.3.4\", \"B=1.2.3.5\"",
    ] {
        let path = dir.join("bad.toml");
        std::fs::write(
            &path,
            format!("[sites]\nlocal_site = \"A\"\nremote_site = [{bad}]\n"),
        )
        .unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_chronos"))
            .args([
                "--config",
                path.to_str().unwrap(),
                "--bind-port",
                &free_port().to_string(),
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("remote_site") || err.contains("twice"),
            "{bad}: {err}"
        );
    }
    let nodes = single_node_sites(2, true);
    let r = nodes[0].request("GET", "/cluster", "");
    let c: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(c["sites"]["local_site"], "S1", "{c}");
    let port = nodes[1].addr.port();
    assert_eq!(
        c["sites"]["remote_site"][0],
        format!("S2=127.0.0.2:{port}"),
        "{c}"
    );
}
