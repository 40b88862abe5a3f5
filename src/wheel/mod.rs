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
//! Timers further away than the top level's window sit on an overflow list and
//! are re-placed when the wheel crosses into their 2^36 ms window.
//!
//! # Invariants
//!
//! - A timer at level `L` shares its level-`L+1` window with `elapsed` (its
//!   level is the highest 6-bit digit in which `due` and `elapsed` differ), so
//!   the lowest occupied level always holds the earliest slot.
//! - Every entry is on exactly one list: a slot, the overflow list, or the free
//!   list. `occupied[L]` has bit `s` set iff slot `(L, s)` is non-empty.
//! - `poll(now)` returns only entries with `due <= now`: never early. Entries
//!   from a slot whose window has started but whose `due` is still ahead are
//!   cascaded down, never dropped, however far `now` jumps.
//! - Storage is one slab (`Vec`) with an intrusive free list and `u32` links:
//!   insert and cancel are O(1) and allocate nothing once the slab has grown.
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

const NIL: u32 = u32::MAX;
/// `loc` of an entry on the free list.
const LOC_FREE: u16 = u16::MAX;
/// `loc` of an entry on the overflow list.
const LOC_OVERFLOW: u16 = u16::MAX - 1;

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
    prev: u32,
    next: u32,
    generation: u32,
    /// `level * SLOTS + slot`, or `LOC_OVERFLOW`, or `LOC_FREE`.
    loc: u16,
    value: Option<T>,
}

/// The next batch of entries to look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Expiration {
    /// Level and slot, or `None` for the overflow list.
    slot: Option<(usize, usize)>,
    /// When that slot's window starts.
    deadline_ms: u64,
}

