//! A timer's extensions: what a timer carries beyond seed 000's fields,
//! as bytes kept after its opaque data (`callback.rs`'s own form), in the
//! storage log's PUT record, and nowhere else in binary (the replication,
//! cross-site and resync bodies carry them as JSON).
//!
//! The bytes are sections, each `[tag u8][length u16 LE][bytes]`, in any
//! order, each tag at most once. A timer without extensions has no bytes
//! and costs nothing. Tags:
//!
//! | tag | section |
//! |---|---|
//! | 1 | the delivery policy (issue 41): the retry policy in its 16-byte code (`retry/code.rs`), then the dead-letter URI (the rest; empty: none) |
//! | 2 | wall-clock or calendar timing (issue 42): the kind (1 `at`, 2 `start-at`, 3 `cron`), the start as wall-clock Unix ms (`i64` LE: what the incarnation's pops count from, the same on every replica), the length of the text (`u16` LE), the text as the client wrote it (the RFC 3339 instant, or the cron expression), then the time zone's name (the rest; `cron` only) |
//!
//! A reader refuses a section it does not know ([`check`]): a log written
//! by a newer build is not silently read as if the timer had no policy.
//! A log written before section 2 existed has none, and reads as before.

use super::retry::{code, RetryPolicy, DEAD_LETTER_URI_BYTES_MAX};
pub use super::timing::{TimingKind, TimingRef};

/// The delivery policy's tag.
pub const DELIVERY: u8 = 1;
/// The timing section's tag.
pub const TIMING: u8 = 2;
/// Bytes of a section's header.
const SECTION_HEADER_BYTES: usize = 3;
/// The most bytes a timer's extensions take: the dead-letter URI's bound,
/// the policy and the headers, with room for the sections to come.
pub const EXT_BYTES_MAX: usize = 16 * 1024;

const _: () = assert!(
    SECTION_HEADER_BYTES + code::ENCODED_BYTES + DEAD_LETTER_URI_BYTES_MAX <= EXT_BYTES_MAX,
    "a delivery section fits"
);
/// Bytes of a timing section before its text: kind, start, text length.
const TIMING_FIXED_BYTES: usize = 1 + 8 + 2;
/// The longest timing text or zone name a section holds.
pub const TIMING_TEXT_MAX: usize = 256;
const _: () = assert!(
    2 * SECTION_HEADER_BYTES
        + code::ENCODED_BYTES
        + DEAD_LETTER_URI_BYTES_MAX
        + TIMING_FIXED_BYTES
        + 2 * TIMING_TEXT_MAX
        <= EXT_BYTES_MAX,
    "a delivery and a timing section fit together"
);
// What `TimingRef::check` accepts fits a section, so a checked timing
// (from a body or a file) never meets `push_timing`'s assert.
const _: () = assert!(
    crate::timer::calendar::EXPRESSION_MAX <= TIMING_TEXT_MAX
        && crate::timer::calendar::AT_MAX <= TIMING_TEXT_MAX
        && crate::timer::calendar::ZONE_NAME_MAX <= TIMING_TEXT_MAX,
    "every checked timing text and zone name fits a section"
);

/// A timer's delivery policy, borrowed from its extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeliveryRef<'a> {
    pub retry: RetryPolicy,
    /// Empty: no dead-letter target.
    pub dead_letter: &'a str,
}

/// Append the delivery section.
pub fn push_delivery(out: &mut Vec<u8>, retry: &RetryPolicy, dead_letter: &str) {
    assert!(
        dead_letter.len() <= DEAD_LETTER_URI_BYTES_MAX,
        "the codec bounds the dead-letter URI"
    );
    let len = code::ENCODED_BYTES + dead_letter.len();
    out.push(DELIVERY);
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.extend_from_slice(&code::encode(Some(retry)));
    out.extend_from_slice(dead_letter.as_bytes());
}

/// Append the timing section (`zone` empty but for `cron`).
pub fn push_timing(out: &mut Vec<u8>, t: &TimingRef<'_>) {
    assert!(
        t.text.len() <= TIMING_TEXT_MAX && t.zone.len() <= TIMING_TEXT_MAX,
        "the codec bounds the timing text"
    );
    let len = TIMING_FIXED_BYTES + t.text.len() + t.zone.len();
    out.push(TIMING);
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.push(t.kind as u8);
    out.extend_from_slice(&t.start_unix_ms.to_le_bytes());
    out.extend_from_slice(&(t.text.len() as u16).to_le_bytes());
    out.extend_from_slice(t.text.as_bytes());
    out.extend_from_slice(t.zone.as_bytes());
}

