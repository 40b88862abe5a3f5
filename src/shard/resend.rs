//! The re-send after a start (`[storage]` with peers or sites).
//!
//! A change is logged, answered, and its replication queued in memory
//! for the other replicas and sites. A crash (or a stop while a peer
//! cannot be reached) loses whatever was still queued, and replaying the
//! log sends nothing: a delete answered a few ms before a `kill -9`
//! stayed on this node while the other replicas popped the timer (the
//! fault soak, seed 9675783058021869).
//!
//! So after the replay, the client changes logged within the replication
//! window, and every delete whose tombstone the log still holds, are sent
//! again, newest first, as they now stand, to the timer's replicas under
//! the current view and every node its ID names; what this site
//! originated (first in its site list) goes to the other sites too. A
//! tombstone lives on while its delete is queued for a member
//! (`cluster/owed.rs`, issue 37), so a delete owed to a replica that is
//! down survives a restart of the node that owes it, however long both
//! take: the hinted hand-off of deletes, kept in the log as the
//! tombstones themselves. (Creates and updates a replica missed while
//! down come back with its own start-up restore, which pulls them.)
//!
//! What the log holds is not always what was sent, and only what was
//! goes out again: a state a client operation set (sequence 0: a create,
//! an update, a delete's tombstone on one of the timer's replicas). Not
//! sent: a pop's outcome (a pop left to the next replica is logged as
//! done here; sent, it would stop the others' pops: the soak lost timers
//! that way; a successful pop's own replication lost in the crash costs
//! a duplicate at worst), a tombstone on a node that is not a replica
//! (a resync's, or the one a client's update answered here leaves, which
//! must not reach the replicas as a delete), a live timer logged under a
//! view since replaced (placing it is the resync's; a delete's tombstone
//! whose ID names this node goes to its replicas under the view of now,
//! as `resend_deletes` sends it after a reload, since a resync lists no
//! tombstones: [`Shard::sent_across_views`]), and, after a downtime
//! longer than the window, live timers (a peer may have let the
//! tombstone of a delete made meanwhile expire). Each body also says
//! `"only-newer": true`, and a receiver of this build applies it only
//! over an older version ([`super::conflict::Source::PeerIfNewer`]); a
//! node of an earlier build ignores the key, and what is sent is safe
//! under its plain rules too (a live copy at sequence 0 never beats a
//! copy of its own version; a delete's version is its own).
//!
//! The window is the longest a queued message is retried
//! ([`Shard::replication_late_ms_max`]), counted back from the newest
//! change in the log (when the node was last seen working; no later than
//! now). Bounds: one `(ID, version)` pair per timer changed in that
//! window (16 B), shared by one pass per peer and per site of the view at
//! start (so a peer that does not answer holds up no other; a peer a
//! reload adds later gets the deletes from `resend_deletes`), freed when
//! the last ends; each pass waits for room in its peer's queue
//! ([`Room`]). Until a peer's pass ends, and what it queued is settled,
//! a hand-off that peer asks for is not settled
//! (`Replicator::resend_done`). A timer changed again since the start is
//! skipped: that change replicated itself.
//!
//! What this cannot mend: a replica that pops the timer before this node
//! is back (down longer than that replica's skew) pops it; a delete
//! answered by a node that is not one of the timer's replicas is not sent
//! again.

use super::replication::body_of;
use super::room::{Room, Who};
use super::Shard;
use crate::cluster::sites::Sites;
use crate::runtime::bulk;
use crate::stats::ShardStats;
use crate::storage::record::Image;
use crate::timer::spec::TAGS_MAX;
use std::rc::Rc;

