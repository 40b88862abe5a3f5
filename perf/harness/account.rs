//! The queue run's accounting: where each message that did not arrive is.
//!
//! "Not delivered within the wait" is not "lost". For every message of the
//! run that never reached the harness's reader this looks, after the wait,
//! at each place it may be: the harness's own produce (acknowledged by the
//! broker, or failed, with the error), the input topic (read again from the
//! beginning: partition and offset), the node's committed offsets on the
//! input topic, and the queue table (stored, claimed by whom and when).
//! A message acknowledged by the broker, below the committed offset of its
//! partition, and neither in the table nor on the output topic is lost by
//! the node; one not yet committed is still the node's to consume (late);
//! one in the table is still the node's to publish (late).

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The harness producer's delivery reports, by the record's key (the
/// message's number in the run).
#[derive(Default)]
pub struct Acks {
    pub acked: std::sync::atomic::AtomicU64,
    /// Failed deliveries: key and error.
    pub failed: Mutex<Vec<(u64, String)>>,
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.acked
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Err((e, m)) => {
                let key = key_of(m.key());
                self.failed.lock().unwrap().push((key, e.to_string()));
            }
        }
    }
}

/// A record key as the run's message number (`u64::MAX`: not one).
pub fn key_of(key: Option<&[u8]>) -> u64 {
    key.and_then(|k| std::str::from_utf8(k).ok())
        .and_then(|k| k.parse().ok())
        .unwrap_or(u64::MAX)
}

/// Where a topic holds each message: `(partition, offset)` of every copy,
/// by key. Read from the beginning until `wanted` distinct keys were seen
/// or nothing new came for `idle`.
pub fn scan_topic(
    brokers: &str,
    topic: &str,
    partitions: u32,
    wanted: usize,
    idle: Duration,
) -> Result<HashMap<u64, Vec<(i32, i64)>>, String> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("perf_scan_{topic}"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "50")
        .create()
        .map_err(|e| e.to_string())?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .map_err(|e| e.to_string())?;
    }
    c.assign(&tpl).map_err(|e| e.to_string())?;
    let mut seen: HashMap<u64, Vec<(i32, i64)>> = HashMap::with_capacity(wanted);
    let mut last_new = Instant::now();
    while seen.len() < wanted && last_new.elapsed() < idle {
        let Some(Ok(m)) = c.poll(Duration::from_millis(100)) else {
            continue;
        };
        last_new = Instant::now();
        seen.entry(key_of(m.key()))
            .or_default()
            .push((m.partition(), m.offset()));
    }
    Ok(seen)
}

/// The offsets `group` committed on `topic` (-1: none), by partition.
pub fn committed(brokers: &str, group: &str, topic: &str, partitions: u32) -> Vec<i64> {
    let Ok(c) = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create::<BaseConsumer>()
    else {
        return vec![-1; partitions as usize];
    };
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition(topic, p);
    }
    let Ok(got) = c.committed_offsets(tpl, Duration::from_secs(10)) else {
        return vec![-1; partitions as usize];
    };
    (0..partitions as i32)
        .map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(n)) => n,
            _ => -1,
        })
        .collect()
}

/// Output of one psql statement (`-tA`), or the error.
pub fn psql(sql: &str) -> Result<String, String> {
    let out = Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "test",
            "-tAc",
            sql,
        ])
        .output()
        .map_err(|e| format!("psql: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A row left in the table: `readied_by`, `readied_at` (empty when not
/// claimed), deadline.
pub struct Row {
    pub deadline: String,
    pub readied_at: String,
    pub readied_by: String,
}

/// Every row left in `table`, by ID.
pub fn table_rows(table: &str) -> Result<HashMap<String, Row>, String> {
    let text = psql(&format!(
        "SELECT id, deadline, coalesce(readied_at::text, ''), coalesce(readied_by::text, '') FROM {table}"
    ))?;
    let mut rows = HashMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split('|').collect();
        if f.len() == 4 {
            let row = Row {
                deadline: f[1].into(),
                readied_at: f[2].into(),
                readied_by: f[3].into(),
            };
            rows.insert(f[0].to_string(), row);
        }
    }
    Ok(rows)
}

/// Keys per fate described in full.
const EXAMPLES: usize = 5;

/// What became of a message that did not arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fate {
    /// The harness's produce failed (the broker never took it).
    ProduceFailed,
    /// Acknowledged to the harness, but not on the input topic.
    NotOnInput,
    /// On the output topic after all: the harness's reader missed it.
    OnOutput,
    /// On the input topic at or past the node's committed offset: the
    /// node has not (durably) taken it yet; it is still the node's.
    NotCommitted,
    /// In the table, waiting for its deadline's claim.
    StoredWaiting,
    /// In the table, claimed (readied) and not published yet.
    StoredClaimed,
    /// Committed, not in the table, never on the output topic: lost.
    Lost,
    /// Lost as above, and the broker does not return them to a fetch
    /// from inside their record batch (tansu 0.6, [`first_offset_from`]):
    /// a consumer that resumed there (after a pause, or from a committed
    /// offset) never saw them.
    SkippedByBroker,
}

