//! The end of a log written with overlapped batches (`sync = "batch"`
//! keeps up to `log::IN_FLIGHT_MAX` = 2 write batches in flight): a crash
//! may leave the older of the two torn and the newer one whole, or both
//! torn. Neither was acknowledged (a batch counts durable only once every
//! batch before it is), so recovery cuts both, as it cuts one torn batch.
//!
//! Told from corruption (a bad batch with a valid one after it) by what
//! the newer batch says and by what follows it:
//! - whole: its COMMIT names the first LSN of the batch it overlapped
//!   (`log::launch`), which must be the torn batch's, the LSN after the
//!   last whole batch; a COMMIT naming none (0: nothing was in flight
//!   when it was written, or a log of an earlier build) means the batch
//!   before it was durable, so a bad one there is corruption, as before;
//! - torn (only its first record reads whole): nothing to check in it;
//! - either way, no valid batch after it.
//!
//! What this gives up: a disk that damages the second-to-last batch of
//! the last segment while the last one is torn, or while the last one
//! overlapped it, looks the same, and both are cut (as a damaged last
//! batch always was: recovery cannot tell the two apart).

use super::record::{self, BLOCK_BYTES};

/// Whether a bad batch followed by the batch at `next` (its first record
/// valid) is the torn pair of a crash with two writes in flight.
/// `last_lsn`: the last LSN read before the bad batch (0: none yet).
pub fn torn_pair(buf: &[u8], next: usize, last_lsn: u64) -> bool {
    let Some(first) = record::check(buf, next) else {
        return false;
    };
    match whole_batch(buf, next) {
        Some((end, overlapped)) => {
            let follows = last_lsn == 0 || last_lsn.checked_add(1) == Some(overlapped);
            let names_the_bad_one = overlapped > last_lsn && overlapped < first.batch_lsn;
            follows && names_the_bad_one && !valid_after(buf, end, first.batch_lsn)
        }
        None => !valid_after(buf, next, first.batch_lsn),
    }
}

/// The batch at `start` if it is whole on its own (its chain unchecked
/// against what precedes it): where it ends and its COMMIT's LSN field.
fn whole_batch(buf: &[u8], start: usize) -> Option<(usize, u64)> {
    let batch_lsn = record::check(buf, start)?.batch_lsn;
    let mut at = start;
    let mut prev = None;
    loop {
        let h = record::check(buf, at)?;
        if prev.is_some_and(|p| p != h.prev) || h.batch_lsn != batch_lsn {
            return None;
        }
        prev = Some(h.crc);
        at += h.len;
        match h.kind {
            record::COMMIT => return at.is_multiple_of(BLOCK_BYTES).then_some((at, h.lsn)),
            record::SEAL => return None,
            _ => {}
        }
    }
}

/// Whether a valid record of a later batch (numbered after `batch_lsn`)
/// starts at any block boundary from `from` on.
fn valid_after(buf: &[u8], from: usize, batch_lsn: u64) -> bool {
    let mut block = from.next_multiple_of(BLOCK_BYTES);
    while block + record::HEADER_BYTES <= buf.len() {
        if record::check(buf, block).is_some_and(|h| h.batch_lsn > batch_lsn) {
            return true;
        }
        block += BLOCK_BYTES;
    }
    false
}

#[cfg(test)]
mod tests {
    //! Real segment files in a temporary directory, read by `recover`.

    use super::super::config::OnCorruption;
    use super::super::{read, record, segment_name};
    use std::ops::Range;
    use std::path::{Path, PathBuf};

    const SEGMENT: usize = 16 * record::BLOCK_BYTES;

    /// A write batch of REMOVEs numbered `lsns`, chained after `prev`, its
    /// COMMIT naming `overlaps`; returns it and its last crc.
    fn batch(lsns: Range<u64>, prev: u32, overlaps: u64) -> (Vec<u8>, u32) {
        let mut b = Vec::new();
        for lsn in lsns.clone() {
            record::remove(&mut b, lsn, lsn * 7);
        }
        record::commit(&mut b, 0, overlaps);
        let crc = record::stamp(&mut b, prev, lsns.start);
        (b, crc)
    }

    /// A fresh directory holding one segment of `batches`, then zeros.
    fn segment(name: &str, batches: &[&[u8]]) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("chronos-tail-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let mut bytes: Vec<u8> = batches.concat();
        assert!(bytes.len() <= SEGMENT, "the test's batches fit its segment");
        bytes.resize(SEGMENT, 0);
        let path = dir.join(segment_name(1));
        std::fs::write(&path, bytes).expect("the segment is written");
        (dir, path)
    }

    /// Damage a batch as a torn write would: its last block not written.
    fn torn(mut b: Vec<u8>) -> Vec<u8> {
        let from = b.len() - record::BLOCK_BYTES;
        b[from..].fill(0);
        b
    }

