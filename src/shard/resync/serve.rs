//! The serving side's pages: each shard's part of a page for a `Query`
//! (read from its session), the entries as JSON, and the whole node's page
//! merged from every shard's part. Bounded in timers (`Range`, at most
//! `RANGE_MAX`) and bytes (`PAGE_BYTES_MAX`, at least one timer).

use super::query::{parse_query, Cursor, Query, ShardPage};
use super::session::Listed;
use crate::cluster::replicate::encode_body;
use crate::cluster::NODES_MAX;
use crate::runtime::bulk::{self, Pacer};
use crate::runtime::clock;
use crate::shard::mesh::{MeshMsg, Reply};
use crate::shard::replication::body_of;
use crate::shard::Shard;
use crate::stats::ShardStats;
use crate::timer::spec::TAGS_MAX;
use crate::timer::{Timer, TimerId};
use std::collections::HashSet;
use std::rc::Rc;

/// Bytes of timer entries per page (a page holds at least one).
pub const PAGE_BYTES_MAX: usize = 1024 * 1024;
/// Session keys a page looks at (the ones it skips included).
pub const EXAMINED_PER_PAGE_MAX: usize = 65_536;

/// Session keys a page prefetches the slab entries of ahead of the one
/// it encodes (each is a cache miss in a store of a million timers).
const PREFETCH_AHEAD: usize = 8;

impl Shard {
    /// Check a resync GET against this shard's cluster view.
    pub fn resync_query(&self, query: &str, range: Option<&[u8]>) -> Result<Query, (u16, String)> {
        parse_query(&self.timers.cluster(), query, range)
    }

    /// This shard's part of a page for `q` (its stretches measured).
    pub async fn resync_local(self: &Rc<Self>, q: Query) -> ShardPage {
        bulk::metered(self.resync_part(q)).await
    }

    async fn resync_part(self: &Rc<Self>, q: Query) -> ShardPage {
        let keys = self.session_keys(&q).await;
        let mut pacer = Pacer::new();
        let start = match q.cursor {
            Some(c) => keys.partition_point(|k| k.at <= c),
            None => keys.partition_point(|k| k.at.due_ms < q.from_ms),
        };
        let mut entries = Vec::new();
        // A timer seen twice by the scan (moved between its slices, at
        // another due time) is listed once per page.
        let mut on_page: HashSet<u64> = HashSet::new();
        let mut bytes = 0;
        for (examined, key) in keys[start..].iter().enumerate() {
            let full = entries.len() >= q.limit || bytes >= PAGE_BYTES_MAX;
            if full || examined >= EXAMINED_PER_PAGE_MAX {
                // A page takes at least one key: `limit` is positive.
                assert!(examined > 0, "a page looks at a key before it is full");
                let looked_to = Some(keys[start + examined - 1].at);
                return ShardPage { entries, looked_to };
            }
            if let Some(ahead) = keys.get(start + examined + PREFETCH_AHEAD) {
                self.timers.store.borrow().prefetch(ahead.slab);
            }
            let fresh = on_page.insert(key.at.unique);
            if let Some(entry) = fresh.then(|| self.entry_json(key, &q)).flatten() {
                bytes += entry.len();
                entries.push((key.at, entry));
            }
            pacer.tick().await;
        }
        ShardPage {
            entries,
            looked_to: None,
        }
    }

