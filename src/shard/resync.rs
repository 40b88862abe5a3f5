//! The serving side of resynchronisation (seeds 000 and 003):
//! `GET /timers?node-for-replicas=..&cluster-view-id=..[&time-from=..]` with
//! `Range: N`, and `DELETE /timers/references`.
//!
//! A GET lists, in pop-time order, the timers this node holds under an
//! older cluster view whose replicas under the current view include the
//! requesting node and that no DELETE has marked as known to it, with
//! their new replica list and view. Timers already under the current view
//! are passed over, so in a stable cluster the answer is empty. Two
//! extensions: `all-views=true` lists current-view timers too (a node that
//! restarted empty takes its replicas back), and `cursor=` continues a
//! listing exactly where the previous page ended (the answer's `cursor`).
//!
//! Cost: the first page of a listing scans the shard's store once, in
//! slices of `SCAN_SLICE` entries, letting the reactor run at least every
//! `bulk::STRETCH` (pops go on),
//! into a *session*: the matching `(due, ID)` keys, sorted, each with the
//! slab index it was seen at. Later pages binary-search the session and
//! find each timer again at its slab index (by ID when it is no longer
//! there), so a listing of `n` timers costs one scan plus `O(n log n)`,
//! not a scan per page.
//! Sessions are bounded: one per requesting node and shard, dropped after
//! `SESSION_IDLE_MS` unused. A page is bounded in timers (`Range`, at most
//! `RANGE_MAX`) and in bytes (`PAGE_BYTES_MAX`, at least one timer).

use super::mesh::{MeshMsg, Reply};
use super::replication::body_of;
use super::Shard;
use crate::cluster::replicate::encode_body;
use crate::cluster::{Cluster, NODES_MAX};
use crate::http::uri::percent_decode;
use crate::runtime::bulk::{self, Pacer};
use crate::runtime::clock;
use crate::stats::ShardStats;
use crate::timer::spec::{self, TAGS_MAX};
use crate::timer::{shard_of, Timer, TimerId};
use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

/// Timers per GET when the request has no `Range`.
pub const RANGE_DEFAULT: usize = 100;
/// The largest `Range` honoured.
pub const RANGE_MAX: usize = 10_000;
/// Bytes of timer entries per page (a page holds at least one).
pub const PAGE_BYTES_MAX: usize = 1024 * 1024;
/// IDs per `DELETE /timers/references`.
pub const REFERENCES_MAX: usize = 100_000;
/// Store entries scanned between looks at the clock while a session is
/// built (a breath follows once `bulk::STRETCH` is used up).
pub const SCAN_SLICE: usize = 512;
/// Session keys a page looks at (the ones it skips included).
pub const EXAMINED_PER_PAGE_MAX: usize = 65_536;
/// IDs of a `DELETE /timers/references` marked per look at the clock.
const MARK_SLICE: usize = 256;
/// A session unused this long is dropped.
pub const SESSION_IDLE_MS: u64 = 60_000;

/// A position in a listing: pop-time order, ties broken by ID. `due_ms`
/// is the serving node's engine clock, so a cursor is opaque elsewhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub due_ms: u64,
    pub unique: u64,
}

impl Cursor {
    pub fn to_text(self) -> String {
        format!("{}-{:016x}", self.due_ms, self.unique)
    }

    pub fn parse(text: &str) -> Option<Cursor> {
        let (due, unique) = text.split_once('-')?;
        Some(Cursor {
            due_ms: due.parse().ok()?,
            unique: u64::from_str_radix(unique, 16).ok()?,
        })
    }
}

/// A session's key: a listing position, and the slab index the scan saw
/// the timer at (`NO_SLAB` for an informational copy), so that a page
/// finds it without probing the ID index while it is still there
/// ([`crate::shard::store::Store::get_at`]). Ordered by position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Listed {
    at: Cursor,
    slab: u32,
}

/// No slab index: the key of an informational timer.
const NO_SLAB: u32 = u32::MAX;

/// Session keys a page prefetches the slab entries of ahead of the one
/// it encodes (each is a cache miss in a store of a million timers).
const PREFETCH_AHEAD: usize = 8;

/// A validated resync GET.
#[derive(Clone, Copy, Debug)]
pub struct Query {
    /// The requesting node's index in the cluster's members.
    pub node: usize,
    /// Engine-clock ms: only timers due at or after this.
    pub from_ms: u64,
    pub limit: usize,
    /// Continue after this position (a new listing when `None`).
    pub cursor: Option<Cursor>,
    /// List current-view timers too (a restarted node's restore).
    pub all_views: bool,
}

