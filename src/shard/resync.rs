//! The serving side of resynchronisation (seeds 000 and 003):
//! `GET /timers?node-for-replicas=..&cluster-view-id=..[&time-from=..]` with
//! `Range: N`, and `DELETE /timers/references`.
//!
//! A GET lists, in pop-time order, the timers this node holds under an
//! older cluster view whose replicas under the current view include the
//! requesting node, with their new replica list and view. Timers already
//! under the current view are passed over, so in a stable cluster the
//! answer is empty.

use super::mesh::{MeshMsg, Reply};
use super::Shard;
use crate::cluster::{Cluster, NODES_MAX};
use crate::http::uri::percent_decode;
use crate::runtime::clock;
use crate::timer::{shard_of, TimerId};

/// Timers per GET when the request has no `Range`.
pub const RANGE_DEFAULT: usize = 100;
/// The largest `Range` honoured.
pub const RANGE_MAX: usize = 10_000;
/// IDs per `DELETE /timers/references`.
pub const REFERENCES_MAX: usize = 100_000;

/// A validated resync GET.
#[derive(Clone, Copy, Debug)]
pub struct Query {
    /// The requesting node's index in the cluster's members.
    pub node: usize,
    /// Engine-clock ms: only timers due at or after this.
    pub from_ms: u64,
    pub limit: usize,
}

impl Shard {
    /// Check a resync GET against this shard's cluster view.
    pub fn resync_query(&self, query: &str, range: Option<&[u8]>) -> Result<Query, (u16, String)> {
        parse_query(&self.cluster(), query, range)
    }
}

/// Check a resync GET: `Err((status, reason))` as seed 000 specifies (400
/// for a missing or mismatched parameter, 404 for an unknown node).
pub fn parse_query(
    cluster: &Cluster,
    query: &str,
    range: Option<&[u8]>,
) -> Result<Query, (u16, String)> {
    let mut node = None;
    let mut view = None;
    let mut time_from = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v).ok_or((400, format!("{k}: bad percent-encoding")))?;
        match k {
            "node-for-replicas" => node = Some(v),
            "cluster-view-id" => view = Some(v),
            "time-from" => time_from = Some(v),
            _ => {}
        }
    }
    let node = node.ok_or((400, "missing node-for-replicas".to_string()))?;
    let view = view.ok_or((400, "missing cluster-view-id".to_string()))?;
    let index = cluster
        .nodes
        .iter()
        .position(|n| n.address == node)
        .ok_or((404, format!("{node} is not a node of this cluster")))?;
    if view != cluster.view_id_string() {
        return Err((
            400,
            format!(
                "cluster-view-id {view} does not match this node's {}",
                cluster.view_id
            ),
        ));
    }
    let from_ms = match time_from {
        None => 0,
        Some(t) => {
            let us: u64 = t
                .parse()
                .map_err(|_| (400, format!("time-from {t:?} is not µs since the epoch")))?;
            // Wall clock to engine clock.
            let ahead_ms = (us / 1000) as i64 - clock::unix_ms() as i64;
            (clock::now_ms() as i64 + ahead_ms).max(0) as u64
        }
    };
    let limit = match range {
        None => RANGE_DEFAULT,
        Some(r) => {
            let text = std::str::from_utf8(r).unwrap_or("").trim();
            // `Range: 100` (seed 000), tolerating a unit prefix.
            let digits = text.rsplit(['=', ' ']).next().unwrap_or(text);
            digits
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or((400, format!("Range {text:?} is not a positive count")))?
                .min(RANGE_MAX)
        }
    };
    assert!((1..=RANGE_MAX).contains(&limit) && index < cluster.nodes.len());
    Ok(Query {
        node: index,
        from_ms,
        limit,
    })
}

impl Shard {
    /// This shard's answer: up to `limit + 1` entries `(due, JSON)`.
    pub fn resync_local(&self, q: Query) -> Vec<(u64, String)> {
        let store = self.store.borrow();
        let cluster = self.cluster();
        let view = self.view();
        let is_replica = |unique: u64, factor: u8| {
            let mut out = [0usize; NODES_MAX];
            let n = cluster.replicas_into(unique, factor as usize, &mut out);
            out[..n].contains(&q.node)
        };
        let found = store.earliest_where(q.from_ms, q.limit + 1, |t| {
            !t.is_tombstone() && t.view != view && is_replica(t.unique, t.replication_factor)
        });
        let now_ms = clock::now_ms() as i64;
        let now_unix = clock::unix_ms() as i64;
        found
            .into_iter()
            .map(|(due, t)| {
                let mut replicas = [0usize; NODES_MAX];
                let n =
                    cluster.replicas_into(t.unique, t.replication_factor as usize, &mut replicas);
                let id = TimerId {
                    unique: t.unique,
                    bloom: cluster.bloom_of(&replicas[..n]),
                };
                let old: Vec<&str> = cluster
                    .all_nodes()
                    .filter(|node| node.bloom & !t.bloom == 0)
                    .map(|node| node.address.as_str())
                    .collect();
                let new: Vec<&str> = replicas[..n]
                    .iter()
                    .map(|&r| cluster.nodes[r].address.as_str())
                    .collect();
                // Seed 000: ms since the epoch, modulo UINT_MAX.
                let start_unix = (now_unix - (now_ms - t.start_ms as i64)).max(0) as u64;
                let entry = serde_json::json!({
                    "TimerID": id.to_hex_string(),
                    "OldReplicas": old,
                    "Timer": {
                        "timing": {
                            "start-time": start_unix % u32::MAX as u64,
                            "sequence-number": t.sequence,
                            "interval": t.interval_ms as f64 / 1000.0,
                            "repeat-for": t.repeat_for_ms as f64 / 1000.0,
                        },
                        "callback": {"http": {"uri": t.uri(), "opaque": t.opaque()}},
                        "reliability": {
                            "cluster-view-id": cluster.view_id_string(),
                            "replicas": new,
                        },
                    },
                });
                (due, entry.to_string())
            })
            .collect()
    }

