//! The shard's side of `[storage]`: rebuilding the store from what the
//! log recovered, waiting for a change to be durable, and compaction.
//!
//! What the log holds for a timer: its state after every client,
//! replication and resync change; for a pop, the state before it until
//! the pop's callback has ended (then the outcome), so a crash between a
//! pop and its callback pops it again (at least once, never lost).
//! Snapshots write the same view: a timer with pops in flight is written
//! as it was before them.

use super::{OpError, Shard};
use crate::runtime::clock;
use crate::runtime::gate::Gate;
use crate::stats::ShardStats;
use crate::storage::{self, snapshot, Log, Recovered};
use std::cell::{Cell, OnceCell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Timers put back into the wheel per turn at start.
const RECOVER_SLICE: usize = 4096;
/// Store slab indices a snapshot encodes per turn: a slice takes well
/// under a millisecond, so pops are not held up.
const SNAPSHOT_SLICE: usize = 1024;
/// After a failed snapshot, the next try waits this long.
const SNAPSHOT_RETRY: Duration = Duration::from_secs(5);

/// The timer log and its flusher: what `[storage]` adds to a shard. The
/// log's one owner: the store holds no copy, and each logged change takes
/// it from here ([`Durable::log`]).
#[derive(Default)]
pub struct Durable {
    /// The timer log (`[storage]`), set once recovery has opened it.
    pub(super) log: OnceCell<Rc<Log>>,
    /// The log's flusher task (awaited at shutdown: it writes what is left).
    pub(super) flusher: RefCell<Option<glommio::Task<()>>>,
    /// The re-send at start is still queueing what the log held
    /// (`resend::run`): until it has, no tombstone expires, since what a
    /// peer was owed before the restart (a queued delete, a repair mark)
    /// lived in memory only.
    pub(super) resending: Cell<bool>,
}

impl Durable {
    /// The timer log, once recovery has opened it.
    pub fn log(&self) -> Option<&Rc<Log>> {
        self.log.get()
    }
}

impl Shard {
    /// Whether any shard of this node is still replaying its log.
    pub fn recovering(&self) -> bool {
        self.base
            .stats
            .iter()
            .any(|s| s.recovering.load(Ordering::Relaxed))
    }

    /// Whether any shard's log failed (a few atomic loads: the pop loop
    /// asks every turn).
    pub fn storage_failed(&self) -> bool {
        self.base
            .stats
            .iter()
            .any(|s| s.storage_failed.load(Ordering::Acquire))
    }

    /// Why any shard's log failed, if one did: then this node pops and
    /// acknowledges nothing more, and stops (fail-stop, issue 38).
    pub fn storage_failure(&self) -> Option<String> {
        let (index, why) = ShardStats::storage_failure(&self.base.stats)?;
        Some(format!("the timer log of shard {index} failed ({why})"))
    }

    /// Whether a change may be made now: not once any shard's log has
    /// failed, not while recovering, not when the log is behind the disk
    /// (`503` with the reason).
    pub fn storage_admits(&self) -> Result<(), OpError> {
        if let Some(why) = self.storage_failure() {
            return Err(OpError::new(
                503,
                format!("{why}: this node acknowledges nothing more and is stopping"),
            ));
        }
        if self.recovering() {
            return Err(OpError::new(
                503,
                "recovering: the node is replaying its timer log; retry shortly",
            ));
        }
        match self.durable.log() {
            Some(log) if !log.has_room() => Err(OpError::new(
                503,
                match log.failure() {
                    Some(why) => format!("the timer log failed ({why}): writes are refused until a restart"),
                    None => "the timer log is behind the disk ([storage] pending-bytes-max reached): retry later".to_string(),
                },
            )),
            _ => Ok(()),
        }
    }

    /// As [`Shard::storage_admits`], for a client's create or update:
    /// also not while the log's file system is below `free-bytes-min`
    /// (`503 storage full`). Deletes and pops free space and go on.
    pub fn storage_admits_growth(&self) -> Result<(), OpError> {
        self.storage_admits()?;
        let Some(log) = self.durable.log() else {
            return Ok(());
        };
        match log.space_low() {
            None => Ok(()),
            Some(free) => Err(OpError::new(
                503,
                format!(
                    "storage full: {free} bytes free under {}, below [storage] free-bytes-min = {}: creates and updates are refused until space comes back (deletes go on); retry later",
                    log.dir().display(),
                    log.free_bytes_min()
                ),
            )),
        }
    }

    /// Wait until every change this shard has made so far is durable
    /// (at once without `[storage]` or with `sync = "none"`).
    pub async fn settle(&self) -> Result<(), OpError> {
        let Some(log) = self.durable.log() else {
            return Ok(());
        };
        if log.is_closed() {
            // Shutting down: a change made now is not logged.
            return Err(OpError::new(503, "shutting down: the timer log is closed"));
        }
        // Any shard's: a change forwarded here may have been logged on a
        // shard whose log failed since.
        if let Some(why) = self.storage_failure() {
            return Err(OpError::new(
                503,
                format!("{why}: the change may not be durable"),
            ));
        }
        log.durable(log.last_lsn()).await.map_err(|why| {
            OpError::new(
                503,
                format!("the timer log failed ({why}): the change may not be durable"),
            )
        })
    }
}

/// Rebuild the store from `recovered`, open the log after it, and start
/// the flusher and compaction. The pop loop starts after this.
/// The recovered timers into the store, in slices (due order: timers that
/// fell due while the node was down pop in it).
async fn recover_timers<'r>(
    shard: &Shard,
    recovered: &'r Recovered,
) -> Vec<storage::record::Image<'r>> {
    let mut images: Vec<_> = recovered.images().collect();
    images.sort_unstable_by_key(|i| i.due_unix_ms);
    for chunk in images.chunks(RECOVER_SLICE) {
        {
            let mut store = shard.timers.store.borrow_mut();
            for image in chunk {
                store.recover(image);
            }
        }
        crate::runtime::bulk::breathe().await;
    }
    images
}

