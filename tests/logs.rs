//! What the log tells an operator, with the real binary (issue 24, "the
//! first hour", items 8, 10 and 17): a wrong shared secret is logged
//! (rate-limited) and stops a restore at once; a failed callback that
//! ends a repeating timer is logged, by its last replica only; start-up's
//! passing peer errors are info, not warnings, and a peer down past the
//! grace period is a warning.

mod common;

use common::{
    cluster_config, cluster_port, reload_config, request, timer_body, wait_until, Behaviour, Node,
    Sink,
};
use std::time::{Duration, Instant};

const SECRET: &str = "first-hour-secret-0123456789";
const OTHER_SECRET: &str = "another-secret-9876543210abc";

/// The log lines of `node` at `level` (`WARN`, `INFO`, ...) that contain
/// every one of `needles`.
fn lines(node: &Node, level: &str, needles: &[&str]) -> Vec<String> {
    node.log_text()
        .lines()
        .filter(|l| l.contains(&format!(" {level} ")) && needles.iter().all(|n| l.contains(n)))
        .map(str::to_string)
        .collect()
}

fn wait_for_line(node: &Node, level: &str, needles: &[&str], timeout: Duration) -> String {
    wait_until(&format!("a {level} line with {needles:?}"), timeout, || {
        lines(node, level, needles)
            .into_iter()
            .next()
            .ok_or_else(|| node.log_text())
    })
}

