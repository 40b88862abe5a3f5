//! A shard's write-ahead log: appends in memory, group commit on disk.
//!
//! The shard appends a record for every change it makes ([`Log::put`],
//! [`Log::remove`]) without waiting; one flusher task per shard writes
//! what has gathered as one batch at a fresh block boundary of the
//! current segment (`DmaFile`, O_DIRECT, its own aligned buffer, so a
//! durable block is never rewritten). Requests wait for [`Log::durable`]
//! of their change:
//! - `sync = "batch"`: until its batch is written and `fdatasync`ed. Up
//!   to [`IN_FLIGHT_MAX`] batches are on their way at once, each its own
//!   write then sync, so the next batch is written while the sync before
//!   it is still running; a batch counts as durable only once every batch
//!   before it is too (a crash may leave the older of two torn and the
//!   newer whole: recovery cuts both, `tail.rs`);
//! - `"none"`: until its batch is written (it has left the process, so a
//!   crash of the process alone loses nothing answered), the `fdatasync`
//!   following within `group-commit-us`.
//!
//! Segments are filled with zeros when created rather than `fallocate`d:
//! a write into unwritten extents makes each sync write the inode's
//! extent changes as well, a write over zeros is data alone. The next
//! segment is made while the current one fills (`spare.rs`), so a
//! rotation is a rename rather than a segment's worth of writes.
//!
//! Bounds: `pending-bytes-max` of records not yet written (beyond it
//! [`Log::has_room`] is false: clients get 503, pops wait); waiters are
//! requests in flight (bounded by the connection bounds).

use super::config::{StorageConfig, SyncMode};
use super::record::{self, Image, BLOCK_BYTES};
use super::segment_name;
use super::spare::{self, Spare};
use crate::runtime::notify::Notify;
use crate::stats::ShardStats;
use glommio::io::{DmaFile, OpenOptions};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Where the log continues after recovery.
#[derive(Clone, Debug)]
pub struct Resume {
    /// The next record's LSN.
    pub next_lsn: u64,
    /// The last record's crc (the chain continues from it).
    pub last_crc: u32,
    /// The last segment and where its written part ends (a block
    /// boundary), or `None`: start a new segment.
    pub segment: Option<(PathBuf, u64)>,
    /// Log bytes since the snapshot recovery started from.
    pub since_snapshot_bytes: u64,
}

/// The flusher's file: the current segment.
struct Segment {
    /// Shared with the writes in flight.
    file: Rc<DmaFile>,
    /// Its path (named in errors).
    path: Rc<std::path::Path>,
    /// Where the next batch goes (a block boundary).
    offset: u64,
}

pub struct Log {
    dir: PathBuf,
    cfg: StorageConfig,
    /// Records appended and not yet taken by the flusher.
    pending: RefCell<Vec<u8>>,
    next_lsn: Cell<u64>,
    /// Every record up to this LSN is on disk.
    durable_lsn: Cell<u64>,
    /// Every record up to this LSN is written (synced or not).
    written_lsn: Cell<u64>,
    last_crc: Cell<u32>,
    /// The first I/O error: the log stops, writes get 503.
    failed: RefCell<Option<String>>,
    closed: Cell<bool>,
    wake: Notify,
    waiters: RefCell<Vec<Waker>>,
    /// Bytes free on the log's file system, as last read, and whether
    /// that is below `free-bytes-min` ([`Log::set_free_bytes`]).
    free_bytes: Cell<u64>,
    space_low: Cell<bool>,
    /// Log bytes since the last snapshot, and that snapshot's size.
    since_snapshot_bytes: Cell<u64>,
    snapshot_bytes: Cell<u64>,
    /// Wakes the compaction task when the log has outgrown its snapshot.
    pub compact: Notify,
    /// The next segment, being made ready (`spare.rs`); `None` before the
    /// flusher starts and after it ends.
    spare: RefCell<Option<Spare>>,
    stats: Arc<[ShardStats]>,
    shard: usize,
}

