//! Test support for the delay queue: a real tansu broker process on a free
//! loopback port, topics of our own, a producer, and an output consumer that
//! records every message with its arrival time.

use super::proxy;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The broker binary: `$CHRONOS_TANSU`, else where `.ci/run` installs it.
pub fn tansu_path() -> String {
    if let Ok(p) = std::env::var("CHRONOS_TANSU") {
        return p;
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let p = format!("{home}/.cache/chronos-ci/tansu/bin/tansu");
    assert!(
        std::path::Path::new(&p).exists(),
        "no Kafka broker: {p} is missing (run .ci/run, which installs tansu, or set CHRONOS_TANSU)"
    );
    p
}

/// A unique suffix for topics and tables.
pub fn unique(prefix: &str) -> String {
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{}_{}", std::process::id(), n % 1_000_000_000_000)
}

/// A running tansu broker with in-memory storage; killed when dropped.
pub struct Broker {
    child: Child,
    pub port: u16,
    /// Set for a broker restarted behind its old port ([`Forward`]).
    forward: Option<Forward>,
}

/// Connections to a loopback port joined to another port: a restarted
/// broker listens on a port of its own, advertising its old one, and is
/// reached through the old one only once its topics exist again.
struct Forward {
    stop: Arc<AtomicBool>,
    /// The accepting thread: joined on drop, so the port is free after.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Forward {
    fn start(from: u16, to: u16) -> Forward {
        let listener = std::net::TcpListener::bind(("127.0.0.1", from))
            .unwrap_or_else(|e| panic!("the broker's port {from} again: {e}"));
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], to));
            let pass: Arc<proxy::Pump> = Arc::new(proxy::pass_as_is);
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        // Accepted sockets do not inherit the listener's
                        // non-blocking mode on Linux.
                        proxy::join(client, upstream, &pass, &pass);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Forward {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Broker {
    pub fn start() -> Broker {
        Self::start_on(super::free_port())
    }

    /// Start on a given port (a restart after `kill`).
    pub fn start_on(port: u16) -> Broker {
        Self::start_advertising(port, port)
    }

    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn create_topic(&self, name: &str, partitions: u32) {
        let out = Command::new(tansu_path())
            .args([
                "topic",
                "create",
                "--broker",
                &format!("tcp://127.0.0.1:{}", self.port),
                "--partitions",
                &partitions.to_string(),
                name,
            ])
            .output()
            .expect("tansu topic create");
        assert!(
            out.status.success(),
            "topic create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Broker {
    /// `kill -9` the broker process.
    pub fn kill(&mut self) {
        self.forward = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A message to put on the input topic.
pub struct Input<'a> {
    pub key: Option<&'a str>,
    pub value: &'a [u8],
    pub headers: Vec<(&'a str, &'a str)>,
}

/// One message with ID `id` (also its key), `value`, due at the ISO 8601
/// deadline `deadline`.
pub fn input<'a>(id: &'a str, value: &'a [u8], deadline: &'a str) -> Input<'a> {
    Input {
        key: Some(id),
        value,
        headers: vec![("chronosMessageId", id), ("chronosDeadline", deadline)],
    }
}

/// One message per key, the key also its `chronosMessageId`, value `v`,
/// all due at the ISO 8601 deadline `dl`.
pub fn inputs_due<'a>(keys: &'a [String], dl: &'a str) -> Vec<Input<'a>> {
    keys.iter().map(|k| input(k, b"v", dl)).collect()
}

pub fn producer(brokers: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "1")
        .create()
        .expect("producer")
}

/// A producer that puts each `produce_to` call's messages into one record
/// batch (one linger, no size or count cut).
pub fn batching_producer(brokers: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "1000")
        .set("batch.num.messages", "100000")
        .set("batch.size", "16000000")
        .set("message.max.bytes", "16000000")
        .create()
        .expect("producer")
}