    /// The GET entry for one timer, if it is (still) listable: the wheel
    /// copy, else an informational one.
    fn entry_json(&self, key: &Listed, q: &Query) -> Option<Vec<u8>> {
        let unique = key.at.unique;
        let cluster = self.timers.cluster();
        let store = self.timers.store.borrow();
        let wheel = store.get_at(key.slab, unique).map(|(_, t)| t);
        let mut replicas = [0usize; NODES_MAX];
        let mut n = 0;
        let mut listable = |t: &Timer| {
            n = self.listable(&cluster, t, q, &mut replicas)?.1;
            Some(())
        };
        let t = match wheel.filter(|t| listable(t).is_some()) {
            Some(t) => t,
            // The informational copy, when the wheel holds no live copy of
            // the incarnation (seed 003: a copy under the current view is
            // this node's answer, and the requester gets it from the
            // replication of whoever moved it).
            None => store
                .info(unique)
                .filter(|i| wheel.is_none_or(|w| w.is_tombstone() && w.version == i.version))
                .filter(|i| listable(i).is_some())?,
        };
        let new: Vec<&str> = replicas[..n]
            .iter()
            .map(|&r| cluster.nodes[r].address.as_str())
            .collect();
        let old: Vec<&str> = cluster
            .rank_among(unique, cluster.bloom_matches(t.bloom))
            .into_iter()
            .map(|p| cluster.node_at(p).address.as_str())
            .collect();
        let mut tags = [("", 0u32); TAGS_MAX];
        let tag_count = store.tag_pairs(t, &mut tags);
        let sites = self.base.resolved.sites.names(t.sites);
        let callback = (t.uri(), t.opaque(), t.ext());
        let tags = &tags[..tag_count];
        let mut body = body_of(&t.head(), callback, tags, &new, &sites, cluster.view_id);
        let start_unix_ms = clock::unix_ms() as i64 + body.start_time_delta_ms;
        body.start_time_unix_ms = Some(start_unix_ms.max(0) as u64);
        // A pop being retried: its new replicas watch it.
        body.attempt = self.attempt_of(unique, t.version);
        let id = TimerId {
            unique,
            bloom: cluster.bloom_of(&replicas[..n]),
        };
        let mut out = Vec::with_capacity(256 + t.uri().len() + t.opaque().len());
        out.extend_from_slice(b"{\"TimerID\":\"");
        out.extend_from_slice(&id.to_hex());
        out.extend_from_slice(b"\",\"OldReplicas\":");
        serde_json::to_writer(&mut out, &old).expect("writing to a Vec");
        out.extend_from_slice(b",\"Timer\":");
        encode_body(&mut out, &body);
        out.push(b'}');
        ShardStats::add(&self.base.my_stats().resync_served, 1);
        // Bytes, not a `String`: they go to the socket as they are, and
        // checking a page's megabyte as UTF-8 cost ~2% of a resync's CPU.
        Some(out)
    }

    /// The whole node's page: `(status, Content-Range count, body)`. The
    /// body is `{"timers": [...]}`, plus `"cursor"` when more follow.
    pub async fn resync_get(self: &Rc<Self>, q: Query) -> (u16, usize, Vec<u8>) {
        // Every shard builds its part at the same time, each on its own
        // core: a listing's first page (a session scan of every shard)
        // costs the slowest shard's scan, not the sum of them, against the
        // requester's resync-timeout-ms.
        let asks: Vec<_> = (0..self.base.shards)
            .filter(|p| *p != self.base.id)
            .map(|peer| {
                let me = self.clone();
                crate::runtime::spawn::spawn_local(async move {
                    let part = me
                        .base
                        .mesh
                        .ask(peer, |reply| MeshMsg::Resync { query: q, reply });
                    match part.await {
                        Some(Reply::Resync(part)) => Some(part),
                        _ => None,
                    }
                })
            })
            .collect();
        let mut parts = vec![self.resync_local(q).await];
        for ask in asks {
            parts.extend(ask.await);
        }
        let page = bulk::timed(|| page_body(parts, q.limit));
        (if page.1 { 206 } else { 200 }, page.0, page.2)
    }
}

/// The page of `parts`: `(entries, whether more follow, body)`.
fn page_body(parts: Vec<ShardPage>, limit: usize) -> (usize, bool, Vec<u8>) {
    let (entries, next) = merge_pages(parts, limit);
    let bytes: usize = entries.iter().map(|(_, e)| e.len() + 1).sum();
    let mut body = Vec::with_capacity(64 + bytes);
    body.extend_from_slice(b"{\"timers\":[");
    for (i, (_, entry)) in entries.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(entry);
    }
    body.push(b']');
    if let Some(c) = next {
        body.extend_from_slice(b",\"cursor\":\"");
        body.extend_from_slice(c.to_text().as_bytes());
        body.push(b'"');
    }
    body.push(b'}');
    (entries.len(), next.is_some(), body)
}

