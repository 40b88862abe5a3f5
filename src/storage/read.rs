//! Recovery: a shard directory's newest snapshot, then its log after it,
//! read with plain blocking reads before the shard takes traffic for
//! the timers (the shard answers `/ready` "recovering" meanwhile).
//!
//! Replay keeps, per ID, the position of its last PUT (a REMOVE drops
//! it): the timers are read straight out of the loaded files, never
//! copied. A batch counts only once its COMMIT is read, so a batch torn
//! by a crash is dropped whole (none of it was acknowledged).
//!
//! What a bad record means depends on where it is:
//! - the last segment, with nothing valid after it but bytes of the same
//!   batch, or only the batch written while it was in flight (`tail.rs`):
//!   the torn tail of a crash; cut (zeroed), logged, counted;
//! - the last segment, followed by zeros only: the log's clean end;
//! - anywhere else (a later batch follows it, or an earlier segment does
//!   not end with its SEAL): corruption. `on-corruption = "stop"` refuses
//!   to start, naming the file and offset; `"skip"` logs and counts it and
//!   goes on at the next valid batch.

use super::config::OnCorruption;
use super::log::Resume;
use super::record::{self, Header, Image, BLOCK_BYTES};
use crate::timer::spec::AttemptState;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What a shard directory held.
#[derive(Default)]
pub struct Recovered {
    files: Vec<Vec<u8>>,
    /// ID → the file and offset of its last PUT.
    live: HashMap<u64, (u32, u64)>,
    /// (ID, sequence) → the file and offset of its last DELIVERY not done.
    deliveries: HashMap<(u64, u32), (u32, u64)>,
    pub next_lsn: u64,
    pub last_crc: u32,
    /// The last segment and where its valid part ends (`None`: start a new one).
    pub tail: Option<(PathBuf, u64)>,
    /// Log bytes after the snapshot, and the snapshot's own size.
    pub since_snapshot_bytes: u64,
    pub snapshot_bytes: u64,
    pub replayed: u64,
    pub torn_tails: u64,
    pub corrupt: u64,
}

impl Recovered {
    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Every recovered timer, in no particular order.
    pub fn images(&self) -> impl Iterator<Item = Image<'_>> + '_ {
        self.live.values().filter_map(|&(file, at)| {
            let buf = &self.files[file as usize];
            let h = record::check(buf, at as usize)?;
            record::image(record::payload(buf, at as usize, &h))
        })
    }

    /// Every pop still being retried or watched, with the timer it
    /// belongs to (`record::delivery_of`), in no particular order.
    pub fn deliveries(&self) -> impl Iterator<Item = (AttemptState, bool, Image<'_>)> + '_ {
        self.deliveries.values().filter_map(|&(file, at)| {
            let buf = &self.files[file as usize];
            let h = record::check(buf, at as usize)?;
            record::delivery_of(record::payload(buf, at as usize, &h))
        })
    }

    pub fn resume(&self) -> Resume {
        Resume {
            next_lsn: self.next_lsn.max(1),
            last_crc: self.last_crc,
            segment: self.tail.clone(),
            since_snapshot_bytes: self.since_snapshot_bytes,
        }
    }
}

/// Replay state while reading.
struct Replay<'a> {
    /// The segment read last ended with its SEAL.
    sealed: bool,
    on_corruption: OnCorruption,
    /// Records below this LSN are in the snapshot.
    covers_lsn: u64,
    last_lsn: u64,
    /// The crc the next record must name as `prev` (`None`: any).
    chain: Option<u32>,
    out: &'a mut Recovered,
}

/// Read `dir` (a shard's directory). `Err` names the file and offset of
/// a bad record, with `on-corruption = "stop"`.
pub fn recover(dir: &Path, on_corruption: OnCorruption) -> Result<Recovered, String> {
    let (snaps, segments) = list(dir)?;
    let mut out = Recovered::default();
    let covers_lsn = load_snapshot(dir, &snaps, on_corruption, &mut out)?;
    let mut replay = Replay {
        sealed: false,
        on_corruption,
        covers_lsn,
        // The segment holding the snapshot's LSN starts before it: its
        // earlier records are read (the chain) but not applied.
        last_lsn: 0,
        chain: None,
        out: &mut out,
    };
    // Segments wholly before the snapshot are left for compaction to remove.
    let first = (0..segments.len())
        .find(|&i| segments.get(i + 1).is_none_or(|(lsn, _)| *lsn > covers_lsn))
        .unwrap_or(segments.len());
    for (i, (_, path)) in segments.iter().enumerate().skip(first) {
        let buf = std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
        let is_last = i + 1 == segments.len();
        let file = replay.out.files.len() as u32;
        replay.out.files.push(Vec::new());
        let end = replay_segment(&mut replay, path, &buf, file, is_last)?;
        replay.out.since_snapshot_bytes += end;
        replay.out.files[file as usize] = buf;
        if is_last && !replay.sealed {
            replay.out.tail = Some((path.clone(), end));
        }
    }
    out.next_lsn = out.next_lsn.max(covers_lsn).max(1);
    Ok(out)
}

