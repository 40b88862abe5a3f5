//! A shard's timer store: the wheel, an index from unique ID to wheel entry,
//! the ID generator and the statistics-tag table.
//!
//! The index is a `hashbrown::HashTable<u32>` of wheel slab indices (4 bytes
//! a bucket): lookups compare the entry's unique ID in the slab. It grows
//! incrementally ([`Index`]): a plain table rehashes every entry when it
//! doubles, which at 2 M timers stalls the shard for ~0.1 s (pops late);
//! here each insert moves a bounded number of entries instead.
//!
//! It holds no log: `insert`, `remove` and `log_current` take the shard's
//! (`Durable` is its one owner), `None` without `[storage]`.

use crate::runtime::clock;
use crate::storage::record::Image;
use crate::storage::Log;
use crate::timer::id::index_hash;
use crate::timer::spec::TAGS_MAX;
use crate::timer::{IdGenerator, Timer};
use crate::wheel::{Key, Wheel};
use hashbrown::HashTable;
use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;

/// Distinct tag names per shard.
pub const TAG_NAMES_MAX: usize = 4096;
/// Informational timers per shard (seed 003: old-view copies kept outside
/// the wheel while a resync runs); beyond it an old copy is not kept, and
/// the new replicas learn the timer from the replication the resync sends.
pub const INFORMATIONAL_MAX: usize = 65_536;

pub struct Store {
    wheel: Wheel<Timer>,
    index: Index,
    pub ids: IdGenerator,
    tag_names: Vec<String>,
    tag_lookup: HashMap<String, u32>,
    /// Live timers × count, per tag index.
    tag_values: Vec<i64>,
    /// Tombstones among the stored entries.
    tombstones: usize,
    /// Informational timers (seed 003), at most one per ID, outside the
    /// wheel; at most `INFORMATIONAL_MAX`.
    info: HashMap<u64, Timer>,
}

impl Store {
    pub fn new(shard: usize, shards: usize, instance: u16, now_ms: u64) -> Store {
        Store {
            wheel: Wheel::new(now_ms),
            index: Index::default(),
            ids: IdGenerator::new(instance, shard, shards),
            tag_names: Vec::new(),
            tag_lookup: HashMap::new(),
            tag_values: Vec::new(),
            tombstones: 0,
            info: HashMap::new(),
        }
    }

    /// Append a PUT of `timer`, due at `due_ms` (engine time).
    fn log_put(&self, log: Option<&Rc<Log>>, due_ms: u64, timer: &Timer) {
        if let Some(log) = log {
            let image = image_of(due_ms, timer);
            let mut pairs = [("", 0u32); TAGS_MAX];
            let n = self.tag_pairs(timer, &mut pairs);
            // `Err`: the log failed or closed. Nothing made since is
            // acknowledged (every durability wait fails), and a failed
            // log stops the node (fail-stop, `shard/durable.rs`).
            let _ = log.put(&image, pairs[..n].iter().copied());
        }
    }

    /// Log the stored state of `unique` as it is now: its incarnation, or
    /// its removal (a pop's outcome, once its callback has ended: the pop
    /// loop's own moves use the `_unlogged` forms, and the log keeps the
    /// pre-pop state until then).
    pub fn log_current(&self, unique: u64, log: Option<&Rc<Log>>) {
        let Some(log) = log else {
            return;
        };
        match self.get(unique) {
            Some((due, t)) => self.log_put(Some(log), due, t),
            None => {
                // As in `log_put`.
                let _ = log.remove(unique);
            }
        }
    }

    /// Store a recovered timer (already in the log), at its due time in
    /// engine time.
    pub fn recover(&mut self, image: &Image<'_>) {
        let timer = self.timer_of_image(image);
        // Replay keeps one incarnation per ID, and recovery fills an empty
        // store: no ID comes twice (`insert_unlogged` debug-asserts it).
        self.insert_unlogged(clock::unix_to_engine(image.due_unix_ms), timer);
    }

