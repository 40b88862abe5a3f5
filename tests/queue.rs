//! The delay queue end to end: a real tansu broker process, real Postgres on
//! 127.0.0.1:5432, the real chronos binary. Every test has its own topics,
//! consumer group and table.

mod common;

use common::queue::*;
use common::*;
use std::collections::BTreeMap;
use std::time::Duration;

const ADVANCE_MS: i64 = 50;

#[test]
fn relays_key_value_and_headers_at_the_deadline_and_late_ones_at_once() {
    let s = setup("relay", 2);
    let node = s.node("");
    // Ready once Postgres is connected on every shard and the broker answers.
    let until = std::time::Instant::now() + Duration::from_secs(15);
    while node.request("GET", "/ready", "").status != 200 {
        assert!(
            std::time::Instant::now() < until,
            "never ready: {}",
            node.request("GET", "/ready", "").text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let p = producer(&s.broker.brokers());
    let start = now_ms();
    // A value that a JSON round trip would change: relayed byte for byte.
    let value = br#"{"b":1,"a":12345678901234567890123, "x" : [1.0]}"#;
    let mut deadlines = BTreeMap::new();
    let mut inputs = Vec::new();
    let ids: Vec<String> = (0..30).map(|i| format!("m{i}")).collect();
    let dls: Vec<String> = (0..30)
        .map(|i| {
            let at = start + 9_000 + i * 100;
            deadlines.insert(format!("k{i}"), at);
            // Every zone form is accepted.
            match i % 3 {
                0 => iso(at),
                1 => format!("{}Z", iso(at)),
                _ => {
                    let shifted = iso(at + 3_600_000);
                    format!("{shifted}+01:00")
                }
            }
        })
        .collect();
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let traces: Vec<String> = (0..30).map(|i| format!("t{i}")).collect();
    for i in 0..30 {
        inputs.push(Input {
            key: Some(&keys[i]),
            value,
            headers: vec![
                ("chronosMessageId", &ids[i]),
                ("chronosDeadline", &dls[i]),
                ("x-trace", &traces[i]),
            ],
        });
    }
    // Late on arrival: published at once.
    let late_dl = iso(start - 10_000);
    for i in 0..5 {
        inputs.push(Input {
            key: Some(["late0", "late1", "late2", "late3", "late4"][i]),
            value: b"late",
            headers: vec![
                ("chronosMessageId", ["l0", "l1", "l2", "l3", "l4"][i]),
                ("chronosDeadline", &late_dl),
            ],
        });
    }
    produce(&p, &s.input, &inputs);
    let seen = reader.wait_for(35, Duration::from_secs(30));
    assert_eq!(
        seen.len(),
        35,
        "messages out: {seen:?}\n{}",
        node.log_text()
    );
    let mut by_key: BTreeMap<String, Vec<Output>> = BTreeMap::new();
    for o in &seen {
        by_key
            .entry(o.key.clone().unwrap())
            .or_default()
            .push(o.clone());
    }
    for i in 0..5 {
        let o = &by_key[&format!("late{i}")][0];
        assert_eq!(o.value, b"late");
        assert!(
            o.at_ms < start + 9_000,
            "a late message waited: {}",
            o.at_ms - start
        );
    }
    for (i, trace) in traces.iter().enumerate() {
        let key = format!("k{i}");
        let list = &by_key[&key];
        assert_eq!(list.len(), 1, "{key}: {list:?}");
        let o = &list[0];
        assert_eq!(o.value, value, "value of {key} changed");
        assert_eq!(o.header("x-trace"), Some(trace.as_str()));
        assert!(
            o.header("chronosMessageId").is_none(),
            "chronos header relayed"
        );
        assert!(
            o.header("chronosDeadline").is_none(),
            "chronos header relayed"
        );
        let due = deadlines[&key];
        assert!(
            o.at_ms >= due - ADVANCE_MS,
            "{key} published {} ms before its deadline",
            due - o.at_ms
        );
        assert!(o.at_ms <= due + 3_000, "{key} {} ms late", o.at_ms - due);
    }
    // Fired rows are deleted once acknowledged.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while table_rows(&s.table) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(table_rows(&s.table), 0);
    assert_eq!(node.metric("chronos_queue_late_total"), 5.0);
    assert_eq!(node.metric("chronos_queue_fired_total"), 30.0);
    // The stage breakdown: per message where a stage is a message's, per
    // statement where it is a statement's.
    let stage = |s: &str| {
        node.metric(&format!(
            "chronos_queue_stage_seconds_count{{stage=\"{s}\"}}"
        ))
    };
    assert_eq!(stage("broker"), 35.0);
    assert_eq!(stage("inbox"), 35.0);
    assert_eq!(stage("claimed_late"), 30.0);
    assert_eq!(stage("fire_late"), 30.0);
    assert_eq!(stage("publish_ack"), 35.0);
    for s in ["insert", "stored", "claim", "delete"] {
        assert!(stage(s) >= 1.0, "no {s} statement timed");
    }
}

#[test]
fn duplicates_are_delivered_once_and_bad_headers_are_skipped() {
    let s = setup("dup", 1);
    let node = s.node("");
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let p = producer(&s.broker.brokers());
    let at = now_ms() + 7_000;
    let dl = iso(at);
    let inputs = vec![
        Input {
            key: Some("dup"),
            value: b"first",
            headers: vec![("chronosMessageId", "same"), ("chronosDeadline", &dl)],
        },
        Input {
            key: Some("nohdr"),
            value: b"x",
            headers: vec![],
        },
        Input {
            key: Some("noid"),
            value: b"x",
            headers: vec![("chronosDeadline", &dl)],
        },
        Input {
            key: Some("garbled"),
            value: b"x",
            headers: vec![
                ("chronosMessageId", "g"),
                ("chronosDeadline", "next tuesday"),
            ],
        },
        Input {
            key: Some("dup"),
            value: b"second",
            headers: vec![("chronosMessageId", "same"), ("chronosDeadline", &dl)],
        },
        Input {
            key: Some("good"),
            value: b"after the bad ones",
            headers: vec![("chronosMessageId", "good"), ("chronosDeadline", &dl)],
        },
    ];
    produce(&p, &s.input, &inputs);
    let seen = reader.wait_for(2, Duration::from_secs(25));
    // Wait a little longer for any duplicate to show.
    std::thread::sleep(Duration::from_secs(2));
    let seen_all = reader.seen();
    let keys: Vec<String> = seen_all.iter().map(|o| o.key.clone().unwrap()).collect();
    assert_eq!(seen.len(), 2, "{keys:?}\n{}", node.log_text());
    assert_eq!(seen_all.len(), 2, "{keys:?}");
    assert!(keys.contains(&"dup".to_string()) && keys.contains(&"good".to_string()));
    let dup = seen_all
        .iter()
        .find(|o| o.key.as_deref() == Some("dup"))
        .unwrap();
    assert_eq!(dup.value, b"first");
    assert_eq!(node.metric("chronos_queue_skipped_invalid_total"), 3.0);
    let log = node.log_text();
    assert!(log.contains("skipping input message"), "{log}");
    assert!(
        log.contains("next tuesday"),
        "the reason names the bad value: {log}"
    );
}

#[test]
fn a_node_killed_between_readying_and_firing_loses_nothing() {
    let s = setup("kill", 2);
    // A claims far ahead, so it holds every message for a while.
    let mut a = s.node("look-ahead-ms = 4000");
    let a_id = queue_node_id(&a);
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let p = producer(&s.broker.brokers());
    let at = now_ms() + 9_000;
    let dl = iso(at);
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let ids: Vec<String> = (0..40).map(|i| format!("id{i}")).collect();
    let inputs: Vec<Input> = (0..40)
        .map(|i| Input {
            key: Some(&keys[i]),
            value: b"v",
            headers: vec![("chronosMessageId", &ids[i]), ("chronosDeadline", &dl)],
        })
        .collect();
    produce(&p, &s.input, &inputs);
    // Wait until A has readied every message, then kill it before it fires.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let readied: i64 = psql(&format!(
            "SELECT count(*) FROM {} WHERE readied_by = '{a_id}'",
            s.table
        ))
        .parse()
        .unwrap();
        if readied == 40 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "A readied only {readied}\n{}",
            a.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        now_ms() < at - ADVANCE_MS,
        "A was not killed before the deadline"
    );
    a.kill9();
    assert!(
        reader.seen().is_empty(),
        "nothing was fired before the kill"
    );
    let b = s.node("");
    // Reset after the hold time (5 s), then fired by B.
    let seen = reader.wait_for(40, Duration::from_secs(30));
    let mut got: Vec<String> = seen.iter().map(|o| o.key.clone().unwrap()).collect();
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 40, "delivered: {got:?}\n{}", b.log_text());
    for o in &seen {
        assert!(o.at_ms >= at - ADVANCE_MS);
    }
    let log = b.log_text();
    assert!(
        log.contains(&format!("suspected failure of {a_id} for message")),
        "{log}"
    );
    assert_eq!(b.metric("chronos_queue_reset_total"), 40.0);
}

