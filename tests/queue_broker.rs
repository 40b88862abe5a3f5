//! Issue 22, item 5: the delay queue against its broker's fetch, with a
//! real tansu broker and real Postgres on 127.0.0.1:5432.
//!
//! At 50 k messages/s the node lost messages (perf/README, "Issue 22: the
//! delay queue at 50 k/s"): its shard fell behind, the consumer thread
//! paused the partition, and on resume librdkafka fetched again from the
//! next offset to hand over, inside a record batch. A Kafka broker answers
//! such a fetch with the whole batch (the client skips the records before
//! the offset); tansu 0.6 (memory storage) answers with the batches that
//! start at or after it, so the rest of that batch never reached the node,
//! and the node committed past it once the next batch came. The consumer
//! thread's gap guard (`src/queue/gaps.rs`) now fetches such a partition
//! again from before the skipped records; and the thread waits a while for
//! room (`pause-after-ms`) before it pauses at all.

mod common;

use common::queue::*;
use common::*;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::collections::BTreeSet;
use std::time::Duration;

/// Messages per record batch: far more than the shard's inbox holds in
/// bytes, so that the consumer pauses the partition inside the first one.
const PER_BATCH: usize = 400;
/// Each message's value: 400 × 8 KB = 3.2 MB per batch against the
/// node's 1 MB `inbox-bytes-max`.
const VALUE_BYTES: usize = 8192;

/// One message per key (the key also its ID), each with `value`, due at
/// `due`.
fn inputs<'a>(keys: &'a [String], value: &'a [u8], due: &'a str) -> Vec<Input<'a>> {
    keys.iter().map(|k| input(k, value, due)).collect()
}

/// Two record batches on one partition, both on the topic before the node
/// starts; the node's inbox holds about 1 MB, so it pauses the partition
/// inside the first batch and resumes there. Every message of both batches
/// is delivered, and nothing is committed past an undelivered one. Before
/// the guard: 552 of 800 never delivered, the committed offset (524) past
/// 276 of them; the tail of the second batch waited for a third one.
#[test]
fn a_partition_resumed_inside_a_record_batch_loses_nothing() {
    let s = setup("midbatch", 1);
    let p = batching_producer(&s.broker.brokers());
    let value = vec![b'v'; VALUE_BYTES];
    let due = iso(now_ms() + 3_000);
    let keys: Vec<String> = (0..2 * PER_BATCH).map(|i| format!("m{i}")).collect();
    for batch in keys.chunks(PER_BATCH) {
        produce_to(&p, &s.input, 0, &inputs(batch, &value, &due));
    }
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    // Small inserts, so that the shard takes the inbox slowly; a pause as
    // soon as the inbox is full (the default waits a while first).
    let node = s.node("inbox-bytes-max = 1048576\ninsert-batch-max = 20\npause-after-ms = 0\n");
    // The indices (the offsets) of the messages not delivered.
    let missing = |seen: &[Output]| -> Vec<usize> {
        let got: BTreeSet<&str> = seen.iter().filter_map(|o| o.key.as_deref()).collect();
        (0..keys.len())
            .filter(|&i| !got.contains(keys[i].as_str()))
            .collect()
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until("every message delivered", Duration::from_secs(60), || {
            let left = missing(&reader.seen());
            match left.len() {
                0 => Ok(()),
                n => Err(format!(
                    "{n} missing, the first at offset {:?}",
                    left.first()
                )),
            }
        })
    }));
    if outcome.is_err() {
        let left = missing(&reader.seen());
        let committed = committed_offsets(&s.broker.brokers(), &s.table, &s.input, 1);
        panic!(
            "{} of {} never delivered (offsets {:?} ..= {:?}); consumed {}; committed offset {committed:?}",
            left.len(),
            keys.len(),
            left.first(),
            left.last(),
            node.metric("chronos_queue_consumed_total"),
        );
    }
    // The path under test was taken: paused, and fetched again.
    assert!(node.metric("chronos_queue_paused_total") >= 1.0);
    assert!(node.metric("chronos_queue_refetched_total") >= 1.0);
}