/// Produce and wait until the broker acknowledged everything.
pub fn produce(p: &BaseProducer, topic: &str, messages: &[Input<'_>]) {
    produce_into(p, topic, None, messages, Duration::from_secs(20));
}

/// Produce to one `partition` (not by key) and wait until the broker
/// acknowledged everything.
pub fn produce_to(p: &BaseProducer, topic: &str, partition: i32, messages: &[Input<'_>]) {
    produce_into(p, topic, Some(partition), messages, Duration::from_secs(30));
}

/// Produce `messages` (to `partition`, or by key), then flush within
/// `flush_within`.
fn produce_into(
    p: &BaseProducer,
    topic: &str,
    partition: Option<i32>,
    messages: &[Input<'_>],
    flush_within: Duration,
) {
    for m in messages {
        let mut headers = OwnedHeaders::new();
        for (k, v) in &m.headers {
            headers = headers.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        let mut r = BaseRecord::<str, [u8]>::to(topic)
            .payload(m.value)
            .headers(headers);
        if let Some(partition) = partition {
            r = r.partition(partition);
        }
        if let Some(k) = m.key {
            r = r.key(k);
        }
        let mut r = Some(r);
        while let Some(rec) = r.take() {
            if let Err((_, rec)) = p.send(rec) {
                p.poll(Duration::from_millis(10));
                r = Some(rec);
            }
        }
    }
    p.flush(flush_within).expect("flush");
}

/// The offsets `group` committed on `topic`'s partitions `0..partitions`
/// (-1 where none). (tansu's high watermarks are not record offsets.)
pub fn committed_offsets(brokers: &str, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    for i in 0..partitions {
        tpl.add_partition(topic, i);
    }
    let t = Duration::from_secs(10);
    let committed = c.committed_offsets(tpl, t).expect("committed offsets");
    (0..partitions)
        .map(
            |i| match committed.find_partition(topic, i).map(|e| e.offset()) {
                Some(rdkafka::Offset::Offset(n)) => n,
                _ => -1,
            },
        )
        .collect()
}

/// Commit `offset` for `group` on `topic`'s `partition`, as a member that
/// consumed up to it would (a node killed there, a partition taken over).
pub fn commit_offset(brokers: &str, group: &str, topic: &str, partition: i32, offset: i64) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))
        .expect("offset");
    c.commit(&tpl, rdkafka::consumer::CommitMode::Sync)
        .expect("commit");
}

/// Produce one message whose header values are raw bytes, and wait for
/// the broker's acknowledgement.
pub fn produce_raw(
    p: &BaseProducer,
    topic: &str,
    key: &str,
    value: &[u8],
    raw_headers: &[(&str, &[u8])],
) {
    let mut headers = OwnedHeaders::new();
    for (k, v) in raw_headers {
        headers = headers.insert(Header {
            key: k,
            value: Some(*v),
        });
    }
    let rec = BaseRecord::<str, [u8]>::to(topic)
        .payload(value)
        .key(key)
        .headers(headers);
    p.send(rec).map_err(|(e, _)| e).expect("queued");
    p.flush(Duration::from_secs(20)).expect("flush");
}

/// ISO 8601 UTC without a zone (seed 004's form) for `at_ms` Unix ms.
pub fn iso(at_ms: i64) -> String {
    chronos::queue::deadline::format_utc_ms(at_ms)
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// One message seen on the output topic.
#[derive(Clone, Debug)]
pub struct Output {
    pub key: Option<String>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, String)>,
    /// The same headers, byte for byte.
    pub raw_headers: Vec<(String, Vec<u8>)>,
    /// Unix ms when the test's consumer received it.
    pub at_ms: i64,
}

impl Output {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Consumes the output topic on a thread, from the beginning.
pub struct OutputReader {
    seen: Arc<Mutex<Vec<Output>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OutputReader {
    pub fn start(brokers: &str, topic: &str) -> OutputReader {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", unique("reader"))
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "6000")
            .set("fetch.wait.max.ms", "20")
            .create()
            .expect("consumer");
        consumer.subscribe(&[topic]).expect("subscribe");
        let seen: Arc<Mutex<Vec<Output>>> = Default::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) else {
                    continue;
                };
                let mut headers = Vec::new();
                let mut raw_headers = Vec::new();
                if let Some(h) = m.headers() {
                    for i in 0..h.count() {
                        let hd = h.get(i);
                        let value = hd.value.unwrap_or_default();
                        headers.push((
                            hd.key.to_string(),
                            String::from_utf8_lossy(value).into_owned(),
                        ));
                        raw_headers.push((hd.key.to_string(), value.to_vec()));
                    }
                }
                s.lock().unwrap().push(Output {
                    key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    value: m.payload().unwrap_or_default().to_vec(),
                    headers,
                    raw_headers,
                    at_ms: now_ms(),
                });
            }
        });
        OutputReader {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    pub fn seen(&self) -> Vec<Output> {
        self.seen.lock().unwrap().clone()
    }

    /// Wait for at least `n` messages, up to `timeout`.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Output> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.seen();
            if seen.len() >= n || Instant::now() >= deadline {
                return seen;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for OutputReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The `[queue]` section for a test.
pub fn queue_config(brokers: &str, input: &str, output: &str, table: &str, extra: &str) -> String {
    format!(
        "[queue]\nkafka-brokers = \"{brokers}\"\ninput-topic = \"{input}\"\noutput-topic = \"{output}\"\nconsumer-group = \"{table}\"\npostgres-url = \"postgres://postgres@127.0.0.1:5432/test\"\ntable = \"{table}\"\n{extra}\n[queue.consumer]\n\"session.timeout.ms\" = 6000\n"
    )
}

/// Rows left in a test table.
pub fn table_rows(table: &str) -> i64 {
    let out = psql(&format!("SELECT count(*) FROM {table}"));
    out.parse()
        .unwrap_or_else(|_| panic!("psql count: {out:?}"))
}

/// `psql` on the tests' database (127.0.0.1:5432, `test`), arguments to add.
pub fn psql_command() -> Command {
    let mut c = Command::new("psql");
    c.args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test"]);
    c
}

pub fn psql(sql: &str) -> String {
    let out = psql_command().args(["-tAc", sql]).output().expect("psql");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// One test's broker, topics and table (the table is dropped at the end).
pub struct Setup {
    pub broker: Broker,
    pub input: String,
    pub output: String,
    pub table: String,
}

/// A broker with fresh `<name>_in`/`<name>_out` topics and a fresh table name.
pub fn setup(name: &str, partitions: u32) -> Setup {
    let broker = Broker::start();
    let input = unique(&format!("{name}_in"));
    let output = unique(&format!("{name}_out"));
    broker.create_topic(&input, partitions);
    broker.create_topic(&output, partitions);
    let table = unique(&format!("q_{name}"));
    Setup {
        broker,
        input,
        output,
        table,
    }
}

impl Setup {
    /// A chronos node on this setup's topics and table.
    pub fn node(&self, extra: &str) -> super::Node {
        super::Node::start(&queue_config(
            &self.broker.brokers(),
            &self.input,
            &self.output,
            &self.table,
            extra,
        ))
    }

    /// Replace the broker with a new one reached on the same port (memory
    /// storage: the topics are created again). The new one listens on a
    /// port of its own, advertising the old one, and is reached through the
    /// old one ([`Forward`]) only once the topics exist:
    /// a node's producer that reconnected in between had its publishes
    /// acknowledged, and the topic the test then made was empty (CI: 40 of
    /// 40 messages never reached the reader, all rows deleted).
    pub fn restart_broker(&mut self, partitions: u32) {
        let port = self.broker.port;
        self.broker.kill();
        let mut broker = Broker::start_advertising(super::free_port(), port);
        broker.create_topic(&self.input, partitions);
        broker.create_topic(&self.output, partitions);
        broker.forward = Some(Forward::start(port, broker.port));
        broker.port = port;
        self.broker = broker;
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        // Quietly: this may run while a failed test unwinds.
        let _ = Command::new("psql")
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc"])
            .arg(format!(
                "DROP TABLE IF EXISTS {0}; DROP TABLE IF EXISTS {0}_nodes",
                self.table
            ))
            .output();
    }
}

/// Wait (up to 15 s) until `table` holds at least `n` rows.
pub fn wait_rows_at_least(table: &str, n: i64, node: &super::Node) {
    let until = Instant::now() + Duration::from_secs(15);
    // The node creates the table when its first Postgres connection is
    // made, which may come after the test's first look.
    let exists = || psql(&format!("SELECT to_regclass('{table}') IS NOT NULL")) == "t";
    while !exists() || table_rows(table) < n {
        assert!(Instant::now() < until, "not enqueued:\n{}", node.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until `/ready` answers 503 naming `what`.
pub fn wait_not_ready(node: &super::Node, what: &str, timeout: Duration) {
    let until = Instant::now() + timeout;
    loop {
        let r = node.request("GET", "/ready", "");
        if r.status == 503 {
            assert!(r.text().contains(what), "{}", r.text());
            return;
        }
        assert!(Instant::now() < until, "still ready with {what} down");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A broker with a fresh `<name>_in` topic and a fresh table name; the
/// output topic's name is chosen but the topic is not created (create it
/// with `broker.create_topic`). tansu 0.6 never creates a topic by itself:
/// it answers a metadata request for a missing topic with
/// `UNKNOWN_TOPIC_OR_PARTITION` whatever `allow_auto_topic_creation` says.
pub fn setup_without_output(name: &str, partitions: u32) -> Setup {
    let broker = Broker::start();
    let input = unique(&format!("{name}_in"));
    broker.create_topic(&input, partitions);
    Setup {
        broker,
        input,
        output: unique(&format!("{name}_out")),
        table: unique(&format!("q_{name}")),
    }
}

impl Setup {
    /// A node on this setup's table and output topic that consumes a topic
    /// of its own (empty) in a group of its own: it claims and publishes
    /// the table's rows like any node, but owns none of the input's
    /// partitions, so that stopping or killing it moves no partition (no
    /// rebalance, no input read again).
    pub fn claimer(&self, extra: &str) -> super::Node {
        let idle = unique("idle_in");
        self.broker.create_topic(&idle, 1);
        let config = queue_config(
            &self.broker.brokers(),
            &idle,
            &self.output,
            &self.table,
            extra,
        );
        let group = format!("consumer-group = \"{}\"", self.table);
        assert!(config.contains(&group));
        let own_group = format!("consumer-group = \"{}_idle\"", self.table);
        super::Node::start(&config.replace(&group, &own_group))
    }
}

/// The node ID a queue node logged at start (`delay queue node started
/// node_id=...`), as its claims write it into `readied_by`.
pub fn queue_node_id(node: &super::Node) -> String {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let log = node.log_text();
        let id = log
            .lines()
            .filter(|l| l.contains("delay queue node started"))
            .find_map(|l| l.split("node_id=").nth(1))
            .and_then(|rest| rest.get(..36));
        if let Some(id) = id {
            return id.to_string();
        }
        assert!(Instant::now() < until, "no node ID logged:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Broker {
    /// Start on `port`, advertising `advertised` in its metadata (a proxy
    /// of the test's own in front of it): a client bootstrapped on either
    /// port then makes every further connection through the proxy.
    pub fn start_advertising(port: u16, advertised: u16) -> Broker {
        let child = Command::new(tansu_path())
            .args(["broker", "--storage-engine", "memory://tansu/"])
            .args(["--listener-url", &format!("tcp://127.0.0.1:{port}")])
            .arg("--advertised-listener-url")
            .arg(format!("tcp://127.0.0.1:{advertised}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tansu");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "tansu did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Broker {
            child,
            port,
            forward: None,
        }
    }
}
