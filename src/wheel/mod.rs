//! The hierarchical timing wheel: one per shard, 1 ms tick.
//!
//! # Shape
//!
//! Six levels of 64 slots. A slot at level `L` covers `64^L` ms, a whole level
//! covers `64^(L+1)` ms:
//!
//! | level | slot width | level span            |
//! |-------|------------|-----------------------|
//! | 0     | 1 ms       | 64 ms                 |
//! | 1     | 64 ms      | ~4.1 s                |
//! | 2     | ~4.1 s     | ~4.4 min              |
//! | 3     | ~4.4 min   | ~4.7 h                |
//! | 4     | ~4.7 h     | ~12.4 days            |
//! | 5     | ~12.4 days | ~2.2 years (2^36 ms)  |
//!
//! Timers further away than the top level's window sit in an overflow array and
//! are re-placed when the wheel crosses into their 2^36 ms window.
//!
//! # Storage
//!
//! Values live in one slab (`Vec<Entry<T>>`) with an intrusive free list.
//! Slots do not link entries together: each slot is a small array of
//! 12-byte *records* `(due, slab index)`. Cascading a slot down a level
//! copies records between arrays and never touches the slab, and firing a
//! level-0 slot reads the slab at independent addresses (prefetched ahead),
//! instead of chasing a linked list one cache miss at a time.
//!
//! Cancel and reschedule are lazy: they update the slab entry only. A record
//! is *live* when its slab entry holds a value with the same `due`; other
//! records are skipped when reached. A record that looks live but belongs to
//! an earlier occupant of the slab entry (the index was reused with the
//! same `due`) fires that occupant at exactly its own due time, and the
//! occupant's own record is then stale: a value fires once, never early.
//!
//! # Invariants
//!
//! - A record at level `L` shares its level-`L+1` window with `elapsed` (its
//!   level is the highest 6-bit digit in which `due` and `elapsed` differ), so
//!   the lowest occupied level always holds the earliest slot.
//! - Every live entry has at least one live record, in a slot or in the
//!   overflow array. `occupied[L]` has bit `s` set iff slot `(L, s)` holds a
//!   record (live or stale).
//! - `poll(now)` returns only entries with `due <= now`: never early. Records
//!   from a slot whose window has started but whose `due` is still ahead are
//!   cascaded down, never dropped, however far `now` jumps.
//! - Stale records are bounded: a slot array that is full is compacted before
//!   it may grow, unless the whole wheel holds fewer stale records than half
//!   the array (then the array is more than half live anyway). It grows only
//!   when more than a quarter of it is live, so a slot holds at most four
//!   times its peak live count plus `COMPACT_RECORDS_MIN`. Compaction costs
//!   at most two record checks per push, amortised, and none when nothing
//!   was cancelled. One compaction is not bounded below the array's size: at
//!   1 M timers in one 4.4-minute slot with constant cancel churn, one push
//!   in about 150 000 paid up to 1.7 ms (`perf/README.md`).
//! - Cancel is O(1); insert and reschedule are O(1) amortised (compaction,
//!   above) and allocate nothing once the slab and the slot arrays have grown.
//! - The wheel does no I/O and reads no clock: time comes in as `now`.

/// Bits of the slot index within a level.
const SLOT_BITS: u32 = 6;
/// Slots per level.
pub const SLOTS: usize = 1 << SLOT_BITS;
/// Number of levels.
pub const LEVELS: usize = 6;
/// Span of the whole wheel: timers further than this from `elapsed` overflow.
pub const SPAN_MS: u64 = 1 << (SLOT_BITS as u64 * LEVELS as u64);
/// The largest number of entries a wheel may hold (links are `u32`; one value
/// is the "none" sentinel).
pub const ENTRIES_MAX: usize = (u32::MAX - 1) as usize;
/// A drained level-0 slot array keeps its allocation up to this many records
/// (12 B each; level 0 is refilled by every level-1 cascade); a larger one is
/// freed.
const KEEP_RECORDS_MAX_LEVEL0: usize = 4096;
/// The same bound for the other levels' arrays. An idle wheel holds at most
/// `SLOTS * (KEEP_RECORDS_MAX_LEVEL0 + (LEVELS - 1) * KEEP_RECORDS_MAX) * 12`
/// B (3.9 MiB) of empty arrays.
const KEEP_RECORDS_MAX: usize = 256;
/// Drained arrays kept apart for slots that are refilled from empty (a
/// slot whose own array was freed, or taken while it fired): each within
/// the keep bound of its level, so at most 64 × 4096 × 12 B (3 MiB).
const SPARE_ARRAYS_MAX: usize = 64;
/// A full slot array below this size grows without compacting first.
const COMPACT_RECORDS_MIN: usize = 64;
/// How many records ahead of the one being fired the slab entry is prefetched.
const PREFETCH_AHEAD: usize = 16;

