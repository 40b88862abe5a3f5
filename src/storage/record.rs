//! The on-disk record: a 32-byte header, a payload, zero padding to 8.
//!
//! ```text
//! 0..4    crc        CRC32C of bytes 4..len (so it covers `prev`: a chain)
//! 4..8    len        whole record, header included, a multiple of 8
//! 8..12   prev       the previous record's crc (0 for a file's first)
//! 12      kind       PUT, REMOVE, COMMIT, SEAL, SNAP_BEGIN, SNAP_END
//! 13..16  zero
//! 16..24  lsn        log sequence number (a snapshot's entries: 0)
//! 24..32  batch_lsn  lsn of the first record of the batch it was written in
//! ```
//!
//! A zeroed, preallocated or stale block never validates: the crc of any
//! all-zero record is not zero, and a stale record's `prev` does not match
//! the record before it. A write batch always ends with a COMMIT record
//! that pads it to a whole block, so recovery applies a batch only when
//! all of it is on disk.
//!
//! A PUT carries one timer incarnation, whole (its wheel due time and
//! start as wall-clock ms, its callback, its tags by name, its extensions),
//! so replay is "the last record of each ID wins" and never needs an
//! earlier one.
//!
//! A PUT's format is versioned by its byte 67 (after the tag count):
//! 0, the first format, ends with the tags; 1 adds the timer's extensions
//! after them (`u16` length, then the bytes: `timer::extras`, the delivery
//! policy). A PUT without extensions is still written in format 0, so an
//! older build reads every log that has no policy in it, and this build
//! reads every older log. A DELIVERY record (kind 7) carries one pop's
//! delivery attempts (`shard/retry`): the last one of each (ID, sequence)
//! wins, and a done one ends it.

use super::crc32c;
use crate::timer::spec::AttemptState;
use crate::timer::{TimerHead, TimerId};

pub const HEADER_BYTES: usize = 32;
/// Write batches start and end on this boundary (a multiple of every
/// O_DIRECT alignment: 512 or 4096).
pub const BLOCK_BYTES: usize = 4096;
pub const RECORD_ALIGN: usize = 8;
/// The largest record accepted on read (a PUT's callback is bounded far
/// below by the HTTP body limit).
pub const RECORD_BYTES_MAX: usize = 64 << 20;

pub const PUT: u8 = 1;
pub const REMOVE: u8 = 2;
pub const COMMIT: u8 = 3;
pub const SEAL: u8 = 4;
pub const SNAP_BEGIN: u8 = 5;
pub const SNAP_END: u8 = 6;
pub const DELIVERY: u8 = 7;

/// A PUT's byte 67: the format without and with extensions.
const PUT_FORMAT_PLAIN: u8 = 0;
const PUT_FORMAT_EXT: u8 = 1;

/// Fixed bytes of a PUT payload before its callback and tags.
const PUT_FIXED_BYTES: usize = 72;