/// Issue 13: a message Postgres cannot store (a NUL in its ID: `text` cannot
/// hold one) is rejected, counted and skipped, and costs only itself: the
/// good messages in its batch and behind it are all delivered. Extra header
/// values that are not UTF-8, or hold a NUL, are relayed byte for byte.
#[test]
fn a_poison_message_costs_only_itself_and_headers_survive_byte_for_byte() {
    let s = setup("poison", 1);
    let node = s.node("");
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let p = producer(&s.broker.brokers());
    let dl = iso(now_ms() + 6_000);
    let raw: &[u8] = &[0xff, 0x00, 0x80, b'a', b'"', b'\\'];
    produce_raw(
        &p,
        &s.input,
        "poison",
        b"x",
        &[
            ("chronosMessageId", b"bad\0id"),
            ("chronosDeadline", dl.as_bytes()),
        ],
    );
    produce_raw(
        &p,
        &s.input,
        "bytes",
        b"v",
        &[
            ("chronosMessageId", b"bytes"),
            ("chronosDeadline", dl.as_bytes()),
            ("raw", raw),
            ("nul", b"a\0b"),
        ],
    );
    let keys: Vec<String> = (0..100).map(|i| format!("g{i}")).collect();
    let inputs: Vec<Input> = keys
        .iter()
        .map(|k| Input {
            key: Some(k),
            value: b"good",
            headers: vec![("chronosMessageId", k), ("chronosDeadline", &dl)],
        })
        .collect();
    produce(&p, &s.input, &inputs);
    let seen = reader.wait_for(101, Duration::from_secs(30));
    assert_eq!(
        seen.len(),
        101,
        "every good message comes out\n{}",
        node.log_text()
    );
    let bytes = seen
        .iter()
        .find(|o| o.key.as_deref() == Some("bytes"))
        .unwrap();
    let header = |name: &str| {
        bytes
            .raw_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header("raw").as_deref(), Some(raw));
    assert_eq!(header("nul").as_deref(), Some(&b"a\0b"[..]));
    assert_eq!(
        node.metric("chronos_queue_rejected_total{reason=\"unstorable\"}"),
        1.0
    );
    assert!(node.log_text().contains("rejected"), "{}", node.log_text());
}

