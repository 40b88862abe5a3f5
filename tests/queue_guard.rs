//! Issue 39, item 2: the gap guard never lets a record through on a guess,
//! with a real tansu broker, real Postgres on 127.0.0.1:5432, and a small
//! Kafka-aware TCP proxy of the test's own in front of the broker
//! ([`KafkaProxy`]).
//!
//! tansu 0.6 answers a fetch from inside a record batch with the batches
//! that start after that offset. So after an assignment the consumer
//! thread's gap guard checks the first record against the group's
//! committed offset, which it looks up itself (an OffsetFetch request,
//! 5 s). When that look-up failed, the first records were let through
//! unchecked: the rest of the batch the committed offset lies in was never
//! fetched, and the later offsets stored and committed past it.

mod common;

use common::queue::*;
use common::*;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The node's consumer names itself so (`client.id`): the proxy fails its
/// look-ups only, not those of the test's own clients, which reach the
/// broker through the proxy too (the broker advertises the proxy).
const NODE_CLIENT: &str = "guarded-node";
/// Kafka's OffsetFetch request: the committed-offset look-up.
const OFFSET_FETCH: i16 = 9;

#[derive(Default)]
struct ProxyState {
    /// Let the node's OffsetFetch requests through; until then each one
    /// cuts its connection unanswered.
    open: AtomicBool,
    /// Connections cut so.
    cuts: AtomicUsize,
}

/// A TCP proxy to the broker (one thread per direction and connection;
/// the threads end with their connections) that reads requests frame by
/// frame.
struct KafkaProxy {
    port: u16,
    state: Arc<ProxyState>,
}

impl KafkaProxy {
    fn start(broker_port: u16) -> KafkaProxy {
        let state: Arc<ProxyState> = Default::default();
        let st = state.clone();
        let port = proxy::start(
            ([127, 0, 0, 1], broker_port).into(),
            Arc::new(move |c: TcpStream, s: TcpStream| pump_requests(c, s, &st)),
            Arc::new(proxy::pass_as_is),
        );
        KafkaProxy { port, state }
    }

    fn open(&self) {
        self.state.open.store(true, Ordering::SeqCst);
    }

    fn cuts(&self) -> usize {
        self.state.cuts.load(Ordering::SeqCst)
    }
}

/// Client to broker, request by request; a request of the node's
/// look-ups, while not open, cuts the connection instead.
fn pump_requests(mut from: TcpStream, mut to: TcpStream, state: &ProxyState) {
    while let Some(frame) = read_frame(&mut from) {
        if is_node_offset_fetch(&frame) && !state.open.load(Ordering::SeqCst) {
            state.cuts.fetch_add(1, Ordering::SeqCst);
            break;
        }
        if to.write_all(&frame).is_err() {
            break;
        }
    }
    proxy::shut_both(&from, &to);
}

/// One request as it came: a 4-byte big-endian length, then that many
/// bytes. `None` at the end of the connection.
fn read_frame(from: &mut TcpStream) -> Option<Vec<u8>> {
    let mut frame = vec![0u8; 4];
    from.read_exact(&mut frame).ok()?;
    let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
    frame.resize(4 + len, 0);
    from.read_exact(&mut frame[4..]).ok()?;
    Some(frame)
}

/// Whether `frame` is an OffsetFetch of the node's consumer. A request
/// header (v1, v2) after the length: api_key i16, api_version i16,
/// correlation_id i32, client_id (i16 length, then the bytes).
fn is_node_offset_fetch(frame: &[u8]) -> bool {
    let i16_at = |at: usize| {
        frame
            .get(at..at + 2)
            .map(|b| i16::from_be_bytes([b[0], b[1]]))
    };
    let id_len = i16_at(12).and_then(|n| usize::try_from(n).ok());
    let client_id = id_len.and_then(|n| frame.get(14..14 + n));
    i16_at(4) == Some(OFFSET_FETCH) && client_id == Some(NODE_CLIENT.as_bytes())
}

/// Messages per record batch, and batches.
const PER_BATCH: usize = 50;
const BATCHES: usize = 3;
/// The group's committed offset before the node starts: inside the second
/// batch (50..=99). A fetch from 60 answers from 100 on.
const COMMITTED: usize = 60;

/// A broker behind a proxy, fresh topics and a fresh table name.
fn setup_behind_proxy(name: &str) -> (Setup, KafkaProxy) {
    let broker_port = free_port();
    let proxy = KafkaProxy::start(broker_port);
    let broker = Broker::start_advertising(broker_port, proxy.port);
    let s = Setup {
        broker,
        input: unique(&format!("{name}_in")),
        output: unique(&format!("{name}_out")),
        table: unique(&format!("q_{name}")),
    };
    s.broker.create_topic(&s.input, 1);
    s.broker.create_topic(&s.output, 1);
    (s, proxy)
}

