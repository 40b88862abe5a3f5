//! Active resynchronisation (seeds 001 and 003) with real processes on
//! loopback, mirroring the reference's FV scenarios: 100 timers (interval
//! 10 s, replication factor 2) each, the scaling configuration reloaded
//! with SIGHUP, the resync started with SIGUSR1 or `chronos resync --wait`,
//! and every timer popping exactly once afterwards, whichever nodes are
//! killed once the resync is complete.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const TIMERS: usize = 100;
/// Interval of the timers: long enough for the scaling steps to finish
/// first on a loaded machine.
const INTERVAL_S: u64 = 10;
/// How long after creation every pop must have arrived: the interval, one
/// replica skew (a backup may pop after a kill), and a margin.
const POP_WITHIN: Duration = Duration::from_secs(INTERVAL_S + 2 + 8);

/// Timers per resync page: small, so that every listing spans pages and
/// continues from its cursor.
const PAGE_TIMERS: usize = 7;

/// The config of node `i` with these member, joining and leaving lists.
/// Odd nodes run two shards (a page merges both shards' parts), even
/// nodes one.
fn config(i: usize, port: u16, nodes: &[usize], joining: &[usize], leaving: &[usize]) -> String {
    format!(
        "[runtime]\ncores = {}\n[cluster]\nlocalhost = {}\nnode = [{}]\njoining = [{}]\nleaving = [{}]\nresync-page-timers = {PAGE_TIMERS}\n",
        1 + i % 2,
        member_addr(i, port),
        member_list(nodes, port),
        member_list(joining, port),
        member_list(leaving, port)
    )
}

fn start(i: usize, port: u16, nodes: &[usize], joining: &[usize], leaving: &[usize]) -> Node {
    Node::start_at(
        &format!("127.0.0.{i}"),
        port,
        &config(i, port, nodes, joining, leaving),
    )
}

/// Rewrite a node's config, SIGHUP it, and wait until the node reports
/// the new cluster view in `GET /cluster`.
fn reload(node: &Node, i: usize, port: u16, nodes: &[usize], joining: &[usize], leaving: &[usize]) {
    reload_view(node, &config(i, port, nodes, joining, leaving));
}

