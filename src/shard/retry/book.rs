//! The retry book: one shard's pops being retried (owned) or watched, by
//! (timer, sequence), and their due times in order. Data only: what an
//! attempt does is `attempt.rs`'s, what a report does `watch.rs`'s.

use super::ENTRIES_MAX;
use crate::runtime::notify::Notify;
use crate::timer::retry::Outcome;
use crate::timer::Timer;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};

/// One pop with a delivery policy that is not delivered yet.
pub struct Entry {
    /// The timer as the pop took it (its `sequence` is this pop's): its
    /// callback, policy and tags, shared with the stored copy.
    pub timer: Timer,
    /// Attempts made so far.
    pub attempts: u8,
    /// Wall-clock ms of the first attempt.
    pub first_unix_ms: u64,
    /// Wall-clock ms the owner sends the next attempt.
    pub next_unix_ms: u64,
    /// Engine ms this shard acts: its next attempt (owned) or its
    /// takeover (watched).
    pub due_ms: u64,
    /// How the last attempt ended.
    pub last: Outcome,
    /// This shard sends the attempts; else it watches another replica.
    pub owned: bool,
    /// An attempt of this entry is in flight.
    pub sending: bool,
}

/// A pop's key: the timer's `unique` and the pop's sequence.
pub type Key = (u64, u32);

/// The book and its task's wake-up.
#[derive(Default)]
pub struct Retries {
    entries: RefCell<HashMap<Key, Entry>>,
    /// `(due_ms, unique, sequence)` of every entry not being sent.
    due: RefCell<BTreeSet<(u64, u64, u32)>>,
    /// Entries per timer, so that a change of a timer without any (nearly
    /// every one) costs one look-up here.
    per_timer: RefCell<HashMap<u64, u32>>,
    /// Wakes the retry task: an entry came due sooner, or a slot freed.
    pub(super) wake: Notify,
    /// Attempts in flight.
    pub(super) sending: Cell<usize>,
    /// Entries in the book (read without a borrow on every change).
    count: Cell<usize>,
    /// Dead-letter `POST`s in flight.
    pub(super) dead_letters: Cell<usize>,
}

impl Retries {
    pub fn len(&self) -> usize {
        self.entries.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.borrow().is_empty()
    }

    /// Whether the pop's attempts of incarnation `version` are still
    /// wanted: its entry is here, of that version.
    pub fn is_wanted(&self, key: Key, version: u64) -> bool {
        self.with(key, |e| e.timer.version == version)
            .unwrap_or(false)
    }

    /// Whether another entry may be added.
    pub fn has_room(&self, key: Key) -> bool {
        let entries = self.entries.borrow();
        entries.len() < ENTRIES_MAX || entries.contains_key(&key)
    }

    /// Put `entry` in (replacing the pop's entry, if any). The caller
    /// checked [`Retries::has_room`].
    pub fn put(&self, entry: Entry) {
        let key = (entry.timer.unique, entry.timer.sequence);
        let mut entries = self.entries.borrow_mut();
        let mut due = self.due.borrow_mut();
        if let Some(old) = entries.get(&key) {
            due.remove(&(old.due_ms, key.0, key.1));
        }
        assert!(
            entries.len() < ENTRIES_MAX || entries.contains_key(&key),
            "the caller checked the room"
        );
        let first = due.first().map(|d| d.0);
        if !entry.sending {
            due.insert((entry.due_ms, key.0, key.1));
        }
        let sooner = first.is_none_or(|f| entry.due_ms < f);
        if entries.insert(key, entry).is_none() {
            *self.per_timer.borrow_mut().entry(key.0).or_default() += 1;
            self.count.set(self.count.get() + 1);
        }
        drop((entries, due));
        if sooner {
            self.wake.notify();
        }
    }

    /// Take the pop's entry out.
    pub fn take(&self, key: Key) -> Option<Entry> {
        let entry = self.entries.borrow_mut().remove(&key)?;
        self.count.set(self.count.get() - 1);
        self.due.borrow_mut().remove(&(entry.due_ms, key.0, key.1));
        let mut per_timer = self.per_timer.borrow_mut();
        let count = per_timer.get_mut(&key.0).expect("counted when put");
        *count -= 1;
        if *count == 0 {
            per_timer.remove(&key.0);
        }
        Some(entry)
    }

    /// Read the pop's entry.
    pub fn with<R>(&self, key: Key, f: impl FnOnce(&Entry) -> R) -> Option<R> {
        self.entries.borrow().get(&key).map(f)
    }

    /// Take out every entry of `unique` whose version is not `version`
    /// (a delete or an update replaced the incarnation): their pops are
    /// not sent again. Returns them (none allocates nothing).
    #[inline]
    pub fn drop_other_versions(&self, unique: u64, version: u64) -> Vec<Entry> {
        // Every change of a timer comes here: an empty book costs a load.
        if self.count.get() == 0 {
            return Vec::new();
        }
        self.drop_other_versions_of(unique, version)
    }

    fn drop_other_versions_of(&self, unique: u64, version: u64) -> Vec<Entry> {
        if !self.per_timer.borrow().contains_key(&unique) {
            return Vec::new();
        }
        let keys: Vec<Key> = self
            .entries
            .borrow()
            .iter()
            .filter(|(k, e)| k.0 == unique && e.timer.version != version)
            .map(|(k, _)| *k)
            .collect();
        keys.iter().filter_map(|key| self.take(*key)).collect()
    }

    /// The next due entry at or before `now_ms`, marked as being sent and
    /// out of the due order; or the first due time after `now_ms`.
    pub fn next_due(&self, now_ms: u64) -> Result<Key, Option<u64>> {
        let mut due = self.due.borrow_mut();
        let Some(&(at, unique, sequence)) = due.first() else {
            return Err(None);
        };
        if at > now_ms {
            return Err(Some(at));
        }
        due.pop_first();
        let mut entries = self.entries.borrow_mut();
        let entry = entries
            .get_mut(&(unique, sequence))
            .expect("the due order holds only entries of the book");
        entry.sending = true;
        Ok((unique, sequence))
    }

    /// Visit the entries of timer `unique` (most timers have none: one
    /// look-up).
    pub fn each_of(&self, unique: u64, mut visit: impl FnMut(&Entry)) {
        if self.entries.borrow().is_empty() || !self.per_timer.borrow().contains_key(&unique) {
            return;
        }
        for (_, entry) in self.entries.borrow().iter().filter(|(k, _)| k.0 == unique) {
            visit(entry);
        }
    }

    /// A share of the timer of `unique`'s earliest pop in the book.
    pub fn first_of(&self, unique: u64) -> Option<Timer> {
        let mut first: Option<Timer> = None;
        self.each_of(unique, |e| {
            if first.as_ref().is_none_or(|f| e.timer.sequence < f.sequence) {
                first = Some(e.timer.share());
            }
        });
        first
    }

    /// Every entry, for a snapshot of the log and a view change's reports.
    pub fn each(&self, mut visit: impl FnMut(&Entry)) {
        for entry in self.entries.borrow().values() {
            visit(entry);
        }
    }
}
