//! The timer model: IDs, the JSON codec, and the record a shard keeps.

pub mod calendar;
pub mod callback;
pub mod config;
pub mod extras;
pub mod id;
pub mod retry;
pub mod spec;
pub mod timing;

pub use id::{
    instance_field, shard_of, IdGenerator, TimerId, DEPLOYMENT_ID_MAX, INSTANCE_ID_MAX,
    NODE_INSTANCE_MAX,
};
pub use spec::TimerSpec;

/// The largest cluster a timer ID can name: a replica set is a 64-bit
/// bloom filter, and replica lists and peer masks are 64 wide.
pub const NODES_MAX: usize = 64;

use callback::Callback;

/// What identifies and schedules one timer incarnation (everything but its
/// callback bytes and tags).
#[derive(Clone, Copy, Debug)]
pub struct TimerHead {
    pub id: TimerId,
    /// Engine-clock ms the incarnation started at (pops count from here).
    pub start_ms: u64,
    /// Wall-clock ms of the client operation that made this incarnation:
    /// the same on every replica, so replicas can tell incarnations apart.
    pub version: u64,
    pub interval_ms: u32,
    pub repeat_for_ms: u32,
    /// Pops already done (or known done by another replica).
    pub sequence: u32,
    /// Fingerprint of the cluster view the timer was placed under.
    pub view: u32,
    pub replica_index: u8,
    /// Replicas in the list the incarnation was placed with (the requested
    /// factor capped at the cluster size then): the skew and whether a
    /// later replica exists follow it.
    pub replication_factor: u8,
    /// The factor the client asked for (seed 000: it never changes), so a
    /// timer gains replicas when the cluster grows. Placement follows it.
    pub factor_requested: u8,
    /// This node's site's place in the timer's site list (GR; 0 without).
    pub site_index: u8,
    /// The timer's site list, packed (`cluster::sites`; `u32::MAX`: none).
    pub sites: u32,
}

/// Seconds as ms at millisecond resolution: 0.1 s is 100 ms despite binary
/// floating point (within a millionth of a whole ms, it is that ms);
/// anything finer rounds up, so a pop is never earlier than asked.
pub fn ms_of_seconds(secs: f64) -> f64 {
    let ms = secs * 1000.0;
    let nearest = ms.round();
    if (ms - nearest).abs() < 1e-6 {
        nearest
    } else {
        ms.ceil()
    }
}

/// `Timer::informed` when no new replica is known to have the timer.
pub const INFORMED_NONE: u8 = u8::MAX;

/// Opaque data up to this many bytes is kept inline in the timer record
/// (longer data, or any tags, go with the URI into an own allocation).
pub const INLINE_OPAQUE_BYTES: usize = 32;
/// Fills the inline buffer past the opaque data: never a byte of UTF-8.
const INLINE_END: u8 = 0xFF;

/// Bit fields of `Timer::roles`: (shift, width) of each.
const REPLICA_INDEX: (u32, u32) = (0, 6);
const REPLICATION_FACTOR: (u32, u32) = (6, 7);
const FACTOR_REQUESTED: (u32, u32) = (13, 7);
const SITE_INDEX: (u32, u32) = (20, 5);
const INFORMED: (u32, u32) = (25, 7);
/// `INFORMED_NONE` in its 7-bit field.
const INFORMED_NONE_PACKED: u32 = (1 << INFORMED.1) - 1;

fn field_max(field: (u32, u32)) -> u32 {
    (1 << field.1) - 1
}

fn get(roles: u32, field: (u32, u32)) -> u8 {
    ((roles >> field.0) & field_max(field)) as u8
}

fn set(roles: &mut u32, field: (u32, u32), value: u8) {
    assert!(u32::from(value) <= field_max(field), "fits its bit field");
    *roles = (*roles & !(field_max(field) << field.0)) | (u32::from(value) << field.0);
}

impl TimerHead {
    /// Whether the small fields fit the timer record's bit fields: a
    /// replica index below `NODES_MAX` (64), factors up to 127, a site
    /// index up to 31. The codec and placement keep them far lower
    /// (replica lists of at most 64, factors capped at 64, site lists of at
    /// most 16); a decoded log record is checked against it.
    pub fn fits_record(&self) -> bool {
        u32::from(self.replica_index) <= field_max(REPLICA_INDEX)
            && u32::from(self.replication_factor) <= field_max(REPLICATION_FACTOR)
            && u32::from(self.factor_requested) <= field_max(FACTOR_REQUESTED)
            && u32::from(self.site_index) <= field_max(SITE_INDEX)
    }
}

