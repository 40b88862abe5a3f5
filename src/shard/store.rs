//! A shard's timer store: the wheel, an index from unique ID to wheel entry,
//! the ID generator and the statistics-tag table.
//!
//! The index is a `hashbrown::HashTable<u32>` of wheel slab indices (4 bytes
//! a bucket): lookups compare the entry's unique ID in the slab.

use crate::timer::id::index_hash;
use crate::timer::spec::TAGS_MAX;
use crate::timer::{IdGenerator, Timer};
use crate::wheel::{Key, Wheel};
use hashbrown::HashTable;
use std::borrow::Cow;
use std::collections::HashMap;

/// Distinct tag names per shard.
pub const TAG_NAMES_MAX: usize = 4096;

pub struct Store {
    wheel: Wheel<Timer>,
    index: HashTable<u32>,
    pub ids: IdGenerator,
    tag_names: Vec<String>,
    tag_lookup: HashMap<String, u32>,
    /// Live timers × count, per tag index.
    tag_values: Vec<i64>,
    /// Tombstones among the stored entries.
    tombstones: usize,
}

impl Store {
    pub fn new(shard: usize, shards: usize, instance: u16, now_ms: u64) -> Store {
        Store {
            wheel: Wheel::new(now_ms),
            index: HashTable::new(),
            ids: IdGenerator::new(instance, shard, shards),
            tag_names: Vec::new(),
            tag_lookup: HashMap::new(),
            tag_values: Vec::new(),
            tombstones: 0,
        }
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
        let wheel = &self.wheel;
        let index = *self.index.find(index_hash(unique), |&i| {
            wheel
                .get_by_index(i)
                .is_some_and(|(_, _, t)| t.unique == unique)
        })?;
        wheel.get_by_index(index).map(|(key, _, _)| key)
    }

    /// The timer with this unique ID, and when it is due.
    pub fn get(&self, unique: u64) -> Option<(u64, &Timer)> {
        let key = self.find_key(unique)?;
        Some((self.wheel.due_ms(key)?, self.wheel.get(key)?))
    }

    pub fn insert(&mut self, due_ms: u64, timer: Timer) {
        let unique = timer.unique;
        self.count_tags(&timer, 1);
        self.tombstones += timer.is_tombstone() as usize;
        let key = self.wheel.insert(due_ms, timer);
        let wheel = &self.wheel;
        self.index
            .insert_unique(index_hash(unique), key.index(), |&i| {
                index_hash(
                    wheel
                        .get_by_index(i)
                        .expect("indexed entries are live")
                        .2
                        .unique,
                )
            });
    }

    pub fn remove(&mut self, unique: u64) -> Option<Timer> {
        let key = self.find_key(unique)?;
        self.unindex(unique, key.index());
        let timer = self.wheel.cancel(key)?;
        self.count_tags(&timer, -1);
        self.tombstones -= timer.is_tombstone() as usize;
        Some(timer)
    }

    fn unindex(&mut self, unique: u64, slab_index: u32) {
        if let Ok(entry) = self
            .index
            .find_entry(index_hash(unique), |&i| i == slab_index)
        {
            entry.remove();
        }
    }

    /// Up to `limit` timers `keep` accepts, due at or after `from_ms`, in
    /// pop-time order (resync; O(n), never on the pop path).
    pub fn earliest_where(
        &self,
        from_ms: u64,
        limit: usize,
        keep: impl Fn(&Timer) -> bool,
    ) -> Vec<(u64, &Timer)> {
        self.wheel
            .earliest_where(from_ms, limit, keep)
            .into_iter()
            .filter_map(|(key, due)| Some((due, self.wheel.get(key)?)))
            .collect()
    }

    /// When the next pop could be due.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.wheel.next_deadline_ms()
    }

    /// Take up to `limit` due timers out of the store.
    pub fn poll(&mut self, now_ms: u64, limit: usize, out: &mut Vec<(u64, Timer)>) -> usize {
        let Store { wheel, index, .. } = self;
        let fired = wheel.poll(now_ms, limit, |key, due, timer| {
            if let Ok(entry) = index.find_entry(index_hash(timer.unique), |&i| i == key.index()) {
                entry.remove();
            }
            out.push((due, timer));
        });
        let start = out.len() - fired;
        for (_, timer) in &out[start..] {
            if timer.is_tombstone() {
                self.tombstones -= 1;
            } else if timer.has_tags() {
                for (index, count) in timer.tags() {
                    self.tag_values[index as usize] -= count as i64;
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
            s.insert(u % 50 + 1, timer(u * 7919));
        }
        assert!(s.get(7919).is_some());
        assert!(s.remove(7919).is_some());
        assert!(s.get(7919).is_none());
        assert!(s.remove(7919).is_none());
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

    #[test]
    fn tags_count_live_timers() {
        let mut s = Store::new(0, 1, 0, 0);
        let t = tagged(&mut s, 1, "CALL", 3);
        s.insert(5, t);
        let t = tagged(&mut s, 2, "CALL", 1);
        s.insert(50, t);
        s.insert(60, timer(3).to_tombstone());
        assert_eq!(s.tombstones(), 1);
        assert_eq!(s.tag_values(), vec![("CALL".to_string(), 4)]);
        s.remove(2);
        assert_eq!(s.tag_values(), vec![("CALL".to_string(), 3)]);
        let mut out = Vec::new();
        s.poll(10, usize::MAX, &mut out);
        assert_eq!(s.tag_values(), vec![("CALL".to_string(), 0)]);
        s.poll(100, usize::MAX, &mut out);
        assert_eq!(s.tombstones(), 0);
    }
}
