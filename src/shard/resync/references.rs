//! `DELETE /timers/references` (seed 003), served: the body's
//! `(ID, ReplicaIndex)` pairs, parsed in slices, each marked on the shard
//! that owns the ID; a copy every new replica knows is dropped. At most
//! `REFERENCES_MAX` IDs per request.

use crate::cluster::NODES_MAX;
use crate::runtime::bulk::{self, Pacer};
use crate::shard::mesh::{MeshMsg, Reply};
use crate::shard::Shard;
use crate::stats::ShardStats;
use crate::timer::spec;
use crate::timer::{shard_of, TimerId};

/// IDs per `DELETE /timers/references`.
pub const REFERENCES_MAX: usize = 100_000;
/// IDs of a `DELETE /timers/references` marked per look at the clock.
const MARK_SLICE: usize = 256;

impl Shard {
    /// `DELETE /timers/references`: `{"IDs": [{"ID": id, "ReplicaIndex": n}]}`.
    /// Each pair is marked on the shard that owns the ID. `Err` is a 400
    /// reason.
    pub async fn resync_references(&self, body: &[u8]) -> Result<usize, String> {
        bulk::metered(self.references(body)).await
    }

    /// [`Shard::resync_references`], marked in slices of `MARK_SLICE` IDs
    /// (on other shards too) with a breath once a stretch is used up.
    async fn references(&self, body: &[u8]) -> Result<usize, String> {
        let mut pacer = Pacer::new();
        let refs = parse_references(body, &mut pacer).await?;
        let mut by_shard: Vec<Vec<(u64, u8)>> = vec![Vec::new(); self.base.shards];
        for (unique, index) in refs {
            by_shard[shard_of(unique, self.base.shards)].push((unique, index));
        }
        let mut marked = 0;
        for (owner, list) in by_shard.into_iter().enumerate() {
            for slice in list.chunks(MARK_SLICE) {
                pacer.tick().await;
                if owner == self.base.id {
                    marked += self.mark_references(slice);
                    continue;
                }
                let list = slice.to_vec();
                let asked = self
                    .base
                    .mesh
                    .ask(owner, |reply| MeshMsg::MarkReferences { list, reply });
                if let Some(Reply::Marked(n)) = asked.await {
                    marked += n;
                }
                pacer.restart();
            }
        }
        Ok(marked)
    }

    /// Seed 003: mark that the new replica at `index`, and every one above
    /// it, knows each timer. A copy every new replica knows (`index` 0) is
    /// dropped when it is informational, or held under an old view by a
    /// node that is not one of its new replicas (it would only pop twice).
    pub fn mark_references(&self, list: &[(u64, u8)]) -> usize {
        let view = self.timers.view();
        let cluster = self.timers.cluster();
        let mut store = self.timers.store.borrow_mut();
        let mut marked = 0;
        for &(unique, index) in list {
            assert_eq!(
                shard_of(unique, self.base.shards),
                self.base.id,
                "marked on its owner"
            );
            if let Some(t) = store
                .get_mut(unique)
                .filter(|t| t.view != view && !t.is_tombstone())
            {
                t.set_informed(t.informed().min(index));
                marked += 1;
                let mut replicas = [0usize; NODES_MAX];
                let n = cluster.replicas_into(unique, t.factor_requested() as usize, &mut replicas);
                let new_replica = cluster.local.is_some_and(|me| replicas[..n].contains(&me));
                if t.informed() == 0 && !new_replica {
                    store.remove(unique, self.durable.log());
                }
            }
            if let Some(i) = store.info_mut(unique) {
                i.set_informed(i.informed().min(index));
                if i.informed() == 0 {
                    store.drop_info(unique);
                }
            }
        }
        ShardStats::add(&self.base.my_stats().resync_references, marked as u64);
        self.refresh_gauges(&store);
        marked
    }
}

/// [`parse_references`] without breaths, for a caller outside an executor
/// (the fuzz target): the same parse, ready at the first poll.
pub fn parse_references_now(body: &[u8]) -> Result<Vec<(u64, u8)>, String> {
    futures_lite::future::block_on(parse_references(body, &mut Pacer::unpaced()))
}

/// The `(unique ID, ReplicaIndex)` pairs of a `DELETE /timers/references`
/// body (up to a few MB): split into entries in slices, each parsed on its
/// own, with a breath whenever `pacer`'s stretch is used up.
pub async fn parse_references(body: &[u8], pacer: &mut Pacer) -> Result<Vec<(u64, u8)>, String> {
    #[derive(serde::Deserialize)]
    struct Rest {
        #[serde(rename = "IDs")]
        ids: Vec<serde::de::IgnoredAny>,
    }
    #[derive(serde::Deserialize)]
    struct Entry<'a> {
        #[serde(rename = "ID", borrow)]
        id: std::borrow::Cow<'a, str>,
        #[serde(rename = "ReplicaIndex", deserialize_with = "spec::integer")]
        replica_index: u32,
    }
    let bad = |e: &dyn std::fmt::Display| {
        format!("expected {{\"IDs\": [{{\"ID\": id, \"ReplicaIndex\": n}}]}}: {e}")
    };
    let (entries, rest) = bulk::parse_array::<Entry>(body, "IDs", pacer)
        .await
        .map_err(|e| bad(&e))?;
    let rest: Rest = serde_json::from_slice(&rest).map_err(|e| bad(&e))?;
    if !rest.ids.is_empty() {
        return Err(bad(&"an IDs key spelled with escapes"));
    }
    if entries.len() > REFERENCES_MAX {
        return Err(format!("at most {REFERENCES_MAX} IDs per request"));
    }
    let mut out = Vec::with_capacity(entries.len());
    for e in &entries {
        let id = TimerId::parse(e.id.as_bytes())
            .ok_or_else(|| format!("{:?} is not a timer ID (32 hex digits)", e.id))?;
        if e.replica_index >= NODES_MAX as u32 {
            return Err(format!("ReplicaIndex {} is out of range", e.replica_index));
        }
        out.push((id.unique, e.replica_index as u8));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn references(body: &[u8]) -> Result<Vec<(u64, u8)>, String> {
        let mut pacer = Pacer::new();
        glommio::LocalExecutor::default().run(parse_references(body, &mut pacer))
    }

    #[test]
    fn references_keep_the_replica_index() {
        let id = "0123456789abcdef0000000000000001";
        let body = format!(r#"{{"IDs":[{{"ID":"{id}","ReplicaIndex":1}}]}}"#);
        assert_eq!(
            references(body.as_bytes()).unwrap(),
            vec![(0x0123456789abcdef, 1)]
        );
        let spaced = format!(
            r#" {{ "IDs" : [ {{"ReplicaIndex":0, "ID":"{id}"}} , {{"ID":"{id}","ReplicaIndex":2}} ] }} "#
        );
        assert_eq!(
            references(spaced.as_bytes()).unwrap(),
            vec![(0x0123456789abcdef, 0), (0x0123456789abcdef, 2)]
        );
        assert_eq!(references(br#"{"IDs":[]}"#).unwrap(), vec![]);
        let bad = format!(r#"{{"IDs":[{{"ID":"{id}","ReplicaIndex":64}}]}}"#);
        assert!(references(bad.as_bytes()).is_err());
        for bad in [
            &b"{}"[..],
            b"{\"IDs\":[1]}",
            b"{\"IDs\":[]",
            b"[]",
            b"{\"IDs\":[],\"IDs\":[]}",
        ] {
            assert!(references(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