/// One timer as a shard stores it in its wheel: 96 bytes.
///
/// | bytes | what |
/// |---|---|
/// | 0-31 | `unique`, `bloom`, `start_ms`, `version` (8 each) |
/// | 32-51 | `interval_ms`, `repeat_for_ms`, `sequence`, `view`, `sites` (4 each) |
/// | 52-55 | `roles`: replica index (6 bits), replication factor (7), factor requested (7), site index (5), informed (7) |
/// | 56-63 | `callback`: the interned URI, or an own allocation of tags, URI and opaque data (its non-null pointer is `Option<Timer>`'s niche) |
/// | 64-95 | the opaque data inline, `0xFF`-filled past its end (unused in the own form) |
///
/// Pop times follow the reference: pop `n` (1-based, the `X-Sequence-Number`)
/// is due at `start + n * interval + replica_index * skew`, and pops continue
/// while `n * interval <= repeat_for`. A tombstone (empty URI) never calls
/// back; it only outlives stale replication messages.
#[derive(Debug)]
pub struct Timer {
    pub unique: u64,
    pub bloom: u64,
    pub start_ms: u64,
    pub version: u64,
    pub interval_ms: u32,
    pub repeat_for_ms: u32,
    pub sequence: u32,
    pub view: u32,
    pub sites: u32,
    /// The head's small fields and `informed`, packed (see the table).
    roles: u32,
    /// Shared with in-flight callbacks and with every timer of the shard
    /// that calls the same URI.
    callback: Callback,
    inline: [u8; INLINE_OPAQUE_BYTES],
}

const _: () = assert!(
    std::mem::size_of::<Timer>() == 96,
    "a timer record is 96 bytes"
);
const _: () = assert!(
    std::mem::size_of::<Option<Timer>>() == 96,
    "an empty slot costs no more than a timer"
);

impl Timer {
    /// A new timer record. `uri.len()` must fit `u16`, `tags.len()` `u8`
    /// (the codec caps both) and the head [`TimerHead::fits_record`].
    /// Allocates nothing when the URI is interned already, the opaque data
    /// fits inline and there are no tags.
    pub fn new(head: TimerHead, uri: &str, opaque: &str, tags: &[(u32, u32)]) -> Timer {
        Timer::with_ext(head, uri, opaque, tags, &[])
    }

    /// [`Timer::new`] with the timer's extensions (`extras`: the delivery
    /// policy), at most `u16::MAX` bytes; a timer with any is an own form.
    pub fn with_ext(
        head: TimerHead,
        uri: &str,
        opaque: &str,
        tags: &[(u32, u32)],
        ext: &[u8],
    ) -> Timer {
        assert!(head.fits_record(), "the codec and placement bound them");
        let mut inline = [INLINE_END; INLINE_OPAQUE_BYTES];
        let shared = tags.is_empty() && ext.is_empty() && opaque.len() <= INLINE_OPAQUE_BYTES;
        let callback = if shared {
            inline[..opaque.len()].copy_from_slice(opaque.as_bytes());
            Callback::interned(uri)
        } else {
            Callback::own(tags, uri, opaque, ext)
        };
        let mut roles = 0;
        set(&mut roles, REPLICA_INDEX, head.replica_index);
        set(&mut roles, REPLICATION_FACTOR, head.replication_factor);
        set(&mut roles, FACTOR_REQUESTED, head.factor_requested);
        set(&mut roles, SITE_INDEX, head.site_index);
        let mut timer = Timer {
            unique: head.id.unique,
            bloom: head.id.bloom,
            start_ms: head.start_ms,
            version: head.version,
            interval_ms: head.interval_ms,
            repeat_for_ms: head.repeat_for_ms,
            sequence: head.sequence,
            view: head.view,
            sites: head.sites,
            roles,
            callback,
            inline,
        };
        timer.set_informed(INFORMED_NONE);
        timer
    }

