//! The serving side's sessions: a listing's matching keys, found by one
//! sliced scan of the shard's store (and its informational timers) and
//! kept for the pages that follow. Bounded: one session per requesting
//! node and kind, dropped after `SESSION_IDLE_MS` unused.

use super::query::{Cursor, Query};
use crate::cluster::{Cluster, NODES_MAX};
use crate::runtime::bulk::{self, Pacer};
use crate::runtime::clock;
use crate::shard::Shard;
use crate::timer::Timer;
use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

/// Store entries scanned between looks at the clock while a session is
/// built (a breath follows once `bulk::STRETCH` is used up).
pub const SCAN_SLICE: usize = 512;
/// A session unused this long is dropped.
pub const SESSION_IDLE_MS: u64 = 60_000;

/// A session's key: a listing position, and the slab index the scan saw
/// the timer at (`NO_SLAB` for an informational copy), so that a page
/// finds it without probing the ID index while it is still there
/// ([`crate::shard::store::Store::get_at`]). Ordered by position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Listed {
    pub(super) at: Cursor,
    pub(super) slab: u32,
}

/// No slab index: the key of an informational timer.
const NO_SLAB: u32 = u32::MAX;

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

impl Shard {
    /// The matching keys of this shard for `q`: the session's, or a new
    /// session built by a sliced scan (a listing without a cursor always
    /// starts a new one).
    pub(super) async fn session_keys(self: &Rc<Self>, q: &Query) -> Rc<Vec<Listed>> {
        let view = self.timers.view();
        let now = clock::now_ms();
        {
            let mut sessions = self.resync.sessions.0.borrow_mut();
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
        let mut sessions = self.resync.sessions.0.borrow_mut();
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
        let mut keys = Vec::with_capacity(self.timers.store.borrow().len());
        let mut next = Some(0);
        let mut pacer = Pacer::new();
        let mut replicas = [0usize; NODES_MAX];
        while let Some(from) = next {
            let cluster = self.timers.cluster();
            next = self
                .timers
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
        let ids = self.timers.store.borrow().info_ids();
        let mut keys = Vec::new();
        let mut replicas = [0usize; NODES_MAX];
        for slice in ids.chunks(SCAN_SLICE) {
            let cluster = self.timers.cluster();
            {
                let store = self.timers.store.borrow();
                for &unique in slice {
                    // An informational copy stands in only behind a tombstone.
                    if store.get(unique).is_some_and(|(_, w)| !w.is_tombstone()) {
                        continue;
                    }
                    let Some(t) = store.info(unique) else {
                        continue;
                    };
                    if self.listable(&cluster, t, q, &mut replicas).is_some() {
                        let due_ms = t.next_pop_ms(self.base.skew_ms());
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
    pub(super) fn listable(
        &self,
        cluster: &Cluster,
        t: &Timer,
        q: &Query,
        replicas: &mut [usize; NODES_MAX],
    ) -> Option<(u8, usize)> {
        if t.is_tombstone() || (t.view == self.timers.view() && !q.all_views) {
            return None;
        }
        let n = cluster.replicas_into(t.unique, t.factor_requested() as usize, replicas);
        let index = replicas[..n].iter().position(|&r| r == q.node)? as u8;
        // A DELETE marked this index (and those above it) as knowing it.
        (t.view == self.timers.view() || index < t.informed()).then_some((index, n))
    }
}