/// A validated record's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub crc: u32,
    pub len: usize,
    pub prev: u32,
    pub kind: u8,
    pub lsn: u64,
    pub batch_lsn: u64,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Start a record of `kind` at the end of `out` (crc, prev and batch are
/// stamped when its batch is written); returns where it starts.
pub fn begin(out: &mut Vec<u8>, kind: u8, lsn: u64) -> usize {
    let at = out.len();
    assert!(at.is_multiple_of(RECORD_ALIGN), "records start aligned");
    out.extend_from_slice(&[0u8; HEADER_BYTES]);
    out[at + 12] = kind;
    out[at + 16..at + 24].copy_from_slice(&lsn.to_le_bytes());
    at
}

/// Close the record started at `at`: pad to 8 and write its length.
pub fn finish(out: &mut Vec<u8>, at: usize) {
    let padded = (out.len() - at).next_multiple_of(RECORD_ALIGN);
    out.resize(at + padded, 0);
    assert!(
        padded <= u32::MAX as usize,
        "a record's length fits its u32 field"
    );
    out[at + 4..at + 8].copy_from_slice(&(padded as u32).to_le_bytes());
}

/// Append a COMMIT record that ends the batch `out[from..]` on a block
/// boundary (at least one header long).
pub fn commit(out: &mut Vec<u8>, from: usize, lsn: u64) {
    let at = begin(out, COMMIT, lsn);
    let used = out.len() - from;
    let end = from + used.next_multiple_of(BLOCK_BYTES);
    out.resize(end, 0);
    out[at + 4..at + 8].copy_from_slice(&((end - at) as u32).to_le_bytes());
}

/// The LSN of the first record in `batch` (records not yet stamped).
pub fn first_lsn(batch: &[u8]) -> u64 {
    assert!(batch.len() >= HEADER_BYTES, "a batch has a record");
    u64_at(batch, 16)
}

/// Stamp every record of `batch` (whole records) with its chain link, its
/// batch and its crc; returns the last crc.
pub fn stamp(batch: &mut [u8], mut prev: u32, batch_lsn: u64) -> u32 {
    let mut at = 0;
    while at < batch.len() {
        let len = u32_at(batch, at + 4) as usize;
        assert!(
            len >= HEADER_BYTES && at + len <= batch.len(),
            "whole records"
        );
        batch[at + 8..at + 12].copy_from_slice(&prev.to_le_bytes());
        batch[at + 24..at + 32].copy_from_slice(&batch_lsn.to_le_bytes());
        prev = crc32c::of(&batch[at + 4..at + len]);
        batch[at..at + 4].copy_from_slice(&prev.to_le_bytes());
        at += len;
    }
    prev
}

/// The record at `buf[at..]` if it is whole and its crc matches (its
/// `prev` is the caller's to check against the chain).
pub fn check(buf: &[u8], at: usize) -> Option<Header> {
    if at + HEADER_BYTES > buf.len() {
        return None;
    }
    let len = u32_at(buf, at + 4) as usize;
    let whole = len >= HEADER_BYTES
        && len.is_multiple_of(RECORD_ALIGN)
        && len <= RECORD_BYTES_MAX
        && at + len <= buf.len();
    if !whole {
        return None;
    }
    let crc = u32_at(buf, at);
    if crc32c::of(&buf[at + 4..at + len]) != crc {
        return None;
    }
    Some(Header {
        crc,
        len,
        prev: u32_at(buf, at + 8),
        kind: buf[at + 12],
        lsn: u64_at(buf, at + 16),
        batch_lsn: u64_at(buf, at + 24),
    })
}

/// The payload of a checked record.
pub fn payload<'a>(buf: &'a [u8], at: usize, h: &Header) -> &'a [u8] {
    &buf[at + HEADER_BYTES..at + h.len]
}

/// One timer incarnation as a PUT carries it. Times are wall-clock ms.
#[derive(Clone, Debug)]
pub struct Image<'a> {
    pub due_unix_ms: u64,
    /// `start_ms` is wall-clock ms here.
    pub head: TimerHead,
    pub uri: &'a str,
    pub opaque: &'a str,
    /// `(name length u16 LE, name, count u32 LE)` repeated, validated.
    tags: &'a [u8],
    /// The timer's extensions (`timer::extras`), checked on read.
    pub ext: &'a [u8],
}

/// Append a PUT of `image` (its `tags` ignored) with these tag names.
pub fn put<'t>(
    out: &mut Vec<u8>,
    lsn: u64,
    image: &Image<'_>,
    tags: impl Iterator<Item = (&'t str, u32)>,
) {
    let at = begin(out, PUT, lsn);
    put_payload(out, at, image, tags);
    finish(out, at);
}

/// Bytes of a DELIVERY record's state, before its timer image.
const DELIVERY_STATE_BYTES: usize = 24;

/// Append a DELIVERY record: one pop's attempts (`owned`: this node sends
/// them), then the timer as the pop took it, as a PUT payload.
pub fn delivery<'t>(
    out: &mut Vec<u8>,
    lsn: u64,
    state: &AttemptState,
    owned: bool,
    image: &Image<'_>,
    tags: impl Iterator<Item = (&'t str, u32)>,
) {
    let at = begin(out, DELIVERY, lsn);
    out.extend_from_slice(&state.sequence.to_le_bytes());
    let flags = u8::from(state.done) | u8::from(owned) << 1;
    out.extend_from_slice(&[state.attempts, flags]);
    out.extend_from_slice(&state.last_outcome.to_le_bytes());
    out.extend_from_slice(&state.first_unix_ms.to_le_bytes());
    out.extend_from_slice(&state.next_unix_ms.to_le_bytes());
    put_payload(out, at + DELIVERY_STATE_BYTES, image, tags);
    finish(out, at);
}

