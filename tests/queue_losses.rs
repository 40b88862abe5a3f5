//! Issue 39: the delay queue loses nothing, with a real tansu broker and
//! real Postgres on 127.0.0.1:5432.
//!
//! - An output topic that does not exist (auto-creation off) blocks
//!   publishing: `/ready` says so, and no message is skipped; once the
//!   topic is created, every message is delivered.
//! - A message that reuses an ID while the previous message's delete is in
//!   flight is delivered (it used to be dropped by the insert's `ON
//!   CONFLICT DO NOTHING`, or not published because its ID seemed to wait,
//!   and then its row deleted with the old one).
//! - A node resumed after a takeover never deletes a newer message with
//!   the same ID (its delete was by ID alone).
//! - A killed node's claimed rows are published by another node within
//!   about a second (it used to take the whole hold time).

mod common;

use common::queue::*;
use common::*;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The tests take turns: two of them measure a takeover to within a
/// second, which two busy cores running the others' brokers and nodes
/// would blur.
static SERIAL: Mutex<()> = Mutex::new(());

fn turn() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const UNPUBLISHABLE: &str = "chronos_queue_rejected_total{reason=\"unpublishable\"}";
const OUTPUT_BLOCKED: &str = "chronos_queue_output_blocked";

/// Wait until `name` reads `want`.
fn wait_metric(node: &Node, name: &str, want: f64, timeout: Duration) {
    wait_until(&format!("{name} = {want}"), timeout, || {
        match node.try_metric(name)? {
            v if v == want => Ok(()),
            v => Err(format!("{name} = {v}")),
        }
    });
}

/// The values published for `key`, in the order they arrived.
fn values_of(reader: &OutputReader, key: &str) -> Vec<String> {
    reader
        .seen()
        .iter()
        .filter(|o| o.key.as_deref() == Some(key))
        .map(|o| String::from_utf8_lossy(&o.value).into_owned())
        .collect()
}

