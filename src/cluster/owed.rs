//! Deletes still owed to a member of the cluster (issue 37): a tombstone
//! whose replication is queued for a member and not yet taken must not
//! expire, or a restart of this node (its queue is in memory) would leave
//! nothing to send again, and the member, back later, would pop a
//! deleted timer. The shard asks [`Owed::holds`] before it lets a
//! tombstone expire, and keeps it one more life if so; the start-up
//! re-send sends every tombstone the log holds again (`shard/resend.rs`).
//!
//! Bounds: one entry per timer with a tombstone queued for a member (at
//! most the messages queued, which the queues bound); removed when its
//! last message is taken, refused, dropped or given up.

use std::cell::RefCell;
use std::collections::HashMap;

/// Timer IDs (their unique part) with tombstone messages queued for
/// members, and how many.
#[derive(Default)]
pub struct Owed {
    queued: RefCell<HashMap<u64, u32>>,
}

impl Owed {
    /// A tombstone message for `unique` was queued.
    pub fn add(&self, unique: u64) {
        *self.queued.borrow_mut().entry(unique).or_default() += 1;
    }

    /// One of `unique`'s tombstone messages is settled (taken, refused,
    /// dropped or given up).
    pub fn settle(&self, unique: u64) {
        let mut queued = self.queued.borrow_mut();
        if let Some(n) = queued.get_mut(&unique) {
            *n -= 1;
            if *n == 0 {
                queued.remove(&unique);
            }
        }
    }

    /// Whether a tombstone message for `unique` is still queued.
    pub fn holds(&self, unique: u64) -> bool {
        self.queued.borrow().contains_key(&unique)
    }

    pub fn len(&self) -> usize {
        self.queued.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.queued.borrow().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tombstone_is_owed_until_its_last_message_settles() {
        let owed = Owed::default();
        owed.add(7);
        owed.add(7);
        assert!(owed.holds(7));
        owed.settle(7);
        assert!(owed.holds(7), "one message still queued");
        owed.settle(7);
        assert!(!owed.holds(7));
        owed.settle(7);
        assert!(owed.is_empty(), "a stray settle changes nothing");
    }
}
