//! `GET /timers/<id>` (issue 42): a timer as a client would write it
//! (`timing`, `callback`, `reliability`, `statistics`), with what only
//! the node knows beside it: its next pop (`next-pop`: `at` in RFC 3339,
//! `unix-ms`, the `sequence` its `X-Sequence-Number` will carry, or
//! `null` once no pop is left), the pops done, its replicas under the
//! current view and its sites.
//!
//! The copy is read on its owner shard (over the mesh from any other)
//! and rendered there; a node that holds none asks the nodes the ID names
//! (`api/lookup.rs`). The body is not a replication body: it names no
//! `reliability.replicas`, so a client may `PUT` it back as it is.

pub use super::mesh::Found;
use super::mesh::{MeshMsg, Reply};
use super::store::Store;
use super::Shard;
use crate::cluster::Node;
use crate::runtime::clock;
use crate::timer::retry::{Outcome, RetryPolicy};
use crate::timer::spec::TAGS_MAX;
use crate::timer::timing::{TimingKind, TimingRef};
use crate::timer::{shard_of, Timer, TimerId, TimerSpec};
use serde_json::{json, Value};

impl Shard {
    /// The timer `id` as this node holds it, read on its owner shard.
    pub async fn look_up(&self, id: TimerId) -> Found {
        let owner = shard_of(id.unique, self.base.shards);
        if owner == self.base.id {
            return self.look_up_here(id.unique);
        }
        let unique = id.unique;
        let asked = self
            .base
            .mesh
            .ask(owner, |reply| MeshMsg::LookUp { unique, reply });
        match asked.await {
            Some(Reply::Found(found)) => found,
            _ => Found::Absent,
        }
    }

    /// The timer `unique` in this shard's store (its owner's).
    pub fn look_up_here(&self, unique: u64) -> Found {
        let store = self.timers.store.borrow();
        let retried = self.retries.first_of(unique);
        // A one-shot timer's pop still being retried: its tombstone (or
        // none, once that expired) stands beside a live pop.
        let stored = store.get(unique).map(|(_, t)| t);
        let retried = retried.filter(|r| stored.is_none_or(|t| t.version == r.version));
        match (stored, retried) {
            (Some(t), _) if !t.is_tombstone() => Found::Live(self.describe(&store, t).to_string()),
            (_, Some(r)) => Found::Live(self.describe(&store, &r).to_string()),
            (Some(_), None) => Found::Deleted,
            (None, None) => Found::Absent,
        }
    }

