//! Delivery with a policy under faults and races (issue 41), each test a
//! defect a cold review reproduced with real processes and the fix keeps
//! away: a delete or an update while an attempt is out, a report of a
//! timer without a policy, a look-up of a version-0 tombstone, a grow
//! during a repeating timer's retry, an owner's retry queued behind busy
//! connections, a takeover past give-up-after; and what the OpenAPI
//! description says of the delivery fields.

mod common;

use common::target::{member_config, owner, Hit, Reply, Target};
use common::*;
use std::time::{Duration, Instant};

/// The config of member `i` (1 or 2) of a two-node cluster with
/// `[storage]` in `stores[i - 1]` and replication factor 2.
fn durable_member(stores: &[durable::Store; 2], port: u16, i: usize) -> String {
    format!(
        "{}[timers]\ndefault-replication-factor = 2\n{}",
        cluster_config(2, i, port, 1, ""),
        stores[i - 1].section("")
    )
}

/// A target that holds each request `hold`, then answers `status`.
fn slow(hold: Duration, status: u16) -> Target {
    Target::start(move |_| Reply {
        hold,
        ..Reply::status(status)
    })
}

/// A DELETE that comes while an attempt is in flight (sent, not answered)
/// must end the pop's attempts: the attempt's failure must not schedule
/// another one for the deleted timer.
#[test]
fn a_delete_during_an_attempt_in_flight_ends_the_attempts() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let target = slow(Duration::from_millis(800), 500);
    let body = format!(
        r#"{{"timing":{{"interval":0.2}},"callback":{{"http":{{"uri":"{}","opaque":"o"}},"retry":{{"attempts":5,"initial-delay":1,"multiplier":1,"jitter":0}}}}}}"#,
        target.uri("/t")
    );
    let id = node.create(&body);
    assert_eq!(target.wait_for(1, Duration::from_secs(10)).len(), 1);
    // Attempt 1 is being held by the target: delete the timer now.
    let r = node.request("DELETE", &format!("/timers/{id}"), "");
    assert_eq!(r.status, 200, "{}", r.text());
    std::thread::sleep(Duration::from_secs(5));
    let hits = target.hits();
    let attempts: Vec<&str> = hits.iter().map(|h| h.header("x-chronos-attempt")).collect();
    assert_eq!(
        hits.len(),
        1,
        "attempts sent after the delete: {attempts:?}; GET after delete: {}",
        node.get(&format!("/timers/{id}")).status
    );
}

