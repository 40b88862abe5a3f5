//! Callback admission per target: a shard's callback slots are shared by
//! every target its timers name, and clients choose those targets, so one
//! slow or hanging target must not take them all.
//!
//! A target (the hash of a callback URI's `host:port`, [`target_of`]) has
//! at most `callback-in-flight-per-target-max` callbacks in flight. A pop
//! whose target is at that share is *held*: it goes back into the wheel at
//! a fallback time and its ID joins the target's held queue; whenever one
//! of the target's callbacks ends, the oldest held ID is promoted (put
//! back in the wheel as due now), so a busy healthy target runs at the
//! pace its callbacks end, without a retry loop, and a hanging target
//! costs nothing while it hangs.
//!
//! Bounds: entries only for targets with a callback in flight or a pop
//! held, so at most `callback-in-flight-max` plus the targets with held
//! pops; `HELD_PER_TARGET_MAX` IDs queued per target (a pop beyond it
//! waits for its fallback time only).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

/// Held IDs queued per target.
pub const HELD_PER_TARGET_MAX: usize = 65_536;

/// The target a callback URI names, as a hash of its authority (`host:port`
/// after the scheme, up to the path), case-insensitive.
pub fn target_of(uri: &str) -> u64 {
    let rest = uri.split_once("://").map_or(uri, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    // FNV-1a: a few bytes, no allocation.
    authority.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b.to_ascii_lowercase() as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

#[derive(Default)]
struct Load {
    in_flight: u32,
    /// Held pops, oldest first: the ID and the fallback time it was put
    /// back at (a pop that has since moved is no longer the held one).
    held: VecDeque<(u64, u64)>,
}

/// Every target's load on one shard.
#[derive(Default)]
pub struct Targets(RefCell<HashMap<u64, Load>>);

impl Targets {
    /// Callbacks to `target` in flight.
    pub fn in_flight(&self, target: u64) -> usize {
        let map = self.0.borrow();
        map.get(&target).map_or(0, |l| l.in_flight as usize)
    }

    /// A callback to `target` starts.
    pub fn take(&self, target: u64) {
        self.0.borrow_mut().entry(target).or_default().in_flight += 1;
    }

    /// A callback to `target` ended.
    pub fn give_back(&self, target: u64) {
        let mut map = self.0.borrow_mut();
        let load = map.get_mut(&target).expect("taken before");
        assert!(load.in_flight > 0, "a callback was in flight");
        load.in_flight -= 1;
        if load.in_flight == 0 && load.held.is_empty() {
            map.remove(&target);
        }
    }

    /// Queue a held pop: its ID and the fallback time it was put back at;
    /// `false` when the target's queue is full.
    pub fn hold(&self, target: u64, unique: u64, due_ms: u64) -> bool {
        let mut map = self.0.borrow_mut();
        let load = map.entry(target).or_default();
        if load.held.len() >= HELD_PER_TARGET_MAX {
            return false;
        }
        load.held.push_back((unique, due_ms));
        true
    }

    /// The oldest held pop of `target` (ID, fallback time), taken off its
    /// queue.
    pub fn next_held(&self, target: u64) -> Option<(u64, u64)> {
        let mut map = self.0.borrow_mut();
        let load = map.get_mut(&target)?;
        let held = load.held.pop_front();
        if load.in_flight == 0 && load.held.is_empty() {
            map.remove(&target);
        }
        held
    }

    /// Forget `target`'s held queue when nothing of it is in flight (its
    /// held pops come back at their fallback times), so a target whose
    /// held timers all went leaves no entry behind.
    pub fn drop_held_if_idle(&self, target: u64) {
        let mut map = self.0.borrow_mut();
        if map.get(&target).is_some_and(|l| l.in_flight == 0) {
            map.remove(&target);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_authorities() {
        let same = [
            "http://a.example:80/x",
            "http://A.example:80/y?z",
            "http://a.example:80",
        ];
        for uri in same {
            assert_eq!(target_of(uri), target_of(same[0]), "{uri}");
        }
        assert_ne!(target_of("http://a.example:81/x"), target_of(same[0]));
        assert_ne!(target_of("http://b.example:80/x"), target_of(same[0]));
    }

    #[test]
    fn held_pops_come_back_in_order_and_entries_go() {
        let t = Targets::default();
        assert_eq!(t.in_flight(1), 0);
        t.take(1);
        assert_eq!((t.in_flight(1), t.in_flight(2)), (1, 0));
        assert!(t.hold(1, 10, 500) && t.hold(1, 11, 600));
        t.give_back(1);
        assert_eq!(t.next_held(1), Some((10, 500)));
        assert!(t.hold(2, 12, 700));
        t.drop_held_if_idle(2);
        assert_eq!(t.next_held(1), Some((11, 600)));
        assert_eq!(t.next_held(1), None);
        assert!(t.0.borrow().is_empty(), "no entry is left behind");
    }
}
