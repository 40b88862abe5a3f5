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
//! pop replication costs a duplicate at worst). Tombstones go first, in a
//! scan of their own: a restarted peer's hand-off waits for the repair at
//! most 15 s, and must not pop a deleted timer whose delete comes last.
//!
//! Bounds: the store is scanned in slices of [`SLICE`] entries, breathing
//! between slices; the candidates of one slice (16 B each) are the only
//! memory held; each send waits for room in the peer's queue ([`Room`]).
//! The loop looks for marks every [`POLL`]. A peer's repairs back off
//! (5 s, doubling to 10 min while they follow each other): one that
//! refuses a message for good is not sent everything every window. A
//! peer that asks for its hand-off (restarted, its pops waiting for what
//! it is owed) has its repair due 5 s after the last at the latest
//! (`shard/handoff.rs`).
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
            let completed = repair(&shard, peers).await;
            shard.outbound.replicator.repair_done(completed);
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
    let (queued, _) = send_selected(&shard, |t| {
        // A client's delete (sequence 0), on one of the timer's replicas
        // under the new view, stored under any view (versions decide, and
        // it is sent only-newer), if a delete: not the tombstone a
        // non-replica or a former holder keeps for an update.
        if !t.is_tombstone() || t.sequence != 0 || !shard.sent_across_views(t) {
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

/// Send every peer of `peers` (a mask, as taken) what this shard holds
/// for it; `false` if a shutdown stopped it. The peers are found by
/// identity as the scan goes (those with a repair running, under the peer
/// order of the moment): a reload may re-index them meanwhile.
async fn repair(shard: &Rc<Shard>, peers: u64) -> bool {
    assert!(peers != 0, "a repair has a peer");
    let names: Vec<String> = (0..64)
        .filter(|i| peers & (1u64 << i) != 0)
        .filter_map(|i| shard.outbound.replicator.address(i))
        .collect();
    tracing::info!(target: "chronos::replication", "shard {}: repairing {}: sending what this shard holds for it", shard.base.id, names.join(", "));
    let replicator = &shard.outbound.replicator;
    let targets =
        |t: &Timer| shard.resend_targets_of(t).map_or(0, |(p, _)| p) & replicator.repairing_mask();
    // Deletes first, in a pass of their own: a restarted peer's hand-off
    // waits at most 15 s, and a repair of a large store takes longer; the
    // peer must not pop a deleted timer whose tombstone comes last.
    let only = |tombstones: bool| {
        move |t: &Timer| match t.is_tombstone() == tombstones {
            true => targets(t),
            false => 0,
        }
    };
    let (deletes, scanned) = send_selected(shard, only(true)).await;
    let (rest, completed) = match scanned {
        true => send_selected(shard, only(false)).await,
        false => (0, false),
    };
    let queued = deletes + rest;
    ShardStats::add(&shard.base.my_stats().replication_repaired, queued);
    match completed {
        true => {
            tracing::info!(target: "chronos::replication", "shard {}: repair of {} done", shard.base.id, names.join(", "))
        }
        false => {
            tracing::info!(target: "chronos::replication", "shard {}: repair of {} stopped by the shutdown after {queued} messages", shard.base.id, names.join(", "))
        }
    }
    completed
}

/// Scan the store in slices and send each timer to the peers `select`
/// names for it (a mask; 0: none), as it now stands, `only-newer`,
/// waiting for room in their queues. Returns the messages queued, and
/// whether the scan ended (not stopped by a shutdown). The masks name
/// peers by their place in the peer list: a slice whose sends a reload
/// re-indexed (`peers_epoch`) is scanned again under the new list.
async fn send_selected(shard: &Rc<Shard>, select: impl Fn(&Timer) -> u64) -> (u64, bool) {
    let mut room = Room::new(Who::Repair);
    let mut candidates: Vec<(u64, u64)> = Vec::with_capacity(SLICE);
    let (mut from, mut queued) = (Some(0usize), 0u64);
    let replicator = &shard.outbound.replicator;
    while let Some(start) = from {
        let epoch = replicator.peers_epoch();
        candidates.clear();
        let next = shard
            .timers
            .store
            .borrow()
            .scan_slice(start, SLICE, |_, _, t| {
                let targets = select(t);
                if targets != 0 {
                    candidates.push((t.unique, targets));
                }
            });
        let mut stale = false;
        for &(unique, targets) in &candidates {
            let waited = room.wait(&shard.base.gate, replicator, targets).await;
            if waited.is_err() {
                return (queued, false);
            }
            stale = replicator.peers_epoch() != epoch;
            if stale {
                break;
            }
            queued += shard.resend_to(unique, targets, 0);
        }
        if !stale {
            from = next;
        }
        bulk::breathe().await;
    }
    (queued, true)
}