/// A node whose every broker connection goes through `proxy`, its
/// consumer named [`NODE_CLIENT`]. Each cut also loses the heartbeats on
/// the coordinator's connection: a session timeout would revoke the
/// partition and assign it again, with a look-up that works then, so the
/// session lasts far longer than the test. And the reconnect backoff,
/// doubled by each cut (up to 10 s by default), is kept short, so that
/// the node reconnects soon after the proxy lets the look-ups through.
fn node_via(s: &Setup, proxy: &KafkaProxy) -> Node {
    let direct = format!("\"{}\"", s.broker.brokers());
    let via = format!("\"127.0.0.1:{}\"", proxy.port);
    let session = "\"session.timeout.ms\" = 6000\n";
    let config = queue_config(&s.broker.brokers(), &s.input, &s.output, &s.table, "");
    assert!(config.contains(&direct) && config.ends_with(session));
    let config = config
        .replace(&direct, &via)
        .replace(session, "\"session.timeout.ms\" = 120000\n");
    Node::start(&format!(
        "{config}\"client.id\" = \"{NODE_CLIENT}\"\n\"reconnect.backoff.max.ms\" = 1000\n"
    ))
}

/// The indices of `keys`, from `from` on, not on the output yet.
fn missing(reader: &OutputReader, keys: &[String], from: usize) -> Vec<usize> {
    let seen = reader.seen();
    let got: BTreeSet<&str> = seen.iter().filter_map(|o| o.key.as_deref()).collect();
    (from..keys.len())
        .filter(|&i| !got.contains(keys[i].as_str()))
        .collect()
}

/// The last 30 lines of the node's delay-queue log, for assertion messages.
fn queue_log(node: &Node) -> String {
    let log = node.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("queue")).collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// The group committed offset 60, inside the batch 50..=99; the node is
/// assigned the partition while every OffsetFetch of its consumer cuts the
/// connection, so its guard's look-up fails (librdkafka's own, for where
/// to start, is retried until it succeeds). Then the proxy lets them
/// through: every message from offset 60 on is delivered. Before the fix
/// the first records were let through unchecked: 60..=99 never delivered,
/// and the committed offset went past them (150).
#[test]
fn a_failed_committed_offset_look_up_lets_nothing_through() {
    let (s, proxy) = setup_behind_proxy("guardlookup");
    let keys = produce_batches(&s);
    commit_offset(&s.broker.brokers(), &s.table, &s.input, 0, COMMITTED as i64);
    let reader = OutputReader::start(&s.broker.brokers(), &s.output);
    let node = node_via(&s, &proxy);
    // The node warns so (before the fix too) when the look-up failed.
    wait_until(
        "the guard's look-up failed",
        Duration::from_secs(30),
        || {
            if node.log_text().contains("could not be had") {
                Ok(())
            } else {
                Err(format!("{} cuts\n{}", proxy.cuts(), queue_log(&node)))
            }
        },
    );
    assert!(proxy.cuts() >= 1, "the look-up failed without a cut");
    proxy.open();
    let delivered = wait_until_ok(Duration::from_secs(20), || {
        match missing(&reader, &keys, COMMITTED).as_slice() {
            [] => Ok(()),
            left => Err(left.to_vec()),
        }
    });
    if let Err(left) = delivered {
        panic!("{}", lost(&s, &node, &left, proxy.cuts()));
    }
    // The path under test was the one taken: a single assignment (no
    // rebalance looked the offset up again), whose look-up failed.
    let assigned = node.log_text().matches("input partitions assigned").count();
    assert_eq!(assigned, 1, "assignments\n{}", queue_log(&node));
}

/// [`BATCHES`] record batches on the input's partition 0, due at once;
/// their keys (the key at index `i` has offset `i`).
fn produce_batches(s: &Setup) -> Vec<String> {
    let p = batching_producer(&s.broker.brokers());
    let due = iso(now_ms() + 1_000);
    let keys: Vec<String> = (0..PER_BATCH * BATCHES).map(|i| format!("m{i}")).collect();
    for batch in keys.chunks(PER_BATCH) {
        produce_to(&p, &s.input, 0, &inputs_due(batch, &due));
    }
    keys
}

/// What was lost (the offsets `left`), with the group's committed offset
/// and the node's log.
fn lost(s: &Setup, node: &Node, left: &[usize], cuts: usize) -> String {
    let committed = committed_offsets(&s.broker.brokers(), &s.table, &s.input, 1);
    format!(
        "{} of {} never delivered (offsets {:?} ..= {:?}); committed offset {committed:?}; {cuts} cuts\n{}",
        left.len(),
        PER_BATCH * BATCHES - COMMITTED,
        left.first(),
        left.last(),
        queue_log(node),
    )
}

/// Poll `check` every 20 ms until it returns `Ok`, for at most `timeout`;
/// its last `Err` after that.
fn wait_until_ok<E>(timeout: Duration, mut check: impl FnMut() -> Result<(), E>) -> Result<(), E> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
