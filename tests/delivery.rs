//! Delivery with a policy (issue 41), with real processes: a target that
//! fails N times and then answers 200 gets exactly N + 1 attempts at the
//! policy's times; a given-up pop reaches its dead-letter target once; a
//! refused pop is not retried; `Retry-After` is honoured; the schedule
//! survives a restart with `[storage]` and the kill of the replica that
//! owns it, with no attempt sent twice.

mod common;

use common::target::{member_config, owner, Hit, Reply, Target};
use common::*;
use std::time::Duration;

/// How a scripted target answers: the first `fails` requests get `status`
/// (with `Retry-After: retry_after` when set), the rest 200.
#[derive(Clone, Copy)]
struct Script {
    fails: usize,
    status: u16,
    retry_after: Option<u32>,
}

/// The `fails` of a [`Script`] count only requests of pop 1; the others
/// get 200.
const POP_ONE_ONLY: usize = usize::MAX - 1;

/// A target answering by `script`.
fn scripted(script: Script) -> Target {
    Target::start(move |hits| {
        let n = match script.fails {
            POP_ONE_ONLY if hits.last().is_some_and(|h| h.sequence() != 1) => usize::MAX,
            POP_ONE_ONLY => hits.iter().filter(|h| h.sequence() == 1).count(),
            _ => hits.len(),
        };
        let fails = match script.fails {
            POP_ONE_ONLY => 2,
            n => n,
        };
        match n <= fails {
            true => Reply {
                retry_after: script.retry_after,
                ..Reply::status(script.status)
            },
            false => Reply::status(200),
        }
    })
}

/// A one-shot timer popping after `interval` s with this `callback` tail
/// (`"retry": {...}` and so on) after its `http`.
fn policy_body(interval: &str, uri: &str, opaque: &str, policy: &str) -> String {
    format!(
        r#"{{"timing":{{"interval":{interval}}},"callback":{{"http":{{"uri":"{uri}","opaque":"{opaque}"}},{policy}}}}}"#
    )
}

/// `retry` (a policy's keys) with a dead-letter target at `uri`.
fn with_dead_letter(retry: &str, uri: &str) -> String {
    format!(r#"{retry},"dead-letter":{{"http":{{"uri":"{uri}"}}}}"#)
}

/// The gaps between successive hits.
fn gaps(hits: &[Hit]) -> Vec<Duration> {
    hits.windows(2).map(|w| w[1].at - w[0].at).collect()
}

/// `gap` is `want` or later, but not much later (a loaded 2-core machine).
fn assert_gap(gap: Duration, want_ms: u64, what: &str) {
    let want = Duration::from_millis(want_ms);
    assert!(
        gap + Duration::from_millis(30) >= want && gap <= want + Duration::from_millis(1500),
        "{what}: {gap:?}, want {want:?}"
    );
}

#[test]
fn a_target_failing_three_times_gets_four_attempts_at_the_policy_times() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let target = Target::failing(3, 503);
    let retry =
        r#""retry":{"attempts":6,"initial-delay":0.5,"multiplier":2,"jitter":0,"max-delay":10}"#;
    let id = node.create(&policy_body("0.2", &target.uri("/t"), "payload", retry));
    let hits = target.wait_for(4, Duration::from_secs(20));
    assert_eq!(hits.len(), 4, "{hits:?}\n{}", node.log_text());
    let attempts: Vec<u32> = hits.iter().map(Hit::attempt).collect();
    assert_eq!(attempts, vec![1, 2, 3, 4], "X-Chronos-Attempt");
    for h in &hits {
        assert_eq!(h.header("x-sequence-number"), "1", "the same pop");
        assert_eq!(h.body, "payload");
    }
    let g = gaps(&hits);
    assert_gap(g[0], 500, "before attempt 2");
    assert_gap(g[1], 1000, "before attempt 3");
    assert_gap(g[2], 2000, "before attempt 4");
    // Delivered: nothing more is sent, and nothing is left pending.
    wait_until("the pop settled", Duration::from_secs(10), || {
        let m = node.metrics()?;
        match metric_value(&m, "chronos_delivery_retried_delivered_total") {
            Some(v) if v >= 1.0 => Ok(()),
            v => Err(format!("retried_delivered {v:?}")),
        }
    });
    target.assert_quiet(4, Duration::from_secs(3), "no attempt after the delivery");
    assert_eq!(
        node.get(&format!("/timers/{id}")).status,
        404,
        "the one-shot timer ended"
    );
}