/// A DELIVERY payload: the state, whether this node owned it, the timer.
pub fn delivery_of(p: &[u8]) -> Option<(AttemptState, bool, Image<'_>)> {
    if p.len() < DELIVERY_STATE_BYTES {
        return None;
    }
    let state = AttemptState {
        sequence: u32_at(p, 0),
        attempts: p[4],
        first_unix_ms: u64_at(p, 8),
        next_unix_ms: u64_at(p, 16),
        last_outcome: u16::from_le_bytes([p[6], p[7]]),
        done: p[5] & 1 != 0,
    };
    if state.attempts == 0 || p[5] > 3 {
        return None;
    }
    let image = image(&p[DELIVERY_STATE_BYTES..])?;
    Some((state, p[5] & 2 != 0, image))
}

/// A PUT payload of `image` (its `tags` ignored) with these tag names, at
/// the end of `out`; `at` is where the payload's record starts, less the
/// bytes before the payload proper (the layout check counts from it).
fn put_payload<'t>(
    out: &mut Vec<u8>,
    at: usize,
    image: &Image<'_>,
    tags: impl Iterator<Item = (&'t str, u32)>,
) {
    let h = &image.head;
    for v in [
        image.due_unix_ms,
        h.id.unique,
        h.id.bloom,
        h.start_ms,
        h.version,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [h.interval_ms, h.repeat_for_ms, h.sequence, h.view, h.sites] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&[
        h.replica_index,
        h.replication_factor,
        h.factor_requested,
        h.site_index,
    ]);
    assert!(
        image.uri.len() <= u16::MAX as usize,
        "the codec keeps a callback URI far below 64 KiB"
    );
    out.extend_from_slice(&(image.uri.len() as u16).to_le_bytes());
    let tag_count_at = out.len();
    let format = match image.ext.is_empty() {
        true => PUT_FORMAT_PLAIN,
        false => PUT_FORMAT_EXT,
    };
    out.extend_from_slice(&[0, format]);
    out.extend_from_slice(&(image.opaque.len() as u32).to_le_bytes());
    assert_eq!(
        out.len() - at - HEADER_BYTES,
        PUT_FIXED_BYTES,
        "the fixed part of a put record"
    );
    out.extend_from_slice(image.uri.as_bytes());
    out.extend_from_slice(image.opaque.as_bytes());
    let mut n = 0u8;
    for (name, count) in tags {
        // Whole names, never cut (a cut could split a UTF-8 character);
        // the codec's limits (256 characters, so at most 1 KiB, and 32
        // tags) are far below these.
        assert!(
            name.len() <= u16::MAX as usize && n < u8::MAX,
            "the codec's tag limits are far below the record's"
        );
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        n += 1;
    }
    out[tag_count_at] = n;
    if format == PUT_FORMAT_EXT {
        assert!(
            image.ext.len() <= crate::timer::extras::EXT_BYTES_MAX,
            "the codec bounds a timer's extensions"
        );
        out.extend_from_slice(&(image.ext.len() as u16).to_le_bytes());
        out.extend_from_slice(image.ext);
    }
}

/// Append a REMOVE of `unique`.
pub fn remove(out: &mut Vec<u8>, lsn: u64, unique: u64) {
    let at = begin(out, REMOVE, lsn);
    out.extend_from_slice(&unique.to_le_bytes());
    finish(out, at);
}

/// A REMOVE's ID.
pub fn removed(p: &[u8]) -> Option<u64> {
    (p.len() >= 8).then(|| u64_at(p, 0))
}