/// One shard's matching keys for one requesting node.
struct Session {
    node: usize,
    view: u32,
    all_views: bool,
    used_ms: u64,
    keys: Rc<Vec<Listed>>,
}

/// A shard's resync sessions (at most one per requesting node).
#[derive(Default)]
pub struct Sessions(RefCell<Vec<Session>>);

/// Drop the sessions `gone` picks; a session's keys (24 MB for a million
/// timers) are freed on a thread of their own when no page holds them.
fn drop_sessions(sessions: &mut Vec<Session>, mut gone: impl FnMut(&Session) -> bool) {
    let mut i = 0;
    while i < sessions.len() {
        if !gone(&sessions[i]) {
            i += 1;
            continue;
        }
        let session = sessions.swap_remove(i);
        if let Ok(keys) = Rc::try_unwrap(session.keys) {
            bulk::drop_aside(keys);
        }
    }
}

/// One shard's part of a page.
pub struct ShardPage {
    /// `(position, JSON entry)`, in order.
    pub entries: Vec<(Cursor, Vec<u8>)>,
    /// `Some(c)`: everything up to `c` was looked at and more may follow;
    /// `None`: nothing follows the entries.
    pub looked_to: Option<Cursor>,
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
    let (mut node, mut view, mut time_from, mut cursor, mut all) = (None, None, None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v).ok_or((400, format!("{k}: bad percent-encoding")))?;
        match k {
            "node-for-replicas" => node = Some(v),
            "cluster-view-id" => view = Some(v),
            "time-from" => time_from = Some(v),
            "cursor" => cursor = Some(v),
            "all-views" => all = Some(v),
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
            (clock::now_ms() as i64).saturating_add(ahead_ms).max(0) as u64
        }
    };
    let cursor = match cursor {
        None => None,
        Some(c) => Some(Cursor::parse(&c).ok_or((400, format!("cursor {c:?} is malformed")))?),
    };
    let all_views = match all.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => return Err((400, format!("all-views {other:?} is not true or false"))),
    };
    let limit = parse_range(range)?;
    assert!((1..=RANGE_MAX).contains(&limit) && index < cluster.nodes.len());
    Ok(Query {
        node: index,
        from_ms,
        limit,
        cursor,
        all_views,
    })
}

/// `Range: 100` (seed 000), tolerating a unit prefix (`timers=100`,
/// `timers = 100`, `timers 100`: letters, `_` or `-`, then `=` or spaces);
/// more than `RANGE_MAX` is `RANGE_MAX`. Exactly the OpenAPI pattern
/// `^([A-Za-z][A-Za-z_-]*( *= *| +))?0*[1-9][0-9]*$` (anything before the
/// last `=` used to pass as a prefix).
fn parse_range(range: Option<&[u8]>) -> Result<usize, (u16, String)> {
    let Some(r) = range else {
        return Ok(RANGE_DEFAULT);
    };
    let text = std::str::from_utf8(r).unwrap_or("").trim();
    let bad = || (400, format!("Range {text:?} is not a positive count"));
    let unit_end = text
        .bytes()
        .position(|b| !(b.is_ascii_alphabetic() || b == b'_' || b == b'-'))
        .unwrap_or(0);
    let digits = match text[unit_end..].trim_start_matches(' ') {
        rest if unit_end == 0 => rest,
        _ if !text.as_bytes()[0].is_ascii_alphabetic() => return Err(bad()),
        rest => match rest.strip_prefix('=') {
            Some(after) => after.trim_start_matches(' '),
            None if rest.len() < text.len() - unit_end => rest,
            None => return Err(bad()),
        },
    };
    let significant = digits.trim_start_matches('0');
    if significant.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    // All digits: a count too large for usize is still "more than the most".
    Ok(significant
        .parse::<usize>()
        .map_or(RANGE_MAX, |n| n.min(RANGE_MAX)))
}

