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
use rdkafka::producer::BaseProducer;
use std::collections::BTreeSet;
use std::time::Duration;

/// Messages per record batch: far more than the shard's inbox holds in
/// bytes, so that the consumer pauses the partition inside the first one.
const PER_BATCH: usize = 400;
/// Each message's value: 400 × 8 KB = 3.2 MB per batch against the
/// node's 1 MB `inbox-bytes-max`.
const VALUE_BYTES: usize = 8192;

/// A producer that puts each `produce_to` call's messages into one record
/// batch (one linger, no size or count cut).
fn batching_producer(brokers: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "1000")
        .set("batch.num.messages", "100000")
        .set("batch.size", "16000000")
        .set("message.max.bytes", "16000000")
        .create()
        .expect("producer")
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
        let msgs: Vec<Input> = batch
            .iter()
            .map(|k| Input {
                key: Some(k),
                value: &value,
                headers: vec![("chronosMessageId", k), ("chronosDeadline", due.as_str())],
            })
            .collect();
        produce_to(&p, &s.input, 0, &msgs);
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
    let msgs: Vec<Input> = keys
        .iter()
        .map(|k| Input {
            key: Some(k),
            value: b"v",
            headers: vec![("chronosMessageId", k), ("chronosDeadline", due.as_str())],
        })
        .collect();
    produce_to(&p, &s.input, 0, &msgs);
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
