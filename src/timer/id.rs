//! Timer IDs.
//!
//! On the wire an ID is 32 lowercase hex digits: the 64-bit unique ID, then
//! the 64-bit replica bloom filter (seed 001: the ID carries its replicas).
//! Clients treat it as opaque.
//!
//! The unique ID is `ms (41 bits) | instance (10 bits) | sequence (13 bits)`:
//! wall-clock milliseconds since 2024-01-01 (good for 69 years), the node's
//! instance ID, and a per-millisecond sequence. Every shard of a node walks the
//! same candidate sequence and keeps only the candidates that hash to itself,
//! so shards never collide, a `POST` never hops, and one node can issue 8,192
//! IDs per ms (8 M/s) before it borrows the next millisecond.

/// 2024-01-01T00:00:00Z in Unix milliseconds.
pub const ID_EPOCH_UNIX_MS: u64 = 1_704_067_200_000;
const SEQ_BITS: u32 = 13;
const INSTANCE_BITS: u32 = 10;
const MS_BITS: u32 = 64 - SEQ_BITS - INSTANCE_BITS;
/// The largest instance ID.
pub const INSTANCE_ID_MAX: u16 = (1 << INSTANCE_BITS) - 1;
const SEQ_MAX: u32 = (1 << SEQ_BITS) - 1;

/// A timer ID: unique part and replica bloom filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerId {
    pub unique: u64,
    pub bloom: u64,
}

/// The 8 lowercase hex digits of `v`, most significant first, eight at a
/// time: each nibble spread into a byte of its own, then `'0'` added and,
/// where the nibble is 10 or more, the 39 from `'9' + 1` to `'a'`.
fn hex8(v: u32) -> [u8; 8] {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let mut x = u64::from(v);
    x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    // Byte k holds nibble k (least significant first); no byte carries.
    let letters = ((x + 6 * ONES) >> 4) & ONES;
    (x + u64::from(b'0') * ONES + letters * 39).to_be_bytes()
}

impl TimerId {
    /// The 32-digit hex form, without allocating.
    pub fn to_hex(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, word) in [self.unique, self.bloom].into_iter().enumerate() {
            out[i * 16..i * 16 + 8].copy_from_slice(&hex8((word >> 32) as u32));
            out[i * 16 + 8..i * 16 + 16].copy_from_slice(&hex8(word as u32));
        }
        out
    }

    /// The hex form as a `String` (cold paths).
    pub fn to_hex_string(self) -> String {
        String::from_utf8(self.to_hex().to_vec()).expect("hex is ascii")
    }

    /// Parse exactly 32 hex digits (either case).
    pub fn parse(text: &[u8]) -> Option<TimerId> {
        if text.len() != 32 {
            return None;
        }
        let mut words = [0u64; 2];
        for (i, &c) in text.iter().enumerate() {
            let digit = (c as char).to_digit(16)? as u64;
            words[i / 16] = (words[i / 16] << 4) | digit;
        }
        Some(TimerId {
            unique: words[0],
            bloom: words[1],
        })
    }
}

/// SplitMix64's finaliser: spreads structured IDs evenly.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The shard that owns a unique ID.
#[inline]
pub fn shard_of(unique: u64, shards: usize) -> usize {
    (((mix(unique) >> 32) * shards as u64) >> 32) as usize
}

/// The hash used by a shard's ID index (independent of `shard_of`'s bits).
#[inline]
pub fn index_hash(unique: u64) -> u64 {
    mix(unique ^ 0x9e37_79b9_7f4a_7c15)
}

/// Bits of the instance field that name a node within its deployment.
pub const NODE_INSTANCE_BITS: u32 = 7;
/// The largest deployment ID (the instance field's top 3 bits).
pub const DEPLOYMENT_ID_MAX: u8 = (1 << (INSTANCE_BITS - NODE_INSTANCE_BITS)) - 1;
/// The largest node instance ID within a deployment.
pub const NODE_INSTANCE_MAX: u8 = (1 << NODE_INSTANCE_BITS) - 1;

/// The 10-bit instance field of a node: `deployment (3 bits) | instance (7 bits)`,
/// as the reference's `[identity] deployment_id` and `instance_id`.
pub fn instance_field(deployment_id: u8, instance_id: u8) -> u16 {
    assert!(
        deployment_id <= DEPLOYMENT_ID_MAX && instance_id <= NODE_INSTANCE_MAX,
        "the configuration's checks bound deployment and instance IDs"
    );
    ((deployment_id as u16) << NODE_INSTANCE_BITS) | instance_id as u16
}

/// Per-shard ID generator.
#[derive(Debug)]
pub struct IdGenerator {
    instance: u64,
    shard: usize,
    shards: usize,
    ms: u64,
    seq: u32,
}

impl IdGenerator {
    pub fn new(instance: u16, shard: usize, shards: usize) -> Self {
        assert!(
            instance <= INSTANCE_ID_MAX && shard < shards,
            "instance {instance} within its 10 bits, shard {shard} of {shards}"
        );
        IdGenerator {
            instance: instance as u64,
            shard,
            shards,
            ms: 0,
            seq: 0,
        }
    }