    /// The other nodes that may hold a copy of `id`: the ones its ID
    /// names, and its replicas under this view and the one before.
    pub fn look_up_peers(&self, id: TimerId) -> Vec<Node> {
        let cluster = self.timers.cluster();
        let mask = self.without_me(self.holders(id, 0));
        cluster
            .all_nodes()
            .enumerate()
            .filter(|(i, _)| *i < 64 && mask & (1u64 << i) != 0)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// The client's fields (`timing`, `callback`, `reliability`,
    /// `statistics`) of `spec` as [`Shard::describe`] writes a stored
    /// copy's, tags in name order: what an `Idempotency-Key`'s second
    /// request is compared by.
    pub fn client_fields(&self, spec: &TimerSpec) -> Value {
        let mut tags: Vec<(&str, u32)> = spec.tags.iter().map(|(n, c)| (n.as_ref(), *c)).collect();
        tags.sort_unstable(); // by name, then count: as the stored side is sorted
        let tag_info: Vec<Value> = tags
            .iter()
            .map(|(name, count)| json!({"type": name, "count": count}))
            .collect();
        json!({
            "timing": timing_json(spec.interval_ms, spec.repeat_for_ms, spec.timing.as_deref().map(|t| t.to_ref(0))),
            "callback": callback_json(&spec.uri, &spec.opaque, spec.delivery.as_ref().map(|d| (d.retry, d.dead_letter.as_ref()))),
            "reliability": {"replication-factor": self.factor_requested(spec).max(1)},
            "statistics": {"tag-info": tag_info},
        })
    }

    /// The ID a client's create or update of `unique` gets under the
    /// current view (its filter names the replicas it is placed on).
    pub fn placed_id(&self, unique: u64, spec: &TimerSpec) -> TimerId {
        let pl = self.placement(unique, self.factor_requested(spec) as usize);
        TimerId {
            unique,
            bloom: pl.bloom,
        }
    }

    /// The answer's JSON for the live copy `t`.
    fn describe(&self, store: &Store, t: &Timer) -> Value {
        let mut tags = [("", 0u32); TAGS_MAX];
        let n = store.tag_pairs(t, &mut tags);
        let tag_info: Vec<Value> = tags[..n]
            .iter()
            .map(|(name, count)| json!({"type": name, "count": count}))
            .collect();
        let factor = t.factor_requested().max(t.replication_factor()).max(1);
        let cluster = self.timers.cluster();
        let replicas: Vec<&str> = self
            .placement(t.unique, factor as usize)
            .members()
            .iter()
            .map(|&r| cluster.node_at(r).address.as_str())
            .collect();
        let sites: Vec<&str> = self.base.resolved.sites.names(t.sites).to_vec();
        json!({
            "id": t.id().to_hex_string(),
            "timing": timing_json(t.interval_ms, t.repeat_for_ms, t.timing()),
            "callback": callback_json(t.uri(), t.opaque(), t.delivery().map(|d| (d.retry, d.dead_letter))),
            "reliability": {"replication-factor": factor},
            "statistics": {"tag-info": tag_info},
            "next-pop": next_pop(t),
            "pops-done": t.sequence,
            "replicas": replicas,
            "sites": sites,
            "delivery": self.delivery_json(t),
        })
    }

    /// `delivery`: the pops of `t`'s incarnation being retried here (its
    /// owner shard), or watched while another replica retries them.
    fn delivery_json(&self, t: &Timer) -> Value {
        let mut pops = Vec::new();
        self.retries.each_of(t.unique, |e| {
            if e.timer.version != t.version {
                return;
            }
            let at = jiff::Timestamp::from_millisecond(e.next_unix_ms as i64)
                .map(|ts| ts.to_string())
                .unwrap_or_default();
            pops.push(json!({
                "sequence": e.timer.sequence,
                "attempts": e.attempts,
                "next-attempt": at,
                "last-outcome": outcome_text(e.last),
                "sender": if e.owned { "this node" } else { "another replica" },
            }));
        });
        pops.sort_by_key(|p| p["sequence"].as_u64());
        json!({"pending": pops})
    }
}

/// `callback` as a client writes it, with its delivery policy if any.
fn callback_json(uri: &str, opaque: &str, delivery: Option<(RetryPolicy, &str)>) -> Value {
    let mut callback = json!({"http": {"uri": uri, "opaque": opaque}});
    if let Some((retry, dead_letter)) = delivery {
        let mut text = Vec::new();
        retry.write_json(&mut text);
        callback["retry"] = serde_json::from_slice(&text).expect("the policy writes JSON");
        if !dead_letter.is_empty() {
            callback["dead-letter"] = json!({"http": {"uri": dead_letter}});
        }
    }
    callback
}

/// An attempt's outcome as `last-outcome` shows it.
fn outcome_text(o: Outcome) -> Value {
    match o {
        Outcome::Status { code, .. } => json!(code),
        other => json!(other.to_string()),
    }
}

/// The timer ID's unique part for an `Idempotency-Key` (issue 42): the
/// same on every node, so a retry through any node finds the timer the
/// first request made. 64 bits of MurmurHash3 x86_128 of the key, never
/// 0; a key shares its part with another key or a generated ID about once
/// in 2^64.
pub fn idempotent_unique(key: &[u8]) -> u64 {
    let [h, _] = crate::murmur::murmur3_x86_128(key, IDEMPOTENCY_SEED);
    h.max(1)
}

/// The hash seed of [`idempotent_unique`] ("idem").
const IDEMPOTENCY_SEED: u32 = 0x6964_656d;

/// `next-pop`: when the timer's next pop is due on its first replica (the
/// others follow a skew each), or `null` when none is left.
fn next_pop(t: &Timer) -> Value {
    if !t.has_next_pop() {
        return Value::Null;
    }
    // A wall-clock or calendar timer's is exact: from its absolute start.
    let unix_ms = match t.timing() {
        Some(timing) => {
            let offset_ms = t.next_pop_ms(0).saturating_sub(t.start_ms);
            (timing.start_unix_ms.max(0) as u64).saturating_add(offset_ms)
        }
        None => clock::engine_to_unix(t.next_pop_ms(0)),
    };
    let at = jiff::Timestamp::from_millisecond(unix_ms as i64)
        .map(|ts| ts.to_string())
        .unwrap_or_default();
    json!({"at": at, "unix-ms": unix_ms, "sequence": t.sequence + 1})
}

/// `timing` as a client writes it: `interval` and `repeat-for`, or with
/// a wall-clock or calendar timing (issue 42) the keys that made it.
fn timing_json(interval_ms: u32, repeat_for_ms: u32, timing: Option<TimingRef<'_>>) -> Value {
    let Some(t) = timing else {
        return json!({"interval": seconds(interval_ms), "repeat-for": seconds(repeat_for_ms)});
    };
    match t.kind {
        TimingKind::At => json!({"at": t.text}),
        TimingKind::StartAt => json!({
            "start-at": t.text,
            "interval": seconds(interval_ms),
            "repeat-for": seconds(repeat_for_ms),
        }),
        TimingKind::Cron => json!({
            "cron": t.text,
            "time-zone": t.zone,
            "repeat-for": seconds(repeat_for_ms),
        }),
    }
}

/// A duration in ms as the codec's seconds: whole seconds as an integer,
/// others with their fraction (`1500` is `1.5`).
fn seconds(ms: u32) -> Value {
    match ms % 1000 {
        0 => json!(ms / 1000),
        _ => json!(ms as f64 / 1000.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_back_as_the_codec_wrote_them() {
        assert_eq!(seconds(0), json!(0));
        assert_eq!(seconds(3000), json!(3));
        assert_eq!(seconds(1500), json!(1.5));
        assert_eq!(seconds(1), json!(0.001));
    }
}