impl Log {
    pub fn new(
        dir: PathBuf,
        cfg: &StorageConfig,
        resume: &Resume,
        stats: Arc<[ShardStats]>,
        shard: usize,
    ) -> Rc<Log> {
        assert!(resume.next_lsn >= 1, "LSNs start at 1");
        Rc::new(Log {
            dir,
            cfg: cfg.clone(),
            pending: RefCell::new(Vec::with_capacity(cfg.group_commit_bytes)),
            next_lsn: Cell::new(resume.next_lsn),
            durable_lsn: Cell::new(resume.next_lsn - 1),
            written_lsn: Cell::new(resume.next_lsn - 1),
            last_crc: Cell::new(resume.last_crc),
            failed: RefCell::new(None),
            closed: Cell::new(false),
            free_bytes: Cell::new(u64::MAX),
            space_low: Cell::new(false),
            wake: Notify::default(),
            waiters: RefCell::new(Vec::new()),
            since_snapshot_bytes: Cell::new(resume.since_snapshot_bytes),
            snapshot_bytes: Cell::new(0),
            compact: Notify::default(),
            spare: RefCell::new(None),
            stats,
            shard,
        })
    }

    fn my_stats(&self) -> &ShardStats {
        &self.stats[self.shard]
    }

    /// Start making the next segment ready (a rotation takes it).
    fn start_spare(&self) {
        let spare = Spare::start(&self.dir, self.cfg.segment_bytes);
        *self.spare.borrow_mut() = Some(spare);
    }

    fn next(&self) -> u64 {
        let lsn = self.next_lsn.get();
        self.next_lsn.set(lsn + 1);
        lsn
    }

    /// Append a PUT of one incarnation; returns its LSN, or why the log
    /// takes nothing more (it failed or closed): then no wait for
    /// durability succeeds either ([`Log::durable`]), so nothing made
    /// since is acknowledged.
    pub fn put<'t>(
        &self,
        image: &Image<'_>,
        tags: impl Iterator<Item = (&'t str, u32)>,
    ) -> Result<u64, String> {
        self.stopped()?;
        let lsn = self.next();
        record::put(&mut self.pending.borrow_mut(), lsn, image, tags);
        self.appended();
        Ok(lsn)
    }

    /// Append a DELIVERY (one pop's attempts, `record::delivery`); returns
    /// its LSN, or why not (as `put`).
    pub fn delivery<'t>(
        &self,
        state: &crate::timer::spec::AttemptState,
        owned: bool,
        image: &Image<'_>,
        tags: impl Iterator<Item = (&'t str, u32)>,
    ) -> Result<u64, String> {
        self.stopped()?;
        let lsn = self.next();
        let mut pending = self.pending.borrow_mut();
        record::delivery(&mut pending, lsn, state, owned, image, tags);
        drop(pending);
        self.appended();
        Ok(lsn)
    }

    /// Append a REMOVE; returns its LSN, or why not (as `put`).
    pub fn remove(&self, unique: u64) -> Result<u64, String> {
        self.stopped()?;
        let lsn = self.next();
        record::remove(&mut self.pending.borrow_mut(), lsn, unique);
        self.appended();
        Ok(lsn)
    }

    /// Whether [`Log::close`] was called (changes are no longer logged).
    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// `Err` once failed or closed: nothing would write an append.
    fn stopped(&self) -> Result<(), String> {
        if let Some(why) = self.failed.borrow().as_ref() {
            return Err(format!("the timer log failed: {why}"));
        }
        match self.closed.get() {
            true => Err("the timer log is closed (shutting down)".into()),
            false => Ok(()),
        }
    }

    /// Whether the disk is behind: more than `pending-bytes-max` waits to
    /// be written (the pop loop waits; client writes get 503).
    pub fn is_behind(&self) -> bool {
        self.pending.borrow().len() >= self.cfg.pending_bytes_max
    }

    fn appended(&self) {
        ShardStats::add(&self.my_stats().storage_records, 1);
        self.wake.notify();
    }