const NIL: u32 = u32::MAX;

/// A handle to one scheduled entry. Stale handles (the entry fired or was
/// cancelled, and the slot was reused) are detected by a generation count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    index: u32,
    generation: u32,
}

impl Key {
    /// The slab index: stable for the entry's lifetime, usable as a compact
    /// reference (for example in an external hash index).
    pub fn index(self) -> u32 {
        self.index
    }
}

struct Entry<T> {
    due_ms: u64,
    generation: u32,
    /// Next free entry while this one is on the free list.
    next_free: u32,
    value: Option<T>,
}

/// A slot's reference to a slab entry: 12 bytes, alignment 4.
#[derive(Clone, Copy, Debug)]
struct Record {
    due_lo: u32,
    due_hi: u32,
    index: u32,
}

impl Record {
    fn new(due_ms: u64, index: u32) -> Self {
        Record {
            due_lo: due_ms as u32,
            due_hi: (due_ms >> 32) as u32,
            index,
        }
    }

    fn due_ms(self) -> u64 {
        (u64::from(self.due_hi) << 32) | u64::from(self.due_lo)
    }
}

/// The next batch of records to look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Expiration {
    /// Level and slot, or `None` for the overflow array.
    slot: Option<(usize, usize)>,
    /// When that slot's window starts.
    deadline_ms: u64,
}

/// A hierarchical timing wheel holding values of type `T`.
pub struct Wheel<T> {
    entries: Vec<Entry<T>>,
    free_head: u32,
    /// `LEVELS * SLOTS` record arrays, level-major.
    slots: Vec<Vec<Record>>,
    occupied: [u64; LEVELS],
    overflow: Vec<Record>,
    /// Time up to which the wheel has been advanced, in ms.
    elapsed_ms: u64,
    len: usize,
    /// Records held in all slots. `records - len` is the number of stale
    /// records: each record either fires its entry or is dropped, and each
    /// live entry's latest record is live.
    records: usize,
    /// Empty record arrays with their allocation (`SPARE_ARRAYS_MAX`).
    spare: Vec<Vec<Record>>,
}

impl<T> Default for Wheel<T> {
    fn default() -> Self {
        Self::new(0)
    }
}

fn level_for(elapsed_ms: u64, when_ms: u64) -> usize {
    let masked = (elapsed_ms ^ when_ms) | (SLOTS as u64 - 1);
    if masked >= SPAN_MS {
        return LEVELS;
    }
    let significant = 63 - masked.leading_zeros();
    (significant / SLOT_BITS) as usize
}

fn slot_for(when_ms: u64, level: usize) -> usize {
    ((when_ms >> (level as u32 * SLOT_BITS)) & (SLOTS as u64 - 1)) as usize
}

/// Is `record` the live reference to its slab entry?
fn record_is_live<T>(entries: &[Entry<T>], record: Record) -> bool {
    let entry = &entries[record.index as usize];
    entry.value.is_some() && entry.due_ms == record.due_ms()
}

/// Append `record`, compacting a full array before letting it grow when the
/// wheel holds enough stale records (`stale`) that it could be half stale.
/// Returns how many stale records compaction dropped.
fn push_record<T>(
    entries: &[Entry<T>],
    records: &mut Vec<Record>,
    record: Record,
    stale: usize,
) -> usize {
    let mut dropped = 0;
    let capacity = records.capacity();
    if records.len() == capacity && capacity >= COMPACT_RECORDS_MIN && stale >= capacity / 2 {
        // `retain`, with the slab reads prefetched ahead so the misses overlap.
        let mut kept = 0;
        for at in 0..records.len() {
            if let Some(ahead) = records.get(at + PREFETCH_AHEAD) {
                prefetch(&entries[ahead.index as usize]);
            }
            let record = records[at];
            if record_is_live(entries, record) {
                records[kept] = record;
                kept += 1;
            }
        }
        records.truncate(kept);
        dropped = capacity - records.len();
        if records.len() > capacity / 4 {
            // More than a quarter live: grow, so the next compaction is at
            // least `capacity` pushes away (cheaper than compacting again soon).
            records.reserve(capacity);
        }
    }
    records.push(record);
    dropped
}

#[inline(always)]
fn prefetch<T>(entry: &T) {
    prefetch_at(entry as *const T as *const u8);
}

