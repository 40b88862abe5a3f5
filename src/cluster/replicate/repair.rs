//! Repairs: a member whose message was dropped at a full queue (or given
//! up after it kept refusing it) is marked; once its queue drains below
//! half its bound the shard takes the mark and sends it everything it
//! holds for it (`shard/repair.rs`). Repairs that follow each other back
//! off, from [`REPAIR_BACKOFF_MS_MIN`] to [`REPAIR_BACKOFF_MS_MAX`].

use super::{Replicator, REPAIR_BACKOFF_MS_MAX, REPAIR_BACKOFF_MS_MIN};
use crate::runtime::clock;

impl Replicator {
    /// The peers (a mask over the peer order) owed a repair whose queue
    /// has drained below half its bound (they answer again), with their
    /// marks cleared: the caller sends each what this shard holds for it
    /// (`shard/repair.rs`). A message dropped meanwhile marks it again.
    pub fn take_repair(&self) -> u64 {
        let peers = self.peers.borrow();
        let now_ms = clock::now_ms();
        let mut mask = 0u64;
        for (i, p) in peers.iter().enumerate() {
            let due = now_ms >= p.repair_at_ms.get();
            if p.repair_owed.get() && self.half_empty(p) && due && i < 64 {
                p.repair_owed.set(false);
                p.repairing.set(true);
                let backoff = p.repair_backoff_ms.get().max(REPAIR_BACKOFF_MS_MIN);
                let quiet = now_ms.saturating_sub(p.repair_last_ms.get()) > 2 * backoff;
                let next = match quiet {
                    true => REPAIR_BACKOFF_MS_MIN,
                    false => (backoff * 2).min(REPAIR_BACKOFF_MS_MAX),
                };
                p.repair_backoff_ms.set(next);
                p.repair_last_ms.set(now_ms);
                p.repair_at_ms.set(now_ms + next);
                mask |= 1u64 << i;
            }
        }
        mask
    }

    /// The repairs of the peers in `mask` ended (every message queued).
    pub fn repair_done(&self, mask: u64) {
        for (i, p) in self.peers.borrow().iter().enumerate() {
            if i < 64 && mask & (1u64 << i) != 0 {
                p.repairing.set(false);
            }
        }
    }
}
