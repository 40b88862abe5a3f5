//! Repairs: a member whose message was dropped at a full queue (or given
//! up after it kept refusing it) is marked; once its queue drains below
//! half its bound the shard takes the mark and sends it everything it
//! holds for it (`shard/repair.rs`). Repairs that follow each other back
//! off, from [`REPAIR_BACKOFF_MS_MIN`] to [`REPAIR_BACKOFF_MS_MAX`],
//! except for a peer that asks for its hand-off (`Replicator::owed`): it
//! restarted, and its pops wait for the repair, which is then due at most
//! [`REPAIR_BACKOFF_MS_MIN`] after the last.

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

    /// Whether any peer in `mask` (over the peer order) is owed a repair,
    /// has one running, or has one's messages unsettled: a tombstone
    /// whose timer it is a replica of must not expire yet, or the repair
    /// finds nothing to send and the peer, back from its log, pops the
    /// deleted timer.
    pub fn owes_repair(&self, mask: u64) -> bool {
        let peers = self.peers.borrow();
        let pending = |(i, p): (usize, &std::rc::Rc<super::queue::Peer>)| {
            i < 64 && mask & (1u64 << i) != 0 && p.repair_pending()
        };
        peers.iter().enumerate().any(pending)
    }

    /// The peers a repair is running for, as a mask over the peer order
    /// of the moment (a reload may have re-indexed them since the repair
    /// was taken).
    pub fn repairing_mask(&self) -> u64 {
        let peers = self.peers.borrow();
        let running = peers
            .iter()
            .enumerate()
            .filter(|(i, p)| *i < 64 && p.repairing.get());
        running.fold(0u64, |mask, (i, _)| mask | 1u64 << i)
    }

    /// The re-send at start (`shard/resend.rs`) begins: every peer of now
    /// but the node at `me` (this one, never sent to) is owed it until
    /// [`Replicator::resend_done`] names it.
    pub fn resend_started(&self, me: &str) {
        for p in self.peers.borrow().iter().filter(|p| p.address != me) {
            p.resending.set(true);
        }
    }

    /// The re-send at start has queued all it holds for the peer at
    /// `address`: a restarted peer's hand-off waits until every message
    /// queued for it so far is settled, as for a repair's. Its question
    /// may have come while the re-send ran: what was queued after it
    /// would not hold the answer up.
    pub fn resend_done(&self, address: &str) {
        for p in self.peers.borrow().iter().filter(|p| p.address == address) {
            p.resending.set(false);
            p.repair_tail
                .set(p.repair_tail.get().max(p.queued_total.get()));
        }
    }

    /// The peers' addresses, in peer order.
    pub fn addresses(&self) -> Vec<String> {
        self.peers
            .borrow()
            .iter()
            .map(|p| p.address.clone())
            .collect()
    }

    /// The place of the peer at `address` in the peer order of now.
    pub fn index_of(&self, address: &str) -> Option<usize> {
        self.peers
            .borrow()
            .iter()
            .position(|p| p.address == address)
    }

    /// The repair running ended: `completed`, every message queued (a
    /// hand-off still waits until they are settled:
    /// `Peer::repair_pending`); else a shutdown stopped it and each of its
    /// peers is marked again. Its peers are found by identity, not by the
    /// mask taken before a reload: a shard runs one repair at a time, so
    /// they are the peers with `repairing` set.
    pub fn repair_done(&self, completed: bool) {
        for p in self.peers.borrow().iter().filter(|p| p.repairing.get()) {
            p.repairing.set(false);
            match completed {
                true => p.repair_tail.set(p.queued_total.get()),
                false => p.repair_owed.set(true),
            }
        }
    }
}