    pub fn head(&self) -> TimerHead {
        TimerHead {
            id: self.id(),
            start_ms: self.start_ms,
            version: self.version,
            interval_ms: self.interval_ms,
            repeat_for_ms: self.repeat_for_ms,
            sequence: self.sequence,
            view: self.view,
            replica_index: self.replica_index(),
            replication_factor: self.replication_factor(),
            factor_requested: self.factor_requested(),
            site_index: self.site_index(),
            sites: self.sites,
        }
    }

    pub fn id(&self) -> TimerId {
        TimerId {
            unique: self.unique,
            bloom: self.bloom,
        }
    }

    pub fn replica_index(&self) -> u8 {
        get(self.roles, REPLICA_INDEX)
    }

    pub fn set_replica_index(&mut self, index: u8) {
        set(&mut self.roles, REPLICA_INDEX, index);
    }

    /// Replicas in the list the incarnation was placed with.
    pub fn replication_factor(&self) -> u8 {
        get(self.roles, REPLICATION_FACTOR)
    }

    pub fn set_replication_factor(&mut self, factor: u8) {
        set(&mut self.roles, REPLICATION_FACTOR, factor);
    }

    /// The factor the client asked for.
    pub fn factor_requested(&self) -> u8 {
        get(self.roles, FACTOR_REQUESTED)
    }

    pub fn set_factor_requested(&mut self, factor: u8) {
        set(&mut self.roles, FACTOR_REQUESTED, factor);
    }

    /// This node's site's place in the timer's site list.
    pub fn site_index(&self) -> u8 {
        get(self.roles, SITE_INDEX)
    }

    /// Resync (seed 003): the lowest index in the timer's new replica list
    /// known to have it (`INFORMED_NONE`: none); every index above it knows
    /// it too. Only meaningful on a copy held under an older view.
    pub fn informed(&self) -> u8 {
        match u32::from(get(self.roles, INFORMED)) {
            INFORMED_NONE_PACKED => INFORMED_NONE,
            i => i as u8,
        }
    }

    /// Set `informed`: a replica list index (below `NODES_MAX`) or
    /// `INFORMED_NONE`.
    pub fn set_informed(&mut self, index: u8) {
        let packed = if index == INFORMED_NONE {
            INFORMED_NONE_PACKED as u8
        } else {
            assert!((index as usize) < NODES_MAX, "a replica list index");
            index
        };
        set(&mut self.roles, INFORMED, packed);
    }

    /// The callback URI (empty for a tombstone).
    pub fn uri(&self) -> &str {
        self.callback.uri()
    }

    /// The opaque data.
    pub fn opaque(&self) -> &str {
        if self.callback.is_own() {
            return self.callback.opaque();
        }
        let len = self
            .inline
            .iter()
            .position(|&b| b == INLINE_END)
            .unwrap_or(INLINE_OPAQUE_BYTES);
        std::str::from_utf8(&self.inline[..len]).expect("stored from a str")
    }

    /// `(tag index, count)` pairs.
    pub fn tags(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.callback
            .tag_bytes()
            .chunks_exact(callback::TAG_BYTES)
            .map(|c| {
                let index = u32::from_le_bytes(c[..4].try_into().expect("4 bytes"));
                let count = u32::from_le_bytes(c[4..].try_into().expect("4 bytes"));
                (index, count)
            })
    }

    pub fn has_tags(&self) -> bool {
        !self.callback.tag_bytes().is_empty()
    }

    /// The timer's extensions (`extras`; empty for most timers).
    pub fn ext(&self) -> &[u8] {
        self.callback.ext()
    }