/// The run's messages that did not arrive, by fate, with a few examples.
pub struct Accounting {
    /// Each fate's input offsets, as runs.
    pub runs: Vec<String>,
    /// Where a few of each fate are.
    pub examples: Vec<String>,
    pub fates: BTreeMap<Fate, Vec<u64>>,
    pub committed: Vec<i64>,
    pub rows_left: usize,
    pub rows_claimed: usize,
    pub input_copies: usize,
    pub input_keys: usize,
    pub output_keys: usize,
    pub output_copies: usize,
    pub produce_errors: Vec<(u64, String)>,
}

/// The places a run looks for its missing messages.
pub struct Places<'a> {
    pub brokers: &'a str,
    pub input: &'a str,
    pub group: &'a str,
    pub output: &'a str,
    pub table: &'a str,
    pub partitions: u32,
    /// The message ID of key `k`.
    pub id_of: &'a dyn Fn(u64) -> String,
}

/// Account for every key of `missing` (keys `0..total` never seen on the
/// output topic).
pub fn account(
    at: &Places<'_>,
    total: u64,
    missing: &[u64],
    acks: &Acks,
) -> Result<Accounting, String> {
    let failed: HashMap<u64, String> = acks.failed.lock().unwrap().iter().cloned().collect();
    let idle = Duration::from_secs(10);
    let input = scan_topic(at.brokers, at.input, at.partitions, total as usize, idle)?;
    let output = scan_topic(at.brokers, at.output, at.partitions, total as usize, idle)?;
    let committed = committed(at.brokers, at.group, at.input, at.partitions);
    let rows = table_rows(at.table)?;
    let mut fates: BTreeMap<Fate, Vec<u64>> = BTreeMap::new();
    for &k in missing {
        let fate = if failed.contains_key(&k) {
            Fate::ProduceFailed
        } else if output.contains_key(&k) {
            Fate::OnOutput
        } else if let Some(copies) = input.get(&k) {
            let below = |&(p, o): &(i32, i64)| committed.get(p as usize).is_some_and(|&c| o < c);
            match rows.get(&(at.id_of)(k)) {
                Some(r) if !r.readied_at.is_empty() => Fate::StoredClaimed,
                Some(_) => Fate::StoredWaiting,
                None if copies.iter().any(below) => Fate::Lost,
                None => Fate::NotCommitted,
            }
        } else {
            Fate::NotOnInput
        };
        fates.entry(fate).or_default().push(k);
    }
    let skipped = broker_skips(
        at,
        &input,
        fates.get(&Fate::Lost).map_or(&[][..], Vec::as_slice),
    );
    if !skipped.is_empty() {
        let lost = fates.remove(&Fate::Lost).unwrap_or_default();
        let (by_broker, rest): (Vec<u64>, Vec<u64>) =
            lost.into_iter().partition(|k| skipped.contains(k));
        fates.insert(Fate::SkippedByBroker, by_broker);
        if !rest.is_empty() {
            fates.insert(Fate::Lost, rest);
        }
    }
    let runs: Vec<String> = fates
        .iter()
        .map(|(fate, keys)| {
            let copies = keys
                .iter()
                .filter_map(|k| input.get(k))
                .flatten()
                .copied()
                .collect();
            let runs: Vec<String> = offset_runs(copies)
                .iter()
                .map(|(p, a, b)| format!("{p}/{a}..={b}"))
                .collect();
            format!("{fate:?} at input offsets {}", runs.join(", "))
        })
        .collect();
    let mut examples: Vec<String> = Vec::new();
    for keys in fates.values() {
        for &k in keys.iter().take(EXAMPLES) {
            let id = (at.id_of)(k);
            let row = rows.get(&id).map_or("no row".to_string(), |r| {
                format!(
                    "row deadline {} readied_at {:?} by {:?}",
                    r.deadline, r.readied_at, r.readied_by
                )
            });
            examples.push(format!(
                "key {k}: produce error {:?}; input copies {:?}; output copies {:?}; {row}",
                failed.get(&k),
                input.get(&k),
                output.get(&k)
            ));
        }
    }
    Ok(Accounting {
        runs,
        examples,
        fates,
        committed,
        rows_left: rows.len(),
        rows_claimed: rows.values().filter(|r| !r.readied_at.is_empty()).count(),
        input_copies: input.values().map(Vec::len).sum(),
        input_keys: input.keys().filter(|&&k| k < total).count(),
        output_keys: output.keys().filter(|&&k| k < total).count(),
        output_copies: output.values().map(Vec::len).sum(),
        produce_errors: acks.failed.lock().unwrap().clone(),
    })
}