    /// A logged timer as a record of this store (tags interned here),
    /// its start in engine time.
    pub fn timer_of_image(&mut self, image: &Image<'_>) -> Timer {
        let mut head = image.head;
        head.start_ms = clock::unix_to_engine(head.start_ms);
        let mut named: [(Cow<'_, str>, u32); TAGS_MAX] = Default::default();
        let mut n = 0;
        for (slot, (name, count)) in named.iter_mut().zip(image.tags()) {
            *slot = (Cow::Borrowed(name), count);
            n += 1;
        }
        let mut tags = [(0u32, 0u32); TAGS_MAX];
        let n = self.intern_tags(&named[..n], &mut tags);
        Timer::with_ext(head, image.uri, image.opaque, &tags[..n], image.ext)
    }

    /// Encode `timer` (due at `due_ms`) into a snapshot.
    pub fn snapshot_put(
        &self,
        enc: &mut crate::storage::snapshot::Encoder,
        due_ms: u64,
        timer: &Timer,
    ) {
        let image = image_of(due_ms, timer);
        let mut pairs = [("", 0u32); TAGS_MAX];
        let n = self.tag_pairs(timer, &mut pairs);
        enc.put(&image, pairs[..n].iter().copied());
    }

    pub fn len(&self) -> usize {
        self.wheel.len()
    }

    pub fn is_empty(&self) -> bool {
        self.wheel.is_empty()
    }

    /// Stored tombstones (part of `len`).
    pub fn tombstones(&self) -> usize {
        self.tombstones
    }

    fn find_key(&self, unique: u64) -> Option<Key> {
        let index = self.index.find(&self.wheel, unique)?;
        self.wheel.get_by_index(index).map(|(key, _, _)| key)
    }

    /// The timer with this unique ID, and when it is due.
    pub fn get(&self, unique: u64) -> Option<(u64, &Timer)> {
        let key = self.find_key(unique)?;
        Some((self.wheel.due_ms(key)?, self.wheel.get(key)?))
    }

    /// [`Store::get`] given where the timer was: `slab`, the slab index a
    /// scan saw it at ([`Store::scan_slice`]). While the timer is still
    /// there (the entry at `slab` holds this ID: the wheel holds one
    /// incarnation per ID) the ID index is not probed; else (it moved, was
    /// replaced or is gone, and the slot may hold another timer now) it is
    /// looked up by ID, as `get` does. A resync page's lookups, in cursor
    /// order, took two cache misses each through the index.
    pub fn get_at(&self, slab: u32, unique: u64) -> Option<(u64, &Timer)> {
        match self.wheel.get_by_index(slab) {
            Some((_, due, t)) if t.unique == unique => Some((due, t)),
            _ => self.get(unique),
        }
    }

    /// Start loading the slab entry at `slab` into the cache (a hint; a
    /// page's lookups by [`Store::get_at`] ask a few keys ahead).
    pub fn prefetch(&self, slab: u32) {
        self.wheel.prefetch_index(slab);
    }

    /// Store a timer; its ID must not be stored already (one incarnation
    /// per ID: replace with `remove` first). Logged in `log` (the shard's
    /// `Durable` owns it; `None` without `[storage]`).
    pub fn insert(&mut self, due_ms: u64, timer: Timer, log: Option<&Rc<Log>>) {
        self.log_put(log, due_ms, &timer);
        self.insert_unlogged(due_ms, timer);
    }

    /// `insert` without a log record: the pop loop's moves (the log keeps
    /// the pre-pop state until the pop's callback ends), and recovery.
    pub fn insert_unlogged(&mut self, due_ms: u64, timer: Timer) {
        let unique = timer.unique;
        debug_assert!(self.find_key(unique).is_none(), "one incarnation per ID");
        let len_before = self.wheel.len();
        self.count_tags(&timer, 1);
        self.tombstones += timer.is_tombstone() as usize;
        let key = self.wheel.insert(due_ms, timer);
        self.index.insert(&self.wheel, unique, key.index());
        assert_eq!(
            self.wheel.len(),
            len_before + 1,
            "an insert of a new ID adds one entry"
        );
        assert!(
            self.tombstones <= self.wheel.len(),
            "tombstones are stored timers"
        );
    }

    /// Take a timer out. Logged in `log`, as `insert` is.
    pub fn remove(&mut self, unique: u64, log: Option<&Rc<Log>>) -> Option<Timer> {
        let timer = self.remove_unlogged(unique)?;
        if let Some(log) = log {
            // As in `log_put`.
            let _ = log.remove(unique);
        }
        Some(timer)
    }

    /// `remove` without a log record (the pop loop's moves).
    pub fn remove_unlogged(&mut self, unique: u64) -> Option<Timer> {
        let key = self.find_key(unique)?;
        self.index.remove(unique, key.index());
        let timer = self.wheel.cancel(key)?;
        assert_eq!(
            timer.unique, unique,
            "the index points at the timer's own entry"
        );
        self.count_tags(&timer, -1);
        self.tombstones -= timer.is_tombstone() as usize;
        Some(timer)
    }

    /// Mutable access to a stored timer, for what does not move it in the
    /// wheel (its resync marks).
    pub fn get_mut(&mut self, unique: u64) -> Option<&mut Timer> {
        let key = self.find_key(unique)?;
        self.wheel.get_mut(key)
    }

    /// Visit the timers at slab indices `from..from + count` (resync scans
    /// the store in bounded slices) as `(slab index, due, timer)`; returns
    /// where the next slice starts, `None` at the end.
    pub fn scan_slice(
        &self,
        from: usize,
        count: usize,
        mut visit: impl FnMut(u32, u64, &Timer),
    ) -> Option<usize> {
        let end = (from + count).min(self.wheel.slab_len());
        for index in from..end {
            if let Some((_, due, t)) = self.wheel.get_by_index(index as u32) {
                visit(index as u32, due, t);
            }
        }
        (end < self.wheel.slab_len()).then_some(end)
    }

    /// Keep an informational timer (an old-view copy of `timer.unique`);
    /// `false` when the bound is reached.
    pub fn keep_info(&mut self, timer: Timer) -> bool {
        assert!(!timer.is_tombstone(), "an informational timer is live");
        if self.info.len() >= INFORMATIONAL_MAX && !self.info.contains_key(&timer.unique) {
            return false;
        }
        self.info.insert(timer.unique, timer);
        true
    }

    pub fn info(&self, unique: u64) -> Option<&Timer> {
        self.info.get(&unique)
    }

    pub fn info_mut(&mut self, unique: u64) -> Option<&mut Timer> {
        self.info.get_mut(&unique)
    }

    pub fn drop_info(&mut self, unique: u64) -> Option<Timer> {
        self.info.remove(&unique)
    }

    pub fn info_len(&self) -> usize {
        self.info.len()
    }

    /// The IDs of every informational timer.
    pub fn info_ids(&self) -> Vec<u64> {
        self.info.keys().copied().collect()
    }

    /// When the next pop could be due.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.wheel.next_deadline_ms()
    }

    /// Take up to `limit` due timers out of the store.
    pub fn poll(&mut self, now_ms: u64, limit: usize, out: &mut Vec<(u64, Timer)>) -> usize {
        let Store { wheel, index, .. } = self;
        let fired = wheel.poll(now_ms, limit, |key, due, timer| {
            index.remove(timer.unique, key.index());
            out.push((due, timer));
        });
        assert!(
            fired <= limit && fired <= out.len(),
            "the poll keeps to its limit and hands every timer it fired"
        );
        let start = out.len() - fired;
        for (due, timer) in &out[start..] {
            assert!(*due <= now_ms, "never early");
            if timer.is_tombstone() {
                self.tombstones -= 1;
            } else if timer.has_tags() {
                for (index, count) in timer.tags() {
                    self.tag_values[index as usize] -= count as i64;
                    debug_assert!(
                        self.tag_values[index as usize] >= 0,
                        "tag counts never negative"
                    );
                }
            }
        }
        fired
    }

    /// Tag names to indices, written into `out`; returns how many (new names
    /// are added, up to `TAG_NAMES_MAX`; beyond that a tag is not counted).
    pub fn intern_tags(
        &mut self,
        tags: &[(Cow<'_, str>, u32)],
        out: &mut [(u32, u32); TAGS_MAX],
    ) -> usize {
        let mut n = 0;
        for (name, count) in tags.iter().take(TAGS_MAX) {
            let index = match self.tag_lookup.get(name.as_ref()) {
                Some(i) => *i,
                None if self.tag_names.len() < TAG_NAMES_MAX => {
                    let i = self.tag_names.len() as u32;
                    self.tag_names.push(name.to_string());
                    self.tag_lookup.insert(name.to_string(), i);
                    self.tag_values.push(0);
                    i
                }
                None => continue,
            };
            out[n] = (index, *count);
            n += 1;
        }
        n
    }

    /// A timer's tags as `(name, count)` into `out`; returns how many.
    pub fn tag_pairs<'s>(&'s self, t: &Timer, out: &mut [(&'s str, u32); TAGS_MAX]) -> usize {
        let mut n = 0;
        for (slot, (index, count)) in out.iter_mut().zip(t.tags()) {
            *slot = (self.tag_name(index), count);
            n += 1;
        }
        n
    }

    /// The name of an interned tag.
    pub fn tag_name(&self, index: u32) -> &str {
        &self.tag_names[index as usize]
    }

    fn count_tags(&mut self, timer: &Timer, sign: i64) {
        if !timer.is_tombstone() {
            for (index, count) in timer.tags() {
                self.tag_values[index as usize] += sign * count as i64;
            }
        }
    }

    /// `(tag, live timers × count)` for every tag seen.
    pub fn tag_values(&self) -> Vec<(String, i64)> {
        self.tag_names
            .iter()
            .cloned()
            .zip(self.tag_values.iter().copied())
            .collect()
    }
}

/// A timer as the log and snapshots keep it: times on the wall clock.
fn image_of(due_ms: u64, t: &Timer) -> Image<'_> {
    let mut head = t.head();
    head.start_ms = clock::engine_to_unix(head.start_ms);
    let mut image = Image::new(clock::engine_to_unix(due_ms), head, t.uri(), t.opaque());
    image.ext = t.ext();
    image
}

/// Slab indices an insert checks while the index is growing: a growth that
/// starts at slab length `S` is done after `S / MIGRATE_SCAN` inserts.
const MIGRATE_SCAN: usize = 64;

/// The ID index: unique ID → wheel slab index, growing without a stop.
///
/// When `current` is full it becomes `previous` and a table of twice the
/// capacity takes its place; every later insert then moves the entries of
/// the next [`MIGRATE_SCAN`] slab indices from `previous` to `current`
/// (`cursor` walks the slab up to `end`, its length when the growth began).
/// Lookups and removals try `current`, then `previous`.
///
/// Invariants: an ID is in at most one table; inserts go only to `current`,
/// so once `cursor` reaches `end` `previous` is empty (asserted) and freed.
#[derive(Default)]
struct Index {
    current: HashTable<u32>,
    previous: HashTable<u32>,
    cursor: usize,
    end: usize,
}

fn unique_at(wheel: &Wheel<Timer>, slab_index: u32) -> u64 {
    wheel
        .get_by_index(slab_index)
        .expect("indexed entries are live")
        .2
        .unique
}

impl Index {
    fn find(&self, wheel: &Wheel<Timer>, unique: u64) -> Option<u32> {
        let hash = index_hash(unique);
        let eq = |&i: &u32| {
            wheel
                .get_by_index(i)
                .is_some_and(|(_, _, t)| t.unique == unique)
        };
        self.current
            .find(hash, eq)
            .or_else(|| self.previous.find(hash, eq))
            .copied()
    }

    fn insert(&mut self, wheel: &Wheel<Timer>, unique: u64, slab_index: u32) {
        if self.cursor < self.end {
            self.migrate(wheel);
        } else if !self.current.is_empty() && self.current.len() == self.current.capacity() {
            // Full: the next insert would rehash everything. Start a growth.
            let capacity = self.current.capacity() * 2;
            self.previous =
                std::mem::replace(&mut self.current, HashTable::with_capacity(capacity));
            self.cursor = 0;
            self.end = wheel.slab_len();
            self.migrate(wheel);
        }
        self.current
            .insert_unique(index_hash(unique), slab_index, |&i| {
                index_hash(unique_at(wheel, i))
            });
    }

    /// Move the entries of the next [`MIGRATE_SCAN`] slab indices.
    fn migrate(&mut self, wheel: &Wheel<Timer>) {
        let stop = (self.cursor + MIGRATE_SCAN).min(self.end);
        for slab_index in self.cursor..stop {
            let slab_index = slab_index as u32;
            let Some((_, _, timer)) = wheel.get_by_index(slab_index) else {
                continue;
            };
            let hash = index_hash(timer.unique);
            if let Ok(entry) = self.previous.find_entry(hash, |&i| i == slab_index) {
                entry.remove();
                self.current
                    .insert_unique(hash, slab_index, |&i| index_hash(unique_at(wheel, i)));
            }
        }
        self.cursor = stop;
        if self.cursor == self.end {
            assert!(
                self.previous.is_empty(),
                "the index growth moved every entry"
            );
            self.previous = HashTable::new();
        }
    }

    fn remove(&mut self, unique: u64, slab_index: u32) {
        let hash = index_hash(unique);
        if let Ok(entry) = self.current.find_entry(hash, |&i| i == slab_index) {
            entry.remove();
        } else if let Ok(entry) = self.previous.find_entry(hash, |&i| i == slab_index) {
            entry.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timer::{TimerHead, TimerId};

    fn head(unique: u64) -> TimerHead {
        TimerHead {
            id: TimerId { unique, bloom: 0 },
            start_ms: 0,
            version: 0,
            interval_ms: 10,
            repeat_for_ms: 10,
            sequence: 0,
            view: 0,
            replica_index: 0,
            replication_factor: 1,
            factor_requested: 1,
            site_index: 0,
            sites: u32::MAX,
        }
    }

    fn timer(unique: u64) -> Timer {
        Timer::new(head(unique), "http://a/", "o", &[])
    }

    fn tagged(s: &mut Store, unique: u64, tag: &str, count: u32) -> Timer {
        let mut out = [(0, 0); TAGS_MAX];
        let n = s.intern_tags(&[(Cow::Borrowed(tag), count)], &mut out);
        Timer::new(head(unique), "http://a/", "o", &out[..n])
    }

    #[test]
    fn index_follows_the_wheel() {
        let mut s = Store::new(0, 1, 0, 0);
        for u in 0..1000u64 {
            s.insert(u % 50 + 1, timer(u * 7919), None);
        }
        assert!(s.get(7919).is_some());
        assert!(s.remove(7919, None).is_some());
        assert!(s.get(7919).is_none());
        assert!(s.remove(7919, None).is_none());
        let mut out = Vec::new();
        s.poll(25, usize::MAX, &mut out);
        assert!(out.iter().all(|(due, _)| *due <= 25));
        for (_, t) in &out {
            assert!(s.get(t.unique).is_none(), "popped timers leave the index");
        }
        assert_eq!(s.len() + out.len(), 999);
        let survivor = (0..1000u64)
            .map(|u| u * 7919)
            .find(|u| s.get(*u).is_some())
            .unwrap();
        assert!(s.get(survivor).unwrap().0 > 25);
    }

    /// A resync lists a timer with its slab index and encodes it later:
    /// by then it may be gone, its slot reused by another timer, or it
    /// may be stored again elsewhere. `get_at` answers as `get` does.
    #[test]
    fn get_at_checks_the_slot_still_holds_the_timer() {
        let mut s = Store::new(0, 1, 0, 0);
        let mut slabs = std::collections::HashMap::new();
        s.insert(5, timer(1), None);
        s.insert(6, timer(2), None);
        s.scan_slice(0, 10, |slab, _, t| {
            slabs.insert(t.unique, slab);
        });
        let (slab1, slab2) = (slabs[&1], slabs[&2]);
        assert_ne!(slab1, slab2);
        assert_eq!(s.get_at(slab1, 1).map(|(d, t)| (d, t.unique)), Some((5, 1)));
        // Gone: its slot is free, then holds another timer.
        s.remove(1, None);
        assert!(s.get_at(slab1, 1).is_none());
        s.insert(7, timer(3), None);
        assert!(s.get(3).is_some());
        assert!(s.get_at(slab1, 1).is_none(), "the slot holds timer 3 now");
        // Stored again, in another slot: found by ID.
        s.insert(8, timer(1), None);
        let (due, t) = s.get_at(slab1, 1).expect("stored again");
        assert_eq!((due, t.unique), (8, 1));
        // Replaced in place of another: timer 2's slot reused by timer 1.
        s.remove(2, None);
        s.remove(1, None);
        s.insert(9, timer(1), None);
        assert_eq!(s.get_at(slab2, 1).map(|(d, _)| d), Some(9));
        assert!(s.get_at(slab2, 2).is_none(), "timer 2 is gone");
        // An index past the slab, or none (an informational timer).
        assert_eq!(s.get_at(u32::MAX, 1).map(|(d, _)| d), Some(9));
        assert!(s.get_at(u32::MAX, 2).is_none());
        s.prefetch(u32::MAX);
        s.prefetch(slab1);
    }

    #[test]
    fn timers_share_an_interned_uri_until_the_last_one_goes() {
        use crate::timer::callback::interned_count;
        let before = interned_count();
        let mut s = Store::new(0, 1, 0, 0);
        for u in 1..=100u64 {
            let uri = if u % 2 == 0 {
                "http://even.test/"
            } else {
                "http://odd.test/"
            };
            s.insert(u, Timer::new(head(u), uri, "o", &[]), None);
        }
        assert_eq!(interned_count(), before + 2, "one entry per distinct URI");
        let mut out = Vec::new();
        s.poll(99, usize::MAX, &mut out);
        assert_eq!(
            interned_count(),
            before + 2,
            "popped timers still hold theirs"
        );
        out.clear();
        assert_eq!(
            interned_count(),
            before + 1,
            "only the last timer's URI is left"
        );
        let last = s.remove(100, None).expect("stored");
        assert_eq!((last.uri(), last.opaque()), ("http://even.test/", "o"));
        drop(last);
        assert_eq!(interned_count(), before);
    }

    #[test]
    fn informational_timers_are_one_per_id_outside_the_wheel() {
        let mut s = Store::new(0, 1, 0, 0);
        s.insert(5, timer(1), None);
        assert!(s.keep_info(timer(1)));
        assert!(s.keep_info(timer(1)), "a second copy replaces the first");
        assert_eq!((s.info_len(), s.len()), (1, 1), "outside the wheel");
        let mut out = Vec::new();
        s.poll(10, usize::MAX, &mut out);
        assert_eq!(out.len(), 1, "the wheel pops only its own copy");
        assert!(s.info(1).is_some());
        assert!(s.drop_info(1).is_some() && s.info(1).is_none());
    }

    #[test]
    fn tags_count_live_timers() {
        let mut s = Store::new(0, 1, 0, 0);
        let t = tagged(&mut s, 1, "CALL", 3);
        s.insert(5, t, None);
        let t = tagged(&mut s, 2, "CALL", 1);
        s.insert(50, t, None);
        s.insert(60, timer(3).to_tombstone(), None);
        assert_eq!(s.tombstones(), 1);
        assert_eq!(s.tag_values(), vec![("CALL".to_string(), 4)]);
        s.remove(2, None);
        assert_eq!(s.tag_values(), vec![("CALL".to_string(), 3)]);
        let mut out = Vec::new();
        s.poll(10, usize::MAX, &mut out);
        assert_eq!(s.tag_values(), vec![("CALL".to_string(), 0)]);
        s.poll(100, usize::MAX, &mut out);
        assert_eq!(s.tombstones(), 0);
    }

    #[test]
    fn index_grows_incrementally_and_never_loses_an_id() {
        // Random inserts, cancels and pops against a model, across many
        // growths of the index (each begun while the slab has holes).
        let mut s = Store::new(0, 1, 0, 0);
        let mut model = std::collections::HashMap::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut now = 0;
        let mut out = Vec::new();
        let mut growths = 0;
        for unique in 1..=60_000u64 {
            let migrating = s.index.cursor < s.index.end;
            let due = now + 1 + next() % 5000;
            s.insert(due, timer(unique), None);
            model.insert(unique, due);
            if !migrating && s.index.cursor < s.index.end {
                growths += 1;
                // A growth moves a bounded share at a time, not everything.
                assert!(!s.index.previous.is_empty());
            }
            match next() % 8 {
                0 => {
                    let victim = 1 + next() % unique;
                    assert_eq!(
                        s.remove(victim, None).is_some(),
                        model.remove(&victim).is_some()
                    );
                }
                1 => {
                    now += 1;
                    out.clear();
                    s.poll(now, usize::MAX, &mut out);
                    for (due, t) in &out {
                        assert_eq!(model.remove(&t.unique), Some(*due));
                    }
                }
                _ => {}
            }
            if unique % 997 == 0 {
                for (&u, &due) in &model {
                    assert_eq!(s.get(u).map(|(d, _)| d), Some(due), "id {u}");
                }
            }
        }
        assert!(growths >= 5, "only {growths} growths");
        assert_eq!(s.len(), model.len());
        for (&u, &due) in &model {
            assert_eq!(s.get(u).map(|(d, _)| d), Some(due));
        }
    }
}