#[test]
fn a_timer_without_a_policy_is_sent_once_without_an_attempt_header() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let target = Target::failing(5, 500);
    node.create(&timer_body("0.2", None, &target.uri("/plain"), "x"));
    let hits = target.wait_for(1, Duration::from_secs(10));
    assert_eq!(hits.len(), 1);
    assert_eq!(
        hits[0].header("x-chronos-attempt"),
        "",
        "the reference's request"
    );
    target.assert_quiet(
        1,
        Duration::from_secs(3),
        "the reference retries nothing on one node",
    );
}

#[test]
fn a_given_up_pop_reaches_its_dead_letter_target_once() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let target = Target::failing(usize::MAX, 500);
    let dead = Target::failing(0, 200);
    let policy = with_dead_letter(
        r#""retry":{"attempts":3,"initial-delay":0.2,"jitter":0}"#,
        &dead.uri("/dlq"),
    );
    let id = node.create(&policy_body("0.1", &target.uri("/t"), "letter", &policy));
    let letters = dead.wait_for(1, Duration::from_secs(15));
    assert_eq!(letters.len(), 1, "{}", node.log_text());
    let l = &letters[0];
    assert_eq!(l.path, "/dlq");
    assert_eq!(l.body, "letter", "the original body");
    assert_eq!(l.header("x-sequence-number"), "1");
    assert_eq!(l.header("x-chronos-timer-id"), id);
    assert_eq!(l.header("x-chronos-attempt"), "3");
    assert_eq!(l.header("x-chronos-last-outcome"), "500");
    assert_eq!(
        target.hits().len(),
        3,
        "three attempts, then the dead letter"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(dead.hits().len(), 1, "one dead letter");
    assert_eq!(target.hits().len(), 3, "no attempt after giving up");
    let m = node.metrics().unwrap();
    assert_eq!(
        metric_value(&m, "chronos_delivery_given_up_total"),
        Some(1.0)
    );
    assert_eq!(
        metric_value(&m, "chronos_dead_letters_sent_total"),
        Some(1.0)
    );
}

#[test]
fn give_up_after_ends_the_attempts_and_sends_the_dead_letter() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let target = Target::failing(usize::MAX, 503);
    let dead = Target::failing(0, 200);
    let policy = with_dead_letter(
        r#""retry":{"attempts":100,"initial-delay":1,"multiplier":1,"jitter":0,"give-up-after":3.9}"#,
        &dead.uri("/dlq"),
    );
    node.create(&policy_body("0.1", &target.uri("/t"), "o", &policy));
    let letters = dead.wait_for(1, Duration::from_secs(15));
    assert_eq!(letters.len(), 1, "{}", node.log_text());
    let hits = target.hits();
    // Attempts at 0, 1, 2, 3 s (each delay counts from the answer before
    // it: 0.9 s of slack for the fourth); the next (4 s) falls past 3.9 s.
    assert_eq!(hits.len(), 4, "{hits:?}");
    assert_eq!(letters[0].header("x-chronos-attempt"), "4");
    assert!(
        hits.last().unwrap().at - hits[0].at
            <= Duration::from_millis(3900) + Duration::from_millis(900)
    );
}

#[test]
fn a_refused_pop_is_not_retried() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let target = Target::failing(usize::MAX, 404);
    let dead = Target::failing(0, 200);
    let policy = with_dead_letter(
        r#""retry":{"attempts":5,"initial-delay":0.2}"#,
        &dead.uri("/dlq"),
    );
    let body = policy_body("0.1", &target.uri("/t"), "o", &policy);
    let tagged = format!(
        r#"{},"statistics":{{"tag-info":[{{"type":"ORDER","count":1}}]}}}}"#,
        &body[..body.len() - 1]
    );
    node.create(&tagged);
    let letters = dead.wait_for(1, Duration::from_secs(10));
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].header("x-chronos-last-outcome"), "404");
    assert_eq!(letters[0].header("x-chronos-attempt"), "1");
    assert_eq!(target.hits().len(), 1, "a 404 is not retried");
    let m = node.metrics().unwrap();
    let by_tag = |name: &str| metric_value(&m, &format!("{name}{{tag=\"ORDER\"}}"));
    assert_eq!(
        by_tag("chronos_delivery_attempts_by_tag_total"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(by_tag("chronos_delivery_given_up_by_tag_total"), Some(1.0));
}

#[test]
fn retry_after_is_honoured() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let target = scripted(Script {
        fails: 1,
        status: 429,
        retry_after: Some(2),
    });
    let retry = r#""retry":{"attempts":3,"initial-delay":0.1,"jitter":0,"max-delay":5}"#;
    node.create(&policy_body("0.1", &target.uri("/t"), "o", retry));
    let hits = target.wait_for(2, Duration::from_secs(10));
    assert_eq!(hits.len(), 2);
    assert_gap(hits[1].at - hits[0].at, 2000, "Retry-After: 2");
}