    /// The delivery policy, if the timer has one (issue 41).
    pub fn delivery(&self) -> Option<extras::DeliveryRef<'_>> {
        extras::delivery(self.callback.ext())
    }

    pub fn is_tombstone(&self) -> bool {
        self.callback.uri_len() == 0
    }

    /// This incarnation as a tombstone (same identity, no callback).
    pub fn to_tombstone(&self) -> Timer {
        let mut head = self.head();
        if self.is_cron() {
            // Its cursor is no period to keep a tombstone for.
            head.interval_ms = 0;
        }
        Timer::new(head, "", "", &[])
    }

    /// A copy sharing the callback bytes (an informational timer, seed 003;
    /// a pop's callback).
    pub fn share(&self) -> Timer {
        Timer {
            callback: self.callback.clone(),
            ..*self
        }
    }

    /// The timer's wall-clock or calendar timing, if it has one (issue 42).
    pub fn timing(&self) -> Option<timing::TimingRef<'_>> {
        match self.callback.is_own() {
            true => extras::timing(self.callback.ext()),
            false => None,
        }
    }

    /// Whether `interval_ms` is a cron timer's cursor (`timing.rs`).
    pub fn is_cron(&self) -> bool {
        self.timing()
            .is_some_and(|t| t.kind == timing::TimingKind::Cron)
    }

    /// Count pop `sequence + 1` as taken: the sequence moves on and, for a
    /// cron timer, the cursor to the next occurrence (the wall clock now,
    /// read only then, and this replica's lag behind the occurrences, for
    /// the misfire rule).
    pub fn step(&mut self, replica_skew_ms: u64, now_unix_ms: impl FnOnce() -> i64) {
        self.sequence += 1;
        if let Some(t) = self.timing().filter(|t| t.kind == timing::TimingKind::Cron) {
            let lag_ms = self.lag_ms(replica_skew_ms) as i64;
            let (cursor, repeat_for_ms) = (self.interval_ms, self.repeat_for_ms);
            self.interval_ms =
                timing::next_cursor(&t, cursor, repeat_for_ms, now_unix_ms(), lag_ms);
        }
    }

    /// The cursor once `sequence` pops are done, stepped from this copy's
    /// through each occurrence in turn (no misfire: what a report of pop
    /// `sequence` carries, so the cursor agrees with the sequence beside
    /// it). Not a cron timer: its `interval_ms`.
    pub fn cursor_at(&self, sequence: u32) -> u32 {
        let Some(t) = self.timing().filter(|t| t.kind == timing::TimingKind::Cron) else {
            return self.interval_ms;
        };
        let mut cursor = self.interval_ms;
        // Bounded: a report is about the pop just taken, one step ahead of
        // the copy it was taken from.
        for _ in self.sequence..sequence.min(self.sequence.saturating_add(64)) {
            let at_ms = t.start_unix_ms.saturating_add(cursor as i64);
            cursor = timing::next_cursor(&t, cursor, self.repeat_for_ms, at_ms, 0);
        }
        cursor
    }

    /// This replica's lag behind the schedule: its skews.
    pub fn lag_ms(&self, replica_skew_ms: u64) -> u64 {
        let site_skew_ms = self.site_index() as u64 * self.factor_requested().max(1) as u64;
        (self.replica_index() as u64 + site_skew_ms) * replica_skew_ms
    }

    /// Whether pop number `sequence + 1` exists.
    pub fn has_next_pop(&self) -> bool {
        if self.callback.is_own() && self.is_cron() {
            let cursor = self.interval_ms;
            return cursor != timing::CURSOR_NONE && cursor <= self.repeat_for_ms;
        }
        if self.interval_ms == 0 {
            return self.sequence == 0;
        }
        (self.sequence as u64 + 1) * self.interval_ms as u64 <= self.repeat_for_ms as u64
    }

    /// When pop number `sequence + 1` is due on this replica: each replica
    /// one skew after the one before it, and each site (GR) a whole
    /// replica list of skews after the one before it.
    /// A cron timer's is its cursor's occurrence (`timing.rs`).
    pub fn next_pop_ms(&self, replica_skew_ms: u64) -> u64 {
        let lag_ms = self.lag_ms(replica_skew_ms);
        if self.callback.is_own() && self.is_cron() {
            return self.start_ms.saturating_add(self.interval_ms as u64) + lag_ms;
        }
        self.start_ms + (self.sequence as u64 + 1) * self.interval_ms as u64 + lag_ms
    }
}