/// Decode a PUT payload; `None` when it is not one (a checksum collision
/// or a bug: never trusted blindly).
pub fn image(p: &[u8]) -> Option<Image<'_>> {
    if p.len() < PUT_FIXED_BYTES {
        return None;
    }
    let uri_len = u16::from_le_bytes([p[64], p[65]]) as usize;
    let opaque_len = u32_at(p, 68) as usize;
    let rest = &p[PUT_FIXED_BYTES..];
    if uri_len + opaque_len > rest.len() {
        return None;
    }
    let uri = std::str::from_utf8(&rest[..uri_len]).ok()?;
    let opaque = std::str::from_utf8(&rest[uri_len..uri_len + opaque_len]).ok()?;
    let tags = trim_tags(&rest[uri_len + opaque_len..], p[66])?;
    let after_tags = &rest[uri_len + opaque_len + tags.len()..];
    let ext = match p[67] {
        PUT_FORMAT_PLAIN => &[][..],
        PUT_FORMAT_EXT => {
            let len = u16::from_le_bytes([*after_tags.first()?, *after_tags.get(1)?]) as usize;
            let ext = after_tags.get(2..2 + len)?;
            crate::timer::extras::check(ext).ok()?;
            ext
        }
        _ => return None,
    };
    let head = TimerHead {
        id: TimerId {
            unique: u64_at(p, 8),
            bloom: u64_at(p, 16),
        },
        start_ms: u64_at(p, 24),
        version: u64_at(p, 32),
        interval_ms: u32_at(p, 40),
        repeat_for_ms: u32_at(p, 44),
        sequence: u32_at(p, 48),
        view: u32_at(p, 52),
        sites: u32_at(p, 56),
        replica_index: p[60],
        replication_factor: p[61],
        // Capped, not refused: logs from before the packed timer record
        // hold any configured default factor (1-255) here.
        factor_requested: p[62].min(crate::timer::NODES_MAX as u8),
        site_index: p[63],
    };
    if !head.fits_record() {
        return None;
    }
    Some(Image {
        due_unix_ms: u64_at(p, 0),
        head,
        uri,
        opaque,
        tags,
        ext,
    })
}

/// The bytes of `count` tags (without the record's zero padding); `None`
/// if malformed.
fn trim_tags(all: &[u8], count: u8) -> Option<&[u8]> {
    let mut used = 0;
    for _ in 0..count {
        let t = &all[used..];
        let n = u16::from_le_bytes([*t.first()?, *t.get(1)?]) as usize;
        if t.len() < 2 + n + 4 {
            return None;
        }
        std::str::from_utf8(&t[2..2 + n]).ok()?;
        used += 2 + n + 4;
    }
    Some(&all[..used])
}

impl<'a> Image<'a> {
    pub fn new(due_unix_ms: u64, head: TimerHead, uri: &'a str, opaque: &'a str) -> Self {
        Image {
            due_unix_ms,
            head,
            uri,
            opaque,
            tags: &[],
            ext: &[],
        }
    }