/// `GET /cluster` with `secret`, as JSON.
fn cluster(node: &Node, secret: &str) -> serde_json::Value {
    let auth = format!("Bearer {secret}");
    let r = request(
        node.addr,
        "GET",
        "/cluster",
        &[("Authorization", &auth)],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    serde_json::from_slice(&r.body).unwrap()
}

fn resync_state(node: &Node, secret: &str) -> (String, String) {
    let c = cluster(node, secret);
    let state = c["resync"]["state"].as_str().unwrap_or("").to_string();
    let error = c["resync"]["last-error"].as_str().unwrap_or("").to_string();
    (state, error)
}

/// Item 8: internal requests with a wrong secret are logged at warn,
/// naming the peer, at most once per 10 s per shard; the next line counts
/// the ones not logged.
#[test]
fn a_refused_internal_request_is_logged_once_per_10_s_naming_the_peer() {
    let config = format!(
        "[runtime]\ncores = 1\n[cluster]\nresync-at-start = false\nshared-secret = \"{SECRET}\"\n"
    );
    let node = Node::start(&config);
    let wrong = format!("Bearer {OTHER_SECRET}");
    let auth = [("Authorization", wrong.as_str())];
    let listing = "/timers?node-for-replicas=127.0.0.9:7253&cluster-view-id=1";
    let id = "0123456789abcdef0000000000000007";
    let replication = r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://127.0.0.1:9/x","opaque":"x"}},"reliability":{"replicas":["127.0.0.9:7253"]}}"#;
    for _ in 0..5 {
        assert_eq!(request(node.addr, "GET", listing, &auth, b"").status, 403);
        let put = request(
            node.addr,
            "PUT",
            &format!("/timers/{id}"),
            &auth,
            replication.as_bytes(),
        );
        assert_eq!(put.status, 403);
    }
    // The node's 10 s began at its first refusal, before this.
    let started = Instant::now();
    let first = wait_for_line(
        &node,
        "WARN",
        &["refused", "127.0.0.9:7253", "shared-secret"],
        Duration::from_secs(2),
    );
    assert!(first.contains("GET /timers"), "{first}");
    assert_eq!(
        lines(&node, "WARN", &["refused", "shared-secret"]).len(),
        1,
        "one line for 10 refusals within 10 s:\n{}",
        node.log_text()
    );
    // Past the 10 s: the next refusal is logged with the count of the 9
    // that were not.
    std::thread::sleep(
        (started + Duration::from_millis(10_300)).saturating_duration_since(Instant::now()),
    );
    assert_eq!(request(node.addr, "GET", listing, &auth, b"").status, 403);
    wait_until("a second refusal line", Duration::from_secs(2), || {
        let found = lines(&node, "WARN", &["refused", "shared-secret"]);
        match found.get(1) {
            Some(l) if l.contains("9 more") => Ok(()),
            _ => Err(format!("{found:?}")),
        }
    });
}

/// Item 8: a restore whose peer answers 403 gives that peer up at once
/// (not after `resync-peer-retry-ms`), logged at error naming the peer
/// and the mismatch.
#[test]
fn a_restore_refused_with_403_stops_at_once_naming_the_peer() {
    let port = cluster_port(2);
    let secret = |s: &str| format!("shared-secret = \"{s}\"\n");
    let first = Node::start_at(
        "127.0.0.1",
        port,
        &cluster_config(2, 1, port, 1, &secret(SECRET)),
    );
    let started = Instant::now();
    let second = Node::start_at(
        "127.0.0.2",
        port,
        &cluster_config(2, 2, port, 1, &secret(OTHER_SECRET)),
    );
    let (state, error) =
        wait_until(
            "the restore to end",
            Duration::from_secs(5),
            || match resync_state(&second, OTHER_SECRET) {
                (s, e) if s == "failed" => Ok((s, e)),
                other => Err(format!("{other:?}")),
            },
        );
    assert!(started.elapsed() < Duration::from_secs(5), "{state}");
    assert!(error.contains("shared-secret mismatch"), "{error}");
    let peer = format!("127.0.0.1:{port}");
    let line = wait_for_line(
        &second,
        "ERROR",
        &[&peer, "shared-secret mismatch"],
        Duration::from_secs(1),
    );
    assert!(line.contains("403"), "{line}");
    assert!(
        lines(&second, "INFO", &[&peer, "retrying"]).is_empty()
            && lines(&second, "WARN", &[&peer, "retrying"]).is_empty(),
        "a 403 is not retried:\n{}",
        second.log_text()
    );
    drop(first);
}

/// Item 8: replication refused for the secret: the sender logs the peer
/// that refused it, the receiver the refusal, each at warn.
#[test]
fn replication_refused_with_403_is_logged_on_both_sides() {
    let port = cluster_port(2);
    let extra = |s: &str| format!("resync-at-start = false\nshared-secret = \"{s}\"\n");
    let first = Node::start_at(
        "127.0.0.1",
        port,
        &cluster_config(2, 1, port, 1, &extra(SECRET)),
    );
    let second = Node::start_at(
        "127.0.0.2",
        port,
        &cluster_config(2, 2, port, 1, &extra(OTHER_SECRET)),
    );
    let sink = Sink::start(Behaviour::Ok);
    first.create(&timer_body("30", None, &sink.uri("/r"), "x"));
    let peer = format!("127.0.0.2:{port}");
    let sent = wait_for_line(
        &first,
        "WARN",
        &[&peer, "403", "shared-secret mismatch"],
        Duration::from_secs(3),
    );
    assert!(sent.contains("chronos::replication"), "{sent}");
    // The receiver names the sender by its address.
    wait_for_line(
        &second,
        "WARN",
        &["refused PUT /timers/", "from 127.0.0.1", "shared-secret"],
        Duration::from_secs(1),
    );
}

/// Item 17: a 3-node cluster started one node after the other: the first
/// nodes' restores meet refused connections for a moment, logged at info,
/// never at warn.
#[test]
fn a_cluster_start_logs_its_passing_peer_errors_at_info() {
    let nodes = common::start_cluster(3, 1, "");
    for node in &nodes {
        wait_until(
            "the restore to complete",
            Duration::from_secs(10),
            || match resync_state(node, "") {
                (s, _) if s == "complete" => Ok(()),
                other => Err(format!("{other:?}")),
            },
        );
    }
    assert!(
        !lines(&nodes[0], "INFO", &["Connection refused"]).is_empty(),
        "node 1 met node 2 down:\n{}",
        nodes[0].log_text()
    );
    for node in &nodes {
        let warned = lines(node, "WARN", &["chronos::resync"]);
        assert!(warned.is_empty(), "{}: {warned:?}", node.addr);
    }
}

/// Item 17: a peer down for longer than the start-up grace period (5 s) is
/// a warning then, not before; the restore fails at `resync-peer-retry-ms`.
#[test]
fn a_peer_down_past_the_grace_period_is_a_warning() {
    let port = cluster_port(2);
    // Before the start: the grace period counts from the node's first try,
    // which comes while it starts.
    let started = Instant::now();
    let node = Node::start_at(
        "127.0.0.1",
        port,
        &cluster_config(2, 1, port, 1, "resync-peer-retry-ms = 9000\n"),
    );
    let peer = format!("127.0.0.2:{port}");
    let info = wait_for_line(&node, "INFO", &[&peer, "retrying"], Duration::from_secs(2));
    assert!(info.contains("Connection refused"), "{info}");
    let warn = wait_for_line(&node, "WARN", &[&peer], Duration::from_secs(9));
    assert!(
        started.elapsed() >= Duration::from_millis(4_900),
        "warned before the grace period: {warn}"
    );
    assert!(warn.contains("5000 ms"), "{warn}");
    assert_eq!(
        lines(&node, "WARN", &[&peer]).len(),
        1,
        "{}",
        node.log_text()
    );
    wait_for_line(
        &node,
        "ERROR",
        &["restore failed", &peer],
        Duration::from_secs(8),
    );
}

/// Item 17: a joining node started before the others reloaded: their 404
/// (unknown node) is info while it lasts less than the grace period.
#[test]
fn a_joining_node_logs_404_at_info_while_the_others_reload() {
    let port = cluster_port(2);
    let a = format!("127.0.0.1:{port}");
    let b = format!("127.0.0.2:{port}");
    let config = |local: &str, joining: &str| {
        format!("[runtime]\ncores = 1\n[cluster]\nlocalhost = \"{local}\"\nnode = [\"{a}\"]\njoining = [{joining}]\n")
    };
    let first = Node::start_at("127.0.0.1", port, &config(&a, ""));
    let joiner = Node::start_at("127.0.0.2", port, &config(&b, &format!("\"{b}\"")));
    wait_for_line(&joiner, "INFO", &[&a, "404"], Duration::from_secs(3));
    reload_config(&first, &config(&a, &format!("\"{b}\"")));
    wait_until(
        "the restore to complete",
        Duration::from_secs(10),
        || match resync_state(&joiner, "") {
            (s, _) if s == "complete" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    let warned = lines(&joiner, "WARN", &["chronos::resync"]);
    assert!(warned.is_empty(), "{warned:?}");
}

/// Item 10: on a single node, a failed callback ends a repeating timer:
/// logged at warn with the timer's ID and the reason, once per 10 s.
#[test]
fn a_failed_callback_that_ends_a_repeating_timer_is_logged() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let sink = Sink::start(Behaviour::Fail);
    let ids: Vec<String> = (0..3)
        .map(|i| {
            node.create(&timer_body(
                "0.3",
                Some("10"),
                &sink.uri(&format!("/r{i}")),
                "x",
            ))
        })
        .collect();
    let once = node.create(&timer_body("0.3", None, &sink.uri("/once"), "x"));
    sink.wait_for(4, Duration::from_secs(3));
    let line = wait_for_line(
        &node,
        "WARN",
        &["ends", "callback answered 500"],
        Duration::from_secs(2),
    );
    assert!(ids.iter().any(|id| line.contains(id.as_str())), "{line}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        sink.pops().len(),
        4,
        "each timer popped once: {:?}",
        sink.pops()
    );
    let ended = lines(&node, "WARN", &["ends"]);
    assert_eq!(ended.len(), 1, "rate-limited: {ended:?}");
    assert!(
        !ended[0].contains(&once),
        "a final pop ends nothing: {ended:?}"
    );
}

/// Item 10: in a cluster only the last replica's failure ends the timer:
/// the first replica's is left to the next one, and not logged.
#[test]
fn only_the_last_replica_logs_a_repeating_timer_it_ends() {
    let nodes = common::start_cluster(2, 1, "resync-at-start = false\n");
    let sink = Sink::start(Behaviour::Fail);
    let id = nodes[0].create(&timer_body("1", Some("30"), &sink.uri("/r"), "x"));
    sink.wait_for(2, Duration::from_secs(6));
    let ended = || {
        nodes
            .iter()
            .map(|n| lines(n, "WARN", &["ends", &id]).len())
            .sum::<usize>()
    };
    wait_until(
        "the last replica's line",
        Duration::from_secs(2),
        || match ended() {
            0 => Err("none yet".into()),
            n => Ok(n),
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(ended(), 1, "only the last replica ends it");
}