/// A hierarchical timing wheel holding values of type `T`.
pub struct Wheel<T> {
    entries: Vec<Entry<T>>,
    free_head: u32,
    heads: [[u32; SLOTS]; LEVELS],
    occupied: [u64; LEVELS],
    overflow_head: u32,
    /// Time up to which the wheel has been advanced, in ms.
    elapsed_ms: u64,
    len: usize,
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

impl<T> Wheel<T> {
    /// An empty wheel whose clock starts at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Wheel {
            entries: Vec::new(),
            free_head: NIL,
            heads: [[NIL; SLOTS]; LEVELS],
            occupied: [0; LEVELS],
            overflow_head: NIL,
            elapsed_ms: now_ms,
            len: 0,
        }
    }

    /// An empty wheel with room for `capacity` entries before it allocates.
    pub fn with_capacity(now_ms: u64, capacity: usize) -> Self {
        let mut wheel = Self::new(now_ms);
        wheel.entries.reserve(capacity);
        wheel
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

    /// Bytes of slab storage per entry (for memory accounting).
    pub const fn entry_size() -> usize {
        std::mem::size_of::<Entry<T>>()
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
            debug_assert_eq!(entry.loc, LOC_FREE);
            self.free_head = entry.next;
            entry.due_ms = due_ms;
            entry.value = Some(value);
            index
        } else {
            assert!(self.entries.len() < ENTRIES_MAX, "wheel is full");
            self.entries.push(Entry {
                due_ms,
                prev: NIL,
                next: NIL,
                generation: 0,
                loc: LOC_FREE,
                value: Some(value),
            });
            (self.entries.len() - 1) as u32
        };
        self.place(index);
        self.len += 1;
        Key {
            index,
            generation: self.entries[index as usize].generation,
        }
    }

    /// Remove a scheduled entry. `None` if the key is stale.
    pub fn cancel(&mut self, key: Key) -> Option<T> {
        let entry = self.entries.get(key.index as usize)?;
        if entry.generation != key.generation || entry.loc == LOC_FREE {
            return None;
        }
        self.unlink(key.index);
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

    /// When a live key is due.
    pub fn due_ms(&self, key: Key) -> Option<u64> {
        let entry = self.entries.get(key.index as usize)?;
        (entry.generation == key.generation && entry.loc != LOC_FREE).then_some(entry.due_ms)
    }

    /// Move a live entry to a new due time, keeping its key. False if stale.
    pub fn reschedule(&mut self, key: Key, due_ms: u64) -> bool {
        match self.entries.get(key.index as usize) {
            Some(e) if e.generation == key.generation && e.loc != LOC_FREE => {}
            _ => return false,
        }
        self.unlink(key.index);
        self.entries[key.index as usize].due_ms = due_ms;
        self.place(key.index);
        true
    }

    /// The earliest time at which `poll` could return something, or `None`
    /// when empty. Never later than the earliest due time; may be earlier
    /// (a higher-level slot's window opens before its entries are due).
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.next_expiration().map(|e| e.deadline_ms)
    }

    /// Advance to `now_ms` and hand every entry with `due <= now_ms` to
    /// `fire`, at most `limit` of them. Returns how many fired. When the limit
    /// stops it early, the remaining due entries fire on the next call.
    pub fn poll(&mut self, now_ms: u64, limit: usize, mut fire: impl FnMut(Key, u64, T)) -> usize {
        let mut fired = 0;
        // Bounded: each turn either empties a slot whose window opened at or
        // before `now_ms` (entries move strictly down a level or fire), or
        // breaks out.
        while fired < limit {
            let Some(expiration) = self.next_expiration() else {
                break;
            };
            if expiration.deadline_ms > now_ms {
                break;
            }
            debug_assert!(expiration.deadline_ms >= self.elapsed_ms);
            self.elapsed_ms = expiration.deadline_ms;
            let mut index = self.take_list(expiration.slot);
            while index != NIL {
                let next = self.entries[index as usize].next;
                let due_ms = self.entries[index as usize].due_ms;
                if due_ms <= now_ms && fired < limit {
                    let generation = self.entries[index as usize].generation;
                    let value = self.release(index);
                    fired += 1;
                    fire(Key { index, generation }, due_ms, value);
                } else {
                    self.place(index);
                }
                index = next;
            }
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
        if self.overflow_head != NIL {
            return Some(Expiration {
                slot: None,
                deadline_ms: (self.elapsed_ms | (SPAN_MS - 1)) + 1,
            });
        }
        None
    }

    fn place(&mut self, index: u32) {
        let due_ms = self.entries[index as usize].due_ms.max(self.elapsed_ms);
        let level = level_for(self.elapsed_ms, due_ms);
        let (head, loc) = if level >= LEVELS {
            (&mut self.overflow_head, LOC_OVERFLOW)
        } else {
            let slot = slot_for(due_ms, level);
            self.occupied[level] |= 1 << slot;
            (&mut self.heads[level][slot], (level * SLOTS + slot) as u16)
        };
        let old_head = *head;
        *head = index;
        if old_head != NIL {
            self.entries[old_head as usize].prev = index;
        }
        let entry = &mut self.entries[index as usize];
        entry.prev = NIL;
        entry.next = old_head;
        entry.loc = loc;
    }

    fn unlink(&mut self, index: u32) {
        let (prev, next, loc) = {
            let e = &self.entries[index as usize];
            (e.prev, e.next, e.loc)
        };
        if next != NIL {
            self.entries[next as usize].prev = prev;
        }
        if prev != NIL {
            self.entries[prev as usize].next = next;
        } else if loc == LOC_OVERFLOW {
            self.overflow_head = next;
        } else {
            let (level, slot) = (loc as usize / SLOTS, loc as usize % SLOTS);
            self.heads[level][slot] = next;
            if next == NIL {
                self.occupied[level] &= !(1 << slot);
            }
        }
    }

    /// Detach a whole list; its entries keep stale links that the caller
    /// overwrites by placing or releasing each one.
    fn take_list(&mut self, slot: Option<(usize, usize)>) -> u32 {
        match slot {
            Some((level, slot)) => {
                self.occupied[level] &= !(1 << slot);
                std::mem::replace(&mut self.heads[level][slot], NIL)
            }
            None => std::mem::replace(&mut self.overflow_head, NIL),
        }
    }

    fn release(&mut self, index: u32) -> T {
        let entry = &mut self.entries[index as usize];
        let value = entry.value.take().expect("released entry holds a value");
        entry.generation = entry.generation.wrapping_add(1);
        entry.loc = LOC_FREE;
        entry.prev = NIL;
        entry.next = self.free_head;
        self.free_head = index;
        self.len -= 1;
        value
    }
}

#[cfg(test)]
mod tests;