pub async fn recover(shard: &Rc<Shard>, dir: PathBuf, recovered: Recovered) -> Rc<Log> {
    let started = Instant::now();
    let stats = shard.base.my_stats();
    assert!(
        stats.recovering.load(Ordering::Relaxed),
        "set before the server"
    );
    let images = recover_timers(shard, &recovered).await;
    let count = images.len();
    for (state, owned, image) in recovered.deliveries() {
        shard.recover_attempt(&state, owned, &image);
    }
    let recent = match shard.keeps_tombstones() {
        true => super::resend::recent(&images, shard.replication_late_ms_max(), clock::unix_us()),
        false => Vec::new(),
    };
    drop(images);
    ShardStats::add(&stats.storage_replayed_records, recovered.replayed);
    ShardStats::add(&stats.storage_torn_tails, recovered.torn_tails);
    ShardStats::add(&stats.storage_corrupt_records, recovered.corrupt);
    let cfg = &shard.base.resolved.config.storage;
    let resume = recovered.resume();
    let log = Log::new(
        dir.clone(),
        cfg,
        &resume,
        shard.base.stats.clone(),
        shard.base.id,
    );
    log.snapshot_taken(recovered.snapshot_bytes, recovered.since_snapshot_bytes);
    assert!(
        shard.durable.log.set(log.clone()).is_ok(),
        "one log per shard"
    );
    let flusher = crate::runtime::spawn::spawn_local(storage::log::flusher(log.clone(), resume));
    *shard.durable.flusher.borrow_mut() = Some(flusher);
    let corrupt = recovered.corrupt > 0;
    drop(recovered);
    shard
        .base
        .gate
        .spawn(watch_space(shard.clone(), log.clone()));
    shard
        .base
        .gate
        .spawn(compaction_loop(shard.clone(), log.clone(), dir, corrupt));
    shard.refresh_gauges(&shard.timers.store.borrow());
    if !recent.is_empty() {
        shard.durable.resending.set(true);
        let me = shard.timers.cluster().local_address.clone();
        shard.outbound.replicator.resend_started(&me);
        let resend = super::resend::run(shard.clone(), recent);
        if !shard.base.gate.spawn(resend) {
            shard.durable.resending.set(false);
        }
    }
    tracing::info!(target: "chronos::storage", "shard {}: recovered {count} timers and tombstones in {} ms", shard.base.id, started.elapsed().as_millis());
    if corrupt && shard.base.id == 0 && shard.has_peers() {
        // What the skipped records held comes back from the peers.
        shard.resync.trigger.request(true);
    }
    log
}