impl Shard {
    /// The matching keys of this shard for `q`: the session's, or a new
    /// session built by a sliced scan (a listing without a cursor always
    /// starts a new one).
    async fn session_keys(self: &Rc<Self>, q: &Query) -> Rc<Vec<Listed>> {
        let view = self.view();
        let now = clock::now_ms();
        {
            let mut sessions = self.sessions.0.borrow_mut();
            drop_sessions(&mut sessions, |s| {
                now.saturating_sub(s.used_ms) >= SESSION_IDLE_MS || s.view != view
            });
            let found = sessions
                .iter_mut()
                .find(|s| s.node == q.node && s.all_views == q.all_views);
            if let (Some(s), Some(_)) = (found, q.cursor) {
                s.used_ms = now;
                return s.keys.clone();
            }
        }
        let keys = Rc::new(self.scan_matching(q).await);
        // Idle from now: a slow build must not count against the session.
        let now = clock::now_ms();
        let mut sessions = self.sessions.0.borrow_mut();
        drop_sessions(&mut sessions, |s| {
            s.node == q.node && s.all_views == q.all_views
        });
        assert!(
            sessions.len() < 2 * NODES_MAX,
            "one session per node and kind"
        );
        sessions.push(Session {
            node: q.node,
            view,
            all_views: q.all_views,
            used_ms: now,
            keys: keys.clone(),
        });
        keys
    }

    /// Scan the store (and the informational timers) in slices for the
    /// timers `q`'s node is a new replica of, sorted by position.
    async fn scan_matching(&self, q: &Query) -> Vec<Listed> {
        // Room for every timer at once: growing by doubling copied up to
        // 12 MB in one go (the pages are only touched as keys come).
        let mut keys = Vec::with_capacity(self.store.borrow().len());
        let mut next = Some(0);
        let mut pacer = Pacer::new();
        let mut replicas = [0usize; NODES_MAX];
        while let Some(from) = next {
            let cluster = self.cluster();
            next = self
                .store
                .borrow()
                .scan_slice(from, SCAN_SLICE, |slab, due, t| {
                    if self.listable(&cluster, t, q, &mut replicas).is_some() {
                        let at = Cursor {
                            due_ms: due,
                            unique: t.unique,
                        };
                        keys.push(Listed { at, slab });
                    }
                });
            pacer.tick().await;
        }
        let info_keys = self.info_keys(q, &mut pacer).await;
        if !info_keys.is_empty() {
            // A tombstone that replaced a live old-view copy after its slice
            // was scanned leaves an informational copy of the same timer:
            // the scan's key for it goes, the informational one stands in.
            let mut listed: HashSet<u64> = HashSet::with_capacity(info_keys.len());
            for slice in info_keys.chunks(SCAN_SLICE) {
                listed.extend(slice.iter().map(|k| k.at.unique));
                pacer.tick().await;
            }
            bulk::retain(&mut keys, &mut pacer, |_, k| !listed.contains(&k.at.unique)).await;
            keys.extend_from_slice(&info_keys);
        }
        // A million keys take tens of ms to sort: in chunks.
        let mut keys = bulk::sort(keys).await;
        // A timer moved within the store between slices is seen twice
        // (at another slab index, perhaps at the same position).
        bulk::retain(&mut keys, &mut pacer, |last, k| {
            last.map(|l| l.at) != Some(k.at)
        })
        .await;
        keys
    }

    /// The keys of the informational timers `q`'s node should be told of
    /// (at most `store::INFORMATIONAL_MAX` per shard), looked at in slices of `SCAN_SLICE`
    /// with a breath once `pacer`'s stretch is used up: 65,536 of them in
    /// one pass held the shard for 8 ms. A copy gone or replaced between
    /// slices is skipped, as the store scan skips what it no longer holds.
    async fn info_keys(&self, q: &Query, pacer: &mut Pacer) -> Vec<Listed> {
        // At most INFORMATIONAL_MAX IDs.
        let ids = self.store.borrow().info_ids();
        let mut keys = Vec::new();
        let mut replicas = [0usize; NODES_MAX];
        for slice in ids.chunks(SCAN_SLICE) {
            let cluster = self.cluster();
            {
                let store = self.store.borrow();
                for &unique in slice {
                    // An informational copy stands in only behind a tombstone.
                    if store.get(unique).is_some_and(|(_, w)| !w.is_tombstone()) {
                        continue;
                    }
                    let Some(t) = store.info(unique) else {
                        continue;
                    };
                    if self.listable(&cluster, t, q, &mut replicas).is_some() {
                        let due_ms = t.next_pop_ms(self.skew_ms());
                        let at = Cursor { due_ms, unique };
                        keys.push(Listed { at, slab: NO_SLAB });
                    }
                }
            }
            pacer.tick().await;
        }
        keys
    }

