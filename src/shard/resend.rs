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
//! must not reach the replicas as a delete), a timer logged under a view
//! since replaced (placing it is the resync's), and, after a downtime
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
//! window (16 B), dropped as it is sent; sends wait for room in the
//! peers' queues ([`Room`]). A timer changed again since the start is
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

/// Send every timer of `recent` again (see the module doc).
pub(super) async fn run(shard: Rc<Shard>, recent: Vec<(u64, u64)>) {
    let (mut nodes, mut sites) = (Room::new(Who::Resend), Room::new(Who::Resend));
    let (mut resent, mut pacer) = (0u64, bulk::Pacer::new());
    for (unique, version) in recent {
        if shard.base.gate.is_closing() {
            break;
        }
        let Some((targets, site_slots)) = shard.resend_targets(unique, version) else {
            continue;
        };
        let room = match nodes
            .wait(&shard.base.gate, &shard.outbound.replicator, targets)
            .await
        {
            Ok(()) => {
                sites
                    .wait(&shard.base.gate, &shard.outbound.sites_out, site_slots)
                    .await
            }
            stop => stop,
        };
        if room.is_err() {
            break;
        }
        pacer.restart();
        let queued = shard.resend(unique, version);
        ShardStats::add(&shard.base.my_stats().replication_resent, queued);
        resent += queued;
        pacer.tick().await;
    }
    tracing::info!(target: "chronos::replication", "shard {}: re-sent {resent} replication messages for the changes logged before the start", shard.base.id);
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

    /// Where a re-send of `unique` goes: the peers (a mask over the
    /// nodes) and the other sites (a mask over the site slots), or `None`
    /// when it is gone or changed since `version` was logged.
    fn resend_targets(&self, unique: u64, version: u64) -> Option<(u64, u64)> {
        let store = self.timers.store.borrow();
        let (_, t) = store.get(unique)?;
        if t.version != version {
            return None;
        }
        self.resend_targets_of(t)
    }

    /// Where `t`, as it stands, is sent again (by a re-send or a repair),
    /// or `None` if it is not.
    pub(super) fn resend_targets_of(&self, t: &crate::timer::Timer) -> Option<(u64, u64)> {
        // A copy logged under a view since replaced (a reload while down)
        // is not sent: placing it under the new view is the resync's.
        if t.view != self.timers.view() {
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

    /// Queue `unique` as it now stands, marked `only-newer`, for its other
    /// replicas and, if this site originated it, the other sites. Returns
    /// the messages queued.
    fn resend(&self, unique: u64, version: u64) -> u64 {
        let Some((targets, site_slots)) = self.resend_targets(unique, version) else {
            return 0;
        };
        self.resend_to(unique, targets, site_slots)
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
        let callback = (t.uri(), t.opaque());
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