/// Wait until `key` was published with `value`, at the latest `until`;
/// `Err` with what was seen.
fn wait_value(reader: &OutputReader, key: &str, value: &str, until: Instant) -> Result<(), String> {
    loop {
        let values = values_of(reader, key);
        if values.iter().any(|v| v == value) {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(format!(
                "{key} = {value} not published in time; {key} published as {values:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `timeout` from now.
fn within(timeout: Duration) -> Instant {
    Instant::now() + timeout
}

/// Unix ms `at_ms` as an `Instant` (now if it has passed).
fn instant_of_ms(at_ms: i64) -> Instant {
    within(Duration::from_millis((at_ms - now_ms()).max(0) as u64))
}

/// An output reader that is already consuming: a marker published
/// straight to the output topic has come back. (A reader still joining its
/// group would see the node's messages late, and blur their arrival times.)
fn warm_reader(s: &Setup, p: &rdkafka::producer::BaseProducer) -> OutputReader {
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let marker = Input {
        key: Some("warm-up"),
        value: b"",
        headers: vec![],
    };
    produce(p, &s.output, &[marker]);
    wait_until(
        "the output reader",
        Duration::from_secs(20),
        || match values_of(&reader, "warm-up").len() {
            0 => Err("no marker yet".into()),
            _ => Ok(()),
        },
    );
    reader
}

/// Wait until `/ready` answers 503 with a reason that names `what` (a
/// node just started may answer 503 for another reason first: its broker
/// not probed yet).
fn wait_ready_503_naming(node: &Node, what: &str, timeout: Duration) {
    wait_until(&format!("/ready 503 naming {what}"), timeout, || {
        let r = node.request("GET", "/ready", "");
        match (r.status, r.text()) {
            (503, text) if text.contains(what) => Ok(()),
            (status, text) => Err(format!("{status} {text}")),
        }
    });
}

/// Wait until the node has created its table.
fn wait_table(table: &str, node: &Node) {
    wait_until("the table", Duration::from_secs(15), || {
        match psql(&format!("SELECT to_regclass('{table}') IS NOT NULL")).as_str() {
            "t" => Ok(()),
            _ => Err(log_tail(node)),
        }
    });
}

/// The node ID in `readied_by` of `id`'s row, if it is claimed.
fn claimed_by(table: &str, id: &str) -> Option<String> {
    let by = psql(&format!(
        "SELECT coalesce(readied_by::text, '') FROM {table} WHERE id = '{id}'"
    ));
    (!by.is_empty()).then_some(by)
}

/// Rows in `table` that no node has claimed.
fn unclaimed_rows(table: &str) -> i64 {
    let n = psql(&format!(
        "SELECT count(*) FROM {table} WHERE readied_by IS NULL"
    ));
    n.parse().unwrap_or_else(|_| panic!("psql count: {n:?}"))
}

/// Item 1. The output topic does not exist and the producer may not have
/// it created (tansu never would anyway): 10 messages stored (due 2 s
/// later) and then 10 late on arrival cannot be published. The node says
/// so (`/ready` 503 naming the topic, `chronos_queue_output_blocked` 1)
/// and skips none of them (no `unpublishable`, every stored row kept past
/// its deadline). Once the topic is created every message is delivered as
/// produced, and the node is ready again. Before the fix: `/ready` stayed
/// 200 (librdkafka itself reports nothing for 30 s,
/// `topic.metadata.propagation.max.ms`).
#[test]
fn a_missing_output_topic_holds_messages_and_says_so_until_it_is_created() {
    let _turn = turn();
    let s = setup_without_output("noout", 2);
    let node = s.node("[queue.producer]\n\"allow.auto.create.topics\" = false\n");
    let p = producer(&s.broker.brokers());
    let stored: Vec<String> = (0..10).map(|i| format!("due-{i}")).collect();
    let late: Vec<String> = (0..10).map(|i| format!("late-{i}")).collect();
    let due_ms = now_ms() + 2_000;
    // Stored first: a shard waits for its late messages' publish before it
    // takes its next batch in, so rows behind them might not be stored.
    produce(&p, &s.input, &inputs_as_ids(&stored, &iso(due_ms)));
    wait_rows_at_least(&s.table, 10, &node);
    produce(&p, &s.input, &inputs_as_ids(&late, &iso(now_ms() - 5_000)));
    wait_ready_503_naming(&node, &s.output, Duration::from_secs(15));
    wait_metric(&node, OUTPUT_BLOCKED, 1.0, Duration::from_secs(5));
    // Blocked, nothing is given up: past their deadline the stored rows
    // are all still there.
    sleep_until(instant_of_ms(due_ms + 1_000));
    let kept = table_rows(&s.table);
    assert_eq!(kept, 10, "rows deleted while blocked\n{}", log_tail(&node));
    assert_eq!(node.try_metric(UNPUBLISHABLE), Ok(0.0));
    s.broker.create_topic(&s.output, 2);
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let until = within(Duration::from_secs(30));
    for k in stored.iter().chain(&late) {
        if let Err(e) = wait_value(&reader, k, k, until) {
            panic!(
                "{e} after the output topic was created\n{}",
                log_tail(&node)
            );
        }
    }
    node.wait_ready_200(Duration::from_secs(15));
    wait_metric(&node, OUTPUT_BLOCKED, 0.0, Duration::from_secs(5));
    assert_eq!(node.try_metric(UNPUBLISHABLE), Ok(0.0));
}

/// One message per ID, the ID also its key and its value, all due at `dl`.
fn inputs_as_ids<'a>(ids: &'a [String], dl: &'a str) -> Vec<Input<'a>> {
    ids.iter().map(|id| input(id, id.as_bytes(), dl)).collect()
}

/// A gate on deletes from `table`: until [`DeleteGate::open`] (or 15 s,
/// well inside the node's 20 s statement timeout), each `DELETE` waits
/// in a statement trigger, before it touches a row. The gate is a row in
/// `chronos_test_gate`, which the trigger reads afresh on each turn; it is
/// taken away when the guard drops, so a failed test leaves no delete
/// waiting.
struct DeleteGate {
    table: String,
}

impl DeleteGate {
    fn close(table: &str) -> DeleteGate {
        psql("CREATE TABLE IF NOT EXISTS chronos_test_gate (tbl text PRIMARY KEY)");
        psql(
            "CREATE OR REPLACE FUNCTION chronos_test_gated_delete() RETURNS trigger
             LANGUAGE plpgsql AS $$
             DECLARE until timestamptz := clock_timestamp() + interval '15 seconds';
             BEGIN
                 WHILE clock_timestamp() < until AND EXISTS
                     (SELECT 1 FROM chronos_test_gate WHERE tbl = TG_ARGV[0]) LOOP
                     PERFORM pg_sleep(0.05);
                 END LOOP;
                 RETURN NULL;
             END $$",
        );
        psql(&format!(
            "INSERT INTO chronos_test_gate VALUES ('{table}') ON CONFLICT DO NOTHING"
        ));
        psql(&format!(
            "CREATE TRIGGER {table}_gated_delete BEFORE DELETE ON {table}
             FOR EACH STATEMENT EXECUTE FUNCTION chronos_test_gated_delete('{table}')"
        ));
        DeleteGate {
            table: table.to_string(),
        }
    }

    /// The statement that opens the gate.
    fn open_sql(&self) -> String {
        format!("DELETE FROM chronos_test_gate WHERE tbl = '{}'", self.table)
    }

    fn open(&self) {
        psql(&self.open_sql());
    }
}

impl Drop for DeleteGate {
    /// As [`DeleteGate::open`], without the assertion: a drop during a
    /// test's panic must not panic again.
    fn drop(&mut self) {
        let _ = psql_command().args(["-tAc", &self.open_sql()]).output();
    }
}

/// Whether a delete on `table` is sleeping in its trigger now.
fn delete_in_flight(table: &str) -> bool {
    let n = psql(&format!(
        "SELECT count(*) FROM pg_stat_activity
         WHERE wait_event = 'PgSleep' AND query ILIKE '%delete%{table}%'"
    ));
    n != "0"
}

/// Item 3. Messages `x` and `y` are published; while their rows' delete
/// is in flight (held by a [`DeleteGate`]) each ID is reused at once: `x`
/// by a message due 2.5 s later, `y` by one already late. Both new
/// messages are delivered. Before the fix: `x`'s was dropped by the
/// insert's `ON CONFLICT DO NOTHING` (the old row was still there), `y`'s
/// was not published (its ID seemed to wait in the table), and the delete
/// then removed the old row: both lost, their offsets committed.
#[test]
fn an_id_reused_while_its_delete_is_in_flight_is_delivered() {
    let _turn = turn();
    let s = setup("reuse", 1);
    let node = s.node("statement-timeout-ms = 20000");
    wait_table(&s.table, &node);
    let gate = DeleteGate::close(&s.table);
    let p = producer(&s.broker.brokers());
    let reader = warm_reader(&s, &p);
    let first = iso(now_ms() + 1_000);
    produce_to(
        &p,
        &s.input,
        0,
        &[input("x", b"x-1", &first), input("y", b"y-1", &first)],
    );
    let until = within(Duration::from_secs(15));
    for (k, v) in [("x", "x-1"), ("y", "y-1")] {
        if let Err(e) = wait_value(&reader, k, v, until) {
            panic!("{e}\n{}", log_tail(&node));
        }
    }
    wait_until(
        "the old rows' delete",
        Duration::from_secs(5),
        || match delete_in_flight(&s.table) {
            true => Ok(()),
            false => Err(log_tail(&node)),
        },
    );
    let (future_ms, past) = (now_ms() + 2_500, iso(now_ms() - 1_000));
    let future = iso(future_ms);
    produce_to(
        &p,
        &s.input,
        0,
        &[input("x", b"x-2", &future), input("y", b"y-2", &past)],
    );
    // The premise: the node took the new messages in while the old rows'
    // delete was still in flight (it began before they were produced).
    wait_metric(
        &node,
        "chronos_queue_consumed_total",
        4.0,
        Duration::from_secs(10),
    );
    assert!(
        delete_in_flight(&s.table),
        "the premise fails: the old rows' delete was over before the new messages were consumed"
    );
    // The batch's insert follows its count after the late message's
    // look-up (one Postgres statement) and its hand-over to the producer:
    // a second for the insert to meet the row that is still there (before
    // the fix it was dropped then); then the delete goes on. The gate
    // holds at most 15 s: it must still have held until now.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        delete_in_flight(&s.table),
        "the premise fails: the gate lapsed before the insert had its second"
    );
    gate.open();
    let until = instant_of_ms(future_ms + 10_000);
    let lost: Vec<String> = [("x", "x-2"), ("y", "y-2")]
        .iter()
        .filter_map(|(k, v)| wait_value(&reader, k, v, until).err())
        .collect();
    assert!(lost.is_empty(), "{lost:?}\n{}", log_tail(&node));
}

/// Item 3, around a takeover. Node B (a claimer: no input partition, see
/// [`Setup::claimer`]) claims message 1 of ID `x` and is stopped
/// (SIGSTOP) before its deadline; node A resets it after the hold time
/// and publishes it, and deletes its row. Message 2 reuses `x`, due 7 s
/// later, and is stored. B resumes (SIGCONT): it publishes message 1
/// again from memory (a duplicate, allowed) and deletes its row, which
/// must not remove message 2's. Message 2 is delivered. Before the fix: B
/// deleted by ID alone, and message 2 was lost.
#[test]
fn a_takeover_never_deletes_a_newer_message_with_the_same_id() {
    let _turn = turn();
    let s = setup("takeover", 1);
    // A claims only within 100 ms of a deadline, B 2 s ahead: B claims.
    let common = "hold-time-ms = 3000\nfailure-detection-interval-ms = 200\n";
    let a = s.node(&format!("{common}look-ahead-ms = 100"));
    let b = s.claimer(&format!("{common}look-ahead-ms = 2000"));
    let b_id = queue_node_id(&b);
    a.wait_ready_200(Duration::from_secs(20));
    b.wait_ready_200(Duration::from_secs(20));
    let p = producer(&s.broker.brokers());
    let reader = warm_reader(&s, &p);
    produce_to(
        &p,
        &s.input,
        0,
        // B claims at 5 s: 5 s for A to consume and store it on a loaded
        // machine, before A's own claim could come first (6.9 s).
        &[input("x", b"x-1", &iso(now_ms() + 7_000))],
    );
    let by = wait_until("message 1 claimed", Duration::from_secs(10), || {
        claimed_by(&s.table, "x").ok_or_else(|| "not claimed".to_string())
    });
    assert_eq!(by, b_id, "the premise fails: B did not claim message 1");
    b.signal(libc::SIGSTOP);
    // A takes over after the hold time, publishes and deletes the row.
    if let Err(e) = wait_value(&reader, "x", "x-1", within(Duration::from_secs(15))) {
        panic!("{e}: no takeover\n{}", log_tail(&a));
    }
    wait_until(
        "message 1's row deleted",
        Duration::from_secs(10),
        || match table_rows(&s.table) {
            0 => Ok(()),
            n => Err(format!("{n} rows")),
        },
    );
    // Due well beyond B's look-ahead: B's delete (within a second or so
    // of its resumption) comes long before B could claim message 2 itself.
    let due_ms = now_ms() + 7_000;
    produce_to(&p, &s.input, 0, &[input("x", b"x-2", &iso(due_ms))]);
    wait_until(
        "message 2 stored",
        Duration::from_secs(10),
        || match unclaimed_rows(&s.table) {
            1 => Ok(()),
            n => Err(format!("{n} unclaimed rows")),
        },
    );
    b.signal(libc::SIGCONT);
    let delivered = wait_value(&reader, "x", "x-2", instant_of_ms(due_ms + 10_000));
    eprintln!("x published as {:?}", values_of(&reader, "x"));
    if let Err(e) = delivered {
        panic!("{e}\nA:\n{}\nB:\n{}", log_tail(&a), log_tail(&b));
    }
}

/// Item 5. Node V (a claimer, see [`Setup::claimer`]) claims 50 rows 2 s
/// ahead of their deadline and is killed (`kill -9`) 0.7 s before it: node
/// S publishes every one of them within 1.5 s of the kill (the issue asks
/// for a second; the rest is margin for a loaded machine). The time from
/// the kill to the first publish is printed. Before the fix: S waited for
/// the hold time (5 s) from the claim, 3.7 s after the kill.
#[test]
fn a_killed_node_s_claimed_rows_are_published_by_another_within_a_second() {
    let _turn = turn();
    let s = setup("killed", 1);
    let survivor = s.node("");
    let mut victim = s.claimer("look-ahead-ms = 2000");
    let victim_id = queue_node_id(&victim);
    survivor.wait_ready_200(Duration::from_secs(20));
    victim.wait_ready_200(Duration::from_secs(20));
    let p = producer(&s.broker.brokers());
    let reader = warm_reader(&s, &p);
    // Claimed 2 s ahead: 6 s for the rows to be consumed and stored on a
    // loaded machine before the claim is due.
    let due_ms = now_ms() + 8_000;
    let keys: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
    produce_to(&p, &s.input, 0, &inputs_due(&keys, &iso(due_ms)));
    let claimed = format!(
        "SELECT count(*) FROM {} WHERE readied_by = '{victim_id}'",
        s.table
    );
    wait_until(
        "V to claim the 50 rows",
        Duration::from_secs(10),
        || match psql(&claimed).as_str() {
            "50" => Ok(()),
            n => Err(format!("{n} claimed by V\n{}", log_tail(&survivor))),
        },
    );
    sleep_until(instant_of_ms(due_ms - 700));
    assert!(
        reader.seen().len() == 1 && now_ms() < due_ms - 300,
        "the premise fails: V was not killed well before the deadline"
    );
    let killed_ms = now_ms();
    victim.kill9();
    let seen = reader.wait_for(51, Duration::from_secs(20));
    report_takeover(&keys, &seen, killed_ms, due_ms, &survivor);
}

/// Check that every key of `keys` was published by `max(deadline, kill +
/// 1.5 s)`, and print the time from the kill to the first publish.
fn report_takeover(keys: &[String], seen: &[Output], killed_ms: i64, due_ms: i64, s: &Node) {
    let first = |k: &String| {
        seen.iter()
            .filter(|o| o.key.as_ref() == Some(k))
            .map(|o| o.at_ms)
            .min()
    };
    let arrivals: Vec<i64> = keys.iter().filter_map(first).collect();
    assert_eq!(arrivals.len(), keys.len(), "lost some\n{}", log_tail(s));
    let (earliest, latest) = (
        arrivals.iter().min().unwrap(),
        arrivals.iter().max().unwrap(),
    );
    eprintln!(
        "takeover: first publish {} ms after the kill, last {} ms ({} ms after the deadline)",
        earliest - killed_ms,
        latest - killed_ms,
        latest - due_ms
    );
    let bound = due_ms.max(killed_ms + 1_500);
    assert!(
        *latest <= bound,
        "the last of the killed node's rows came {} ms after the kill (bound: {} ms)\n{}",
        latest - killed_ms,
        bound - killed_ms,
        log_tail(s)
    );
}

/// The cold review of issue 39's first cut (ON CONFLICT replaced a
/// claimed row): a message whose ID reuses that of a row claimed but not
/// yet published, and then the holder stops before publishing (`kill -9`,
/// or SIGTERM). Both messages must come out. The first cut lost the older
/// one (its row held the newer message, nothing was left to take over);
/// the code before it lost the newer one (dropped as a duplicate, then its
/// row deleted with the old one). Now the newer message waits in the
/// enqueue until the claimed row is gone.
fn reused_id_while_claimed_then_holder_stops(name: &str, stop: impl FnOnce(&mut Node)) {
    let _turn = turn();
    let s = setup(name, 1);
    let survivor = s.node("");
    // The longest look-ahead the default hold time allows (with the 100 ms
    // poll, below 5 s): V claims message 1 at about 2.5 s, and message 2
    // has 4 s from there to be consumed before V must be stopped.
    let mut victim = s.claimer("look-ahead-ms = 4500");
    let victim_id = queue_node_id(&victim);
    survivor.wait_ready_200(Duration::from_secs(20));
    victim.wait_ready_200(Duration::from_secs(20));
    let p = producer(&s.broker.brokers());
    let reader = warm_reader(&s, &p);
    let due1 = now_ms() + 7_000;
    produce_to(&p, &s.input, 0, &[input("x", b"x-1", &iso(due1))]);
    let by = wait_until("message 1 claimed", Duration::from_secs(10), || {
        claimed_by(&s.table, "x").ok_or_else(|| "not claimed".to_string())
    });
    assert_eq!(
        by, victim_id,
        "the premise fails: V did not claim message 1"
    );
    let due2 = now_ms() + 8_000;
    produce_to(&p, &s.input, 0, &[input("x", b"x-2", &iso(due2))]);
    // Consumed by S (which holds message 2 back: its ID is claimed).
    wait_metric(
        &survivor,
        "chronos_queue_consumed_total",
        2.0,
        Duration::from_secs(10),
    );
    assert!(
        now_ms() < due1 - 300,
        "the premise fails: too late to stop V before message 1's deadline"
    );
    stop(&mut victim);
    let until = instant_of_ms(due2 + 8_000);
    let r1 = wait_value(&reader, "x", "x-1", until);
    let r2 = wait_value(&reader, "x", "x-2", until);
    eprintln!("x published as {:?}", values_of(&reader, "x"));
    assert!(
        r1.is_ok(),
        "message 1 lost: {r1:?}\n{}",
        log_tail(&survivor)
    );
    assert!(
        r2.is_ok(),
        "message 2 lost: {r2:?}\n{}",
        log_tail(&survivor)
    );
}

#[test]
fn an_older_message_survives_its_holder_s_kill_after_its_id_was_reused() {
    reused_id_while_claimed_then_holder_stops("r39kill", |v| v.kill9());
}

#[test]
fn an_older_message_survives_its_holder_s_stop_after_its_id_was_reused() {
    reused_id_while_claimed_then_holder_stops("r39term", |v| v.signal(libc::SIGTERM));
}