/// Prefetch the cache line holding `at` (within a live allocation).
#[inline(always)]
fn prefetch_at(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address
    // (and the callers' point into a live allocation).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

impl<T> Wheel<T> {
    /// An empty wheel whose clock starts at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Wheel {
            entries: Vec::new(),
            free_head: NIL,
            slots: (0..LEVELS * SLOTS).map(|_| Vec::new()).collect(),
            occupied: [0; LEVELS],
            overflow: Vec::new(),
            elapsed_ms: now_ms,
            len: 0,
            records: 0,
            spare: Vec::new(),
        }
    }

    /// An empty wheel with room for `capacity` entries before the slab
    /// allocates.
    pub fn with_capacity(now_ms: u64, capacity: usize) -> Self {
        let mut wheel = Self::new(now_ms);
        wheel.entries.reserve(capacity);
        wheel
    }

    /// Slab entries ever allocated (live or free): every live index is below.
    pub fn slab_len(&self) -> usize {
        self.entries.len()
    }

    /// Number of scheduled entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The time the wheel has been advanced to.
    pub fn elapsed_ms(&self) -> u64 {
        self.elapsed_ms
    }

    /// Bytes of slab storage per entry (for memory accounting); each live
    /// entry also has a 12-byte record in its slot.
    pub const fn entry_size() -> usize {
        std::mem::size_of::<Entry<T>>()
    }

    /// Records held in all slots, live and stale (for tests and accounting).
    pub fn records_len(&self) -> usize {
        debug_assert_eq!(
            self.records,
            self.slots.iter().map(Vec::len).sum::<usize>() + self.overflow.len(),
            "the record count follows every push and compaction"
        );
        self.records
    }

    /// Schedule `value` at `due_ms`. A `due_ms` in the past fires on the next
    /// `poll`.
    ///
    /// # Panics
    /// If the wheel already holds `ENTRIES_MAX` entries.
    pub fn insert(&mut self, due_ms: u64, value: T) -> Key {
        let index = if self.free_head != NIL {
            let index = self.free_head;
            let entry = &mut self.entries[index as usize];
            debug_assert!(entry.value.is_none(), "a free entry holds no value");
            self.free_head = entry.next_free;
            entry.next_free = NIL;
            entry.due_ms = due_ms;
            entry.value = Some(value);
            index
        } else {
            assert!(self.entries.len() < ENTRIES_MAX, "wheel is full");
            self.entries.push(Entry {
                due_ms,
                generation: 0,
                next_free: NIL,
                value: Some(value),
            });
            (self.entries.len() - 1) as u32
        };
        self.place(Record::new(due_ms, index));
        self.len += 1;
        Key {
            index,
            generation: self.entries[index as usize].generation,
        }
    }

    /// Remove a scheduled entry. `None` if the key is stale. Its record stays
    /// in its slot, stale, until reached or compacted.
    pub fn cancel(&mut self, key: Key) -> Option<T> {
        let entry = self.entries.get(key.index as usize)?;
        if entry.generation != key.generation || entry.value.is_none() {
            return None;
        }
        Some(self.release(key.index))
    }

    /// The value behind a live key.
    pub fn get(&self, key: Key) -> Option<&T> {
        let entry = self.entries.get(key.index as usize)?;
        if entry.generation != key.generation {
            return None;
        }
        entry.value.as_ref()
    }

    /// Mutable access to the value behind a live key.
    pub fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        let entry = self.entries.get_mut(key.index as usize)?;
        if entry.generation != key.generation {
            return None;
        }
        entry.value.as_mut()
    }

    /// The value at a slab index, if that index is live (see [`Key::index`]).
    pub fn get_by_index(&self, index: u32) -> Option<(Key, u64, &T)> {
        let entry = self.entries.get(index as usize)?;
        let value = entry.value.as_ref()?;
        Some((
            Key {
                index,
                generation: entry.generation,
            },
            entry.due_ms,
            value,
        ))
    }

    /// Start loading the slab entry at `index` into the cache, both of its
    /// cache lines (a hint: nothing happens for an index out of range).
    pub fn prefetch_index(&self, index: u32) {
        if let Some(entry) = self.entries.get(index as usize) {
            let first = entry as *const Entry<T> as *const u8;
            prefetch_at(first);
            // An entry (~112 bytes for a timer) spans two lines.
            prefetch_at(first.wrapping_add(std::mem::size_of::<Entry<T>>() - 1));
        }
    }

    /// When a live key is due.
    pub fn due_ms(&self, key: Key) -> Option<u64> {
        let entry = self.entries.get(key.index as usize)?;
        (entry.generation == key.generation && entry.value.is_some()).then_some(entry.due_ms)
    }

    /// Move a live entry to a new due time, keeping its key. False if stale.
    pub fn reschedule(&mut self, key: Key, due_ms: u64) -> bool {
        let Some(entry) = self.entries.get_mut(key.index as usize) else {
            return false;
        };
        if entry.generation != key.generation || entry.value.is_none() {
            return false;
        }
        if entry.due_ms != due_ms {
            entry.due_ms = due_ms;
            self.place(Record::new(due_ms, key.index));
        }
        true
    }

    /// The earliest time at which `poll` could return something, or `None`
    /// when no slot holds a record. Never later than the earliest due time;
    /// may be earlier (a higher-level slot's window opens before its entries
    /// are due, or a slot holds only stale records).
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.next_expiration().map(|e| e.deadline_ms)
    }

    /// Advance to `now_ms` and hand every entry with `due <= now_ms` to
    /// `fire`, at most `limit` of them. Returns how many fired. When the limit
    /// stops it early, the remaining due entries fire on the next call.
    pub fn poll(&mut self, now_ms: u64, limit: usize, mut fire: impl FnMut(Key, u64, T)) -> usize {
        let mut fired = 0;
        // Bounded: each turn either empties a slot whose window opened at or
        // before `now_ms` (records move strictly down a level, fire, or are
        // dropped as stale), or breaks out.
        while fired < limit {
            let Some(expiration) = self.next_expiration() else {
                break;
            };
            if expiration.deadline_ms > now_ms {
                break;
            }
            debug_assert!(
                expiration.deadline_ms >= self.elapsed_ms,
                "the wheel's time never goes back"
            );
            self.elapsed_ms = expiration.deadline_ms;
            let mut records = self.take_records(expiration.slot);
            // Pass 1: cascade what is not due yet, and pack what is due to
            // the front (order kept). This pass never reads the slab.
            let mut due = 0;
            for at in 0..records.len() {
                let record = records[at];
                if record.due_ms() > now_ms {
                    self.cascade(record);
                } else {
                    records[due] = record;
                    due += 1;
                }
            }
            // Pass 2: fire. Each slab entry is prefetched a few records
            // ahead, so the misses overlap instead of forming a chain.
            let mut done = 0;
            while done < due && fired < limit {
                if done + PREFETCH_AHEAD < due {
                    let ahead = records[done + PREFETCH_AHEAD];
                    prefetch(&self.entries[ahead.index as usize]);
                }
                let record = records[done];
                self.records -= 1;
                if record_is_live(&self.entries, record) {
                    let generation = self.entries[record.index as usize].generation;
                    let value = self.release(record.index);
                    fired += 1;
                    fire(
                        Key {
                            index: record.index,
                            generation,
                        },
                        record.due_ms(),
                        value,
                    );
                }
                done += 1;
            }
            records.truncate(due);
            // Stopped by the limit: the rest go back, placed from `elapsed`.
            for &record in &records[done..] {
                self.cascade(record);
            }
            self.recycle(expiration.slot, records);
        }
        if fired < limit && now_ms > self.elapsed_ms {
            self.elapsed_ms = now_ms;
        }
        fired
    }

    /// Visit every live entry (slab order, not time order).
    pub fn for_each(&self, mut visit: impl FnMut(Key, u64, &T)) {
        for (index, entry) in self.entries.iter().enumerate() {
            if let Some(value) = entry.value.as_ref() {
                visit(
                    Key {
                        index: index as u32,
                        generation: entry.generation,
                    },
                    entry.due_ms,
                    value,
                );
            }
        }
    }

    /// Up to `limit` live entries with `due >= from_ms`, in due-time order
    /// (ties by slab index). O(n log limit); used by resync, never on the pop path.
    pub fn earliest_from(&self, from_ms: u64, limit: usize) -> Vec<(Key, u64)> {
        self.earliest_where(from_ms, limit, |_| true)
    }

    /// Like `earliest_from`, counting only entries that `keep` accepts.
    pub fn earliest_where(
        &self,
        from_ms: u64,
        limit: usize,
        keep: impl Fn(&T) -> bool,
    ) -> Vec<(Key, u64)> {
        let mut heap: std::collections::BinaryHeap<(u64, u32, u32)> =
            std::collections::BinaryHeap::with_capacity(limit.min(self.len) + 1);
        if limit == 0 {
            return Vec::new();
        }
        self.for_each(|key, due_ms, item| {
            if due_ms < from_ms || !keep(item) {
                return;
            }
            let item = (due_ms, key.index, key.generation);
            if heap.len() < limit {
                heap.push(item);
            } else if let Some(top) = heap.peek() {
                if item < *top {
                    heap.pop();
                    heap.push(item);
                }
            }
        });
        let mut out: Vec<(Key, u64)> = heap
            .into_iter()
            .map(|(due, index, generation)| (Key { index, generation }, due))
            .collect();
        out.sort_unstable_by_key(|(key, due)| (*due, key.index));
        out
    }

    fn next_expiration(&self) -> Option<Expiration> {
        for level in 0..LEVELS {
            let occupied = self.occupied[level];
            if occupied == 0 {
                continue;
            }
            let shift = level as u32 * SLOT_BITS;
            let slot_range = 1u64 << shift;
            let level_range = slot_range << SLOT_BITS;
            let now_slot = ((self.elapsed_ms >> shift) & (SLOTS as u64 - 1)) as u32;
            let level_start = self.elapsed_ms & !(level_range - 1);
            let ahead = occupied & (u64::MAX << now_slot);
            // By the level invariant every occupied slot is at or after the
            // current one; a wrap would mean a bug, so fall back to the
            // next window rather than report a time in the past.
            debug_assert!(ahead != 0, "occupied slot behind elapsed at level {level}");
            let (slot, start) = if ahead != 0 {
                (ahead.trailing_zeros(), level_start)
            } else {
                (occupied.trailing_zeros(), level_start + level_range)
            };
            let deadline_ms = (start + slot as u64 * slot_range).max(self.elapsed_ms);
            return Some(Expiration {
                slot: Some((level, slot as usize)),
                deadline_ms,
            });
        }
        if !self.overflow.is_empty() {
            return Some(Expiration {
                slot: None,
                deadline_ms: (self.elapsed_ms | (SPAN_MS - 1)) + 1,
            });
        }
        None
    }

    /// Where `record` belongs now: a slot (`level * SLOTS + slot`, marked
    /// occupied) or `None` for the overflow array.
    fn home_of(&mut self, record: Record) -> Option<usize> {
        let due_ms = record.due_ms().max(self.elapsed_ms);
        let level = level_for(self.elapsed_ms, due_ms);
        if level >= LEVELS {
            return None;
        }
        let slot = slot_for(due_ms, level);
        self.occupied[level] |= 1 << slot;
        Some(level * SLOTS + slot)
    }

    /// Put a new record (from insert or reschedule) in its slot, compacting
    /// the slot's array before it grows.
    fn place(&mut self, record: Record) {
        let stale = self.records - self.len;
        let records = match self.home_of(record) {
            Some(at) => &mut self.slots[at],
            None => &mut self.overflow,
        };
        if records.capacity() == 0 {
            *records = self.spare.pop().unwrap_or_default();
        }
        let dropped = push_record(&self.entries, records, record, stale);
        self.records = self.records + 1 - dropped;
    }

    /// Move a record down during a cascade. No compaction: a cascade never
    /// adds records, and it must not read the slab (that is its point).
    fn cascade(&mut self, record: Record) {
        let records = match self.home_of(record) {
            Some(at) => &mut self.slots[at],
            None => &mut self.overflow,
        };
        if records.capacity() == 0 {
            *records = self.spare.pop().unwrap_or_default();
        }
        records.push(record);
    }

    /// Detach a slot's records.
    fn take_records(&mut self, slot: Option<(usize, usize)>) -> Vec<Record> {
        match slot {
            Some((level, slot)) => {
                self.occupied[level] &= !(1 << slot);
                std::mem::take(&mut self.slots[level * SLOTS + slot])
            }
            None => std::mem::take(&mut self.overflow),
        }
    }

    /// Give a drained array's allocation back to its slot when it is small
    /// and the slot has not been refilled meanwhile.
    fn recycle(&mut self, slot: Option<(usize, usize)>, mut records: Vec<Record>) {
        let keep_max = match slot {
            Some((0, _)) => KEEP_RECORDS_MAX_LEVEL0,
            _ => KEEP_RECORDS_MAX,
        };
        if records.capacity() > keep_max {
            return;
        }
        let home = match slot {
            Some((level, slot)) => &mut self.slots[level * SLOTS + slot],
            None => &mut self.overflow,
        };
        records.clear();
        if home.capacity() == 0 {
            *home = records;
        } else if self.spare.len() < SPARE_ARRAYS_MAX {
            self.spare.push(records);
        }
    }

    fn release(&mut self, index: u32) -> T {
        let entry = &mut self.entries[index as usize];
        let value = entry.value.take().expect("released entry holds a value");
        entry.generation = entry.generation.wrapping_add(1);
        entry.next_free = self.free_head;
        self.free_head = index;
        self.len -= 1;
        value
    }
}

#[cfg(test)]
mod tests;
