//! The repair of a peer whose replication queue overflowed (issue 37).
//!
//! A shard's queue to a peer is bounded in messages and bytes. To a
//! member of the cluster nothing is given up by age, so while the peer is
//! down or slow the queue fills; a message that does not fit is dropped
//! (counted), and the peer is marked as owed a repair
//! ([`Replicator::take_repair`]). Once its queue has drained below half
//! its bound (the peer answers again), this shard sends it everything it
//! holds that the peer is a replica of, as it now stands, the way a
//! re-send after a start does (`shard/resend.rs`: client-made states only,
//! marked `only-newer`, so a receiver applies them only over an older
//! version): every create, update and delete the dropped messages carried
//! is among them, or was superseded. A pop's outcome is not sent (a lost
//! pop replication costs a duplicate at worst).
//!
//! Bounds: the store is scanned in slices of [`SLICE`] entries, breathing
//! between slices; the candidates of one slice (16 B each) are the only
//! memory held; each send waits for room in the peer's queue ([`Room`]).
//! The loop looks for marks every [`POLL`]. A peer's repairs back off
//! (5 s, doubling to 10 min while they follow each other): one that
//! refuses a message for good is not sent everything every window.
//!
//! [`Replicator::take_repair`]: crate::cluster::replicate::Replicator::take_repair

use super::room::{Room, Who};
use super::Shard;
use crate::runtime::bulk;
use crate::stats::ShardStats;
use crate::timer::Timer;
use std::rc::Rc;
use std::time::Duration;

/// How often a shard looks for peers owed a repair.
const POLL: Duration = Duration::from_millis(500);
/// Store entries visited per slice of the scan.
const SLICE: usize = 512;

/// Repair the peers marked by the replicator, until shutdown.
pub async fn repair_loop(shard: Rc<Shard>) {
    loop {
        if shard
            .base
            .gate
            .unless_closing(glommio::timer::sleep(POLL))
            .await
            .is_none()
        {
            return;
        }
        let peers = shard.outbound.replicator.take_repair();
        if peers != 0 {
            repair(&shard, peers).await;
            shard.outbound.replicator.repair_done(peers);
        }
    }
}

/// After a reload that changed the view: send every delete this shard
/// holds (a client's tombstone, where this node is one of the timer's
/// replicas) to the timer's replicas under the new view, `only-newer`.
/// A delete taken by a node still on the old view could not name a
/// joiner that a node already reloaded had queued the create for, and
/// a resync lists live timers, not tombstones (the fault soak: the
/// joiner popped deleted timers). Tombstones are few (they live one
/// interval and the skews, unless owed), so this is a short scan.
pub async fn resend_deletes(shard: Rc<Shard>) {
    let queued = send_selected(&shard, |t| {
        // A client's delete (sequence 0), on one of the timer's replicas
        // under the new view; whatever view it was stored under (versions
        // decide, and it is sent only-newer).
        if !t.is_tombstone() || t.sequence != 0 {
            return 0;
        }
        let pl = shard.placement(t.unique, shard.resend_factor(t) as usize);
        if pl.my_index.is_none() {
            return 0;
        }
        shard.without_me(pl.mask() | shard.timers.cluster().bloom_matches(t.bloom))
    })
    .await;
    ShardStats::add(&shard.base.my_stats().replication_resent, queued);
    if queued > 0 {
        tracing::info!(target: "chronos::replication", "shard {}: re-sent {queued} deletes to the timers' replicas under the new view", shard.base.id);
    }
}

/// Send every peer of `peers` (a mask) what this shard holds for it.
async fn repair(shard: &Rc<Shard>, peers: u64) {
    assert!(peers != 0, "a repair has a peer");
    let names: Vec<String> = (0..64)
        .filter(|i| peers & (1u64 << i) != 0)
        .filter_map(|i| shard.outbound.replicator.address(i))
        .collect();
    tracing::info!(target: "chronos::replication", "shard {}: repairing {}: sending what this shard holds for it", shard.base.id, names.join(", "));
    let queued = send_selected(shard, |t| {
        shard.resend_targets_of(t).map_or(0, |(p, _)| p) & peers
    })
    .await;
    ShardStats::add(&shard.base.my_stats().replication_repaired, queued);
    tracing::info!(target: "chronos::replication", "shard {}: repair of {} done", shard.base.id, names.join(", "));
}

/// Scan the store in slices and send each timer to the peers `select`
/// names for it (a mask; 0: none), as it now stands, `only-newer`,
/// waiting for room in their queues. Returns the messages queued (until
/// shutdown, if it comes first).
async fn send_selected(shard: &Rc<Shard>, select: impl Fn(&Timer) -> u64) -> u64 {
    let mut room = Room::new(Who::Repair);
    let mut candidates: Vec<(u64, u64)> = Vec::with_capacity(SLICE);
    let (mut from, mut queued) = (Some(0usize), 0u64);
    while let Some(start) = from {
        candidates.clear();
        from = shard
            .timers
            .store
            .borrow()
            .scan_slice(start, SLICE, |_, _, t| {
                let targets = select(t);
                if targets != 0 {
                    candidates.push((t.unique, targets));
                }
            });
        for &(unique, targets) in &candidates {
            if room
                .wait(&shard.base.gate, &shard.outbound.replicator, targets)
                .await
                .is_err()
            {
                return queued;
            }
            queued += shard.resend_to(unique, targets, 0);
        }
        bulk::breathe().await;
    }
    queued
}
