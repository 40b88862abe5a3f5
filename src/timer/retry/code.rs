//! A retry policy in 16 bytes, for the storage log's record and the
//! replication body (issue 41): fixed size, so a record's layout does not
//! depend on it, and all zeros for "no policy", so a record without one
//! reads as it did.
//!
//! The layout, one little-endian `u128`, from the lowest bit: the format
//! (4 bits, 1), `attempts` (8), `initial_delay_ms` (27), `max_delay_ms`
//! (27), `give_up_after_ms` (32), `multiplier_centi` (10), `jitter_milli`
//! (10), and 10 bits of zeros. Each field's bound fits its width; a
//! decoded policy is checked as a parsed one is. The dead-letter URI is
//! not here: it has a length, and goes beside the callback's own.

use super::RetryPolicy;

/// Bytes of an encoded policy.
pub const ENCODED_BYTES: usize = 16;
/// The layout above.
const FORMAT: u128 = 1;

/// `(shift, width)` of each field.
const FORMAT_BITS: (u32, u32) = (0, 4);
const ATTEMPTS: (u32, u32) = (4, 8);
const INITIAL: (u32, u32) = (12, 27);
const MAX: (u32, u32) = (39, 27);
const GIVE_UP: (u32, u32) = (66, 32);
const MULTIPLIER: (u32, u32) = (98, 10);
const JITTER: (u32, u32) = (108, 10);
/// Bits above the last field: zero in format 1.
const USED_BITS: u32 = 118;

fn put(word: &mut u128, (shift, width): (u32, u32), value: u64) {
    assert!(
        u128::from(value) < 1 << width,
        "the policy's bounds fit the field"
    );
    *word |= u128::from(value) << shift;
}

fn get(word: u128, (shift, width): (u32, u32)) -> u64 {
    ((word >> shift) & ((1 << width) - 1)) as u64
}

/// The 16 bytes of `policy` (`None`: all zeros).
pub fn encode(policy: Option<&RetryPolicy>) -> [u8; ENCODED_BYTES] {
    let Some(p) = policy else {
        return [0; ENCODED_BYTES];
    };
    debug_assert_eq!(p.check(), Ok(()), "a policy is made checked");
    let mut word = 0;
    put(&mut word, FORMAT_BITS, FORMAT as u64);
    put(&mut word, ATTEMPTS, p.attempts.into());
    put(&mut word, INITIAL, p.initial_delay_ms.into());
    put(&mut word, MAX, p.max_delay_ms.into());
    put(&mut word, GIVE_UP, p.give_up_after_ms.into());
    put(&mut word, MULTIPLIER, p.multiplier_centi.into());
    put(&mut word, JITTER, p.jitter_milli.into());
    word.to_le_bytes()
}

/// The policy in 16 bytes (`None` for all zeros), refused when the format
/// is not this node's or a field is out of its bound.
pub fn decode(bytes: &[u8; ENCODED_BYTES]) -> Result<Option<RetryPolicy>, String> {
    let word = u128::from_le_bytes(*bytes);
    if word == 0 {
        return Ok(None);
    }
    let format = get(word, FORMAT_BITS);
    if u128::from(format) != FORMAT {
        return Err(format!(
            "retry policy in format {format}: this node reads format {FORMAT}"
        ));
    }
    if word >> USED_BITS != 0 {
        return Err("retry policy with bits set past its fields (a later format?)".into());
    }
    // Each width is at most 32 bits, so the casts keep every value.
    let policy = RetryPolicy {
        attempts: get(word, ATTEMPTS) as u8,
        initial_delay_ms: get(word, INITIAL) as u32,
        max_delay_ms: get(word, MAX) as u32,
        give_up_after_ms: get(word, GIVE_UP) as u32,
        multiplier_centi: get(word, MULTIPLIER) as u16,
        jitter_milli: get(word, JITTER) as u16,
    };
    policy.check()?;
    Ok(Some(policy))
}

#[cfg(test)]
mod tests {
    use super::super::{
        ATTEMPTS_MAX, DELAY_MS_MAX, GIVE_UP_MS_MAX, JITTER_MILLI_MAX, MULTIPLIER_CENTI_MAX,
    };
    use super::*;

    #[test]
    fn policies_round_trip() {
        let least = RetryPolicy {
            attempts: 1,
            initial_delay_ms: 1,
            max_delay_ms: 1,
            multiplier_centi: 100,
            jitter_milli: 0,
            give_up_after_ms: 1,
        };
        let most = RetryPolicy {
            attempts: ATTEMPTS_MAX,
            initial_delay_ms: DELAY_MS_MAX,
            max_delay_ms: DELAY_MS_MAX,
            multiplier_centi: MULTIPLIER_CENTI_MAX,
            jitter_milli: JITTER_MILLI_MAX,
            give_up_after_ms: GIVE_UP_MS_MAX,
        };
        let odd = RetryPolicy {
            attempts: 7,
            initial_delay_ms: 1234,
            max_delay_ms: 56_789,
            multiplier_centi: 157,
            jitter_milli: 333,
            give_up_after_ms: 99_999,
        };
        for p in [least, most, odd, RetryPolicy::default()] {
            let bytes = encode(Some(&p));
            assert_ne!(bytes, [0; ENCODED_BYTES]);
            assert_eq!(decode(&bytes), Ok(Some(p)));
        }
        assert_eq!(encode(None), [0; ENCODED_BYTES]);
        assert_eq!(decode(&[0; ENCODED_BYTES]), Ok(None));
    }

    #[test]
    fn the_layout_is_fixed() {
        // Written down once: a change here is a new format (and a
        // storage log that still reads the old one).
        let bytes = encode(Some(&RetryPolicy::default()));
        assert_eq!(
            bytes,
            [
                0xa1, 0x80, 0x3e, 0x00, 0x00, 0x40, 0x77, 0x1b, 0x00, 0x70, 0x99, 0x14, 0x20, 0x83,
                0x0c, 0x00
            ]
        );
    }

    /// The default policy's bytes with one field replaced.
    fn with(field: (u32, u32), value: u64) -> [u8; ENCODED_BYTES] {
        let mut word = u128::from_le_bytes(encode(Some(&RetryPolicy::default())));
        word &= !(((1u128 << field.1) - 1) << field.0);
        put(&mut word, field, value);
        word.to_le_bytes()
    }

    #[test]
    fn foreign_or_damaged_bytes_are_refused() {
        let past = (USED_BITS, 128 - USED_BITS);
        let table = [
            (with(FORMAT_BITS, 2), "format 2: this node reads format 1"),
            (with(FORMAT_BITS, 0), "format 0: this node reads format 1"),
            (with(past, 1), "bits set past its fields"),
            (with(ATTEMPTS, 0), "attempts must be 1 to 200"),
            (with(ATTEMPTS, 201), "attempts must be 1 to 200"),
            (
                with(INITIAL, 0),
                "initial-delay must be 0.001 to 86400 seconds",
            ),
            (
                with(MAX, 86_400_001),
                "max-delay must be 0.001 to 86400 seconds",
            ),
            (with(GIVE_UP, 0), "give-up-after must be 0.001 to 2592000"),
            (with(MULTIPLIER, 99), "multiplier must be 1 to 10"),
            (with(MULTIPLIER, 1001), "multiplier must be 1 to 10"),
            (with(JITTER, 1001), "jitter must be 0 to 1"),
        ];
        for (bytes, want) in table {
            let err = decode(&bytes).expect_err(want);
            assert!(err.contains(want), "{err:?} lacks {want:?}");
        }
    }
}