#[test]
fn a_repeating_timer_pops_on_while_an_earlier_pop_is_retried() {
    let node = Node::start("[runtime]\ncores = 1\n");
    // Pop 1 fails twice (retried 1.5 s and 3 s later); pops 2 and 3 come
    // at 1 and 2 s, each on its schedule.
    let target = scripted(Script {
        fails: POP_ONE_ONLY,
        status: 500,
        retry_after: None,
    });
    let body = format!(
        r#"{{"timing":{{"interval":1,"repeat-for":3}},"callback":{{"http":{{"uri":"{}","opaque":"o"}},"retry":{{"attempts":4,"initial-delay":1.5,"multiplier":1,"jitter":0}}}}}}"#,
        target.uri("/r")
    );
    node.create(&body);
    let hits = target.wait_for(5, Duration::from_secs(15));
    let seen: Vec<(String, u32)> = hits
        .iter()
        .map(|h| (h.header("x-sequence-number").to_string(), h.attempt()))
        .collect();
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec![
            ("1".to_string(), 1),
            ("1".to_string(), 2),
            ("1".to_string(), 3),
            ("2".to_string(), 1),
            ("3".to_string(), 1),
        ],
        "every pop with its own attempts: {seen:?}"
    );
}

#[test]
fn a_bad_policy_is_refused_with_a_reason() {
    let node = Node::start("[runtime]\ncores = 1\n");
    for (policy, reason) in [
        (r#""retry":{"attempts":0}"#, "attempts"),
        (r#""retry":{"attempts":3,"backoff":2}"#, "backoff"),
        (r#""retry":{"multiplier":11}"#, "multiplier"),
        (
            r#""dead-letter":{"http":{"uri":"ftp://x/"}}"#,
            "dead-letter",
        ),
        (r#""retry":[]"#, "retry"),
    ] {
        let r = node.request(
            "POST",
            "/timers",
            &policy_body("10", "http://127.0.0.1:9/x", "o", policy),
        );
        assert_eq!(r.status, 400, "{policy}: {}", r.text());
        assert!(r.text().contains(reason), "{policy}: {}", r.text());
    }
}

#[test]
fn a_look_up_shows_the_policy_and_the_pending_pop() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let target = Target::failing(usize::MAX, 503);
    let policy = r#""retry":{"attempts":5,"initial-delay":30,"jitter":0},"dead-letter":{"http":{"uri":"http://127.0.0.1:9/dlq"}}"#;
    let id = node.create(&policy_body("0.1", &target.uri("/t"), "o", policy));
    target.wait_for(1, Duration::from_secs(10));
    wait_until("the pending pop shows", Duration::from_secs(10), || {
        let r = node.get(&format!("/timers/{id}"));
        let v: serde_json::Value = serde_json::from_str(&r.text()).map_err(|e| e.to_string())?;
        let pending = &v["delivery"]["pending"];
        match pending.as_array().map(|a| a.len()) {
            Some(1) => {
                assert_eq!(v["callback"]["retry"]["attempts"], 5);
                assert_eq!(v["callback"]["retry"]["initial-delay"], 30);
                assert_eq!(
                    v["callback"]["dead-letter"]["http"]["uri"],
                    "http://127.0.0.1:9/dlq"
                );
                assert_eq!(pending[0]["sequence"], 1);
                assert_eq!(pending[0]["attempts"], 1);
                assert_eq!(pending[0]["last-outcome"], 503);
                Ok(())
            }
            _ => Err(format!("{} {}", r.status, r.text())),
        }
    });
    // A delete ends the schedule: nothing pending, nothing sent.
    assert_eq!(
        node.request("DELETE", &format!("/timers/{id}"), "").status,
        200
    );
    assert_eq!(node.get(&format!("/timers/{id}")).status, 404);
}

#[test]
fn a_restart_with_storage_carries_the_schedule_on() {
    let store = durable::Store::new("delivery-restart");
    let port = free_port();
    let config = store.config(1, "");
    let mut node = Node::start_at("127.0.0.1", port, &config);
    let target = Target::failing(2, 503);
    let retry = r#""retry":{"attempts":5,"initial-delay":3,"multiplier":1,"jitter":0}"#;
    node.create(&policy_body("0.1", &target.uri("/t"), "o", retry));
    let first = target.wait_for(1, Duration::from_secs(10));
    assert_eq!(first.len(), 1);
    // The failed attempt's state is logged once its answer came; then the
    // node dies before attempt 2.
    wait_until("attempt 1 logged", Duration::from_secs(5), || {
        let m = node.metrics()?;
        match metric_value(&m, "chronos_delivery_attempts_total") {
            Some(v) if v >= 1.0 => Ok(()),
            v => Err(format!("{v:?}")),
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    node.kill9();
    let node = Node::start_at("127.0.0.1", port, &config);
    let hits = target.wait_for(3, Duration::from_secs(20));
    let attempts: Vec<u32> = hits.iter().map(Hit::attempt).collect();
    assert_eq!(
        attempts,
        vec![1, 2, 3],
        "carried on, not restarted: {}",
        node.log_text()
    );
    assert_gap(hits[1].at - hits[0].at, 3000, "attempt 2 at its time");
    target.assert_quiet(
        3,
        Duration::from_secs(4),
        "delivered at attempt 3, nothing after",
    );
}

/// Two one-shard nodes, replication factor 2, both ready.
fn ready_pair() -> Vec<Node> {
    let mut nodes = start_cluster(2, 1, "[timers]\ndefault-replication-factor = 2\n");
    for n in &mut nodes {
        n.wait_ready();
    }
    nodes
}

#[test]
fn the_next_replica_carries_the_schedule_on_when_the_owner_dies() {
    let mut nodes = ready_pair();
    let target = Target::failing(3, 503);
    let retry = r#""retry":{"attempts":8,"initial-delay":3,"multiplier":1,"jitter":0}"#;
    nodes[0].create(&policy_body("0.5", &target.uri("/t"), "o", retry));
    let first = target.wait_for(2, Duration::from_secs(15));
    assert_eq!(first.len(), 2, "attempts 1 and 2");
    let o = owner(&nodes);
    // The owner's second attempt failed; its report reached the other
    // replica. Kill it before attempt 3.
    std::thread::sleep(Duration::from_millis(500));
    nodes[o].wait_replication_settled(Duration::from_secs(10));
    nodes[o].kill9();
    let hits = target.wait_for(4, Duration::from_secs(30));
    let attempts: Vec<u32> = hits.iter().map(Hit::attempt).collect();
    assert_eq!(attempts, vec![1, 2, 3, 4], "none twice, none lost");
    // Attempt 3 comes from the survivor, one skew (2 s) after its time.
    assert_gap(hits[2].at - hits[1].at, 5000, "the survivor's attempt 3");
    target.assert_quiet(4, Duration::from_secs(4), "nothing after the delivery");
}

#[test]
fn a_living_owner_sends_every_attempt_and_the_backup_none() {
    let nodes = ready_pair();
    let target = Target::failing(3, 503);
    let retry = r#""retry":{"attempts":8,"initial-delay":1,"multiplier":1,"jitter":0}"#;
    nodes[1].create(&policy_body("0.5", &target.uri("/t"), "o", retry));
    let hits = target.wait_for(4, Duration::from_secs(20));
    let attempts: Vec<u32> = hits.iter().map(Hit::attempt).collect();
    assert_eq!(attempts, vec![1, 2, 3, 4]);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        target.hits().len(),
        4,
        "the backup sent nothing: {:?}",
        target.hits()
    );
    let o = owner(&nodes);
    let other = &nodes[1 - o];
    let m = other.metrics().unwrap();
    assert_eq!(
        metric_value(&m, "chronos_delivery_attempts_total"),
        Some(0.0),
        "the backup only watched"
    );
}

#[test]
fn a_grow_during_a_schedule_lets_the_joiner_carry_it_on() {
    let port = cluster_port(2);
    let mut first = start_member(1, port, &member_config(1, port, &[1], &[]));
    first.wait_ready();
    let target = Target::failing(3, 503);
    let retry = r#""retry":{"attempts":8,"initial-delay":4,"multiplier":1,"jitter":0}"#;
    first.create(&policy_body("0.3", &target.uri("/t"), "o", retry));
    assert_eq!(target.wait_for(1, Duration::from_secs(10)).len(), 1);
    // Grow to two nodes while the pop waits for its attempt 2: the joiner
    // is told of it, then the original dies before that attempt.
    let mut second = start_member(2, port, &member_config(2, port, &[1], &[2]));
    second.wait_ready();
    reload_view(&first, &member_config(1, port, &[1], &[2]));
    resync_cli(&first);
    resync_cli(&second);
    wait_until(
        "the joiner watches the pop",
        Duration::from_secs(10),
        || {
            let r = second.get("/metrics");
            let body = r.text();
            let v = serde_json::to_string(&body).unwrap();
            match target.hits().len() {
                1 => Ok(()),
                n => Err(format!("{n} attempts already: {v}")),
            }
        },
    );
    first.kill9();
    let hits = target.wait_for(4, Duration::from_secs(40));
    let attempts: Vec<u32> = hits.iter().map(Hit::attempt).collect();
    assert_eq!(
        attempts,
        vec![1, 2, 3, 4],
        "none twice, none lost: {}",
        second.log_text()
    );
    target.assert_quiet(4, Duration::from_secs(5), "nothing after the delivery");
}

/// Two single-node sites replicating timers across (`[sites]`).
fn two_sites() -> Vec<Node> {
    let port = cluster_port(2);
    (1..=2)
        .map(|i| {
            let other = 3 - i;
            let cfg = format!(
                "[runtime]\ncores = 1\n[cluster]\nlocalhost = \"127.0.0.{i}:{port}\"\nnode = [\"127.0.0.{i}:{port}\"]\n[sites]\nlocal_site = \"S{i}\"\nremote_site = [\"S{other}=127.0.0.{other}:{port}\"]\nreplicate_timers_across_sites = true\n"
            );
            Node::start_at(&format!("127.0.0.{i}"), port, &cfg)
        })
        .collect()
}

#[test]
fn the_other_site_carries_the_schedule_on_when_the_first_dies() {
    let mut nodes = two_sites();
    for n in &mut nodes {
        n.wait_ready();
    }
    let target = Target::failing(3, 503);
    let retry = r#""retry":{"attempts":8,"initial-delay":3,"multiplier":1,"jitter":0}"#;
    nodes[0].create(&policy_body("0.5", &target.uri("/t"), "o", retry));
    assert_eq!(target.wait_for(2, Duration::from_secs(15)).len(), 2);
    std::thread::sleep(Duration::from_millis(500));
    nodes[0].kill9();
    let hits = target.wait_for(4, Duration::from_secs(40));
    let attempts: Vec<u32> = hits.iter().map(Hit::attempt).collect();
    assert_eq!(
        attempts,
        vec![1, 2, 3, 4],
        "none twice, none lost: {}",
        nodes[1].log_text()
    );
    target.assert_quiet(4, Duration::from_secs(5), "nothing after the delivery");
}

#[test]
fn a_deleted_timers_pop_stays_ended_across_a_restart() {
    let store = durable::Store::new("delivery-deleted");
    let port = free_port();
    let config = store.config(1, "");
    let mut node = Node::start_at("127.0.0.1", port, &config);
    let target = Target::failing(usize::MAX, 503);
    let retry = r#""retry":{"attempts":5,"initial-delay":3,"multiplier":1,"jitter":0}"#;
    let id = node.create(&policy_body("0.1", &target.uri("/t"), "o", retry));
    assert_eq!(target.wait_for(1, Duration::from_secs(10)).len(), 1);
    wait_until("the pop pending", Duration::from_secs(5), || {
        let r = node.get(&format!("/timers/{id}"));
        match r.text().contains("\"pending\":[{") {
            true => Ok(()),
            false => Err(r.text()),
        }
    });
    assert_eq!(
        node.request("DELETE", &format!("/timers/{id}"), "").status,
        200
    );
    node.kill9();
    let node = Node::start_at("127.0.0.1", port, &config);
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        target.hits().len(),
        1,
        "the delete holds: {}",
        node.log_text()
    );
    assert_eq!(node.get(&format!("/timers/{id}")).status, 404);
}