/// A node whose group committed an offset inside a partition's last record
/// batch (a node killed there and started again, or a partition taken over
/// from one) is owed the rest of that batch. tansu answers the fetch from
/// inside it with nothing (no batch starts after it), so the tail waited
/// for new input to reach the same partition: with none, for ever.
#[test]
fn a_node_starting_inside_the_last_record_batch_delivers_its_tail() {
    const MESSAGES: usize = 200;
    const COMMITTED: usize = 120;
    let s = setup("tailstart", 1);
    let p = batching_producer(&s.broker.brokers());
    let due = iso(now_ms() + 2_000);
    let keys: Vec<String> = (0..MESSAGES).map(|i| format!("m{i}")).collect();
    produce_to(&p, &s.input, 0, &inputs_due(&keys, &due));
    commit_offset(&s.broker.brokers(), &s.table, &s.input, 0, COMMITTED as i64);
    let committed = committed_offsets(&s.broker.brokers(), &s.table, &s.input, 1);
    assert_eq!(committed, [COMMITTED as i64], "the commit took");
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let _node = s.node("");
    wait_until("the tail delivered", Duration::from_secs(30), || {
        let seen = reader.seen();
        let got: BTreeSet<&str> = seen.iter().filter_map(|o| o.key.as_deref()).collect();
        let left: Vec<usize> = (COMMITTED..MESSAGES)
            .filter(|&i| !got.contains(keys[i].as_str()))
            .collect();
        match left.len() {
            0 => Ok(()),
            n => Err(format!(
                "{n} of the tail missing, the first {:?}",
                left.first()
            )),
        }
    });
}

/// A partition paused because its shard is full, then given back to the
/// same node by a rebalance (another member joins and leaves; the eager
/// protocol revokes and assigns everything), stays paused in librdkafka.
/// The guard counted its silence from the assignment and sought it back
/// committed-1, -2, -4, ... to offset 0 while it could not answer (17
/// seeks in the cold review's run), then re-read the whole partition. Now
/// its check waits for the resume, and every message is still delivered.
#[test]
fn a_paused_partition_given_back_by_a_rebalance_is_not_sought_while_paused() {
    const N: usize = 1000;
    let s = setup("pausedrebalance", 1);
    let p = batching_producer(&s.broker.brokers());
    let value = vec![b'v'; VALUE_BYTES];
    let due = iso(now_ms() + 1_000);
    let keys: Vec<String> = (0..2 * N).map(|i| format!("m{i}")).collect();
    let send = |ks: &[String]| {
        for batch in ks.chunks(100) {
            produce_to(&p, &s.input, 0, &inputs(batch, &value, &due));
        }
    };
    send(&keys[..N]);
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let node = s.node("inbox-bytes-max = 1048576\npostgres-stall-leave-ms = 120000\n");
    wait_until("the first half committed", Duration::from_secs(60), || {
        let c = committed_offsets(&s.broker.brokers(), &s.table, &s.input, 1)[0];
        if c >= N as i64 {
            Ok(())
        } else {
            Err(format!("committed {c}"))
        }
    });
    // The inserts wait behind a lock: the shard fills, the partition pauses.
    let lock = format!(
        "BEGIN; LOCK TABLE {} IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(30); COMMIT;",
        s.table
    );
    let mut locker = psql_command()
        .args(["-c", &lock])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("psql");
    wait_until("the table locked", Duration::from_secs(10), || {
        let n = psql(&format!("SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = '{}' AND l.mode = 'AccessExclusiveLock' AND l.granted", s.table));
        if n.trim() == "1" {
            Ok(())
        } else {
            Err(n)
        }
    });
    send(&keys[N..]);
    wait_until("the partition paused", Duration::from_secs(10), || {
        let n = node.metric("chronos_queue_paused_total");
        if n >= 1.0 {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    });
    let assigned = |n: &common::Node| n.log_text().matches("input partitions assigned").count();
    let before = (
        node.metric("chronos_queue_refetched_total"),
        assigned(&node),
    );
    // Another member joins and leaves.
    {
        let other: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", s.broker.brokers())
            .set("group.id", &s.table)
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        other.subscribe(&[s.input.as_str()]).expect("subscribe");
        wait_until("the other member joined", Duration::from_secs(20), || {
            let _ = other.poll(Duration::from_millis(100));
            match other.assignment() {
                Ok(a) if assigned(&node) > before.1 => Ok(a.count()),
                _ => Err("not yet".to_string()),
            }
        });
    }
    wait_until("the partition given back", Duration::from_secs(20), || {
        if assigned(&node) >= before.1 + 2 {
            Ok(())
        } else {
            Err(format!("{} assignments", assigned(&node)))
        }
    });
    // Paused (the lock holds): six silence periods would have meant six
    // seeks back before the fix.
    std::thread::sleep(Duration::from_secs(3));
    let sought = node.metric("chronos_queue_refetched_total") - before.0;
    assert!(sought < 1.0, "sought back {sought} times while paused");
    let _ = locker.wait();
    wait_until("every message delivered", Duration::from_secs(90), || {
        let got: BTreeSet<String> = reader.seen().into_iter().filter_map(|o| o.key).collect();
        match keys.iter().filter(|k| !got.contains(k.as_str())).count() {
            0 => Ok(()),
            n => Err(format!("{n} missing")),
        }
    });
}