/// The timing section's fields, or why they are not (the texts are
/// checked as the codec checks them, so a pop never meets a bad one).
fn read_timing(bytes: &[u8]) -> Result<TimingRef<'_>, String> {
    let t = decode_timing(bytes)?;
    t.check()?;
    Ok(t)
}

/// The timing section's fields, without parsing its texts: what a timer
/// whose bytes were checked on their way in reads at each pop (`check`
/// parses the cron expression and looks the zone up).
fn decode_timing(bytes: &[u8]) -> Result<TimingRef<'_>, String> {
    if bytes.len() < TIMING_FIXED_BYTES {
        return Err("a timing section shorter than its header".into());
    }
    let kind = TimingKind::from_code(bytes[0]).ok_or("a timing section of an unknown kind")?;
    let start_unix_ms = i64::from_le_bytes(bytes[1..9].try_into().expect("8 bytes"));
    let text_len = u16::from_le_bytes([bytes[9], bytes[10]]) as usize;
    let rest = &bytes[TIMING_FIXED_BYTES..];
    if text_len > rest.len() {
        return Err("a timing text past its section".into());
    }
    let (text, zone) = rest.split_at(text_len);
    let text = std::str::from_utf8(text).map_err(|_| "a timing text not UTF-8")?;
    let zone = std::str::from_utf8(zone).map_err(|_| "a time zone name not UTF-8")?;
    Ok(TimingRef {
        kind,
        start_unix_ms,
        text,
        zone,
    })
}

/// The sections of `ext`, `None` at the first malformed one.
fn sections(ext: &[u8]) -> impl Iterator<Item = Option<(u8, &[u8])>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= ext.len() {
            return None;
        }
        if at + SECTION_HEADER_BYTES > ext.len() {
            at = ext.len();
            return Some(None);
        }
        let tag = ext[at];
        let len = u16::from_le_bytes([ext[at + 1], ext[at + 2]]) as usize;
        let start = at + SECTION_HEADER_BYTES;
        if start + len > ext.len() {
            at = ext.len();
            return Some(None);
        }
        at = start + len;
        Some(Some((tag, &ext[start..start + len])))
    })
}

/// The delivery section's policy, or why it is not one.
fn read_delivery(bytes: &[u8]) -> Result<DeliveryRef<'_>, String> {
    if bytes.len() < code::ENCODED_BYTES {
        return Err("a delivery section shorter than its policy".into());
    }
    let (policy, uri) = bytes.split_at(code::ENCODED_BYTES);
    let policy: &[u8; code::ENCODED_BYTES] = policy.try_into().expect("split at its size");
    let retry = code::decode(policy)?.ok_or("a delivery section without a policy")?;
    let dead_letter = std::str::from_utf8(uri).map_err(|_| "a dead-letter URI not UTF-8")?;
    if dead_letter.len() > DEAD_LETTER_URI_BYTES_MAX {
        return Err("a dead-letter URI past its bound".into());
    }
    Ok(DeliveryRef { retry, dead_letter })
}

/// Whether `ext` is well formed: known sections, each once, each valid.
/// Stored bytes are checked once, where they are read from a file.
pub fn check(ext: &[u8]) -> Result<(), String> {
    if ext.len() > EXT_BYTES_MAX {
        return Err(format!("extensions of {} bytes", ext.len()));
    }
    let mut seen = 0u32;
    for section in sections(ext) {
        let (tag, bytes) = section.ok_or("a cut extension section")?;
        if tag != DELIVERY && tag != TIMING {
            return Err(format!("an unknown extension section {tag}"));
        }
        if seen & (1 << tag) != 0 {
            return Err(format!("extension section {tag} twice"));
        }
        seen |= 1 << tag;
        match tag {
            DELIVERY => read_delivery(bytes).map(|_| ())?,
            _ => read_timing(bytes).map(|_| ())?,
        }
    }
    Ok(())
}