/// `snap-*.snap` and `log-*.wal` files by LSN (leftover `.tmp` files of an
/// unfinished snapshot are removed).
type Listed = (Vec<(u64, PathBuf)>, Vec<(u64, PathBuf)>);

fn list(dir: &Path) -> Result<Listed, String> {
    let read = std::fs::read_dir(dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
    let (mut snaps, mut segments) = (Vec::new(), Vec::new());
    for entry in read.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            let _ = std::fs::remove_file(&path);
        } else if let Some(lsn) = super::lsn_of(&name, "snap-", ".snap") {
            snaps.push((lsn, path));
        } else if let Some(lsn) = super::lsn_of(&name, "log-", ".wal") {
            segments.push((lsn, path));
        }
    }
    snaps.sort();
    segments.sort();
    Ok((snaps, segments))
}

/// Load the newest snapshot; returns the LSN it covers up to (1: none).
fn load_snapshot(
    dir: &Path,
    snaps: &[(u64, PathBuf)],
    on_corruption: OnCorruption,
    out: &mut Recovered,
) -> Result<u64, String> {
    let Some((lsn, path)) = snaps.last() else {
        return Ok(1);
    };
    let buf = std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let file = out.files.len() as u32;
    match read_snapshot(&buf, file, &mut out.live, &mut out.deliveries) {
        Ok(count) => {
            out.replayed += count;
            out.snapshot_bytes = buf.len() as u64;
            out.files.push(buf);
            Ok(*lsn)
        }
        Err(at) => {
            let why = format!(
                "{}: bad snapshot record at offset {at} (in {})",
                path.display(),
                dir.display()
            );
            if on_corruption == OnCorruption::Stop {
                return Err(format!("{why}; refusing to start ([storage] on-corruption = \"skip\" recovers what the log still has and resyncs the rest from the peers)"));
            }
            tracing::error!(target: "chronos::storage", "{why}: skipped (on-corruption = \"skip\")");
            out.live.clear();
            out.deliveries.clear();
            out.corrupt += 1;
            Ok(1)
        }
    }
}

/// A snapshot's entries into `live`; `Err(offset)` of the first bad record.
pub fn read_snapshot(
    buf: &[u8],
    file: u32,
    live: &mut HashMap<u64, (u32, u64)>,
    deliveries: &mut HashMap<(u64, u32), (u32, u64)>,
) -> Result<u64, usize> {
    let mut at = 0;
    let mut prev = 0u32;
    let mut count = 0u64;
    loop {
        let h = record::check(buf, at)
            .filter(|h| h.prev == prev)
            .ok_or(at)?;
        match h.kind {
            record::SNAP_BEGIN if at == 0 => {}
            record::PUT if at > 0 => {
                let p = record::payload(buf, at, &h);
                let image = record::image(p).ok_or(at)?;
                live.insert(image.head.id.unique, (file, at as u64));
                count += 1;
            }
            record::DELIVERY if at > 0 => {
                let p = record::payload(buf, at, &h);
                let (state, _, image) = record::delivery_of(p).ok_or(at)?;
                deliveries.insert((image.head.id.unique, state.sequence), (file, at as u64));
            }
            record::SNAP_END if at > 0 => {
                let p = record::payload(buf, at, &h);
                let want = p
                    .get(..8)
                    .map(|b| u64::from_le_bytes(b.try_into().expect("8")));
                return if want == Some(count) {
                    Ok(count)
                } else {
                    Err(at)
                };
            }
            _ => return Err(at),
        }
        prev = h.crc;
        at += h.len;
    }
}

/// How one batch read ended.
enum Batch {
    /// Whole, ending at this offset; `true`: a SEAL batch (the segment ends).
    Whole(usize, bool),
    /// Not whole: bad or missing record at this offset.
    Bad,
}

/// Replay one segment; returns where its valid part ends.
fn replay_segment(
    r: &mut Replay<'_>,
    path: &Path,
    buf: &[u8],
    file: u32,
    is_last: bool,
) -> Result<u64, String> {
    let mut at = 0usize;
    r.sealed = false;
    loop {
        match read_batch(r, buf, at, file) {
            Batch::Whole(end, sealed) => {
                at = end;
                if sealed {
                    r.sealed = true;
                    return Ok(at as u64);
                }
            }
            Batch::Bad => {
                let zeros = buf[at..].iter().all(|b| *b == 0);
                let later = later_batch(buf, at, r.last_lsn);
                // Two writes in flight (`sync = "batch"`): the later may
                // have landed whole or torn after a torn one (`tail.rs`).
                let pair = later.is_some_and(|next| super::tail::torn_pair(buf, next, r.last_lsn));
                if is_last && (later.is_none() || pair) {
                    if !zeros {
                        tracing::warn!(target: "chronos::storage", "{}: torn tail at offset {at} ({} bytes after the last whole write batch) cut", path.display(), buf.len() - at);
                        r.out.torn_tails += 1;
                        zero_tail(path, at as u64, buf.len() as u64)?;
                    }
                    return Ok(at as u64);
                }
                let why = if zeros || later.is_none() {
                    "the segment ends without its seal, before a later segment".to_string()
                } else {
                    "a bad record with valid write batches after it".to_string()
                };
                corruption(r, path, at, &why)?;
                match later {
                    Some(next) => at = next,
                    None => return Ok(at as u64),
                }
            }
        }
    }
}

