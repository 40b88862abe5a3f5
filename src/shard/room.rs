//! Backpressure for bulk senders of replication (a resync run, the
//! re-send after a start): they wait for room in the peers' queues, so
//! they never crowd out, or get dropped with, the replication of client
//! operations and pops.
//!
//! Bounded: a peer whose queue does not drain within [`WAIT_MS_MAX`] (it
//! is down) is not waited for again by this sender; its queue's own
//! bounds drop and count what does not fit.

use super::Shard;
use std::time::{Duration, Instant};

/// How often a bulk sender looks for room, and how long it waits for it
/// per message.
const POLL_MS: u64 = 2;
const WAIT_MS_MAX: u64 = 10_000;

/// One bulk sender's view of the peers' queues.
pub(super) struct Room {
    /// Peers whose queue did not drain (not waited for again).
    congested: u64,
    /// Who waits, as its warning names it ("the resync run").
    who: &'static str,
}

impl Room {
    pub(super) fn new(who: &'static str) -> Room {
        Room { congested: 0, who }
    }

    /// Wait until the replication queues to `peers` (a peer mask) are
    /// less than half full; `Err` when the shard is shutting down.
    pub(super) async fn wait(&mut self, shard: &Shard, peers: u64) -> Result<(), String> {
        let started = Instant::now();
        let wanted = peers & !self.congested;
        while !shard.replicator.has_room(wanted) {
            if shard.gate.is_closing() {
                return Err("shutting down".into());
            }
            if started.elapsed() > Duration::from_millis(WAIT_MS_MAX) {
                self.give_up_on_full(shard, wanted);
                return Ok(());
            }
            glommio::timer::sleep(Duration::from_millis(POLL_MS)).await;
        }
        Ok(())
    }

    /// Mark every peer of `wanted` whose queue is still full as congested.
    fn give_up_on_full(&mut self, shard: &Shard, wanted: u64) {
        let cluster = shard.cluster();
        let mut rest = wanted;
        while rest != 0 {
            let peer = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            if !shard.replicator.has_room(1u64 << peer) {
                let address = &cluster.node_at(peer).address;
                tracing::warn!(target: "chronos::replication", "{address}: its replication queue does not drain; {} no longer waits for it", self.who);
                self.congested |= 1u64 << peer;
            }
        }
    }
}