/// A cluster view ID folded to the 32 bits a timer keeps (only compared for
/// equality).
pub fn view_fingerprint(view_id: u64) -> u32 {
    (view_id ^ (view_id >> 32)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn head(unique: u64, interval_ms: u32, repeat_for_ms: u32, replica_index: u8) -> TimerHead {
        TimerHead {
            id: TimerId { unique, bloom: 0 },
            start_ms: 0,
            version: 0,
            interval_ms,
            repeat_for_ms,
            sequence: 0,
            view: 0,
            replica_index,
            replication_factor: 2,
            factor_requested: 2,
            site_index: 0,
            sites: u32::MAX,
        }
    }

    #[test]
    fn data_layout_round_trips() {
        let t = Timer::new(head(1, 10, 10, 0), "http://a/b", "xyz", &[(3, 4), (7, 1)]);
        assert_eq!(t.uri(), "http://a/b");
        assert_eq!(t.opaque(), "xyz");
        assert_eq!(t.tags().collect::<Vec<_>>(), vec![(3, 4), (7, 1)]);
        let tomb = t.to_tombstone();
        assert!(tomb.is_tombstone() && !tomb.has_tags());
        assert_eq!(tomb.opaque(), "");
        assert_eq!(tomb.head().id, t.id());
    }

    #[test]
    fn opaque_data_inline_up_to_the_buffer_then_own() {
        let before = callback::interned_count();
        let fits = "é".repeat(INLINE_OPAQUE_BYTES / 2);
        let long = "x".repeat(INLINE_OPAQUE_BYTES + 1);
        for opaque in ["", "o", fits.as_str(), long.as_str()] {
            let t = Timer::new(head(1, 10, 10, 0), "http://inline.test/", opaque, &[]);
            assert_eq!((t.uri(), t.opaque()), ("http://inline.test/", opaque));
            assert!(!t.has_tags() && !t.is_tombstone());
            let shared = t.share();
            assert_eq!((shared.uri(), shared.opaque()), (t.uri(), opaque));
        }
        let a = Timer::new(head(1, 10, 10, 0), "http://inline.test/", "a", &[]);
        let b = Timer::new(head(2, 10, 10, 0), "http://inline.test/", "b", &[]);
        assert_eq!(callback::interned_count(), before + 1, "one shared URI");
        assert_eq!((a.opaque(), b.opaque()), ("a", "b"));
        drop((a, b));
        assert_eq!(
            callback::interned_count(),
            before,
            "freed with the last timer"
        );
    }

    #[test]
    fn small_fields_round_trip_through_the_roles() {
        let mut h = head(9, 10, 10, 63);
        h.replication_factor = 64;
        h.factor_requested = 127;
        h.site_index = 16;
        let mut t = Timer::new(h, "http://a/", "", &[]);
        let back = t.head();
        assert_eq!(
            (
                back.replica_index,
                back.replication_factor,
                back.factor_requested,
                back.site_index
            ),
            (63, 64, 127, 16)
        );
        assert_eq!(t.informed(), INFORMED_NONE);
        t.set_informed(0);
        assert_eq!(t.informed(), 0);
        t.set_informed(63);
        assert_eq!((t.informed(), t.replica_index()), (63, 63));
        t.set_replication_factor(3);
        t.set_replica_index(2);
        assert_eq!(
            (t.replication_factor(), t.replica_index(), t.site_index()),
            (3, 2, 16)
        );
        h.replica_index = 64;
        assert!(!h.fits_record());
    }

    #[test]
    fn pop_schedule_table() {
        // (interval, repeat-for, replica index) -> due times of every pop
        let table: &[(u32, u32, u8, &[u64])] = &[
            (1000, 1000, 0, &[1000]),
            (1000, 3000, 0, &[1000, 2000, 3000]),
            (1000, 3500, 0, &[1000, 2000, 3000]),
            (1000, 999, 0, &[]),
            (1000, 2000, 1, &[3000, 4000]),
            (0, 0, 0, &[0]),
        ];
        for &(interval, repeat_for, replica, want) in table {
            let mut t = Timer::new(
                head(1, interval, repeat_for, replica),
                "http://a/",
                "o",
                &[],
            );
            let mut got = Vec::new();
            while t.has_next_pop() {
                got.push(t.next_pop_ms(2000));
                t.sequence += 1;
                assert!(got.len() < 10);
            }
            assert_eq!(got, want, "interval {interval} repeat-for {repeat_for}");
        }
    }

    #[test]
    fn record_size_is_compact() {
        // Budget: the timer record (with 32 B of opaque data inline) and
        // the whole wheel entry (timer + due + links) stay within 112 bytes.
        let entry = crate::wheel::Wheel::<Timer>::entry_size();
        assert!(entry <= 112, "wheel entry is {entry} bytes");
    }
}
