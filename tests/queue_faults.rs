//! The delay queue across a Postgres outage and a broker restart. In its own
//! test binary: cargo runs test binaries one after another, so stopping the
//! shared Postgres here cannot disturb another test; within the binary the
//! tests take turns (`SERIAL`).

mod common;

use common::queue::*;
use common::*;
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
    let broker = Broker::start();
    let input = unique("pgout_in");
    let output = unique("pgout_out");
    broker.create_topic(&input, 2);
    broker.create_topic(&output, 2);
    let table = unique("q_pgout");
    let node = Node::start(&queue_config(
        &broker.brokers(),
        &input,
        &output,
        &table,
        "",
    ));
    let reader = OutputReader::start(&broker.brokers(), &output);
    let p = producer(&broker.brokers());
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
    produce(&p, &input, &batch(0..60));
    let until = Instant::now() + Duration::from_secs(15);
    while table_rows(&table) < 60 {
        assert!(Instant::now() < until, "not enqueued:\n{}", node.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(node.request("GET", "/ready", "").status, 200);
    let guard = RestartGuard;
    pg_ctl("stop");
    // Messages keep arriving while the database is away.
    produce(&p, &input, &batch(60..100));
    // Not ready while Postgres is away, yet still serving.
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let r = node.request("GET", "/ready", "");
        if r.status == 503 {
            assert!(r.text().contains("Postgres"), "{}", r.text());
            break;
        }
        assert!(Instant::now() < until, "still ready with Postgres down");
        std::thread::sleep(Duration::from_millis(50));
    }
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
    let _ = psql(&format!("DROP TABLE IF EXISTS {table}"));
}

#[test]
fn a_broker_outage_and_restart_loses_nothing() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut broker = Broker::start();
    let port = broker.port;
    let input = unique("kout_in");
    let output = unique("kout_out");
    broker.create_topic(&input, 1);
    broker.create_topic(&output, 1);
    let table = unique("q_kout");
    let node = Node::start(&queue_config(
        &broker.brokers(),
        &input,
        &output,
        &table,
        "",
    ));
    let p = producer(&broker.brokers());
    let due = now_ms() + 8_000;
    let dl = iso(due);
    let keys: Vec<String> = (0..30).map(|i| format!("b{i}")).collect();
    let inputs: Vec<Input> = keys
        .iter()
        .map(|k| Input {
            key: Some(k),
            value: b"v",
            headers: vec![("chronosMessageId", k), ("chronosDeadline", &dl)],
        })
        .collect();
    produce(&p, &input, &inputs);
    drop(p);
    let until = Instant::now() + Duration::from_secs(15);
    while table_rows(&table) < 30 {
        assert!(Instant::now() < until, "not enqueued:\n{}", node.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The broker dies before the deadline and stays away past it.
    broker.kill();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let r = node.request("GET", "/ready", "");
        if r.status == 503 {
            assert!(r.text().contains("Kafka"), "{}", r.text());
            break;
        }
        assert!(Instant::now() < until, "still ready with the broker down");
        std::thread::sleep(Duration::from_millis(100));
    }
    while now_ms() < due + 2_000 {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(node.request("GET", "/ping", "").status, 200);
    assert_eq!(table_rows(&table), 30, "nothing is deleted unacknowledged");
    // A new broker on the same address (memory storage: topics again).
    let broker = Broker::start_on(port);
    broker.create_topic(&input, 1);
    broker.create_topic(&output, 1);
    let reader = OutputReader::start(&broker.brokers(), &output);
    let seen = reader.wait_for(30, Duration::from_secs(40));
    let got: BTreeSet<String> = seen.iter().map(|o| o.key.clone().unwrap()).collect();
    assert_eq!(
        got.len(),
        30,
        "lost {}:\n{}",
        30 - got.len(),
        node.log_text()
    );
    let until = Instant::now() + Duration::from_secs(10);
    while table_rows(&table) > 0 {
        assert!(
            Instant::now() < until,
            "rows left after the acknowledgements"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = psql(&format!("DROP TABLE IF EXISTS {table}"));
}