impl Accounting {
    /// Print it, with a few keys per fate and where they are.
    pub fn print(&self) {
        println!(
            "accounting: the input topic holds {} of the run's keys ({} copies), the output topic {} ({} copies); committed offsets {:?}; {} rows left in the table ({} claimed)",
            self.input_keys, self.input_copies, self.output_keys, self.output_copies, self.committed, self.rows_left, self.rows_claimed
        );
        let distinct: HashSet<&str> = self
            .produce_errors
            .iter()
            .map(|(_, e)| e.as_str())
            .collect();
        if !self.produce_errors.is_empty() {
            println!(
                "  harness produce failures: {} ({:?})",
                self.produce_errors.len(),
                distinct
            );
        }
        for (fate, keys) in &self.fates {
            println!("  {fate:?}: {}", keys.len());
        }
        for r in &self.runs {
            println!("    {r}");
        }
        for e in &self.examples {
            println!("    {e}");
        }
    }

    pub fn json(&self) -> serde_json::Value {
        let fates: serde_json::Map<String, serde_json::Value> = self
            .fates
            .iter()
            .map(|(f, k)| (format!("{f:?}"), serde_json::json!(k.len())))
            .collect();
        serde_json::json!({
            "fates": fates, "committed": self.committed, "rows_left": self.rows_left,
            "rows_claimed": self.rows_claimed, "input_keys": self.input_keys,
            "input_copies": self.input_copies, "output_keys": self.output_keys,
            "output_copies": self.output_copies, "produce_errors": self.produce_errors.len(),
            "examples": self.examples, "runs": self.runs,
        })
    }
}

/// The first record a fresh fetch of `partition` from `offset` returns
/// (`None`: nothing within 5 s). A Kafka broker answers a fetch from inside
/// a record batch with that whole batch (the client skips the records
/// before `offset`), so this is `offset` itself while the record exists;
/// tansu 0.6 answers with the batches that *start* at or after `offset`,
/// so from inside a batch the rest of that batch is never returned.
pub fn first_offset_from(brokers: &str, topic: &str, partition: i32, offset: i64) -> Option<i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("perf_probe_{topic}"))
        .set("enable.auto.commit", "false")
        .create()
        .ok()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
        .ok()?;
    c.assign(&tpl).ok()?;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            return Some(m.offset());
        }
    }
    None
}

/// Consecutive offsets of `copies` (partition, offset) as runs, by
/// partition: `(partition, first, last)`.
pub fn offset_runs(mut copies: Vec<(i32, i64)>) -> Vec<(i32, i64, i64)> {
    copies.sort_unstable();
    let mut runs: Vec<(i32, i64, i64)> = Vec::new();
    for (p, o) in copies {
        match runs.last_mut() {
            Some((rp, _, last)) if *rp == p && *last + 1 == o => *last = o,
            _ => runs.push((p, o, o)),
        }
    }
    runs
}

/// The keys of `lost` whose run of input offsets the broker does not
/// return to a fetch from the run's first offset.
fn broker_skips(
    at: &Places<'_>,
    input: &HashMap<u64, Vec<(i32, i64)>>,
    lost: &[u64],
) -> HashSet<u64> {
    let mut by_offset: HashMap<(i32, i64), u64> = HashMap::new();
    for &k in lost {
        for &c in input.get(&k).into_iter().flatten() {
            by_offset.insert(c, k);
        }
    }
    let mut skipped = HashSet::new();
    for (p, first, last) in offset_runs(by_offset.keys().copied().collect()) {
        let got = first_offset_from(at.brokers, at.input, p, first);
        println!(
            "  a fetch of {}/{p} from {first} returns {got:?} first (lost run {first}..={last})",
            at.input
        );
        if got.is_some_and(|o| o > first) {
            skipped.extend((first..=last).filter_map(|o| by_offset.get(&(p, o))));
        }
    }
    skipped
}