    /// The instance field changed (a reload moved this node's derived ID).
    /// The millisecond part stays monotonic across the change.
    pub fn set_instance(&mut self, instance: u16) {
        assert!(instance <= INSTANCE_ID_MAX, "an instance field has 10 bits");
        self.instance = instance as u64;
    }

    /// The instance field IDs are made with.
    pub fn instance(&self) -> u16 {
        self.instance as u16
    }

    /// A fresh unique ID owned by this shard. `unix_ms` is the wall clock;
    /// when it steps backwards the generator keeps counting from the last
    /// millisecond it used, so its IDs never repeat within a process.
    pub fn next(&mut self, unix_ms: u64) -> u64 {
        let ms = unix_ms.saturating_sub(ID_EPOCH_UNIX_MS) & ((1 << MS_BITS) - 1);
        if ms > self.ms {
            self.ms = ms;
            self.seq = 0;
        }
        // Each candidate belongs to this shard with probability 1/shards;
        // the bound is many orders of magnitude past any realistic run.
        for _ in 0..(1u32 << 20) {
            if self.seq > SEQ_MAX {
                self.ms += 1;
                self.seq = 0;
            }
            let id = (self.ms << (SEQ_BITS + INSTANCE_BITS))
                | (self.instance << SEQ_BITS)
                | self.seq as u64;
            self.seq += 1;
            if shard_of(id, self.shards) == self.shard {
                return id;
            }
        }
        unreachable!("no ID maps to shard {} of {}", self.shard, self.shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const HEX: &[u8; 16] = b"0123456789abcdef";

    #[test]
    fn hex_digits_are_the_tables() {
        let mut v: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..10_000 {
            v = mix(v.wrapping_add(1));
            let id = TimerId {
                unique: v,
                bloom: v.rotate_left(17) ^ 0xf0f0,
            };
            let mut want = [0u8; 32];
            for (i, word) in [id.unique, id.bloom].into_iter().enumerate() {
                for j in 0..16 {
                    want[i * 16 + j] = HEX[((word >> (60 - 4 * j)) & 0xf) as usize];
                }
            }
            assert_eq!(id.to_hex(), want, "{v:x}");
        }
        for v in [0, u32::MAX, 0x0a0a_0a0a, 0x9999_9999, 0xabcd_ef01] {
            assert_eq!(hex8(v), *format!("{v:08x}").as_bytes());
        }
    }

    #[test]
    fn hex_round_trip() {
        let id = TimerId {
            unique: 0x0123_4567_89ab_cdef,
            bloom: 0xfedc_ba98_7654_3210,
        };
        assert_eq!(&id.to_hex(), b"0123456789abcdeffedcba9876543210");
        assert_eq!(TimerId::parse(&id.to_hex()), Some(id));
        assert_eq!(
            TimerId::parse(b"0123456789ABCDEFFEDCBA9876543210"),
            Some(id)
        );
        for bad in [
            &b"0123"[..],
            b"0123456789abcdeffedcba987654321g",
            b"0123456789abcdeffedcba98765432100",
        ] {
            assert_eq!(TimerId::parse(bad), None);
        }
    }

    #[test]
    fn shards_never_collide_and_own_their_ids() {
        let shards = 3;
        let mut gens: Vec<IdGenerator> = (0..shards)
            .map(|s| IdGenerator::new(7, s, shards))
            .collect();
        let mut seen = HashSet::new();
        let now = ID_EPOCH_UNIX_MS + 1_000_000;
        // 30,000 IDs in the same millisecond: more than one ms of sequence space.
        for i in 0..30_000 {
            let s = i % shards;
            let id = gens[s].next(now);
            assert_eq!(shard_of(id, shards), s);
            assert!(seen.insert(id), "duplicate id {id:#x}");
        }
    }

    #[test]
    fn a_wall_clock_stepping_back_never_repeats_an_id() {
        let mut g = IdGenerator::new(3, 0, 1);
        let now = ID_EPOCH_UNIX_MS + 10_000;
        let mut last = 0;
        for t in [now, now, now - 5_000, now - 9_000, now + 1, now - 1] {
            let id = g.next(t);
            assert!(id > last, "{id:#x} after {last:#x}");
            last = id;
        }
    }

    #[test]
    fn instance_field_packs_deployment_over_instance() {
        assert_eq!(instance_field(0, 0), 0);
        assert_eq!(instance_field(1, 5), 128 + 5);
        assert_eq!(
            instance_field(DEPLOYMENT_ID_MAX, NODE_INSTANCE_MAX),
            INSTANCE_ID_MAX
        );
    }

    #[test]
    fn ids_carry_the_instance_and_differ_across_instances() {
        let mut a = IdGenerator::new(1, 0, 1);
        let mut b = IdGenerator::new(2, 0, 1);
        let now = ID_EPOCH_UNIX_MS + 5;
        let (x, y) = (a.next(now), b.next(now));
        assert_ne!(x, y);
        assert_eq!((x >> 13) & 1023, 1);
        assert_eq!((y >> 13) & 1023, 2);
    }
}