/// The `(unique, version)` of every image a start sends again (see the
/// module doc), newest first: changed within `window_ms` before the
/// newest change among them (or before `now_us`, if earlier), and every
/// delete (tombstone) the log still holds, however old (a tombstone lives
/// on while its delete is owed to a member: `cluster/owed.rs`); never a
/// pop's outcome (sequence above 0); and only deletes when the node was
/// down longer than the window.
pub(super) fn recent(images: &[Image<'_>], window_ms: u64, now_us: u64) -> Vec<(u64, u64)> {
    let Some(newest_us) = images.iter().map(|i| i.head.version).max() else {
        return Vec::new();
    };
    let window_us = window_ms.saturating_mul(1000);
    let since_us = newest_us.min(now_us).saturating_sub(window_us);
    // Down that long, a peer may have let the tombstone of a timer
    // deleted meanwhile expire: a live copy sent now would bring it back.
    let deletes_only = now_us.saturating_sub(newest_us) > window_us;
    let mut out: Vec<(u64, u64)> = images
        .iter()
        .filter(|i| i.head.sequence == 0)
        .filter(|i| i.uri.is_empty() || (i.head.version >= since_us && !deletes_only))
        .map(|i| (i.head.id.unique, i.head.version))
        .collect();
    // The newest changes are the likeliest unsent; a delete's tombstone
    // is due late and would otherwise come last.
    out.sort_unstable_by_key(|&(_, version)| std::cmp::Reverse(version));
    out
}

/// Send every timer of `recent` again (see the module doc): one pass per
/// peer and per site, each at the pace its own queue drains, so a peer
/// that does not answer (a timeout per batch) holds up no other, and a
/// restarted peer's hand-off waits only for what is sent to it.
pub(super) async fn run(shard: Rc<Shard>, recent: Vec<(u64, u64)>) {
    let recent = Rc::new(recent);
    let me = shard.timers.cluster().local_address.clone();
    let nodes = shard.outbound.replicator.addresses();
    let sites = shard.outbound.sites_out.addresses();
    let passes: Vec<_> = (nodes.into_iter().filter(|a| *a != me))
        .map(|a| (a, false))
        .chain(sites.into_iter().map(|a| (a, true)))
        .map(|(address, site)| {
            let pass = pass(shard.clone(), recent.clone(), address, site);
            crate::runtime::spawn::spawn_local(pass)
        })
        .collect();
    let mut resent = 0u64;
    for pass in passes {
        resent += pass.await;
    }
    tracing::info!(target: "chronos::replication", "shard {}: re-sent {resent} replication messages for the changes logged before the start", shard.base.id);
    shard.durable.resending.set(false);
}

/// The re-send to the peer (or the site, if `site`) at `address`: the
/// messages queued. Ended by a shutdown, its peer is still owed it.
async fn pass(shard: Rc<Shard>, recent: Rc<Vec<(u64, u64)>>, address: String, site: bool) -> u64 {
    let out = match site {
        true => &shard.outbound.sites_out,
        false => &shard.outbound.replicator,
    };
    let mut room = Room::new(Who::Resend);
    let (mut resent, mut pacer) = (0u64, bulk::Pacer::new());
    for &(unique, version) in recent.iter() {
        if shard.base.gate.is_closing() {
            return resent;
        }
        // Its place may change with a reload; gone, it is owed nothing
        // (and the rest of the list is not scanned for it).
        let Some(place) = out.index_of(&address) else {
            break;
        };
        let Some(mask) = shard.resend_mask(unique, version, place, site) else {
            // Most of the list may be skipped: it must breathe too.
            pacer.tick().await;
            continue;
        };
        if room.wait(&shard.base.gate, out, mask).await.is_err() {
            return resent;
        }
        pacer.restart();
        // Looked up again: the wait may have seen a change or a reload.
        let place = out.index_of(&address);
        if let Some(mask) = place.and_then(|i| shard.resend_mask(unique, version, i, site)) {
            let queued = match site {
                true => shard.resend_to(unique, 0, mask),
                false => shard.resend_to(unique, mask, 0),
            };
            ShardStats::add(&shard.base.my_stats().replication_resent, queued);
            resent += queued;
        }
        pacer.tick().await;
    }
    out.resend_done(&address);
    resent
}

impl Shard {
    /// The replication window: how long after a change its replication
    /// can still be delivered (`replication-deliver-within-ms` plus
    /// `replication-timeout-ms`; the sites' when longer and replicating).
    pub fn replication_late_ms_max(&self) -> u64 {
        let c = &self.base.resolved.config.cluster;
        let mut late_ms_max = c.replication_deliver_within_ms + c.replication_timeout_ms;
        if self.base.resolved.sites.replicating() {
            let st = &self.base.resolved.config.sites;
            late_ms_max = late_ms_max.max(st.site_deliver_within_ms + st.site_timeout_ms);
        }
        late_ms_max
    }

    /// Whether a re-send of `unique` goes to the peer (or, if `site`, the
    /// site) at `place` in the peer order of now: its bit, or `None` when
    /// it does not, or the timer is gone or changed since `version` was
    /// logged.
    fn resend_mask(&self, unique: u64, version: u64, place: usize, site: bool) -> Option<u64> {
        let bit = 1u64.checked_shl(u32::try_from(place).ok()?)?;
        let store = self.timers.store.borrow();
        let (_, t) = store.get(unique)?;
        if t.version != version {
            return None;
        }
        let (peers, slots) = self.resend_targets_of(t)?;
        let targets = if site { slots } else { peers };
        (targets & bit != 0).then_some(bit)
    }

    /// Whether tombstone `t` must outlive its life: the re-send at start
    /// has not yet queued what the log held, its delete is still queued
    /// for a member, or a member it would be sent to by a repair is owed
    /// one (the delete may have been dropped at a full queue).
    /// Such tombstones are held while the member stays down and marked;
    /// the store's bound (`timers-per-shard-max`) bounds them.
    pub(super) fn tombstone_owed(&self, t: &crate::timer::Timer) -> bool {
        let replicator = &self.outbound.replicator;
        // Any peer owed a repair at all (`u64::MAX`) before the placement
        // is worked out.
        self.durable.resending.get()
            || replicator.owes_tombstone(t.unique)
            || replicator.owes_repair(u64::MAX)
                && self
                    .resend_targets_of(t)
                    .is_some_and(|(peers, _)| replicator.owes_repair(peers))
    }

    /// Whether `t` may be sent again although it was stored under a view
    /// since replaced (a reload, or a restart with a new member list). A
    /// live copy is not: placing it under the new view is the resync's. A
    /// delete's tombstone is, placed under the view of now: a resync lists
    /// no tombstones, and one a down replica is owed must be held and
    /// repaired across a reload, or the replica, back from its log, pops
    /// the deleted timer. Only one whose ID names this node, though (a
    /// delete taken as one of the timer's replicas): a non-replica that
    /// answered a client's update, or a former holder, keeps a tombstone
    /// of the update's own version, which must not reach a replica that
    /// missed the update as a delete.
    pub(super) fn sent_across_views(&self, t: &crate::timer::Timer) -> bool {
        if t.view == self.timers.view() {
            return true;
        }
        let cluster = self.timers.cluster();
        let named = |i: usize| cluster.node_at(i).bloom & !t.bloom == 0;
        t.is_tombstone() && cluster.local_peer().is_some_and(named)
    }

    /// Where `t`, as it stands, is sent again (by a re-send or a repair),
    /// or `None` if it is not.
    pub(super) fn resend_targets_of(&self, t: &crate::timer::Timer) -> Option<(u64, u64)> {
        if !self.sent_across_views(t) {
            return None;
        }
        if t.sequence != 0 {
            return None;
        }
        let unique = t.unique;
        let pl = self.placement(unique, self.resend_factor(t) as usize);
        // A tombstone on a node that is not a replica is not sent: it may
        // stand for a live change (a client's update answered here, kept
        // as a tombstone: the replicas got the timer) or be a resync's.
        if t.is_tombstone() && pl.my_index.is_none() {
            return None;
        }
        let peers = self.without_me(pl.mask() | self.timers.cluster().bloom_matches(t.bloom));
        let head = t.head();
        let mut sites = 0u64;
        if head.site_index == 0 && self.sends_to_sites(&head) {
            for slot in Sites::remote_in(head.sites) {
                sites |= 1u64 << (slot - 1);
            }
        }
        Some((peers, sites))
    }

    /// A tombstone reaches every replica the default factor would have
    /// (as a client's delete does); a live timer its own factor's.
    pub(super) fn resend_factor(&self, t: &crate::timer::Timer) -> u8 {
        match t.is_tombstone() {
            true => t.factor_requested().max(self.default_factor()),
            false => t.factor_requested(),
        }
    }

    /// Queue `unique` as it now stands, marked `only-newer`, for the peers
    /// in `targets` and the sites in `site_slots`. Returns the messages
    /// queued.
    pub(super) fn resend_to(&self, unique: u64, targets: u64, site_slots: u64) -> u64 {
        let store = self.timers.store.borrow();
        let Some((_, t)) = store.get(unique) else {
            return 0;
        };
        let cluster = self.timers.cluster();
        let pl = self.placement(unique, self.resend_factor(t) as usize);
        let (names, n) = pl.names(&cluster);
        let mut tags = [("", 0u32); TAGS_MAX];
        let tag_count = store.tag_pairs(t, &mut tags);
        let head = t.head();
        let callback = (t.uri(), t.opaque(), t.ext());
        let sites = self.base.resolved.sites.names(head.sites);
        let tags = &tags[..tag_count];
        let mut body = body_of(&head, callback, tags, &names[..n], &sites, cluster.view_id);
        body.only_newer = true;
        if targets != 0 {
            self.send_body(head.id, &body, targets);
        }
        body.replicas = &[];
        let mut rest = site_slots;
        while rest != 0 {
            let slot = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            self.outbound.sites_out.send(slot, head.id, &body);
        }
        (targets.count_ones() + site_slots.count_ones()) as u64
    }
}