/// Refuse (with `stop`) or log and count (with `skip`) a bad record.
fn corruption(r: &mut Replay<'_>, path: &Path, at: usize, why: &str) -> Result<(), String> {
    let what = format!(
        "{}: corrupt log record at offset {at}: {why}",
        path.display()
    );
    if r.on_corruption == OnCorruption::Stop {
        return Err(format!("{what}; refusing to start ([storage] on-corruption = \"skip\" recovers the rest and resyncs from the peers)"));
    }
    tracing::error!(target: "chronos::storage", "{what}: skipped (on-corruption = \"skip\"); the node resyncs from its peers");
    r.out.corrupt += 1;
    r.chain = None;
    Ok(())
}

/// The offset of a later write batch after a bad one at `at`: a valid
/// first record of a batch (at a block boundary) numbered after every
/// record read so far.
fn later_batch(buf: &[u8], at: usize, last_lsn: u64) -> Option<usize> {
    let mut block = at.next_multiple_of(BLOCK_BYTES);
    if block == at {
        block += BLOCK_BYTES;
    }
    while block + record::HEADER_BYTES <= buf.len() {
        if let Some(h) = record::check(buf, block) {
            if h.batch_lsn > last_lsn && h.lsn == h.batch_lsn && is_data(h.kind) {
                return Some(block);
            }
        }
        block += BLOCK_BYTES;
    }
    None
}

fn is_data(kind: u8) -> bool {
    kind == record::PUT || kind == record::REMOVE || kind == record::DELIVERY
}

/// Read the batch at `at`: apply it if whole.
fn read_batch(r: &mut Replay<'_>, buf: &[u8], start: usize, file: u32) -> Batch {
    let mut at = start;
    let mut chain = r.chain;
    let mut lsn = r.last_lsn;
    let mut sealed = false;
    let mut records: Vec<(usize, Header)> = Vec::new();
    loop {
        let Some(h) = record::check(buf, at) else {
            return Batch::Bad;
        };
        if chain.is_some_and(|c| c != h.prev) {
            return Batch::Bad;
        }
        match h.kind {
            record::PUT | record::REMOVE | record::DELIVERY if h.lsn > lsn => lsn = h.lsn,
            record::SEAL => sealed = true,
            record::COMMIT => {}
            _ => return Batch::Bad,
        }
        chain = Some(h.crc);
        at += h.len;
        if h.kind == record::COMMIT {
            break;
        }
        records.push((at - h.len, h));
    }
    if !at.is_multiple_of(BLOCK_BYTES) {
        return Batch::Bad;
    }
    for (pos, h) in &records {
        apply(r, buf, file, *pos, h);
    }
    r.chain = chain;
    r.last_lsn = lsn;
    r.out.last_crc = chain.unwrap_or(0);
    r.out.next_lsn = lsn + 1;
    Batch::Whole(at, sealed)
}

fn apply(r: &mut Replay<'_>, buf: &[u8], file: u32, at: usize, h: &Header) {
    if h.lsn < r.covers_lsn {
        return;
    }
    let p = record::payload(buf, at, h);
    match h.kind {
        record::PUT => {
            if let Some(image) = record::image(p) {
                r.out.live.insert(image.head.id.unique, (file, at as u64));
            }
        }
        record::REMOVE => {
            if let Some(unique) = record::removed(p) {
                r.out.live.remove(&unique);
            }
        }
        record::DELIVERY => {
            if let Some((state, _, image)) = record::delivery_of(p) {
                let key = (image.head.id.unique, state.sequence);
                match state.done {
                    true => r.out.deliveries.remove(&key),
                    false => r.out.deliveries.insert(key, (file, at as u64)),
                };
            }
        }
        _ => return,
    }
    r.out.replayed += 1;
}

/// Zero a torn tail on disk, so the next start does not find it again.
fn zero_tail(path: &Path, from: u64, to: u64) -> Result<(), String> {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    f.seek(SeekFrom::Start(from))
        .map_err(|e| format!("seek {}: {e}", path.display()))?;
    let zeros = vec![0u8; 1 << 20];
    let mut left = to - from;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        f.write_all(&zeros[..n])
            .map_err(|e| format!("zero the tail of {}: {e}", path.display()))?;
        left -= n as u64;
    }
    f.sync_data()
        .map_err(|e| format!("sync {}: {e}", path.display()))
}