/// Merge the shards' parts into one page of at most `limit` entries and
/// about `PAGE_BYTES_MAX` bytes; the cursor to continue from, if more
/// follow. Entries beyond the least position every shard looked to are
/// held back: a shard may have more before them.
pub fn merge_pages(
    parts: Vec<ShardPage>,
    limit: usize,
) -> (Vec<(Cursor, Vec<u8>)>, Option<Cursor>) {
    assert!(limit >= 1, "a page takes at least one timer");
    let bound = parts.iter().filter_map(|p| p.looked_to).min();
    let mut all: Vec<(Cursor, Vec<u8>)> = parts
        .into_iter()
        .flat_map(|p| p.entries)
        .filter(|(k, _)| bound.is_none_or(|b| *k <= b))
        .collect();
    all.sort_unstable_by_key(|(k, _)| *k);
    // Shards own disjoint IDs and each lists a position once; a repeat is
    // dropped rather than trusted.
    all.dedup_by_key(|(k, _)| *k);
    let mut bytes = 0;
    let mut take = 0;
    for (_, entry) in &all {
        if take == limit || (take > 0 && bytes + entry.len() > PAGE_BYTES_MAX) {
            break;
        }
        bytes += entry.len();
        take += 1;
    }
    let truncated = take < all.len();
    all.truncate(take);
    let next = match (truncated, bound) {
        (true, _) => all.last().map(|(k, _)| *k),
        (false, Some(b)) => Some(b),
        (false, None) => None,
    };
    assert!(
        all.len() <= limit && all.windows(2).all(|w| w[0].0 < w[1].0),
        "a page within its bound, in ID order, without repeats"
    );
    (all, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(due_ms: u64, unique: u64) -> Cursor {
        Cursor { due_ms, unique }
    }

    fn part(keys: &[(u64, u64)], looked_to: Option<(u64, u64)>) -> ShardPage {
        ShardPage {
            entries: keys
                .iter()
                .map(|&(d, u)| (key(d, u), format!("e{u}").into_bytes()))
                .collect(),
            looked_to: looked_to.map(|(d, u)| key(d, u)),
        }
    }

    #[test]
    fn merge_table() {
        // (parts, limit) -> (entries taken, next cursor)
        type Case = (Vec<ShardPage>, usize, Vec<u64>, Option<Cursor>);
        let cases: Vec<Case> = vec![
            // Both exhausted, fewer than the limit: done.
            (
                vec![part(&[(1, 1), (3, 3)], None), part(&[(2, 2)], None)],
                10,
                vec![1, 2, 3],
                None,
            ),
            // The limit cuts: continue after the last taken.
            (
                vec![part(&[(1, 1), (3, 3)], None), part(&[(2, 2)], None)],
                2,
                vec![1, 2],
                Some(key(2, 2)),
            ),
            // A shard stopped at (2,2): nothing beyond it yet.
            (
                vec![part(&[(1, 1), (3, 3)], None), part(&[(2, 2)], Some((2, 2)))],
                10,
                vec![1, 2],
                Some(key(2, 2)),
            ),
            // A shard that looked far but found nothing holds the page back.
            (
                vec![part(&[(5, 5)], None), part(&[], Some((4, 0)))],
                10,
                vec![],
                Some(key(4, 0)),
            ),
            // Ties on due are broken by ID.
            (
                vec![part(&[(7, 2)], None), part(&[(7, 1)], None)],
                1,
                vec![1],
                Some(key(7, 1)),
            ),
        ];
        for (i, (parts, limit, want, next)) in cases.into_iter().enumerate() {
            let (got, got_next) = merge_pages(parts, limit);
            let ids: Vec<u64> = got.iter().map(|(k, _)| k.unique).collect();
            assert_eq!((ids, got_next), (want, next), "case {i}");
        }
    }
}