/// How often a shard reads the free space of its log's file system.
const SPACE_WATCH: Duration = Duration::from_millis(200);

/// Read the free space of the log's file system every [`SPACE_WATCH`]
/// (one `statvfs`), for the reserve ([`Shard::storage_admits_growth`]).
async fn watch_space(shard: Rc<Shard>, log: Rc<Log>) {
    while !shard.base.gate.is_closing() {
        match crate::storage::free_bytes(log.dir()) {
            Ok(free) => log.set_free_bytes(free),
            Err(e) => tracing::warn!(target: "chronos::storage", "shard {}: {e}", shard.base.id),
        }
        let tick = glommio::timer::sleep(SPACE_WATCH);
        futures_lite::future::or(tick, shard.base.gate.closing()).await;
    }
}

/// Close the log at shutdown: write what is pending, then end.
pub async fn close(shard: &Shard, timeout: Duration) {
    let Some(log) = shard.durable.log() else {
        return;
    };
    log.close();
    let flusher = shard.durable.flusher.borrow_mut().take();
    if let Some(task) = flusher {
        let sleep = async {
            glommio::timer::sleep(timeout).await;
            tracing::warn!(target: "chronos::storage", "shard {}: the timer log's last write did not end within {timeout:?}", shard.base.id);
        };
        futures_lite::future::or(task, sleep).await;
    }
}

/// Snapshot whenever the log has outgrown its last snapshot (at once when
/// recovery skipped corrupt records: the snapshot replaces them).
async fn compaction_loop(shard: Rc<Shard>, log: Rc<Log>, dir: PathBuf, mut now: bool) {
    let gate: Rc<Gate> = shard.base.gate.clone();
    while !gate.is_closing() {
        if !now {
            if gate.unless_closing(log.compact.wait()).await.is_none() {
                return;
            }
            if !log.wants_snapshot() {
                continue;
            }
        }
        now = false;
        if let Err(why) = snapshot(&shard, &log, &dir).await {
            tracing::error!(target: "chronos::storage", "shard {}: snapshot failed: {why}; retrying in {SNAPSHOT_RETRY:?}", shard.base.id);
            let _ = gate
                .unless_closing(glommio::timer::sleep(SNAPSHOT_RETRY))
                .await;
            now = true;
        }
    }
}

/// Write a snapshot of the store in slices, put it in place, remove what
/// it covers.
async fn snapshot(shard: &Shard, log: &Log, dir: &std::path::Path) -> Result<(), String> {
    let started = Instant::now();
    let covers_lsn = log.last_lsn() + 1;
    let since_at_start = log.since_snapshot_bytes();
    let mut w = snapshot::Writer::create(dir, covers_lsn).await?;
    let mut from = Some(0);
    while let Some(at) = from {
        {
            let store = shard.timers.store.borrow();
            from = store.scan_slice(at, SNAPSHOT_SLICE, |_, due, t| {
                store.snapshot_put(&mut w.enc, due, t);
            });
        }
        w.write_some().await?;
        // A sleep, not a yield: glommio polls its reactor (due pops'
        // timers) only when no task is runnable (runtime::bulk).
        crate::runtime::bulk::breathe().await;
    }
    {
        // Pops in flight: as the log has them, before the pop (written
        // last, so they win over the store's state of the same ID).
        let store = shard.timers.store.borrow();
        shard
            .pop
            .each_before_pop(|due, t| store.snapshot_put(&mut w.enc, due, t));
    }
    // Pops being retried or watched: their state, as the log has it.
    shard.snapshot_attempts(&mut w.enc);
    let count = w.enc.count();
    let bytes = w.finish().await?;
    storage::fault_point("after-snapshot-rename");
    let removed = snapshot::remove_covered(dir, covers_lsn).await?;
    log.snapshot_taken(bytes, log.since_snapshot_bytes() - since_at_start);
    let stats = shard.base.my_stats();
    ShardStats::add(&stats.storage_snapshots, 1);
    let took = started.elapsed();
    stats.record_storage_snapshot(took);
    stats
        .storage_snapshot_unix_ms
        .store(crate::runtime::clock::unix_ms() as i64, Ordering::Relaxed);
    tracing::info!(target: "chronos::storage", "shard {}: snapshot of {count} timers ({bytes} bytes) in {} ms; {removed} file(s) it covers removed", shard.base.id, took.as_millis());
    Ok(())
}