    /// The last LSN appended.
    pub fn last_lsn(&self) -> u64 {
        self.next_lsn.get() - 1
    }

    /// Whether more changes may be appended now (the disk keeps up).
    pub fn has_room(&self) -> bool {
        !self.is_behind() && self.failed.borrow().is_none()
    }

    /// The free bytes of the log's file system, read now: below
    /// `free-bytes-min`, creates and updates are refused
    /// ([`Log::space_low`]). Logs each crossing.
    pub fn set_free_bytes(&self, free: u64) {
        self.free_bytes.set(free);
        let stats = self.my_stats();
        let free_i64 = free.min(i64::MAX as u64) as i64;
        stats
            .storage_free_bytes
            .store(free_i64, std::sync::atomic::Ordering::Relaxed);
        stats
            .storage_free_read
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let low = free < self.cfg.free_bytes_min;
        if low == self.space_low.replace(low) {
            return;
        }
        let (dir, min) = (self.dir.display(), self.cfg.free_bytes_min);
        match low {
            true => {
                tracing::error!(target: "chronos::storage", "shard {}: {free} bytes free under {dir}, below free-bytes-min = {min}: client creates and updates get 503 until space comes back; deletes, pops and compaction go on", self.shard)
            }
            false => {
                tracing::info!(target: "chronos::storage", "shard {}: {free} bytes free under {dir} again: creates and updates are taken", self.shard)
            }
        }
    }

    /// `Some(free bytes)` while the file system is below `free-bytes-min`.
    pub fn space_low(&self) -> Option<u64> {
        self.space_low.get().then(|| self.free_bytes.get())
    }

    /// The reserve, `free-bytes-min`.
    pub fn free_bytes_min(&self) -> u64 {
        self.cfg.free_bytes_min
    }

    /// The log's directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Why the log stopped, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failed.borrow().clone()
    }

    /// Wait until `lsn` is on disk (at once with `sync = "none"`).
    pub fn durable(&self, lsn: u64) -> Durable<'_> {
        Durable { log: self, lsn }
    }

    /// Log bytes since the last snapshot (what compaction weighs).
    pub fn since_snapshot_bytes(&self) -> u64 {
        self.since_snapshot_bytes.get()
    }

    /// Whether the log has outgrown both `compact-log-bytes` and the last
    /// snapshot.
    pub fn wants_snapshot(&self) -> bool {
        let since = self.since_snapshot_bytes.get();
        since > self.cfg.compact_log_bytes && since > self.snapshot_bytes.get()
    }

    /// A snapshot covering every LSN before `covers_lsn` is in place: the
    /// log since it is what was written after that LSN was handed out.
    pub fn snapshot_taken(&self, snapshot_bytes: u64, since_bytes: u64) {
        self.snapshot_bytes.set(snapshot_bytes);
        self.since_snapshot_bytes.set(since_bytes);
        self.my_stats()
            .storage_log_bytes
            .store(since_bytes as i64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Stop taking changes; the flusher writes what is pending and ends.
    pub fn close(&self) {
        self.closed.set(true);
        self.wake.notify();
    }

    fn wake_waiters(&self) {
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Stop for good (fail-stop, issue 38): every wait for durability
    /// fails from now on, and the node-wide flag tells the shards to pop
    /// and acknowledge nothing more and the node to stop.
    fn fail(&self, why: String) {
        tracing::error!(target: "chronos::storage", "shard {}: the timer log failed: {why}; this node pops and acknowledges nothing more, and stops", self.shard);
        let stats = self.my_stats();
        if let Ok(mut failure) = stats.storage_failure.lock() {
            *failure = why.clone();
        }
        stats
            .storage_failed
            .store(true, std::sync::atomic::Ordering::Release);
        *self.failed.borrow_mut() = Some(why);
        self.wake_waiters();
    }
}

/// [`Log::durable`]'s future: `Err` when the log failed or closed first;
/// with `sync = "none"` it waits for the write, not the sync.
pub struct Durable<'a> {
    log: &'a Log,
    lsn: u64,
}

impl Future for Durable<'_> {
    type Output = Result<(), String>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let log = self.log;
        // Failure first: once the log failed, what it dropped may carry an
        // LSN at or below the durable one (issue 38: 16 of 26 forwarded
        // deletes were acknowledged unlogged).
        if let Some(why) = log.failed.borrow().as_ref() {
            return Poll::Ready(Err(why.clone()));
        }
        let reached = match log.cfg.sync {
            SyncMode::Batch => log.durable_lsn.get(),
            SyncMode::None => log.written_lsn.get(),
        };
        if reached >= self.lsn {
            return Poll::Ready(Ok(()));
        }
        log.waiters.borrow_mut().push(cx.waker().clone());
        Poll::Pending
    }
}