/// A replication body (the internal PUT) with `delivery-state` for a timer
/// WITHOUT a delivery policy: the node watches it, takes it over and must
/// not panic when the attempt ends (attempt.rs: `delivery().expect(..)`).
#[test]
fn a_delivery_state_without_a_policy_does_not_panic_the_node() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let me = node.addr.to_string();
    let target = slow(Duration::ZERO, 200);
    let body = format!(
        r#"{{"timing":{{"interval":300,"repeat-for":300,"start-time-delta":-5,"sequence-number":1}},"callback":{{"http":{{"uri":"{}","opaque":"o"}}}},"reliability":{{"cluster-view-id":"1","replicas":["{me}"]}},"delivery-state":{{"sequence":1,"attempts":1,"first-attempt":0,"next-attempt":0,"last-outcome":500,"done":false}}}}"#,
        target.uri("/np")
    );
    let id = format!("{:016x}{:016x}", 0x4141_0000_0000_0001u64, u64::MAX);
    let r = node.request("PUT", &format!("/timers/{id}"), &body);
    assert_eq!(r.status, 200, "{}", r.text());
    std::thread::sleep(Duration::from_secs(5));
    let hits = target.hits();
    let log = node.log_text();
    assert!(
        !log.contains("panicked"),
        "the node panicked after {} attempt(s) {:?}:\n{}",
        hits.len(),
        hits.iter()
            .map(|h| h.header("x-chronos-attempt").to_string())
            .collect::<Vec<_>>(),
        log.lines()
            .filter(|l| l.contains("panicked") || l.contains("expect"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(node.request("GET", "/ping", "").status, 200);
}

/// A target that answers 503 to every request of pop 1 and 200 to the
/// rest.
fn pop_one_fails() -> Target {
    Target::start(|hits| match hits.last().map(Hit::sequence) {
        Some(1) => Reply::status(503),
        _ => Reply::status(200),
    })
}

/// `(sequence, attempt)` of every request `target` got.
fn seen(target: &Target) -> Vec<(u32, u32)> {
    target
        .hits()
        .iter()
        .map(|h| (h.sequence(), h.attempt()))
        .collect()
}

/// A grow while pop 1 of a repeating timer is being retried (its later
/// pops delivered at once): nobody is killed, so every (sequence,
/// attempt) must be sent once, and only pop 1 has attempts beyond 1.
#[test]
fn a_grow_during_a_repeating_timers_retry_sends_nothing_twice() {
    let port = cluster_port(2);
    let mut first = start_member(1, port, &member_config(1, port, &[1], &[]));
    first.wait_ready();
    let target = pop_one_fails();
    let body = format!(
        r#"{{"timing":{{"interval":1,"repeat-for":14}},"callback":{{"http":{{"uri":"http://{}/r","opaque":"o"}},"retry":{{"attempts":3,"initial-delay":5,"multiplier":1,"jitter":0}}}}}}"#,
        target.addr
    );
    first.create(&body);
    wait_until_true("pop 1 attempt 1", Duration::from_secs(10), || {
        !seen(&target).is_empty()
    });
    let mut second = start_member(2, port, &member_config(2, port, &[1], &[2]));
    second.wait_ready();
    // Let a few later pops happen first, so the stored copy is ahead of pop 1.
    std::thread::sleep(Duration::from_millis(1500));
    reload_view(&first, &member_config(1, port, &[1], &[2]));
    resync_cli(&first);
    resync_cli(&second);
    std::thread::sleep(Duration::from_secs(16));
    let seen = seen(&target);
    let mut sorted = seen.clone();
    sorted.sort();
    let mut dups = sorted.clone();
    dups.dedup();
    let extra: Vec<_> = seen.iter().filter(|(s, a)| *s != 1 && *a > 1).collect();
    assert!(
        dups.len() == sorted.len() && extra.is_empty(),
        "sent twice or retried a delivered pop: {seen:?}\n--- first:\n{}\n--- second:\n{}",
        log_tail(&first),
        log_tail(&second)
    );
}

/// openapi.json checks callback.retry and callback.dead-letter in every
/// body, a replication tombstone's (callback uri "") included; the node
/// skips the policy of a tombstone unchecked, so schema-invalid input gets
/// a 2xx (the schemathesis negative-data check).
#[test]
fn a_tombstone_body_with_an_invalid_policy_is_refused() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let me = node.addr.to_string();
    let mut accepted = Vec::new();
    for (k, policy) in [
        r#""retry":{"attempts":0}"#,
        r#""retry":{"jitter":5}"#,
        r#""dead-letter":{"http":{"uri":"ftp://nowhere"}}"#,
    ]
    .iter()
    .enumerate()
    {
        // The policy alone, with a valid one as control.
        let good = r#""retry":{"attempts":2}"#;
        for (p, want_4xx) in [(good, false), (*policy, true)] {
            let body = format!(
                r#"{{"timing":{{"interval":100}},"callback":{{"http":{{"uri":""}},{p}}},"reliability":{{"cluster-view-id":"1","replicas":["{me}"]}}}}"#
            );
            let id = format!(
                "{:016x}{:016x}",
                0x4242_0000_0000_0000u64 + k as u64,
                u64::MAX
            );
            let r = node.request("PUT", &format!("/timers/{id}"), &body);
            if want_4xx && !(400..500).contains(&r.status) {
                accepted.push(format!("{p}: {}", r.status));
            }
        }
    }
    assert!(
        accepted.is_empty(),
        "schema-invalid policies in a tombstone body accepted: {accepted:?}"
    );
}

/// Every `callback.retry` key may be `null` (its default), as the OpenAPI
/// description says: schemathesis's valid-data check sends such bodies.
#[test]
fn a_null_retry_key_takes_its_default_as_the_schema_says() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let schema: serde_json::Value =
        serde_json::from_str(&node.get("/openapi.json").text()).unwrap();
    let retry = &schema["components"]["schemas"]["Timer"]["properties"]["callback"]["properties"]
        ["retry"]["properties"];
    for key in [
        "attempts",
        "initial-delay",
        "max-delay",
        "multiplier",
        "jitter",
        "give-up-after",
    ] {
        let types = retry[key]["type"].as_array().expect("a type list");
        assert!(types.iter().any(|t| t == "null"), "{key}: {types:?}");
        let body = format!(
            r#"{{"timing":{{"interval":300}},"callback":{{"http":{{"uri":"http://127.0.0.1:9/x","opaque":"o"}},"retry":{{"{key}":null}}}}}}"#
        );
        let r = node.request("POST", "/timers", &body);
        assert_eq!(r.status, 200, "{key}: {}", r.text());
    }
}