    /// Three whole batches: `a` (LSNs 1-2), `n` (3-202, two blocks), `m`
    /// (203-204, its COMMIT naming `m_overlaps`).
    fn three(m_overlaps: u64) -> (Vec<u8>, Vec<u8>, Vec<u8>, u32) {
        let (a, crc) = batch(1..3, 0, 0);
        let (n, crc) = batch(3..203, crc, 1);
        assert_eq!(
            n.len(),
            2 * record::BLOCK_BYTES,
            "200 REMOVEs of 40 bytes take two blocks"
        );
        let (m, crc) = batch(203..205, crc, m_overlaps);
        (a, n, m, crc)
    }

    fn cleanup(dir: &Path) {
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_torn_batch_then_a_whole_one_that_overlapped_it_is_a_torn_tail() {
        let (a, n, m, _) = three(3);
        let (dir, path) = segment("pair", &[&a, &torn(n), &m]);
        let got = read::recover(&dir, OnCorruption::Stop).expect("a torn pair is no corruption");
        assert_eq!(got.torn_tails, 1, "the pair is cut as one torn tail");
        assert_eq!(got.corrupt, 0, "nothing counted corrupt");
        assert_eq!(
            got.next_lsn, 3,
            "the log continues after the whole batch, LSN 3"
        );
        assert_eq!(
            got.replayed, 2,
            "only the first batch's two records are applied"
        );
        assert_eq!(
            got.tail,
            Some((path.clone(), a.len() as u64)),
            "the next write goes where the torn batch was"
        );
        let bytes = std::fs::read(&path).expect("the segment reads back");
        assert!(
            bytes[a.len()..].iter().all(|&b| b == 0),
            "both batches of the pair are zeroed on disk"
        );
        let again =
            read::recover(&dir, OnCorruption::Stop).expect("the second start reads the cut log");
        assert_eq!(
            (again.torn_tails, again.next_lsn),
            (0, 3),
            "a second start finds nothing more to cut"
        );
        cleanup(&dir);
    }

    #[test]
    fn a_torn_batch_then_one_written_after_it_was_durable_is_corruption() {
        let (a, n, m, _) = three(0);
        let (dir, _) = segment("not-overlapped", &[&a, &torn(n), &m]);
        let err = read::recover(&dir, OnCorruption::Stop)
            .err()
            .expect("refused: the bad batch was durable");
        assert!(
            err.contains("offset 4096"),
            "names the bad batch's offset: {err}"
        );
        let skip = read::recover(&dir, OnCorruption::Skip).expect("skip recovers the rest");
        assert_eq!(skip.corrupt, 1, "the bad batch is counted corrupt");
        cleanup(&dir);
    }

    #[test]
    fn a_pair_naming_another_batch_is_corruption() {
        let (a, n, m, _) = three(2);
        let (dir, _) = segment("wrong-name", &[&a, &torn(n), &m]);
        assert!(
            read::recover(&dir, OnCorruption::Stop).is_err(),
            "the COMMIT names a batch that is not the bad one"
        );
        cleanup(&dir);
    }

    #[test]
    fn two_torn_batches_at_the_end_are_a_torn_tail() {
        let (a, crc) = batch(1..3, 0, 0);
        let (n, crc) = batch(3..5, crc, 1);
        let (m, _) = batch(5..205, crc, 3);
        let (dir, _) = segment("both-torn", &[&a, &torn(n), &torn(m)]);
        let got =
            read::recover(&dir, OnCorruption::Stop).expect("two torn batches are no corruption");
        assert_eq!(
            (got.torn_tails, got.next_lsn),
            (1, 3),
            "both are cut; the log continues at LSN 3"
        );
        cleanup(&dir);
    }

    #[test]
    fn a_valid_batch_after_the_pair_is_corruption() {
        let (a, n, m, crc) = three(3);
        let (after, _) = batch(205..207, crc, 203);
        let (dir, _) = segment("three-after", &[&a, &torn(n), &m, &after]);
        assert!(
            read::recover(&dir, OnCorruption::Stop).is_err(),
            "a third batch was never in flight with a torn one"
        );
        cleanup(&dir);
    }

    #[test]
    fn a_torn_pair_before_a_later_segment_is_corruption() {
        let (a, n, m, _) = three(3);
        let (dir, path) = segment("not-last", &[&a, &torn(n), &m]);
        let later = dir.join(segment_name(205));
        std::fs::write(&later, vec![0u8; SEGMENT]).expect("a later, empty segment");
        assert!(
            read::recover(&dir, OnCorruption::Stop).is_err(),
            "only the last segment may end torn: {path:?}"
        );
        cleanup(&dir);
    }
}