    /// The whole node's answer: `(status, Content-Range count, body)`.
    pub async fn resync_get(&self, q: Query) -> (u16, usize, String) {
        let mut all = self.resync_local(q);
        for peer in 0..self.shards {
            if peer == self.id {
                continue;
            }
            if let Some(Reply::Resync(list)) = self
                .mesh
                .ask(peer, |reply| MeshMsg::Resync { query: q, reply })
                .await
            {
                all.extend(list);
            }
        }
        all.sort_by_key(|(due, _)| *due);
        let more = all.len() > q.limit;
        all.truncate(q.limit);
        assert!(all.len() <= q.limit && all.windows(2).all(|w| w[0].0 <= w[1].0));
        let mut body = String::from("{\"timers\":[");
        for (i, (_, entry)) in all.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(entry);
        }
        body.push_str("]}");
        (if more { 206 } else { 200 }, all.len(), body)
    }

    /// `DELETE /timers/references`: `{"IDs": [{"ID": id, "ReplicaIndex": n}]}`.
    /// Each ID whose every new replica now knows the timer (replica index 0)
    /// and that this node holds under an old view without being one of its
    /// new replicas is dropped here. `Err` is a 400 reason.
    pub async fn resync_references(&self, body: &[u8]) -> Result<usize, String> {
        assert!(self.id < self.shards);
        let done = parse_references(body)?;
        let mut dropped = 0;
        for unique in done {
            let owner = shard_of(unique, self.shards);
            if owner == self.id {
                dropped += self.drop_reference(unique) as usize;
            } else if let Some(Reply::Dropped(d)) = self
                .mesh
                .ask(owner, |reply| MeshMsg::DropReference { unique, reply })
                .await
            {
                dropped += d as usize;
            }
        }
        Ok(dropped)
    }

    /// Drop this node's old-view copy of a timer whose new replicas all
    /// know it, unless this node is one of them.
    pub fn drop_reference(&self, unique: u64) -> bool {
        let mut store = self.store.borrow_mut();
        let Some((_, t)) = store.get(unique) else {
            return false;
        };
        if t.view == self.view() {
            return false;
        }
        let me = self.cluster().local;
        let mut replicas = [0usize; NODES_MAX];
        let n = self
            .cluster()
            .replicas_into(unique, t.replication_factor as usize, &mut replicas);
        if me.is_some_and(|m| replicas[..n].contains(&m)) {
            return false;
        }
        let dropped = store.remove(unique);
        assert!(
            dropped.is_some_and(|t| t.view != self.view()),
            "only an old-view copy is dropped"
        );
        self.refresh_gauges(&store);
        true
    }
}

/// The unique IDs a `DELETE /timers/references` body releases: the entries
/// with `ReplicaIndex` 0 (seed 000).
pub fn parse_references(body: &[u8]) -> Result<Vec<u64>, String> {
    #[derive(serde::Deserialize)]
    struct Body {
        #[serde(rename = "IDs")]
        ids: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(rename = "ID")]
        id: String,
        #[serde(rename = "ReplicaIndex")]
        replica_index: u32,
    }
    let parsed: Body = serde_json::from_slice(body)
        .map_err(|e| format!("expected {{\"IDs\": [{{\"ID\": id, \"ReplicaIndex\": n}}]}}: {e}"))?;
    if parsed.ids.len() > REFERENCES_MAX {
        return Err(format!("at most {REFERENCES_MAX} IDs per request"));
    }
    let mut done = Vec::with_capacity(parsed.ids.len());
    for e in &parsed.ids {
        let id = TimerId::parse(e.id.as_bytes())
            .ok_or_else(|| format!("{:?} is not a timer ID (32 hex digits)", e.id))?;
        if e.replica_index == 0 {
            done.push(id.unique);
        }
    }
    Ok(done)
}
