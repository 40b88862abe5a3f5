//! Durable timers: a write-ahead log per shard, snapshots, recovery.
//!
//! ```text
//! DIR/LOCK                         flock'ed by the running node
//! DIR/CURRENT                      "generation G" and "shards N"
//! DIR/gen-G/shard-i/log-<L>.wal    log segments, named by their first LSN
//! DIR/gen-G/shard-i/snap-<S>.snap  a snapshot of every LSN before S
//! DIR/gen-G/shard-i/log-spare.tmp  the next segment, being made ready
//! ```
//!
//! | file | concern |
//! |---|---|
//! | `config.rs` | `[storage]` |
//! | `crc32c.rs` | the checksum (SSE4.2, or a table) |
//! | `record.rs` | the record format, chained checksums, the PUT codec |
//! | `log.rs` | appends, group commit, durability waits, segments |
//! | `spare.rs` | the next segment, zero-filled ahead of the rotation |
//! | `snapshot.rs` | snapshot encoding and writing, removing what it covers |
//! | `read.rs` | recovery: snapshot + log replay, torn tails, corruption |
//! | `tail.rs` | recovery: the torn pair two overlapped writes may leave |
//!
//! Invariants: a durable block is never written again (each batch starts
//! on a fresh block); a batch is applied at recovery only when whole; the
//! generation named by CURRENT is always complete (re-sharding for a new
//! core count writes the next generation, then switches CURRENT).
//! Absent here: anything about what a timer means (the shard decides what
//! to log; this module only keeps bytes safe).

pub mod config;
pub mod crc32c;
pub mod log;
pub mod read;
pub mod record;
pub mod snapshot;
pub mod spare;
pub mod tail;

pub use config::{OnCorruption, StorageConfig, SyncMode};
pub use log::{Log, Resume};
pub use read::Recovered;

use std::path::{Path, PathBuf};

pub fn segment_name(first_lsn: u64) -> String {
    format!("log-{first_lsn:020}.wal")
}

/// The LSN in a file name `<prefix><20 digits><suffix>`.
pub fn lsn_of(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Sync a directory (after a file in it was created, renamed or removed).
pub async fn sync_dir(dir: &Path) -> Result<(), String> {
    let d = glommio::io::Directory::open(dir)
        .await
        .map_err(|e| format!("open {}: {e}", dir.display()))?;
    d.sync()
        .await
        .map_err(|e| format!("sync {}: {e}", dir.display()))?;
    let _ = d.close().await;
    Ok(())
}

/// Bytes free to this process on the file system of `dir` (`statvfs`).
pub fn free_bytes(dir: &Path) -> Result<u64, String> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    // SAFETY: statvfs reads the NUL-terminated path and fills `stat`,
    // which lives for the call.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    match unsafe { libc::statvfs(path.as_ptr(), &mut stat) } {
        0 => Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64)),
        _ => Err(format!(
            "statvfs {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        )),
    }
}

pub fn sync_dir_blocking(dir: &Path) -> Result<(), String> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("sync {}: {e}", dir.display()))
}

/// Test builds' fault hook: `CHRONOS_TEST_FAULT=<point>` aborts the
/// process at that point, as a crash would.
pub fn fault_point(point: &str) {
    if std::env::var("CHRONOS_TEST_FAULT").is_ok_and(|v| v == point) {
        eprintln!("CHRONOS_TEST_FAULT: aborting at {point}");
        std::process::abort();
    }
}

/// The storage directory as this process uses it: the shard directories
/// of the current generation, and the lock that keeps a second process
/// out while this one lives.
pub struct Layout {
    pub shard_dirs: Vec<PathBuf>,
    /// Bad records skipped (`on-corruption = "skip"`) while re-sharding
    /// the log at this start: the new generation no longer shows them, so
    /// they are counted here, and the node resyncs from its peers as for
    /// any skipped record (issue 38).
    pub resharded_corrupt: u64,
    _lock: std::fs::File,
}

/// Open (or create) the storage directory for `shards` shards; a layout
/// written by another core count is re-sharded first.
pub fn prepare(cfg: &StorageConfig, shards: usize) -> Result<Layout, String> {
    let root = PathBuf::from(cfg.path.as_deref().expect("storage is on"));
    std::fs::create_dir_all(&root)
        .map_err(|e| format!("[storage] path {}: {e}", root.display()))?;
    let lock = lock(&root)?;
    let (generation, old_shards) = match read_current(&root)? {
        Some(current) => current,
        None => {
            make_generation(&root, 1, shards)?;
            write_current(&root, 1, shards)?;
            (1, shards)
        }
    };
    let (generation, resharded_corrupt) = if old_shards == shards {
        (generation, 0)
    } else {
        reshard(&root, cfg, generation, old_shards, shards)?
    };
    let gen_dir = root.join(format!("gen-{generation}"));
    Ok(Layout {
        shard_dirs: (0..shards)
            .map(|i| gen_dir.join(format!("shard-{i}")))
            .collect(),
        resharded_corrupt,
        _lock: lock,
    })
}