    /// Whether `q`'s node should be told of `t`: its index in the timer's
    /// replica list under the current view, and the length of that list
    /// (written into `replicas`), if so.
    fn listable(
        &self,
        cluster: &Cluster,
        t: &Timer,
        q: &Query,
        replicas: &mut [usize; NODES_MAX],
    ) -> Option<(u8, usize)> {
        if t.is_tombstone() || (t.view == self.view() && !q.all_views) {
            return None;
        }
        let n = cluster.replicas_into(t.unique, t.factor_requested() as usize, replicas);
        let index = replicas[..n].iter().position(|&r| r == q.node)? as u8;
        // A DELETE marked this index (and those above it) as knowing it.
        (t.view == self.view() || index < t.informed()).then_some((index, n))
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
                self.store.borrow().prefetch(ahead.slab);
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
        let cluster = self.cluster();
        let store = self.store.borrow();
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
        let sites = self.resolved.sites.names(t.sites);
        let callback = (t.uri(), t.opaque());
        let tags = &tags[..tag_count];
        let mut body = body_of(&t.head(), callback, tags, &new, &sites, cluster.view_id);
        let start_unix_ms = clock::unix_ms() as i64 + body.start_time_delta_ms;
        body.start_time_unix_ms = Some(start_unix_ms.max(0) as u64);
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
        ShardStats::add(&self.my_stats().resync_served, 1);
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
        let asks: Vec<_> = (0..self.shards)
            .filter(|p| *p != self.id)
            .map(|peer| {
                let me = self.clone();
                glommio::spawn_local(async move {
                    let part = me
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
    assert!(limit >= 1);
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
    assert!(all.len() <= limit && all.windows(2).all(|w| w[0].0 < w[1].0));
    (all, next)
}

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
        let mut by_shard: Vec<Vec<(u64, u8)>> = vec![Vec::new(); self.shards];
        for (unique, index) in refs {
            by_shard[shard_of(unique, self.shards)].push((unique, index));
        }
        let mut marked = 0;
        for (owner, list) in by_shard.into_iter().enumerate() {
            for slice in list.chunks(MARK_SLICE) {
                pacer.tick().await;
                if owner == self.id {
                    marked += self.mark_references(slice);
                    continue;
                }
                let list = slice.to_vec();
                let asked = self
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
        let view = self.view();
        let cluster = self.cluster();
        let mut store = self.store.borrow_mut();
        let mut marked = 0;
        for &(unique, index) in list {
            assert_eq!(
                shard_of(unique, self.shards),
                self.id,
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
                    store.remove(unique);
                }
            }
            if let Some(i) = store.info_mut(unique) {
                i.set_informed(i.informed().min(index));
                if i.informed() == 0 {
                    store.drop_info(unique);
                }
            }
        }
        ShardStats::add(&self.my_stats().resync_references, marked as u64);
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
    /// The Range header: a count with an optional letters-only unit prefix.
    #[test]
    fn range_header_is_exactly_the_documented_pattern() {
        assert_eq!(parse_range(None), Ok(RANGE_DEFAULT));
        for (text, n) in [
            ("7", 7),
            ("0007", 7),
            ("timers=7", 7),
            ("timers 7", 7),
            ("timers = 7", 7),
            ("x-timers=7", 7),
            ("items_per_page =7", 7),
            (" 10000 ", RANGE_MAX),
            ("999999999", RANGE_MAX),
            ("99999999999999999999999", RANGE_MAX),
        ] {
            assert_eq!(parse_range(Some(text.as_bytes())), Ok(n), "{text}");
        }
        for bad in [
            "",
            "0",
            "000",
            "-1",
            "+5",
            "1e3",
            "7x",
            "=7",
            "t1=7",
            "){L^NUmI^CN=4",
            "a=b=7",
            "timers=",
            "timers",
            "timers:7",
            "_x=7",
            "timers==7",
            "timers=-7",
            "t=0",
        ] {
            assert!(parse_range(Some(bad.as_bytes())).is_err(), "{bad}");
        }
    }

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

    #[test]
    fn cursor_round_trips_and_rejects_junk() {
        let c = key(123_456, 0xdead_beef);
        assert_eq!(Cursor::parse(&c.to_text()), Some(c));
        for bad in ["", "12", "x-1", "1-zz", "-1"] {
            assert_eq!(Cursor::parse(bad), None, "{bad}");
        }
    }

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
