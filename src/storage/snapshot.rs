//! Snapshots: every live timer and tombstone of a shard, written in the
//! background so that the log before it can be deleted (compaction).
//!
//! A snapshot `snap-<S>.snap` holds the state of every ID as of some
//! moment at or after LSN `S` was handed out; replay applies the log's
//! records from `S` on over it, and the last record of each ID wins, so a
//! snapshot taken while changes go on is still exact. The file is one
//! chain of records: SNAP_BEGIN, a PUT per timer, SNAP_END with the count.
//!
//! Crash safety: written to `.tmp`, synced, renamed, directory synced;
//! only then are the covered segments and older snapshots removed. A crash
//! at any step leaves the old state or the new one, never neither.

use super::record::{self, Image, BLOCK_BYTES};
use glommio::io::{DmaFile, OpenOptions};
use std::path::{Path, PathBuf};

/// Bytes gathered before a write (whole blocks are written).
pub const CHUNK_BYTES: usize = 1 << 20;

/// A snapshot's bytes as they are encoded.
pub struct Encoder {
    buf: Vec<u8>,
    prev: u32,
    count: u64,
    /// Bytes handed out by `take_blocks`.
    taken: u64,
}

impl Encoder {
    pub fn new(covers_lsn: u64) -> Encoder {
        let mut e = Encoder {
            buf: Vec::with_capacity(CHUNK_BYTES + BLOCK_BYTES),
            prev: 0,
            count: 0,
            taken: 0,
        };
        let at = record::begin(&mut e.buf, record::SNAP_BEGIN, 0);
        e.buf.extend_from_slice(&covers_lsn.to_le_bytes());
        record::finish(&mut e.buf, at);
        e.seal_from(at);
        e
    }

    fn seal_from(&mut self, at: usize) {
        self.prev = record::stamp(&mut self.buf[at..], self.prev, 0);
    }

    pub fn put<'t>(&mut self, image: &Image<'_>, tags: impl Iterator<Item = (&'t str, u32)>) {
        let at = self.buf.len();
        record::put(&mut self.buf, 0, image, tags);
        self.seal_from(at);
        self.count += 1;
    }

    /// A pop's attempts (`record::delivery`); not counted as a timer.
    pub fn delivery<'t>(
        &mut self,
        state: &crate::timer::spec::AttemptState,
        owned: bool,
        image: &Image<'_>,
        tags: impl Iterator<Item = (&'t str, u32)>,
    ) {
        let at = self.buf.len();
        record::delivery(&mut self.buf, 0, state, owned, image, tags);
        self.seal_from(at);
    }

    /// Whole blocks ready to write, once a chunk has gathered.
    pub fn take_blocks(&mut self) -> Option<Vec<u8>> {
        if self.buf.len() < CHUNK_BYTES {
            return None;
        }
        let whole = self.buf.len() / BLOCK_BYTES * BLOCK_BYTES;
        let rest = self.buf.split_off(whole);
        self.taken += whole as u64;
        Some(std::mem::replace(&mut self.buf, rest))
    }