/// The flusher: one per shard, until [`Log::close`]; writes what is left
/// before it ends.
pub async fn flusher(log: Rc<Log>, resume: Resume) {
    let segment = match open_segment(&log, &resume).await {
        Ok(s) => s,
        Err(e) => return log.fail(e),
    };
    log.start_spare();
    match log.cfg.sync {
        SyncMode::Batch => flush_overlapped(log.clone(), segment).await,
        SyncMode::None => flush_unsynced(log.clone(), segment).await,
    }
    // A spare still being made is dropped, which cancels it (recovery
    // removes what it left).
    log.spare.borrow_mut().take();
}

/// Write batches in flight at once with `sync = "batch"`. Two: the next
/// batch is written while the `fdatasync` of the one before runs, and
/// recovery has one case more to tell from corruption (the older torn,
/// the newer whole: `tail.rs`); more would widen that to every batch
/// still in flight.
pub const IN_FLIGHT_MAX: usize = 2;

/// A batch on its way to disk, not yet counted durable.
struct InFlight {
    /// Its first and last LSNs.
    first_lsn: u64,
    last_lsn: u64,
    /// Its write task's progress.
    state: Rc<Progress>,
}

/// How far a batch's write task has come: set by the task, read by the
/// flusher (each change wakes it).
#[derive(Default)]
struct Progress {
    /// The write has ended (its `fdatasync` may be running).
    written: Cell<bool>,
    /// The sync has ended too, or either failed.
    done: RefCell<Option<Result<(), String>>>,
}

/// `sync = "batch"`: batches written and synced, up to [`IN_FLIGHT_MAX`]
/// at once, counted durable in order.
async fn flush_overlapped(log: Rc<Log>, mut segment: Segment) {
    let mut flight: VecDeque<InFlight> = VecDeque::with_capacity(IN_FLIGHT_MAX);
    let mut batch: Vec<u8> = Vec::with_capacity(log.cfg.group_commit_bytes);
    loop {
        if let Err(e) = retire(&log, &mut flight) {
            return log.fail(e);
        }
        let idle = log.pending.borrow().is_empty();
        // The next batch goes once the one before has been written: while
        // that write runs, more changes join the next batch.
        let room =
            flight.len() < IN_FLIGHT_MAX && flight.back().is_none_or(|b| b.state.written.get());
        if !idle && room {
            gather(&log).await;
            if let Err(e) = launch(&log, &mut segment, &mut flight, &mut batch).await {
                return log.fail(e);
            }
            continue;
        }
        if idle && flight.is_empty() && log.closed.get() {
            break;
        }
        // An append or a write's end wakes the flusher.
        log.wake.wait().await;
    }
    log.wake_waiters();
}

/// Count the written batches at the front of `flight` durable, in order.
fn retire(log: &Log, flight: &mut VecDeque<InFlight>) -> Result<(), String> {
    let mut moved = false;
    while let Some(front) = flight.front() {
        let Some(result) = front.state.done.borrow_mut().take() else {
            break;
        };
        result?;
        log.written_lsn.set(front.last_lsn);
        log.durable_lsn.set(front.last_lsn);
        flight.pop_front();
        moved = true;
    }
    if moved {
        log.wake_waiters();
        if log.wants_snapshot() {
            log.compact.notify();
        }
    }
    Ok(())
}