/// A target whose first `fails` requests get 503, the rest 200.
fn failing_target(fails: usize) -> (std::net::SocketAddr, Target) {
    let target = Target::failing(fails, 503);
    (target.addr, target)
}

fn attempts_of(target: &Target) -> Vec<String> {
    target.attempts()
}

/// Two members with [storage] in `stores`, ready; a timer popping in
/// 0.5 s whose target fails its first `fails` requests (6 attempts, 3 s
/// apart); back once attempt 1 has been made.
fn durable_pair_at_attempt_1(
    stores: &[durable::Store; 2],
    port: u16,
    fails: usize,
) -> (Vec<Node>, Target) {
    let mut nodes: Vec<Node> = (1..=2)
        .map(|i| {
            Node::start_at(
                &format!("127.0.0.{i}"),
                port,
                &durable_member(stores, port, i),
            )
        })
        .collect();
    for n in &mut nodes {
        n.wait_ready();
    }
    let (addr, hits) = failing_target(fails);
    let body = format!(
        r#"{{"timing":{{"interval":0.5}},"callback":{{"http":{{"uri":"http://{addr}/t","opaque":"o"}},"retry":{{"attempts":6,"initial-delay":3,"multiplier":1,"jitter":0}}}}}}"#
    );
    nodes[0].create(&body);
    wait_until_true("attempt 1", Duration::from_secs(10), || {
        !attempts_of(&hits).is_empty()
    });
    (nodes, hits)
}

/// Two nodes with [storage]: the owner dies after attempt 1, the other
/// replica carries on and delivers at attempt 3; then the owner comes
/// back. Its log still says "attempt 2 due" (long past): it must not
/// send the delivered pop again.
#[test]
fn a_restarted_owner_does_not_resend_a_pop_the_survivor_delivered() {
    let stores = [durable::Store::new("r41-a"), durable::Store::new("r41-b")];
    let port = cluster_port(2);
    let cfg = |i: usize| durable_member(&stores, port, i);
    let (mut nodes, hits) = durable_pair_at_attempt_1(&stores, port, 2);
    let o = owner(&nodes);
    std::thread::sleep(Duration::from_millis(500));
    nodes[o].wait_replication_settled(Duration::from_secs(10));
    nodes[o].kill9();
    wait_until_true("delivered by the survivor", Duration::from_secs(30), || {
        attempts_of(&hits).len() >= 3
    });
    std::thread::sleep(Duration::from_millis(300));
    let before = attempts_of(&hits);
    let ip = format!("127.0.0.{}", o + 1);
    let back = Node::start_at(&ip, port, &cfg(o + 1));
    std::thread::sleep(Duration::from_secs(6));
    let after = attempts_of(&hits);
    assert_eq!(
        after,
        before,
        "the restarted owner sent the delivered pop again:\n{}",
        log_tail(&back)
    );
}

