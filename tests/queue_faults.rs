//! The delay queue across a Postgres outage and a broker restart. In its own
//! test binary: cargo runs test binaries one after another, so stopping the
//! shared Postgres here cannot disturb another test; within the binary the
//! tests take turns (`SERIAL`).

mod common;

use common::log_tail;
use common::queue::*;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

fn pg_ctl(action: &str) {
    let versions = std::fs::read_dir("/etc/postgresql").expect("/etc/postgresql");
    let version = versions
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .expect("a Postgres cluster");
    let out = Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", action])
        .output()
        .expect("pg_ctlcluster");
    assert!(
        out.status.success() || action == "start",
        "pg_ctlcluster {action}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One fault at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Starts Postgres again however the test ends.
struct RestartGuard;

impl Drop for RestartGuard {
    fn drop(&mut self) {
        pg_ctl("start");
    }
}

#[test]
fn a_postgres_outage_mid_run_loses_nothing_and_http_keeps_serving() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = setup("pgout", 2);
    let node = s.node("");
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let p = producer(&s.broker.brokers());
    let start = now_ms();
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    let dls: Vec<String> = (0..100).map(|i| iso(start + 9_000 + i * 40)).collect();
    let batch = |range: std::ops::Range<usize>| -> Vec<Input> {
        range
            .map(|i| Input {
                key: Some(&keys[i]),
                value: b"v",
                headers: vec![("chronosMessageId", &keys[i]), ("chronosDeadline", &dls[i])],
            })
            .collect()
    };
    produce(&p, &s.input, &batch(0..60));
    wait_rows_at_least(&s.table, 60, &node);
    assert_eq!(node.request("GET", "/ready", "").status, 200);
    let guard = RestartGuard;
    pg_ctl("stop");
    // Messages keep arriving while the database is away.
    produce(&p, &s.input, &batch(60..100));
    // Not ready while Postgres is away, yet still serving.
    wait_not_ready(&node, "Postgres", Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(node.request("GET", "/ping", "").status, 200);
    pg_ctl("start");
    drop(guard);
    let seen = reader.wait_for(100, Duration::from_secs(40));
    let got: BTreeSet<String> = seen.iter().map(|o| o.key.clone().unwrap()).collect();
    assert_eq!(
        got.len(),
        100,
        "lost {}:\n{}",
        100 - got.len(),
        node.log_text()
    );
    let log = node.log_text();
    assert!(log.contains("Postgres unavailable"), "{log}");
    // No hot retry loop: a handful of log lines for the whole outage.
    let lines = log
        .lines()
        .filter(|l| l.contains("Postgres unavailable"))
        .count();
    assert!(lines <= 10, "{lines} lines about the outage");
}

#[test]
fn a_broker_outage_and_restart_loses_nothing() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut s = setup("kout", 1);
    // A hold time shorter than the outage: failure detection runs while
    // this node still holds every row it claimed (issue 13).
    let node = s.node("hold-time-ms = 2000");
    let p = producer(&s.broker.brokers());
    let due = now_ms() + 8_000;
    let dl = iso(due);
    let keys: Vec<String> = (0..30).map(|i| format!("b{i}")).collect();
    produce(&p, &s.input, &inputs_due(&keys, &dl));
    drop(p);
    wait_rows_at_least(&s.table, 30, &node);
    // The broker dies before the deadline and stays away past it.
    s.broker.kill();
    wait_not_ready(&node, "Kafka", Duration::from_secs(10));
    while now_ms() < due + 2_000 {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(node.request("GET", "/ping", "").status, 200);
    assert_eq!(
        table_rows(&s.table),
        30,
        "nothing is deleted unacknowledged"
    );
    // A new broker on the same address (memory storage: topics again).
    s.restart_broker(1);
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let seen = reader.wait_for(30, Duration::from_secs(40));
    let got: BTreeSet<String> = seen.iter().map(|o| o.key.clone().unwrap()).collect();
    assert_eq!(
        got.len(),
        30,
        "lost {}:\n{}",
        30 - got.len(),
        node.log_text()
    );
    assert_eq!(
        node.metric("chronos_queue_reset_total"),
        0.0,
        "failure detection reset rows this node holds"
    );
    let until = Instant::now() + Duration::from_secs(10);
    while table_rows(&s.table) > 0 {
        assert!(
            Instant::now() < until,
            "rows left after the acknowledgements"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Every acknowledgement is in: a duplicate would have been published
    // before its row was deleted.
    assert_eq!(reader.seen().len(), 30, "a message came out twice");
}

/// Two nodes hold rows through a broker outage longer than the hold time.
/// Each refreshes `readied_at` of the rows it holds, so neither node's
/// failure detection takes the other for dead: no row is reset, and every
/// message comes out once after the broker returns.
#[test]
fn a_broker_outage_past_the_hold_time_resets_no_live_node_s_rows() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut s = setup("kout2", 2);
    let a = s.node("hold-time-ms = 2000");
    let b = s.node("hold-time-ms = 2000");
    let p = producer(&s.broker.brokers());
    let due = now_ms() + 8_000;
    let dl = iso(due);
    let keys: Vec<String> = (0..40).map(|i| format!("h{i}")).collect();
    produce(&p, &s.input, &inputs_due(&keys, &dl));
    drop(p);
    wait_rows_at_least(&s.table, 40, &a);
    s.broker.kill();
    wait_not_ready(&a, "Kafka", Duration::from_secs(10));
    // Both nodes claim their share at the deadline minus the look-ahead,
    // then hold it through 5 s of outage: more than twice the hold time.
    while now_ms() < due + 4_000 {
        std::thread::sleep(Duration::from_millis(100));
    }
    let resets = a.metric("chronos_queue_reset_total") + b.metric("chronos_queue_reset_total");
    s.restart_broker(2);
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let seen = reader.wait_for(40, Duration::from_secs(40));
    let got: BTreeSet<String> = seen.iter().map(|o| o.key.clone().unwrap()).collect();
    // What a failure needs to be told apart: rows still in the table (the
    // nodes did not publish) or none (published, not read), and the logs.
    assert_eq!(
        got.len(),
        40,
        "lost {}; rows left {}\nA:\n{}\nB:\n{}",
        40 - got.len(),
        table_rows(&s.table),
        log_tail(&a),
        log_tail(&b)
    );
    assert_eq!(resets, 0.0, "a live node's rows were reset");
    let until = Instant::now() + Duration::from_secs(10);
    while table_rows(&s.table) > 0 {
        assert!(
            Instant::now() < until,
            "rows left after the acknowledgements"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(reader.seen().len(), 40, "a message came out twice");
}