/// Wait until every batch in flight is durable (before a segment ends).
async fn drain(log: &Log, flight: &mut VecDeque<InFlight>) -> Result<(), String> {
    loop {
        retire(log, flight)?;
        if flight.is_empty() {
            return Ok(());
        }
        log.wake.wait().await;
    }
}

/// Take what is pending as one batch and start its write: its COMMIT
/// names the first LSN of the batch still in flight, if one is (what
/// recovery needs to tell a torn pair from corruption), else 0.
async fn launch(
    log: &Rc<Log>,
    segment: &mut Segment,
    flight: &mut VecDeque<InFlight>,
    batch: &mut Vec<u8>,
) -> Result<(), String> {
    std::mem::swap(&mut *log.pending.borrow_mut(), batch);
    let last_lsn = log.last_lsn();
    let first_lsn = record::first_lsn(batch);
    if segment.offset > 0 && segment.offset + sealed_len(batch) > segment_room(log) {
        drain(log, flight).await?;
        *segment = rotate(log, segment, first_lsn).await?;
    }
    let overlaps = flight.back().map_or(0, |b| b.first_lsn);
    record::commit(batch, 0, overlaps);
    let crc = record::stamp(batch, log.last_crc.get(), first_lsn);
    let mut buf = segment.file.alloc_dma_buffer(batch.len());
    buf.as_bytes_mut().copy_from_slice(batch);
    log.last_crc.set(crc);
    count_written(log, batch.len() as u64);
    let state = Rc::new(Progress::default());
    let write = segment_write(segment, buf, log.clone(), state.clone());
    crate::runtime::spawn::spawn_local(write).detach();
    segment.offset += batch.len() as u64;
    batch.clear();
    flight.push_back(InFlight {
        first_lsn,
        last_lsn,
        state,
    });
    Ok(())
}

/// A batch's size once its COMMIT pads it to a block.
fn sealed_len(batch: &[u8]) -> u64 {
    (batch.len() + record::HEADER_BYTES).next_multiple_of(BLOCK_BYTES) as u64
}

/// Where a segment's last data batch must end: a block is kept for its SEAL.
fn segment_room(log: &Log) -> u64 {
    log.cfg.segment_bytes.saturating_sub(BLOCK_BYTES as u64)
}

/// The write of one batch at the segment's offset, then an `fdatasync`
/// (it covers every write to the segment that ended before it): when it
/// ends the batch is on disk (or the error says why not). It tells
/// `state` when the write and when the sync has ended, and wakes the
/// flusher each time.
fn segment_write(
    segment: &Segment,
    buf: glommio::io::DmaBuffer,
    log: Rc<Log>,
    state: Rc<Progress>,
) -> impl Future<Output = ()> + 'static {
    let (file, path, at) = (segment.file.clone(), segment.path.clone(), segment.offset);
    async move {
        let len = buf.len();
        let wrote = match file.write_at(buf, at).await {
            Ok(n) if n == len => Ok(()),
            Ok(n) => Err(format!(
                "short write {} at offset {at}: {n} of {len} bytes",
                path.display()
            )),
            Err(e) => Err(format!("write {} at offset {at}: {e}", path.display())),
        };
        let stats = log.my_stats();
        let started = Instant::now();
        let result = match wrote {
            Ok(()) => {
                ShardStats::add(&stats.storage_bytes, len as u64);
                state.written.set(true);
                log.wake.notify();
                (file.fdatasync().await).map_err(|e| format!("fdatasync {}: {e}", path.display()))
            }
            Err(e) => Err(e),
        };
        if result.is_ok() {
            stats.record_storage_sync(started.elapsed());
            ShardStats::add(&stats.storage_syncs, 1);
        }
        *state.done.borrow_mut() = Some(result);
        log.wake.notify();
    }
}

