//! The next segment, made ready before the log needs it.
//!
//! A segment is created, allocated, filled with zeros and synced before
//! the log writes into it (a write over zeros changes no file metadata,
//! `log.rs`). Made at the moment the current segment fills, that is a
//! segment's worth of writes and a sync on the log's own path: every
//! change waiting behind the rotation waited for it too (about 35 ms per
//! 64 MiB segment on the 2-core test machine, a latency spike every
//! 64 MiB of log). So each flusher keeps one segment ready: a task fills
//! [`SPARE_NAME`] while the current segment fills, and a rotation renames
//! it to its first LSN's name and syncs the directory. A spare still
//! being filled is waited for (it is already on its way); one that failed
//! is made again in place, so its error is named where the log stops.
//!
//! Recovery removes every `.tmp` file (`read.rs`), so a spare cut short
//! by a crash is never taken for the log; it is made again at start.
//!
//! Bounds: one spare per shard (a segment's bytes of disk beyond the
//! log, counted by `free-bytes-min`), one task making it, one
//! [`ZERO_CHUNK`] of zeros written at a time.

use super::record::BLOCK_BYTES;
use glommio::io::OpenOptions;
use std::path::{Path, PathBuf};

/// The spare's name in the log's directory (a `.tmp`: recovery removes it).
pub const SPARE_NAME: &str = "log-spare.tmp";

/// Zeros written per request while a segment is filled.
const ZERO_CHUNK: usize = 1 << 20;

/// The spare being made (or made): its task's outcome is its path.
pub struct Spare {
    task: glommio::Task<Result<PathBuf, String>>,
    /// Its size, for a segment made in place when it failed.
    bytes: u64,
}

impl Spare {
    /// Start making the spare of `segment_bytes` in `dir`, in the
    /// background.
    pub fn start(dir: &Path, segment_bytes: u64) -> Spare {
        let path = dir.join(SPARE_NAME);
        let task = crate::runtime::spawn::spawn_local(async move {
            zero_filled(&path, segment_bytes).await.map(|()| path)
        });
        Spare {
            task,
            bytes: segment_bytes,
        }
    }

    /// The spare renamed to `path` (which must not exist yet), or made
    /// there in place if it could not be made ahead. The caller syncs the
    /// directory before it writes into it.
    pub async fn into_place(self, path: &Path) -> Result<(), String> {
        refuse_existing(path)?;
        match self.task.await {
            Ok(spare) => glommio::io::rename(&spare, path)
                .await
                .map_err(|e| format!("rename {} to {}: {e}", spare.display(), path.display())),
            Err(e) => {
                tracing::warn!(target: "chronos::storage", "the spare segment could not be made ahead ({e}); making {} now", path.display());
                zero_filled(path, self.bytes).await
            }
        }
    }
}

/// A segment's name is never reused: one that exists is an error (as
/// `O_EXCL` made it before the spare).
pub fn refuse_existing(path: &Path) -> Result<(), String> {
    match path.exists() {
        true => Err(format!("create {}: it exists already", path.display())),
        false => Ok(()),
    }
}

/// A file of `bytes` at `path` (any file there before is replaced):
/// created, allocated, filled with zeros and synced, so its blocks are
/// written extents and the log's writes into it change no file metadata.
/// One that fails is removed: a half-allocated spare must not keep the
/// file system's last free space from compaction and the other shards
/// (an unlink on the shard's thread, once per failure: rare).
pub async fn zero_filled(path: &Path, bytes: u64) -> Result<(), String> {
    let made = fill(path, bytes).await;
    if made.is_err() {
        let _ = std::fs::remove_file(path);
    }
    made
}

async fn fill(path: &Path, bytes: u64) -> Result<(), String> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .dma_open(path)
        .await
        .map_err(|e| format!("create {}: {e}", path.display()))?;
    // The space first (a full disk fails here, named), then the zeros.
    file.pre_allocate(bytes, false)
        .await
        .map_err(|e| format!("fallocate {}: {e}", path.display()))?;
    let end = bytes.next_multiple_of(BLOCK_BYTES as u64);
    let mut at = 0u64;
    while at < end {
        let len = (end - at).min(ZERO_CHUNK as u64) as usize;
        let mut zeros = file.alloc_dma_buffer(len);
        zeros.as_bytes_mut().fill(0);
        match file.write_at(zeros, at).await {
            Ok(n) if n == len => at += len as u64,
            Ok(n) => {
                return Err(format!(
                    "zero {}: short write at {at}: {n} of {len} bytes",
                    path.display()
                ))
            }
            Err(e) => return Err(format!("zero {} at {at}: {e}", path.display())),
        }
    }
    file.fdatasync()
        .await
        .map_err(|e| format!("fdatasync {}: {e}", path.display()))?;
    let _ = file.close().await;
    Ok(())
}
