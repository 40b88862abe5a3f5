//! Backpressure for bulk senders of replication (a resync run, the
//! re-send after a start): they wait for room in the peers' queues, so
//! they never crowd out, or get dropped with, the replication of client
//! operations and pops.
//!
//! Bounded: a peer whose queue does not drain within [`WAIT_MS_MAX`] (it
//! is down) is not waited for again by this sender; its queue's own
//! bounds drop and count what does not fit.

use crate::cluster::replicate::Replicator;
use crate::runtime::gate::Gate;
use std::time::{Duration, Instant};

/// How often a bulk sender looks for room, and how long it waits for it
/// per message.
const POLL_MS: u64 = 2;
const WAIT_MS_MAX: u64 = 10_000;

/// Which bulk sender waits (its warning's log target and words).
#[derive(Clone, Copy, Debug)]
pub(super) enum Who {
    /// A resync run (`chronos::resync`).
    Resync,
    /// The re-send at start (`chronos::replication`).
    Resend,
    /// The repair of a peer whose queue overflowed (`chronos::replication`).
    Repair,
}

/// One bulk sender's view of one replicator's queues (to nodes, or to
/// sites).
pub(super) struct Room {
    /// Peers whose queue did not drain (not waited for again).
    congested: u64,
    who: Who,
}

impl Room {
    pub(super) fn new(who: Who) -> Room {
        Room { congested: 0, who }
    }

    /// Wait until `out`'s queues to `peers` (a peer mask) are less than
    /// half full; `Err` when `gate` is closing (a shutdown).
    pub(super) async fn wait(
        &mut self,
        gate: &Gate,
        out: &Replicator,
        peers: u64,
    ) -> Result<(), String> {
        let started = Instant::now();
        let wanted = peers & !self.congested;
        while !out.has_room(wanted) {
            if gate.is_closing() {
                return Err("shutting down".into());
            }
            if started.elapsed() > Duration::from_millis(WAIT_MS_MAX) {
                self.give_up_on_full(out, wanted);
                return Ok(());
            }
            glommio::timer::sleep(Duration::from_millis(POLL_MS)).await;
        }
        Ok(())
    }

    /// Mark every peer of `wanted` whose queue is still full as congested.
    fn give_up_on_full(&mut self, out: &Replicator, wanted: u64) {
        let mut rest = wanted;
        while rest != 0 {
            let peer = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            if !out.has_room(1u64 << peer) {
                let address = out.address(peer).unwrap_or_default();
                match self.who {
                    Who::Resync => {
                        tracing::warn!(target: "chronos::resync", "{address}: its replication queue does not drain; not waited for again in this run")
                    }
                    Who::Resend | Who::Repair => {
                        tracing::warn!(target: "chronos::replication", "{address}: its replication queue does not drain; the re-send at start no longer waits for it")
                    }
                }
                self.congested |= 1u64 << peer;
            }
        }
    }
}