/// SIGUSR1 (`service chronos resync`), then wait for `GET /cluster` to
/// report the run complete. A run already going when the signal came (the
/// start-up's, a reload's) finishes first and the signal's starts after
/// it: so wait until a run started after the signal and every started run
/// finished.
fn resync_usr1(node: &Node) {
    let count = |c: &serde_json::Value, name: &str| c["resync"][name].as_u64().unwrap();
    let started_before = count(&cluster_json(node), "started-runs");
    node.signal(libc::SIGUSR1);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = cluster_json(node);
        let started = count(&c, "started-runs");
        if started > started_before && count(&c, "finished-runs") >= started {
            assert_eq!(c["resync"]["state"], "complete", "{c}");
            return;
        }
        assert!(Instant::now() < deadline, "resync did not complete: {c}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn timer(uri: &str, interval: u64, repeat_for: u64) -> String {
    let repeat_for = repeat_for.to_string();
    replicated_body(&interval.to_string(), Some(&repeat_for), uri, "x", 2)
}

/// Create the 100 one-shot timers on `node`, calling back on `/t/<i>`.
fn create_timers(node: &Node, sink: &Sink) -> Instant {
    let created = Instant::now();
    for i in 0..TIMERS {
        node.create(&timer(
            &sink.uri(&format!("/t/{i}")),
            INTERVAL_S,
            INTERVAL_S,
        ));
    }
    created
}

/// Every timer popped exactly once (a duplicate or a missing pop fails);
/// `nodes` are the nodes still running.
fn assert_popped_once(sink: &Sink, created: Instant, nodes: &[&Node]) {
    for p in assert_popped_once_among(sink, created, "/t/", TIMERS, nodes) {
        assert!(p.at >= created + Duration::from_secs(INTERVAL_S), "early");
    }
}

/// Page through `node`'s resync listing for node `k` (seed 000's GET,
/// `Range: 7`) and check each page's form; the number of timers listed.
fn list_all(node: &Node, k: usize, port: u16) -> usize {
    let view = view_id(node);
    let mut path_next =
        format!("/timers?node-for-replicas=127.0.0.{k}:{port}&cluster-view-id={view}");
    let mut listed = 0;
    for _ in 0..100 {
        let r = request(node.addr, "GET", &path_next, &[("Range", "7")], b"");
        let page: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let timers = page["timers"].as_array().unwrap();
        assert!(timers.len() <= 7);
        for t in timers {
            assert_eq!(t["TimerID"].as_str().unwrap().len(), 32, "{t}");
            assert!(t["OldReplicas"].as_array().is_some(), "{t}");
            let timer = &t["Timer"];
            assert!(timer["timing"]["start-time"].is_u64(), "{t}");
            assert_eq!(
                timer["reliability"]["cluster-view-id"],
                view.as_str(),
                "{t}"
            );
            let replicas = timer["reliability"]["replicas"].as_array().unwrap();
            assert!(
                replicas.contains(&format!("127.0.0.{k}:{port}").into()),
                "{t}"
            );
        }
        listed += timers.len();
        match r.status {
            200 => return listed,
            206 => {
                assert_eq!(
                    r.header("Content-Range"),
                    Some(timers.len().to_string().as_str())
                );
                let cursor = page["cursor"].as_str().unwrap();
                path_next = format!(
                    "/timers?node-for-replicas=127.0.0.{k}:{port}&cluster-view-id={view}&cursor={cursor}"
                );
            }
            other => panic!("{other}: {}", r.text()),
        }
    }
    panic!("the listing did not end within 100 pages")
}

/// Nodes 1 and 2 in a cluster of two, nodes 3 and 4 joining it.
fn two_and_two_joining(port: u16) -> Vec<Node> {
    (1..=4)
        .map(|i| match i {
            1 | 2 => start(i, port, &[1, 2], &[], &[]),
            _ => start(i, port, &[1, 2], &[3, 4], &[]),
        })
        .collect()
}

/// 2 → 4: nodes 3 and 4 join; after the resync each timer is live on
/// exactly its replicas under the four-node view, before any pop.
#[test]
fn scale_up_two_to_four() {
    let port = cluster_port(4);
    let sink = Sink::start(Behaviour::Ok);
    let nodes = two_and_two_joining(port);
    let created = create_timers(&nodes[0], &sink);
    nodes[0].wait_replication_settled(Duration::from_secs(5));
    for i in 1..=2 {
        reload(&nodes[i - 1], i, port, &[1, 2], &[3, 4], &[]);
    }
    let listed = list_all(&nodes[0], 3, port);
    assert!(
        listed > 0 && listed < TIMERS,
        "node 1 lists {listed} timers for node 3"
    );
    for node in &nodes {
        resync_cli(node);
    }
    wait_settled(&nodes);
    assert!(
        Instant::now() < created + Duration::from_secs(INTERVAL_S),
        "the scaling steps took longer than the interval"
    );
    let total: f64 = nodes.iter().map(Node::live_timers).sum();
    assert_eq!(total, 2.0 * TIMERS as f64, "two live copies of each timer");
    assert!(
        nodes[2].live_timers() > 0.0 && nodes[3].live_timers() > 0.0,
        "the new nodes hold timers"
    );
    assert!(nodes[2].metric("chronos_resync_added_total") > 0.0);
    assert_popped_once(&sink, created, &nodes.iter().collect::<Vec<_>>());
}

/// 4 → 2, then the two leavers are killed: every timer still pops once.
#[test]
fn scale_down_four_to_two_then_kill_the_leavers() {
    let port = cluster_port(4);
    let sink = Sink::start(Behaviour::Ok);
    let mut nodes: Vec<Node> = (1..=4)
        .map(|i| start(i, port, &[1, 2, 3, 4], &[], &[]))
        .collect();
    let created = create_timers(&nodes[3], &sink);
    nodes[3].wait_replication_settled(Duration::from_secs(5));
    for i in 1..=4 {
        reload(&nodes[i - 1], i, port, &[1, 2], &[], &[3, 4]);
    }
    resync_usr1(&nodes[0]);
    resync_usr1(&nodes[1]);
    wait_settled(&nodes);
    nodes[2].kill9();
    nodes[3].kill9();
    assert_eq!(
        nodes[0].live_timers() + nodes[1].live_timers(),
        2.0 * TIMERS as f64
    );
    assert_popped_once(&sink, created, &[&nodes[0], &nodes[1]]);
}

/// 2 → 4, then the original two leave (4 → 2 onto the new nodes) and are
/// killed: every timer pops once, from the new nodes.
#[test]
fn scale_up_then_the_original_two_leave() {
    let port = cluster_port(4);
    let sink = Sink::start(Behaviour::Ok);
    let mut nodes = two_and_two_joining(port);
    let created = create_timers(&nodes[1], &sink);
    nodes[1].wait_replication_settled(Duration::from_secs(5));
    for i in 1..=2 {
        reload(&nodes[i - 1], i, port, &[1, 2], &[3, 4], &[]);
    }
    for node in &nodes {
        resync_cli(node);
    }
    for i in 1..=4 {
        reload(&nodes[i - 1], i, port, &[3, 4], &[], &[1, 2]);
    }
    resync_cli(&nodes[2]);
    resync_cli(&nodes[3]);
    wait_settled(&nodes);
    nodes[0].kill9();
    nodes[1].kill9();
    assert_eq!(
        nodes[2].live_timers() + nodes[3].live_timers(),
        2.0 * TIMERS as f64
    );
    assert_popped_once(&sink, created, &[&nodes[2], &nodes[3]]);
}

/// 1 → 2, then the original is killed: timers created on one node with
/// replication factor 2 gain their second replica in the resync.
#[test]
fn scale_up_one_to_two_then_kill_the_original() {
    let port = cluster_port(2);
    let sink = Sink::start(Behaviour::Ok);
    let mut first = start(1, port, &[1], &[], &[]);
    let created = create_timers(&first, &sink);
    let second = start(2, port, &[1], &[2], &[]);
    reload(&first, 1, port, &[1], &[2], &[]);
    resync_cli(&first);
    resync_cli(&second);
    second.wait_replication_settled(Duration::from_secs(5));
    assert_eq!(
        second.live_timers(),
        TIMERS as f64,
        "node 2 holds every timer"
    );
    // The bulk work of both sides (pages served, pages applied) was
    // measured in stretches between breaths (`GET /cluster`).
    for node in [&first, &second] {
        let r = cluster_json(node)["resync"].clone();
        let counts: Vec<u64> = serde_json::from_value(r["stretch-counts"].clone()).unwrap();
        let bounds: Vec<u64> = serde_json::from_value(r["stretch-us-bounds"].clone()).unwrap();
        assert_eq!(counts.len(), bounds.len() + 1, "{r}");
        assert!(counts.iter().sum::<u64>() > 0, "stretches counted: {r}");
        assert!(
            r["stretch-us-max"].is_u64() && r["stretch-wall-us-max"].is_u64(),
            "{r}"
        );
    }
    first.kill9();
    assert_popped_once(&sink, created, &[&second]);
}

/// Beyond the reference: a node killed and restarted takes its replicas
/// back from its peer at start-up, so its peer can be killed next.
#[test]
fn a_restarted_node_takes_its_timers_back() {
    let port = cluster_port(2);
    let sink = Sink::start(Behaviour::Ok);
    let mut first = start(1, port, &[1, 2], &[], &[]);
    let mut second = start(2, port, &[1, 2], &[], &[]);
    let created = create_timers(&first, &sink);
    first.wait_replication_settled(Duration::from_secs(5));
    second.kill9();
    // The kernel tears an io_uring down after its process has gone, and
    // the listening socket with it: wait until the port is free again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpListener::bind(("127.0.0.2", port)).is_err() {
        assert!(Instant::now() < deadline, "127.0.0.2:{port} stays taken");
        std::thread::sleep(Duration::from_millis(20));
    }
    second = start(2, port, &[1, 2], &[], &[]);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let c = cluster_json(&second);
        if c["resync"]["finished-runs"].as_u64().unwrap() >= 1 {
            assert_eq!(c["resync"]["state"], "complete", "{c}");
            break;
        }
        assert!(Instant::now() < deadline, "no start-up resync: {c}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        second.live_timers(),
        TIMERS as f64,
        "node 2 restored every timer"
    );
    first.kill9();
    assert_popped_once(&sink, created, &[&second]);
}

