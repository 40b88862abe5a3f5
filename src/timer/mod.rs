//! The timer model: IDs, the JSON codec, and the record a shard keeps.

pub mod id;
pub mod spec;

pub use id::{instance_id_for, shard_of, IdGenerator, TimerId, INSTANCE_ID_MAX};
pub use spec::TimerSpec;

use std::rc::Rc;

/// One timer as a shard stores it in its wheel.
///
/// Pop times follow the reference: pop `n` (1-based, the `X-Sequence-Number`)
/// is due at `start + n * interval + replica_index * skew`, and pops continue
/// while `n * interval <= repeat_for`.
#[derive(Debug)]
pub struct Timer {
    pub unique: u64,
    pub bloom: u64,
    /// When the timer (or its last client update) started, on the engine's
    /// monotonic millisecond clock.
    pub start_ms: u64,
    pub interval_ms: u32,
    pub repeat_for_ms: u32,
    /// Pops already done (or known done by another replica).
    pub sequence: u32,
    pub replica_index: u8,
    pub replication_factor: u8,
    /// Length of the URI at the front of `data`.
    uri_len: u16,
    /// The callback URI followed by the opaque data. Shared with in-flight
    /// callbacks, so a pop does not copy it.
    data: Rc<[u8]>,
    /// `(tag index, count)` pairs; tag names live in the shard's tag table.
    pub tags: Option<Box<[(u32, u32)]>>,
}

impl Timer {
    /// A new timer record. `uri.len()` must fit `u16` (the codec caps it).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: TimerId,
        start_ms: u64,
        interval_ms: u32,
        repeat_for_ms: u32,
        sequence: u32,
        replica_index: u8,
        replication_factor: u8,
        uri: &str,
        opaque: &str,
    ) -> Timer {
        assert!(uri.len() <= u16::MAX as usize);
        let mut data = Vec::with_capacity(uri.len() + opaque.len());
        data.extend_from_slice(uri.as_bytes());
        data.extend_from_slice(opaque.as_bytes());
        Timer {
            unique: id.unique,
            bloom: id.bloom,
            start_ms,
            interval_ms,
            repeat_for_ms,
            sequence,
            replica_index,
            replication_factor,
            uri_len: uri.len() as u16,
            data: data.into(),
            tags: None,
        }
    }

    pub fn id(&self) -> TimerId {
        TimerId {
            unique: self.unique,
            bloom: self.bloom,
        }
    }

    /// The callback URI (empty for a tombstone).
    pub fn uri(&self) -> &str {
        std::str::from_utf8(&self.data[..self.uri_len as usize]).expect("stored from a str")
    }

    /// The opaque data.
    pub fn opaque(&self) -> &[u8] {
        &self.data[self.uri_len as usize..]
    }

    /// The shared callback data (URI, then opaque).
    pub fn data(&self) -> (Rc<[u8]>, usize) {
        (self.data.clone(), self.uri_len as usize)
    }

    pub fn is_tombstone(&self) -> bool {
        self.uri_len == 0
    }

    /// Whether pop number `sequence + 1` exists.
    pub fn has_next_pop(&self) -> bool {
        if self.interval_ms == 0 {
            return self.sequence == 0;
        }
        (self.sequence as u64 + 1) * self.interval_ms as u64 <= self.repeat_for_ms as u64
    }

    /// When pop number `sequence + 1` is due on this replica.
    pub fn next_pop_ms(&self, replica_skew_ms: u64) -> u64 {
        self.start_ms
            + (self.sequence as u64 + 1) * self.interval_ms as u64
            + self.replica_index as u64 * replica_skew_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let id = TimerId {
                unique: 1,
                bloom: 0,
            };
            let mut t = Timer::new(id, 0, interval, repeat_for, 0, replica, 2, "http://a/", "o");
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
        assert!(entry <= 104, "wheel entry is {entry} bytes");
    }
}