    /// The last bytes: SNAP_END and zero padding to a block.
    pub fn finish(mut self) -> (Vec<u8>, u64) {
        let at = record::begin(&mut self.buf, record::SNAP_END, 0);
        self.buf.extend_from_slice(&self.count.to_le_bytes());
        record::finish(&mut self.buf, at);
        self.seal_from(at);
        let padded = self.buf.len().next_multiple_of(BLOCK_BYTES);
        self.buf.resize(padded, 0);
        let total = self.taken + self.buf.len() as u64;
        (self.buf, total)
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

pub fn name(covers_lsn: u64) -> String {
    format!("snap-{covers_lsn:020}.snap")
}

/// A snapshot being written with O_DIRECT (compaction on a live shard).
pub struct Writer {
    file: DmaFile,
    dir: PathBuf,
    tmp: PathBuf,
    covers_lsn: u64,
    offset: u64,
    pub enc: Encoder,
}

impl Writer {
    pub async fn create(dir: &Path, covers_lsn: u64) -> Result<Writer, String> {
        let tmp = dir.join(format!("{}.tmp", name(covers_lsn)));
        let _ = std::fs::remove_file(&tmp);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .dma_open(&tmp)
            .await
            .map_err(|e| format!("create {}: {e}", tmp.display()))?;
        Ok(Writer {
            file,
            dir: dir.to_path_buf(),
            tmp,
            covers_lsn,
            offset: 0,
            enc: Encoder::new(covers_lsn),
        })
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        if bytes.is_empty() {
            return Ok(());
        }
        let mut buf = self.file.alloc_dma_buffer(bytes.len());
        buf.as_bytes_mut().copy_from_slice(bytes);
        let n = self
            .file
            .write_at(buf, self.offset)
            .await
            .map_err(|e| format!("write {}: {e}", self.tmp.display()))?;
        if n != bytes.len() {
            return Err(format!("short write to {}", self.tmp.display()));
        }
        self.offset += n as u64;
        Ok(())
    }

    /// Write what has gathered, if a chunk has.
    pub async fn write_some(&mut self) -> Result<(), String> {
        match self.enc.take_blocks() {
            Some(blocks) => self.write(&blocks).await,
            None => Ok(()),
        }
    }

    /// End it, sync it and put it in place; returns its size in bytes.
    pub async fn finish(mut self) -> Result<u64, String> {
        let enc = std::mem::replace(&mut self.enc, Encoder::new(0));
        let (last, total) = enc.finish();
        self.write(&last).await?;
        self.file
            .fdatasync()
            .await
            .map_err(|e| format!("fdatasync {}: {e}", self.tmp.display()))?;
        let path = self.dir.join(name(self.covers_lsn));
        self.file
            .rename(&path)
            .await
            .map_err(|e| format!("rename to {}: {e}", path.display()))?;
        let _ = self.file.close().await;
        super::sync_dir(&self.dir).await?;
        Ok(total)
    }
}

/// Remove what a snapshot covering up to `covers_lsn` makes redundant:
/// older snapshots, and segments whose successor starts at or before it.
/// The unlinks run on a thread of their own: unlinking a 64 MiB segment
/// took 4-11 ms here, which on the shard's thread held up its pops
/// (perf/README, "Durable log").
pub async fn remove_covered(dir: &Path, covers_lsn: u64) -> Result<usize, String> {
    let mut segments = Vec::new();
    let mut doomed = Vec::new();
    let read = std::fs::read_dir(dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
    for entry in read.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(lsn) = super::lsn_of(&name, "snap-", ".snap") {
            if lsn < covers_lsn {
                doomed.push(entry.path());
            }
        } else if let Some(lsn) = super::lsn_of(&name, "log-", ".wal") {
            segments.push((lsn, entry.path()));
        }
    }
    segments.sort();
    for pair in segments.windows(2) {
        if pair[1].0 <= covers_lsn {
            doomed.push(pair[0].1.clone());
        }
    }
    let worker = std::thread::spawn(move || {
        doomed
            .iter()
            .filter(|p| std::fs::remove_file(p).is_ok())
            .count()
    });
    while !worker.is_finished() {
        glommio::timer::sleep(UNLINK_POLL).await;
    }
    let removed = worker.join().unwrap_or(0);
    super::sync_dir(dir).await?;
    Ok(removed)
}

/// How often the shard looks whether the unlink thread has finished.
const UNLINK_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// Write a whole snapshot with plain blocking I/O (re-sharding at start).
pub fn write_blocking(dir: &Path, covers_lsn: u64, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let tmp = dir.join(format!("{}.tmp", name(covers_lsn)));
    let path = dir.join(name(covers_lsn));
    let err = |what: &str, e: std::io::Error| format!("{what} {}: {e}", tmp.display());
    let mut f = std::fs::File::create(&tmp).map_err(|e| err("create", e))?;
    f.write_all(bytes).map_err(|e| err("write", e))?;
    f.sync_all().map_err(|e| err("sync", e))?;
    std::fs::rename(&tmp, &path).map_err(|e| err("rename", e))?;
    super::sync_dir_blocking(dir)
}