/// A pop waiting for its attempt 2 while the log is compacted (a
/// snapshot, the covered segments removed), then a kill -9 and restart:
/// the schedule carries on from the snapshot.
#[test]
fn a_snapshot_keeps_the_retry_book() {
    let store = durable::Store::new("r41-snap");
    let port = free_port();
    let config = store.config(1, durable::COMPACT);
    let mut node = Node::start_at("127.0.0.1", port, &config);
    let (addr, hits) = failing_target(1);
    let body = format!(
        r#"{{"timing":{{"interval":0.1}},"callback":{{"http":{{"uri":"http://{addr}/t","opaque":"o"}},"retry":{{"attempts":4,"initial-delay":12,"multiplier":1,"jitter":0}}}}}}"#
    );
    node.create(&body);
    wait_until_true("attempt 1", Duration::from_secs(10), || {
        !attempts_of(&hits).is_empty()
    });
    std::thread::sleep(Duration::from_millis(300));
    // ~3 MiB of long timers: the log compacts.
    let pad = "p".repeat(4000);
    for _ in 0..800 {
        node.create(&timer_body("3000", None, "http://127.0.0.1:9/x", &pad));
    }
    wait_until_true("a snapshot", Duration::from_secs(20), || {
        node.metrics()
            .ok()
            .and_then(|m| metric_value(&m, "chronos_storage_snapshots_total"))
            .unwrap_or(0.0)
            >= 1.0
    });
    std::thread::sleep(Duration::from_millis(500));
    node.kill9();
    let node = Node::start_at("127.0.0.1", port, &config);
    wait_until_true(
        "attempt 2 after the restart",
        Duration::from_secs(20),
        || attempts_of(&hits).len() >= 2,
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(attempts_of(&hits), vec!["1", "2"], "{}", log_tail(&node));
}

/// The cluster variant: a delete during attempt 1 (in flight) leaves a
/// tombstone, which outlives only `replication-deliver-within-ms +
/// replication-timeout-ms` (32 s by default); a retry due later than that
/// is sent for the deleted timer.
#[test]
fn a_delete_during_an_attempt_in_flight_ends_the_attempts_in_a_cluster() {
    let mut nodes = start_cluster(2, 1, "[timers]\ndefault-replication-factor = 2\n");
    for n in &mut nodes {
        n.wait_ready();
    }
    let target = slow(Duration::from_millis(800), 500);
    let body = format!(
        r#"{{"timing":{{"interval":0.5}},"callback":{{"http":{{"uri":"{}","opaque":"o"}},"retry":{{"attempts":3,"initial-delay":36,"multiplier":1,"jitter":0}}}}}}"#,
        target.uri("/t")
    );
    let id = nodes[0].create(&body);
    assert_eq!(target.wait_for(1, Duration::from_secs(10)).len(), 1);
    let r = nodes[0].request("DELETE", &format!("/timers/{id}"), "");
    assert_eq!(r.status, 200, "{}", r.text());
    std::thread::sleep(Duration::from_secs(44));
    let hits = target.hits();
    let attempts: Vec<&str> = hits.iter().map(|h| h.header("x-chronos-attempt")).collect();
    assert_eq!(
        hits.len(),
        1,
        "attempts sent after the delete: {attempts:?}"
    );
}

/// A target that holds every request `hold` then answers 503, recording
/// the path too.
fn slow_503(hold: Duration) -> (std::net::SocketAddr, Target) {
    let target = slow(hold, 503);
    (target.addr, target)
}

/// `(path, attempt, when)` of every request `target` got.
fn seen_paths(target: &Target) -> Vec<(String, String, Instant)> {
    let hits = target.hits();
    hits.iter()
        .map(|h| {
            (
                h.path.clone(),
                h.header("x-chronos-attempt").to_string(),
                h.at,
            )
        })
        .collect()
}

/// A living owner whose retry waits for a connection to its target (busy
/// with other pops): retries are queued with no wait bound (attempt.rs
/// passes `None`), so the attempt goes out later than the backup's
/// takeover (one skew after its time), and both send it.
#[test]
fn a_living_owners_queued_retry_is_not_sent_twice() {
    let mut nodes = start_cluster(
        2,
        1,
        "[timers]\ndefault-replication-factor = 2\ncallback-connections-per-host-max = 1\n",
    );
    for n in &mut nodes {
        n.wait_ready();
    }
    let (addr, hits) = slow_503(Duration::from_millis(1000));
    let x = format!(
        r#"{{"timing":{{"interval":0.5}},"callback":{{"http":{{"uri":"http://{addr}/x","opaque":"o"}},"retry":{{"attempts":3,"initial-delay":3,"multiplier":1,"jitter":0}}}}}}"#
    );
    nodes[0].create(&x);
    for i in 0..16 {
        nodes[0].create(&timer_body(
            "4.2",
            None,
            &format!("http://{addr}/f{i}"),
            "f",
        ));
    }
    std::thread::sleep(Duration::from_secs(24));
    let all = seen_paths(&hits);
    let start = all.first().map(|h| h.2).unwrap();
    let xs: Vec<(String, u128)> = all
        .iter()
        .filter(|h| h.0 == "/x")
        .map(|h| (h.1.clone(), (h.2 - start).as_millis()))
        .collect();
    eprintln!(
        "XS {xs:?} all {:?}",
        all.iter()
            .map(|h| (h.0.clone(), (h.2 - start).as_millis()))
            .collect::<Vec<_>>()
    );
    let mut numbers: Vec<&String> = xs.iter().map(|x| &x.0).collect();
    numbers.sort();
    let n = numbers.len();
    numbers.dedup();
    assert_eq!(
        numbers.len(),
        n,
        "an attempt sent twice (attempt, ms): {xs:?}"
    );
}

/// A tombstone of version 0 (a replication PUT may carry any version) with
/// no pop being retried: the look-up's match falls to its last arm, which
/// expects a retried pop (lookup.rs: `retried.expect(..)`).
#[test]
fn a_look_up_of_a_version_0_tombstone_does_not_panic() {
    let mut nodes = start_cluster(2, 1, "[timers]\ndefault-replication-factor = 2\n");
    for n in &mut nodes {
        n.wait_ready();
    }
    let me = nodes[0].addr.to_string();
    let id = format!("{:016x}{:016x}", 0x4343_0000_0000_0001u64, u64::MAX);
    let body = format!(
        r#"{{"timing":{{"interval":100,"sequence-number":0,"version":0}},"callback":{{"http":{{"uri":""}}}},"reliability":{{"cluster-view-id":"1","replicas":["{me}"]}}}}"#
    );
    let r = nodes[0].request("PUT", &format!("/timers/{id}"), &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let g = try_request(nodes[0].addr, "GET", &format!("/timers/{id}"), &[], b"")
        .map(|r| r.status.to_string())
        .unwrap_or_else(|e| format!("no answer ({e})"));
    std::thread::sleep(Duration::from_millis(500));
    let log = nodes[0].log_text();
    assert!(
        !log.contains("panicked"),
        "GET: {} and the node panicked:\n{}",
        g,
        log.lines()
            .filter(|l| l.contains("panicked") || l.contains("executor"))
            .take(4)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A target answering 503 to all, holding requests to a path starting
/// with "/slow" 2 s and the others 0.1 s.
fn by_path_503() -> (std::net::SocketAddr, Target) {
    let target = Target::start(|hits| {
        let slow = hits.last().is_some_and(|h| h.path.starts_with("/slow"));
        Reply {
            hold: Duration::from_millis(if slow { 1400 } else { 100 }),
            ..Reply::status(503)
        }
    });
    (target.addr, target)
}

/// An update while the old incarnation's attempt is in flight: the new
/// incarnation's pop 1 has the same book key (unique, 1); when the old
/// attempt's failure comes last, it replaces the new pop's entry, which
/// is then dropped as "not wanted": the new pop's retries are lost.
#[test]
fn an_update_during_an_attempt_keeps_the_new_incarnations_retries() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let (addr, hits) = by_path_503();
    let v1 = format!(
        r#"{{"timing":{{"interval":0.2}},"callback":{{"http":{{"uri":"http://{addr}/slow","opaque":"o"}},"retry":{{"attempts":3,"initial-delay":3,"multiplier":1,"jitter":0}}}}}}"#
    );
    let id = node.create(&v1);
    wait_until_true("v1 attempt 1", Duration::from_secs(10), || {
        !seen_paths(&hits).is_empty()
    });
    let v2 = format!(
        r#"{{"timing":{{"interval":0.1}},"callback":{{"http":{{"uri":"http://{addr}/new","opaque":"o"}},"retry":{{"attempts":3,"initial-delay":3,"multiplier":1,"jitter":0}}}}}}"#
    );
    let r = node.request("PUT", &format!("/timers/{id}"), &v2);
    assert!(r.status < 300, "{} {}", r.status, r.text());
    std::thread::sleep(Duration::from_secs(9));
    let all: Vec<(String, String)> = seen_paths(&hits)
        .iter()
        .map(|h| (h.0.clone(), h.1.clone()))
        .collect();
    let new: Vec<&str> = all
        .iter()
        .filter(|h| h.0 == "/new")
        .map(|h| h.1.as_str())
        .collect();
    assert_eq!(
        new,
        vec!["1", "2", "3"],
        "the new incarnation's attempts; all: {all:?}"
    );
}

/// Two nodes with [storage]: the backup (watcher) dies after attempt 1,
/// the owner (alive throughout) sends attempt 2, and the backup comes
/// back more than a skew after that: its log still says "watch attempt
/// 2", long past, so it takes over at once and sends attempt 2 again.
#[test]
fn a_restarted_watcher_does_not_resend_the_owners_attempt() {
    let stores = [durable::Store::new("r41-wa"), durable::Store::new("r41-wb")];
    let port = cluster_port(2);
    let cfg = |i: usize| durable_member(&stores, port, i);
    let (mut nodes, hits) = durable_pair_at_attempt_1(&stores, port, 3);
    let w = 1 - owner(&nodes);
    std::thread::sleep(Duration::from_millis(500));
    nodes[1 - w].wait_replication_settled(Duration::from_secs(10));
    nodes[w].kill9();
    wait_until_true("attempt 2 by the owner", Duration::from_secs(10), || {
        attempts_of(&hits).len() >= 2
    });
    // More than a skew (2 s) past attempt 2's time; before attempt 3's.
    std::thread::sleep(Duration::from_millis(2300));
    let back = Node::start_at(&format!("127.0.0.{}", w + 1), port, &cfg(w + 1));
    std::thread::sleep(Duration::from_secs(8));
    let seen = attempts_of(&hits);
    assert_eq!(seen, vec!["1", "2", "3", "4"], "{}", log_tail(&back));
}

/// give-up-after bounds every attempt from the first one; a backup's
/// takeover comes a skew after the owner's time, and is not checked
/// against it (start_attempt sends whatever is due).
#[test]
fn a_takeover_does_not_send_past_give_up_after() {
    let mut nodes = start_cluster(2, 1, "[timers]\ndefault-replication-factor = 2\n");
    for n in &mut nodes {
        n.wait_ready();
    }
    let (addr, hits) = failing_target(usize::MAX);
    let body = format!(
        r#"{{"timing":{{"interval":0.5}},"callback":{{"http":{{"uri":"http://{addr}/t","opaque":"o"}},"retry":{{"attempts":5,"initial-delay":3,"multiplier":1,"jitter":0,"give-up-after":3.5}}}}}}"#
    );
    nodes[0].create(&body);
    wait_until_true("attempt 1", Duration::from_secs(10), || {
        !attempts_of(&hits).is_empty()
    });
    let o = owner(&nodes);
    std::thread::sleep(Duration::from_millis(500));
    nodes[o].wait_replication_settled(Duration::from_secs(10));
    nodes[o].kill9();
    std::thread::sleep(Duration::from_secs(8));
    let all = hits.hits();
    let late: Vec<(String, u128)> = all
        .iter()
        .map(|h| {
            (
                h.header("x-chronos-attempt").to_string(),
                (h.at - all[0].at).as_millis(),
            )
        })
        .collect();
    assert!(
        late.iter().all(|(_, ms)| *ms <= 3500 + 300),
        "an attempt later than give-up-after (3.5 s) after the first: {late:?}"
    );
}