/// The timing in `ext`, if any (`ext` was checked on its way in).
pub fn timing(ext: &[u8]) -> Option<TimingRef<'_>> {
    if ext.is_empty() {
        return None;
    }
    sections(ext)
        .map_while(|s| s)
        .find(|(tag, _)| *tag == TIMING)
        .and_then(|(_, bytes)| decode_timing(bytes).ok())
}

/// The delivery policy in `ext`, if any (`ext` was checked on its way in).
pub fn delivery(ext: &[u8]) -> Option<DeliveryRef<'_>> {
    sections(ext)
        .map_while(|s| s)
        .find(|(tag, _)| *tag == DELIVERY)
        .and_then(|(_, bytes)| read_delivery(bytes).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_section_reads_back() {
        let retry = RetryPolicy {
            attempts: 4,
            ..RetryPolicy::default()
        };
        let mut ext = Vec::new();
        push_delivery(&mut ext, &retry, "http://dlq.test/x");
        assert_eq!(check(&ext), Ok(()));
        let d = delivery(&ext).expect("a policy");
        assert_eq!((d.retry, d.dead_letter), (retry, "http://dlq.test/x"));
        assert_eq!(delivery(&[]), None, "no extensions, no policy");
    }

    #[test]
    fn malformed_bytes_are_refused_not_trusted() {
        let mut ext = Vec::new();
        push_delivery(&mut ext, &RetryPolicy::default(), "");
        for cut in 0..ext.len() {
            assert!(cut == 0 || check(&ext[..cut]).is_err(), "cut at {cut}");
        }
        let mut twice = ext.clone();
        twice.extend_from_slice(&ext);
        assert!(check(&twice).is_err(), "a section twice");
        assert!(check(&[9, 0, 0]).is_err(), "an unknown section");
        let mut zero = ext.clone();
        zero[SECTION_HEADER_BYTES..SECTION_HEADER_BYTES + 16].fill(0);
        assert!(check(&zero).is_err(), "no policy in a delivery section");
    }

    fn cron() -> TimingRef<'static> {
        TimingRef {
            kind: TimingKind::Cron,
            start_unix_ms: 1_790_000_000_123,
            text: "*/2 * * * * *",
            zone: "Europe/Paris",
        }
    }

    #[test]
    fn a_timing_section_reads_back_beside_a_policy() {
        let at = TimingRef {
            kind: TimingKind::At,
            start_unix_ms: -5,
            text: "2026-12-01T09:00:00+01:00",
            zone: "",
        };
        for t in [cron(), at] {
            let mut ext = Vec::new();
            push_timing(&mut ext, &t);
            assert_eq!(check(&ext), Ok(()));
            assert_eq!(timing(&ext), Some(t));
            assert_eq!(delivery(&ext), None);
            // With a delivery policy, in either order.
            let mut both = ext.clone();
            push_delivery(&mut both, &RetryPolicy::default(), "http://dlq.test/");
            assert_eq!(check(&both), Ok(()));
            assert_eq!(timing(&both), Some(t));
            assert!(delivery(&both).is_some());
            let mut other = Vec::new();
            push_delivery(&mut other, &RetryPolicy::default(), "");
            push_timing(&mut other, &t);
            assert_eq!((check(&other), timing(&other)), (Ok(()), Some(t)));
        }
        assert_eq!(timing(&[]), None, "no extensions, no timing");
    }

    #[test]
    fn a_bad_timing_section_is_refused() {
        let mut ext = Vec::new();
        push_timing(&mut ext, &cron());
        for cut in 1..ext.len() {
            assert!(check(&ext[..cut]).is_err(), "cut at {cut}");
        }
        let mut kind = ext.clone();
        kind[SECTION_HEADER_BYTES] = 9;
        assert!(check(&kind).is_err(), "an unknown kind");
        for (text, zone) in [("61 * * * *", "UTC"), ("* * * * *", "Mars/Olympus")] {
            let mut bad = Vec::new();
            push_timing(
                &mut bad,
                &TimingRef {
                    text,
                    zone,
                    ..cron()
                },
            );
            assert!(check(&bad).is_err(), "{text} in {zone}");
        }
        let mut twice = ext.clone();
        twice.extend_from_slice(&ext);
        assert!(check(&twice).is_err(), "a section twice");
    }
}
