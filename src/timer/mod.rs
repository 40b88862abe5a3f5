//! The timer model: IDs, the JSON codec, and the record a shard keeps.

pub mod id;
pub mod spec;

pub use id::{
    instance_field, shard_of, IdGenerator, TimerId, DEPLOYMENT_ID_MAX, INSTANCE_ID_MAX,
    NODE_INSTANCE_MAX,
};
pub use spec::TimerSpec;

/// The largest cluster a timer ID can name: a replica set is a 64-bit
/// bloom filter, and replica lists and peer masks are 64 wide.
pub const NODES_MAX: usize = 64;

use std::rc::Rc;

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

/// `Timer::informed` when no new replica is known to have the timer.
pub const INFORMED_NONE: u8 = u8::MAX;

thread_local! {
    static EMPTY: Rc<[u8]> = Rc::from(&[][..]);
}

/// One timer as a shard stores it in its wheel.
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
    /// Length of the URI inside `data`.
    uri_len: u16,
    pub replica_index: u8,
    pub replication_factor: u8,
    pub factor_requested: u8,
    pub site_index: u8,
    pub sites: u32,
    /// Resync (seed 003): the lowest index in the timer's new replica list
    /// known to have it (`INFORMED_NONE`: none); every index above it knows
    /// it too. Only meaningful on a copy held under an older view.
    pub informed: u8,
    /// `(tag index, count)` pairs at the front of `data`, 8 bytes each.
    tag_count: u8,
    /// Tag pairs, then the callback URI, then the opaque data. Shared with
    /// in-flight callbacks, so a pop does not copy it.
    data: Rc<[u8]>,
}

/// Bytes of one `(tag index, count)` pair in `Timer::data`.
const TAG_BYTES: usize = 8;

impl Timer {
    /// A new timer record. `uri.len()` must fit `u16` and `tags.len()` `u8`
    /// (the codec caps both).
    pub fn new(head: TimerHead, uri: &str, opaque: &str, tags: &[(u32, u32)]) -> Timer {
        assert!(uri.len() <= u16::MAX as usize);
        assert!(tags.len() <= u8::MAX as usize);
        let data = if uri.is_empty() && opaque.is_empty() && tags.is_empty() {
            EMPTY.with(|e| e.clone())
        } else {
            let mut data = Vec::with_capacity(tags.len() * TAG_BYTES + uri.len() + opaque.len());
            for (index, count) in tags {
                data.extend_from_slice(&index.to_le_bytes());
                data.extend_from_slice(&count.to_le_bytes());
            }
            data.extend_from_slice(uri.as_bytes());
            data.extend_from_slice(opaque.as_bytes());
            data.into()
        };
        Timer {
            unique: head.id.unique,
            bloom: head.id.bloom,
            start_ms: head.start_ms,
            version: head.version,
            interval_ms: head.interval_ms,
            repeat_for_ms: head.repeat_for_ms,
            sequence: head.sequence,
            view: head.view,
            uri_len: uri.len() as u16,
            replica_index: head.replica_index,
            replication_factor: head.replication_factor,
            factor_requested: head.factor_requested,
            site_index: head.site_index,
            sites: head.sites,
            informed: INFORMED_NONE,
            tag_count: tags.len() as u8,
            data,
        }
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
            replica_index: self.replica_index,
            replication_factor: self.replication_factor,
            factor_requested: self.factor_requested,
            site_index: self.site_index,
            sites: self.sites,
        }
    }

    pub fn id(&self) -> TimerId {
        TimerId {
            unique: self.unique,
            bloom: self.bloom,
        }
    }

    fn uri_start(&self) -> usize {
        self.tag_count as usize * TAG_BYTES
    }

    /// The callback URI (empty for a tombstone).
    pub fn uri(&self) -> &str {
        let a = self.uri_start();
        std::str::from_utf8(&self.data[a..a + self.uri_len as usize]).expect("stored from a str")
    }

    /// The opaque data.
    pub fn opaque(&self) -> &str {
        let a = self.uri_start() + self.uri_len as usize;
        std::str::from_utf8(&self.data[a..]).expect("stored from a str")
    }

    /// `(tag index, count)` pairs.
    pub fn tags(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.data[..self.uri_start()]
            .chunks_exact(TAG_BYTES)
            .map(|c| {
                let index = u32::from_le_bytes(c[..4].try_into().expect("4 bytes"));
                let count = u32::from_le_bytes(c[4..].try_into().expect("4 bytes"));
                (index, count)
            })
    }

    pub fn has_tags(&self) -> bool {
        self.tag_count > 0
    }

    /// The shared callback bytes: the data, where the URI starts, its length.
    /// The opaque data follows the URI to the end.
    pub fn callback_data(&self) -> (Rc<[u8]>, usize, usize) {
        (self.data.clone(), self.uri_start(), self.uri_len as usize)
    }

    pub fn is_tombstone(&self) -> bool {
        self.uri_len == 0
    }

    /// This incarnation as a tombstone (same identity, no callback).
    pub fn to_tombstone(&self) -> Timer {
        Timer::new(self.head(), "", "", &[])
    }

    /// A copy sharing the callback bytes (an informational timer, seed 003).
    pub fn share(&self) -> Timer {
        Timer {
            data: self.data.clone(),
            ..*self
        }
    }

    /// Whether pop number `sequence + 1` exists.
    pub fn has_next_pop(&self) -> bool {
        if self.interval_ms == 0 {
            return self.sequence == 0;
        }
        (self.sequence as u64 + 1) * self.interval_ms as u64 <= self.repeat_for_ms as u64
    }

    /// When pop number `sequence + 1` is due on this replica: each replica
    /// one skew after the one before it, and each site (GR) a whole
    /// replica list of skews after the one before it.
    pub fn next_pop_ms(&self, replica_skew_ms: u64) -> u64 {
        let site_skew_ms = self.site_index as u64 * self.factor_requested.max(1) as u64;
        self.start_ms
            + (self.sequence as u64 + 1) * self.interval_ms as u64
            + (self.replica_index as u64 + site_skew_ms) * replica_skew_ms
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
        let (data, at, len) = t.callback_data();
        assert_eq!(&data[at..at + len], b"http://a/b");
        assert_eq!(&data[at + len..], b"xyz");
        let tomb = t.to_tombstone();
        assert!(tomb.is_tombstone() && !tomb.has_tags());
        assert_eq!(tomb.opaque(), "");
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
        // Budget: the whole wheel entry (timer + links) stays well under 128 bytes.
        let entry = crate::wheel::Wheel::<Timer>::entry_size();
        assert!(entry <= 96, "wheel entry is {entry} bytes");
    }
}