/// A resync while timers are created (under the new view) and deleted on
/// another node: every timer not deleted
/// pops exactly once, and no deleted one pops; repeating timers keep their
/// sequence numbers across the move.
#[test]
fn a_resync_under_creates_and_deletes_loses_nothing_and_pops_nothing_deleted() {
    let port = cluster_port(3);
    let sink = Sink::start(Behaviour::Ok);
    let n1 = start(1, port, &[1, 2], &[], &[]);
    let n2 = start(2, port, &[1, 2], &[], &[]);
    let n3 = start(3, port, &[1, 2], &[3], &[]);
    let created = create_timers(&n1, &sink);
    let repeating: Vec<String> = (0..10)
        .map(|i| n2.create(&timer(&sink.uri(&format!("/r/{i}")), 2, 16)))
        .collect();
    // Seed 001's step 1 first: every node takes the new configuration
    // (a node still on the old one cannot address a node it does not know).
    reload(&n1, 1, port, &[1, 2], &[3], &[]);
    reload(&n2, 2, port, &[1, 2], &[3], &[]);
    let churn = std::thread::scope(|s| {
        let churn = s.spawn(|| {
            // Create and delete at once, alternately on both old nodes.
            let mut deleted = 0;
            let stop = Instant::now() + Duration::from_secs(4);
            while Instant::now() < stop {
                let (a, b) = if deleted % 2 == 0 {
                    (&n1, &n2)
                } else {
                    (&n2, &n1)
                };
                let id = a.create(&timer(&sink.uri(&format!("/gone/{deleted}")), 6, 6));
                assert_eq!(
                    b.request("DELETE", &format!("/timers/{id}"), "").status,
                    200
                );
                deleted += 1;
            }
            deleted
        });
        for node in [&n1, &n2, &n3] {
            resync_cli(node);
        }
        churn.join().unwrap()
    });
    assert!(churn > 10, "only {churn} timers churned");
    drop(repeating);
    // The positive controls of the same run: the "/t/" timers pop once
    // each and the "/r/" ones all 8 pops. Both are checked once no node
    // holds a live copy, so no deleted timer can pop after the check.
    assert_popped_once_among(&sink, created, "/t/", TIMERS, &[&n1, &n2, &n3]);
    let pops = sink.pops();
    let gone: Vec<_> = pops
        .iter()
        .filter(|p| p.path.starts_with("/gone/"))
        .collect();
    assert!(gone.is_empty(), "deleted timers popped: {gone:?}");
    for i in 0..10 {
        let mut seqs: Vec<u32> = pops
            .iter()
            .filter(|p| p.ok && p.path == format!("/r/{i}"))
            .map(|p| p.sequence)
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=8).collect::<Vec<_>>(), "/r/{i}");
    }
}