/// The log's size since the snapshot grew by a written batch.
fn count_written(log: &Log, bytes: u64) {
    log.since_snapshot_bytes
        .set(log.since_snapshot_bytes.get() + bytes);
    log.my_stats().storage_log_bytes.store(
        log.since_snapshot_bytes.get() as i64,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// `sync = "none"`: one write at a time, each answered once written;
/// `fdatasync` once `group-commit-us` has passed since the oldest write
/// not yet synced.
async fn flush_unsynced(log: Rc<Log>, mut segment: Segment) {
    let mut batch: Vec<u8> = Vec::with_capacity(log.cfg.group_commit_bytes);
    // When the oldest write not yet synced was made.
    let mut unsynced_since: Option<Instant> = None;
    loop {
        if log.pending.borrow().is_empty() {
            if let Some(since) = unsynced_since {
                if let Err(e) = sync_when_due(&log, &mut segment, since).await {
                    return log.fail(e);
                }
                if log.durable_lsn.get() == log.written_lsn.get() {
                    unsynced_since = None;
                }
                continue;
            }
            if log.closed.get() {
                break;
            }
            log.wake.wait().await;
            continue;
        }
        gather(&log).await;
        std::mem::swap(&mut *log.pending.borrow_mut(), &mut batch);
        let last = log.last_lsn();
        let window = Duration::from_micros(log.cfg.group_commit_us);
        let sync = unsynced_since.is_some_and(|since| since.elapsed() >= window);
        let wrote = write_batch(&log, &mut segment, &mut batch, sync).await;
        batch.clear();
        if let Err(e) = wrote {
            return log.fail(e);
        }
        log.written_lsn.set(last);
        match sync {
            true => {
                log.durable_lsn.set(last);
                unsynced_since = None;
            }
            false => {
                unsynced_since.get_or_insert_with(Instant::now);
            }
        }
        log.wake_waiters();
        if log.wants_snapshot() {
            log.compact.notify();
        }
    }
    log.wake_waiters();
}

/// `sync = "none"`, nothing pending: `fdatasync` what was written once
/// `group-commit-us` has passed since the oldest unsynced write (at once
/// when closing), or return early when more changes arrive.
async fn sync_when_due(log: &Log, segment: &mut Segment, since: Instant) -> Result<(), String> {
    let window = Duration::from_micros(log.cfg.group_commit_us);
    let left = window.saturating_sub(since.elapsed());
    if !left.is_zero() && !log.closed.get() {
        let more = log.wake.wait();
        futures_lite::future::or(more, glommio::timer::sleep(left)).await;
        if !log.pending.borrow().is_empty() || since.elapsed() < window {
            return Ok(());
        }
    }
    let written = log.written_lsn.get();
    sync_segment(log, segment).await?;
    log.durable_lsn.set(written);
    log.wake_waiters();
    Ok(())
}

/// Let more changes join the batch while each turn of the executor adds
/// some, up to `group-commit-us` and `group-commit-bytes`. Either mode
/// answers only once its change is written, so a batch never waits for
/// the whole window.
async fn gather(log: &Log) {
    let window = Duration::from_micros(log.cfg.group_commit_us);
    let started = Instant::now();
    loop {
        let before = log.pending.borrow().len();
        futures_lite::future::yield_now().await;
        let now = log.pending.borrow().len();
        if now == before || now >= log.cfg.group_commit_bytes || started.elapsed() >= window {
            return;
        }
    }
}

/// `sync = "none"`: write one batch (ended by its COMMIT), and sync it
/// if `sync`; rotate to a new segment first when it would not fit.
async fn write_batch(
    log: &Log,
    segment: &mut Segment,
    batch: &mut Vec<u8>,
    sync: bool,
) -> Result<(), String> {
    let first_lsn = record::first_lsn(batch);
    record::commit(batch, 0, 0);
    if segment.offset > 0 && segment.offset + batch.len() as u64 > segment_room(log) {
        *segment = rotate(log, segment, first_lsn).await?;
    }
    let crc = record::stamp(batch, log.last_crc.get(), first_lsn);
    write_at(log, segment, batch).await?;
    if sync {
        sync_segment(log, segment).await?;
    }
    log.last_crc.set(crc);
    count_written(log, batch.len() as u64);
    Ok(())
}

/// Write `bytes` (whole blocks) at the segment's offset.
async fn write_at(log: &Log, segment: &mut Segment, bytes: &[u8]) -> Result<(), String> {
    assert!(
        bytes.len().is_multiple_of(BLOCK_BYTES),
        "batches are padded to whole blocks by their COMMIT or SEAL"
    );
    let mut buf = segment.file.alloc_dma_buffer(bytes.len());
    buf.as_bytes_mut().copy_from_slice(bytes);
    let wrote = segment
        .file
        .write_at(buf, segment.offset)
        .await
        .map_err(|e| {
            format!(
                "write {} at offset {}: {e}",
                segment.path.display(),
                segment.offset
            )
        })?;
    if wrote != bytes.len() {
        return Err(format!(
            "short write {} at offset {}: {wrote} of {} bytes",
            segment.path.display(),
            segment.offset,
            bytes.len()
        ));
    }
    ShardStats::add(&log.my_stats().storage_bytes, bytes.len() as u64);
    segment.offset += bytes.len() as u64;
    Ok(())
}

/// `fdatasync` the segment (everything written to it so far).
async fn sync_segment(log: &Log, segment: &mut Segment) -> Result<(), String> {
    let started = Instant::now();
    segment
        .file
        .fdatasync()
        .await
        .map_err(|e| format!("fdatasync {}: {e}", segment.path.display()))?;
    let stats = log.my_stats();
    stats.record_storage_sync(started.elapsed());
    ShardStats::add(&stats.storage_syncs, 1);
    Ok(())
}

/// Seal the current segment (a SEAL batch: it ends there) and start the
/// next one, named by `first_lsn`, the next batch's first LSN. SEAL and
/// COMMIT records carry LSN 0: only PUT and REMOVE are numbered (a
/// COMMIT's LSN field names the batch it overlapped, `launch`).
async fn rotate(log: &Log, old: &mut Segment, first_lsn: u64) -> Result<Segment, String> {
    let mut seal = Vec::with_capacity(BLOCK_BYTES);
    let at = record::begin(&mut seal, record::SEAL, 0);
    record::finish(&mut seal, at);
    record::commit(&mut seal, 0, 0);
    let crc = record::stamp(&mut seal, log.last_crc.get(), first_lsn);
    write_at(log, old, &seal).await?;
    sync_segment(log, old).await?;
    log.last_crc.set(crc);
    let made = log.spare.borrow_mut().take();
    let segment = create_segment(log, log.dir.join(segment_name(first_lsn)), made).await?;
    log.start_spare();
    Ok(segment)
}

/// A new segment at `path`: the spare made ahead renamed there, or (a
/// log's first segment) one filled and synced in place; the directory
/// synced, then opened for the log.
async fn create_segment(log: &Log, path: PathBuf, made: Option<Spare>) -> Result<Segment, String> {
    match made {
        Some(made) => made.into_place(&path).await?,
        None => {
            spare::refuse_existing(&path)?;
            spare::zero_filled(&path, log.cfg.segment_bytes).await?;
        }
    }
    super::sync_dir(&log.dir).await?;
    open_for_log(&path, 0).await
}

/// Open a segment for the log's writes from `offset`.
async fn open_for_log(path: &std::path::Path, offset: u64) -> Result<Segment, String> {
    let file = OpenOptions::new()
        .write(true)
        .read(true)
        .dma_open(path)
        .await
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    Ok(Segment {
        file: Rc::new(file),
        path: path.into(),
        offset,
    })
}

async fn open_segment(log: &Log, resume: &Resume) -> Result<Segment, String> {
    match &resume.segment {
        Some((path, offset)) => {
            assert!(
                offset.is_multiple_of(BLOCK_BYTES as u64),
                "recovery ends the written part of a segment after a whole batch, on a block"
            );
            open_for_log(path, *offset).await
        }
        None => {
            let name = segment_name(log.next_lsn.get());
            create_segment(log, log.dir.join(name), None).await
        }
    }
}