/// Issue 22: the queue table's dead rows (a claim's update and a delete per
/// message) must not wait for Postgres's autovacuum, which may be off (as
/// on the CI machine) or a minute away: the node vacuums the table itself
/// once `vacuum-dead-rows` pile up. A new table also gets its own
/// autovacuum threshold. Autovacuum is switched off for this table here, so
/// only the node can have vacuumed it.
#[test]
fn the_node_vacuums_its_table_once_dead_rows_pile_up() {
    let s = setup("vacuum", 1);
    let node = s.node("vacuum-dead-rows = 300\nvacuum-check-ms = 200");
    node.wait_ready_200(Duration::from_secs(15));
    let options = psql(&format!(
        "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = '{}'::regclass",
        s.table
    ));
    assert!(
        options.contains("autovacuum_vacuum_scale_factor=0")
            && options.contains("autovacuum_vacuum_threshold="),
        "a new table has no autovacuum settings of its own: {options:?}"
    );
    psql(&format!(
        "ALTER TABLE {} SET (autovacuum_enabled = false)",
        s.table
    ));
    relay_due(&s, "v", 1_000, 1_500, &node);
    let vacuum_count = || {
        psql(&format!(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = '{}'::regclass",
            s.table
        ))
        .parse::<i64>()
        .unwrap_or(0)
    };
    // 2,000 dead rows, reported within about a second: vacuumed within
    // a few look-ups after that.
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while vacuum_count() == 0 || node.metric("chronos_queue_vacuums_total") < 1.0 {
        assert!(
            std::time::Instant::now() < until,
            "the node never vacuumed its table (vacuum_count {}, metric {}):\n{}",
            vacuum_count(),
            node.metric("chronos_queue_vacuums_total"),
            node.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Produce `n` messages (IDs `<prefix><i>`) due in `in_ms`, and wait
/// (bounded) until all of them came out.
fn relay_due(s: &Setup, prefix: &str, n: usize, in_ms: i64, node: &Node) {
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let p = producer(&s.broker.brokers());
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    let dl = iso(now_ms() + in_ms);
    let inputs: Vec<Input<'_>> = ids
        .iter()
        .map(|id| Input {
            key: Some(id),
            value: b"v",
            headers: vec![("chronosMessageId", id), ("chronosDeadline", &dl)],
        })
        .collect();
    produce(&p, &s.input, &inputs);
    let seen = reader.wait_for(n, Duration::from_secs(60));
    assert_eq!(seen.len(), n, "{}", node.log_text());
}

/// The review of issue 22's vacuum: rows an open snapshot still sees cannot
/// be removed, so the dead-row count stays high after a vacuum; the node
/// must not then vacuum back to back every `vacuum-check-ms` (it counts
/// from what its last vacuum left).
#[test]
fn a_snapshot_that_pins_dead_rows_does_not_make_the_node_vacuum_back_to_back() {
    let s = setup("vacpin", 1);
    let node = s.node("vacuum-dead-rows = 300\nvacuum-check-ms = 100");
    node.wait_ready_200(Duration::from_secs(15));
    psql(&format!(
        "ALTER TABLE {} SET (autovacuum_enabled = false)",
        s.table
    ));
    // A transaction whose snapshot pins every row deleted after it began.
    let mut pin = std::process::Command::new("psql")
        .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc"])
        .arg("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class; SELECT pg_sleep(60); COMMIT;")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("psql");
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(60)%' AND state = 'active' AND pid <> pg_backend_pid()") != "1" {
        assert!(std::time::Instant::now() < until, "the pinning transaction never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    relay_due(&s, "p", 1_000, 1_000, &node);
    let vacuums = || node.metric("chronos_queue_vacuums_total");
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while vacuums() < 1.0 {
        assert!(
            std::time::Instant::now() < until,
            "never vacuumed:\n{}",
            node.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // 30 look-ups with the pinned rows still there and nothing new: at
    // most one more vacuum (one whose count raced the last deletes).
    let first = vacuums();
    std::thread::sleep(Duration::from_secs(3));
    let after = vacuums();
    let _ = pin.kill();
    let _ = pin.wait();
    // Its backend would sleep on: end it, so that other tests' tables are
    // not pinned.
    psql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(60)%' AND pid <> pg_backend_pid()");
    assert!(
        after <= first + 1.0,
        "the node vacuumed back to back while a snapshot pinned the dead rows: {first} -> {after} in 3 s"
    );
}