/// Each of the `count` timers called back under `prefix` popped exactly
/// once (a duplicate or a missing pop fails), checked once the running
/// `nodes` hold no live copy of any timer; the successful pops.
fn assert_popped_once_among(
    sink: &Sink,
    created: Instant,
    prefix: &str,
    count: usize,
    nodes: &[&Node],
) -> Vec<Pop> {
    let deadline = created + POP_WITHIN;
    loop {
        let n = sink
            .pops()
            .iter()
            .filter(|p| p.path.starts_with(prefix))
            .count();
        if n >= count || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // No late duplicate can follow once no copy is left to pop it.
    wait_pops_done(nodes, Duration::from_secs(30));
    let pops: Vec<Pop> = sink
        .pops()
        .into_iter()
        .filter(|p| p.ok && p.path.starts_with(prefix))
        .collect();
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    for p in &pops {
        *per.entry(p.path.clone()).or_default() += 1;
    }
    let twice: Vec<_> = per.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "popped more than once: {twice:?}");
    assert_eq!(per.len(), count, "{} of {count} popped", per.len());
    pops
}

/// Timers created under the old view, moved by the resync, then deleted
/// with the IDs the client holds (which name only the old replicas): the
/// delete also reaches their new replicas, and none pops.
#[test]
fn timers_moved_by_a_resync_then_deleted_with_their_old_ids_never_pop() {
    let port = cluster_port(3);
    let sink = Sink::start(Behaviour::Ok);
    let n1 = start(1, port, &[1, 2], &[], &[]);
    let n2 = start(2, port, &[1, 2], &[], &[]);
    let n3 = start(3, port, &[1, 2], &[3], &[]);
    let created = Instant::now();
    // Every other timer is kept: the positive control, created, moved and
    // held like the deleted ones, must pop once each.
    let ids: Vec<String> = (0..60)
        .map(|i| {
            let path = match i % 2 {
                0 => format!("/d/{i}"),
                _ => format!("/k/{i}"),
            };
            n1.create(&timer(&sink.uri(&path), INTERVAL_S, INTERVAL_S))
        })
        .collect();
    wait_settled([&n1]);
    reload(&n1, 1, port, &[1, 2], &[3], &[]);
    reload(&n2, 2, port, &[1, 2], &[3], &[]);
    for node in [&n1, &n2, &n3] {
        resync_cli(node);
    }
    wait_settled([&n1, &n2, &n3]);
    assert!(n3.live_timers() > 0.0, "the resync moved timers to node 3");
    for id in ids.iter().step_by(2) {
        assert_eq!(
            n2.request("DELETE", &format!("/timers/{id}"), "").status,
            200
        );
    }
    assert!(
        Instant::now() < created + Duration::from_secs(INTERVAL_S),
        "slower than the interval"
    );
    wait_settled([&n1, &n2, &n3]);
    assert!(n3.live_timers() > 0.0, "node 3 holds moved control timers");
    // The controls pop, and then no node holds a live copy of any timer:
    // a deleted one can no longer pop.
    assert_popped_once_among(&sink, created, "/k/", 30, &[&n1, &n2, &n3]);
    let pops = sink.pops();
    let deleted: Vec<&str> = pops
        .iter()
        .filter(|p| p.path.starts_with("/d/"))
        .map(|p| p.path.as_str())
        .collect();
    assert!(deleted.is_empty(), "deleted timers popped: {deleted:?}");
}