    /// The timer's tags, by name.
    pub fn tags(&self) -> impl Iterator<Item = (&'a str, u32)> + 'a {
        let mut t = self.tags;
        std::iter::from_fn(move || {
            let n = u16::from_le_bytes([*t.first()?, *t.get(1)?]) as usize;
            let name = std::str::from_utf8(&t[2..2 + n]).unwrap_or("");
            let count = u32_at(t, 2 + n);
            t = &t[2 + n + 4..];
            Some((name, count))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(unique: u64) -> TimerHead {
        TimerHead {
            id: TimerId { unique, bloom: 9 },
            start_ms: 1_700_000_000_000,
            version: 77,
            interval_ms: 1000,
            repeat_for_ms: 5000,
            sequence: 2,
            view: 3,
            replica_index: 1,
            replication_factor: 2,
            factor_requested: 3,
            site_index: 0,
            sites: u32::MAX,
        }
    }

    #[test]
    fn a_batch_round_trips_and_chains() {
        let mut out = Vec::new();
        let img = Image::new(123, head(42), "http://a/b", "opaque");
        put(&mut out, 1, &img, [("red", 2u32), ("blue", 1)].into_iter());
        remove(&mut out, 2, 42);
        commit(&mut out, 0, 3);
        assert!(out.len().is_multiple_of(BLOCK_BYTES));
        let last = stamp(&mut out, 5, 1);
        let a = check(&out, 0).expect("put");
        assert_eq!((a.kind, a.lsn, a.prev, a.batch_lsn), (PUT, 1, 5, 1));
        let got = image(payload(&out, 0, &a)).expect("image");
        assert_eq!(
            (got.uri, got.opaque, got.due_unix_ms),
            ("http://a/b", "opaque", 123)
        );
        assert_eq!(got.head.id.unique, 42);
        assert_eq!(got.head.sequence, 2);
        assert_eq!(got.head.factor_requested, 3);
        assert_eq!(
            got.tags().collect::<Vec<_>>(),
            vec![("red", 2), ("blue", 1)]
        );
        let b = check(&out, a.len).expect("remove");
        assert_eq!((b.kind, b.prev), (REMOVE, a.crc));
        assert_eq!(removed(payload(&out, a.len, &b)), Some(42));
        let c = check(&out, a.len + b.len).expect("commit");
        assert_eq!((c.kind, c.prev, c.crc), (COMMIT, b.crc, last));
        assert_eq!(a.len + b.len + c.len, out.len());
    }

    #[test]
    fn an_old_record_with_a_large_requested_factor_still_decodes() {
        // Logs written before the packed record took any configured
        // `default-replication-factor` (1-255) as the requested factor:
        // such a record decodes with it capped at NODES_MAX, not refused.
        let mut old = head(8);
        old.factor_requested = 200;
        let mut out = Vec::new();
        put(
            &mut out,
            1,
            &Image::new(5, old, "http://a/", ""),
            [].into_iter(),
        );
        commit(&mut out, 0, 0);
        stamp(&mut out, 0, 1);
        let h = check(&out, 0).expect("put");
        let got = image(payload(&out, 0, &h)).expect("an old record decodes");
        assert_eq!(got.head.factor_requested as usize, crate::timer::NODES_MAX);
        assert!(got.head.fits_record());
    }

    #[test]
    fn a_timing_section_travels_through_a_put_and_an_old_put_has_none() {
        use crate::timer::extras::{self, TimingKind, TimingRef};
        let timing = TimingRef {
            kind: TimingKind::Cron,
            start_unix_ms: 1_790_000_000_000,
            text: "0 9 * * MON-FRI",
            zone: "Europe/Paris",
        };
        let mut ext = Vec::new();
        extras::push_timing(&mut ext, &timing);
        let mut out = Vec::new();
        let mut img = Image::new(9, head(6), "http://a/", "o");
        img.ext = &ext;
        put(&mut out, 1, &img, [].into_iter());
        // A record of the format before issue 42: no extensions at all.
        put(
            &mut out,
            2,
            &Image::new(9, head(7), "http://a/", "o"),
            [].into_iter(),
        );
        commit(&mut out, 0, 0);
        stamp(&mut out, 0, 1);
        let a = check(&out, 0).expect("put with a timing");
        let got = image(payload(&out, 0, &a)).expect("image");
        assert_eq!(extras::timing(got.ext), Some(timing));
        let b = check(&out, a.len).expect("put without");
        let old = image(payload(&out, a.len, &b)).expect("an old record reads");
        assert_eq!((old.ext, extras::timing(old.ext)), (&[][..], None));
    }

    #[test]
    fn tag_names_round_trip_whole_at_the_codec_limits() {
        // 256 bytes ending in a two-byte character, an empty name, 32 tags.
        let long = format!("{}é", "a".repeat(254));
        let mut names: Vec<String> = (0..30).map(|i| format!("t{i}")).collect();
        names.push(long.clone());
        names.push(String::new());
        let mut out = Vec::new();
        let img = Image::new(1, head(5), "http://a/", "");
        put(&mut out, 1, &img, names.iter().map(|n| (n.as_str(), 3u32)));
        commit(&mut out, 0, 0);
        stamp(&mut out, 0, 1);
        let h = check(&out, 0).expect("put");
        let got = image(payload(&out, 0, &h)).expect("image");
        let back: Vec<&str> = got.tags().map(|(n, _)| n).collect();
        assert_eq!(back.len(), 32);
        assert_eq!(back[30], long);
        assert_eq!(back[31], "");
    }

    #[test]
    fn zeros_garbage_and_flipped_bits_never_validate() {
        let zeros = vec![0u8; BLOCK_BYTES];
        assert!(check(&zeros, 0).is_none());
        let mut out = Vec::new();
        remove(&mut out, 1, 7);
        commit(&mut out, 0, 2);
        stamp(&mut out, 0, 1);
        for bit in 0..(HEADER_BYTES + 8) * 8 {
            let mut bad = out.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                check(&bad, 0).is_none_or(|h| h.len != 40 || h.kind != REMOVE),
                "bit {bit}"
            );
        }
        let garbage: Vec<u8> = (0..BLOCK_BYTES).map(|i| (i * 131 % 251) as u8).collect();
        assert!(check(&garbage, 0).is_none());
    }

    #[test]
    fn malformed_payloads_decode_to_none_not_a_panic() {
        assert!(image(&[0u8; 10]).is_none());
        let mut p = vec![0u8; PUT_FIXED_BYTES];
        p[64] = 0xff; // uri length beyond the payload
        assert!(image(&p).is_none());
        let mut p = vec![0u8; PUT_FIXED_BYTES + 3];
        p[66] = 1; // one tag,
        p[PUT_FIXED_BYTES] = 9; // its name running past the end
        assert!(image(&p).is_none());
    }
}