/// What `prepare` needs of `[storage] path`, checked without changing
/// anything (`chronos check-config`): a directory this process may write,
/// or one it may create, and a readable `CURRENT` if there is one. The
/// lock is not tried: a running node holds it. `Ok` says what was found.
pub fn check_path(cfg: &StorageConfig) -> Result<String, String> {
    let Some(path) = cfg.path.as_deref() else {
        return Ok("in memory".into());
    };
    let root = PathBuf::from(path);
    let writable = |dir: &Path| {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: access only reads the NUL-terminated path.
        match unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error().to_string()),
        }
    };
    if root.is_dir() {
        writable(&root).map_err(|e| format!("[storage] path {path}: not writable: {e}"))?;
        return Ok(match read_current(&root)? {
            Some((generation, shards)) => {
                format!("{path} (generation {generation}, {shards} shards)")
            }
            None => format!("{path} (empty: created at start)"),
        });
    }
    if root.exists() {
        return Err(format!("[storage] path {path}: not a directory"));
    }
    // A relative path's last ancestor is "": the working directory.
    let parent = root
        .ancestors()
        .skip(1)
        .map(|a| match a.as_os_str().is_empty() {
            true => Path::new("."),
            false => a,
        })
        .find(|a| a.exists());
    match parent {
        Some(p) if p.is_dir() && writable(p).is_ok() => {
            Ok(format!("{path} (created at start, in {})", p.display()))
        }
        Some(p) => Err(format!(
            "[storage] path {path}: cannot be created: {} is not a writable directory",
            p.display()
        )),
        None => Err(format!("[storage] path {path}: cannot be created")),
    }
}

fn lock(root: &Path) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd;
    let path = root.join("LOCK");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(format!(
            "[storage] path {}: another chronos process is using it (LOCK is held)",
            root.display()
        ));
    }
    Ok(f)
}

fn read_current(root: &Path) -> Result<Option<(u64, usize)>, String> {
    let path = root.join("CURRENT");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
    };
    match (field("generation "), field("shards ")) {
        (Some(g), Some(n)) if n >= 1 => Ok(Some((g, n as usize))),
        _ => Err(format!(
            "{}: not a chronos storage CURRENT file (want \"generation G\" and \"shards N\" lines)",
            path.display()
        )),
    }
}

fn write_current(root: &Path, generation: u64, shards: usize) -> Result<(), String> {
    let tmp = root.join("CURRENT.tmp");
    let text = format!("chronos storage\ngeneration {generation}\nshards {shards}\n");
    let err = |e: std::io::Error| format!("{}: {e}", tmp.display());
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(err)?;
    std::fs::rename(&tmp, root.join("CURRENT")).map_err(err)?;
    sync_dir_blocking(root)
}

fn make_generation(root: &Path, generation: u64, shards: usize) -> Result<PathBuf, String> {
    let gen_dir = root.join(format!("gen-{generation}"));
    if gen_dir.exists() {
        // A re-sharding that did not finish: start it over.
        std::fs::remove_dir_all(&gen_dir).map_err(|e| format!("{}: {e}", gen_dir.display()))?;
    }
    for i in 0..shards {
        let d = gen_dir.join(format!("shard-{i}"));
        std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        sync_dir_blocking(&d)?;
    }
    sync_dir_blocking(&gen_dir)?;
    sync_dir_blocking(root)?;
    Ok(gen_dir)
}

/// Hand every timer of a layout of `old` shards to the shard that owns it
/// among `new`: the next generation gets one snapshot per shard, then
/// CURRENT switches to it and the old generation is removed. Returns the
/// new generation and the bad records skipped on the way.
fn reshard(
    root: &Path,
    cfg: &StorageConfig,
    generation: u64,
    old: usize,
    new: usize,
) -> Result<(u64, u64), String> {
    tracing::info!(target: "chronos::storage", "re-sharding the timer log from {old} to {new} shards");
    let old_dir = root.join(format!("gen-{generation}"));
    let mut encoders: Vec<snapshot::Encoder> =
        (0..new).map(|_| snapshot::Encoder::new(1)).collect();
    let mut corrupt = 0;
    for i in 0..old {
        let dir = old_dir.join(format!("shard-{i}"));
        let recovered = read::recover(&dir, cfg.on_corruption)?;
        corrupt += recovered.corrupt;
        for image in recovered.images() {
            let owner = crate::timer::shard_of(image.head.id.unique, new);
            encoders[owner].put(&image, image.tags());
        }
    }
    let next = generation + 1;
    let gen_dir = make_generation(root, next, new)?;
    for (i, enc) in encoders.into_iter().enumerate() {
        let count = enc.count();
        let mut bytes = Vec::new();
        let mut enc = enc;
        while let Some(blocks) = enc.take_blocks() {
            bytes.extend_from_slice(&blocks);
        }
        let (last, _) = enc.finish();
        bytes.extend_from_slice(&last);
        snapshot::write_blocking(&gen_dir.join(format!("shard-{i}")), 1, &bytes)?;
        tracing::info!(target: "chronos::storage", "shard {i}: {count} timers after re-sharding");
    }
    write_current(root, next, new)?;
    let _ = std::fs::remove_dir_all(&old_dir);
    sync_dir_blocking(root)?;
    Ok((next, corrupt))
}
