//! The requesting side's trigger: requests for a resync (SIGUSR1,
//! `POST /resync`, start-up) coalesce into shard 0's loop, which runs one
//! at a time and records each run's state and outcome in the stats and
//! the log.

use super::request::{run, VIEW_CHANGED};
use crate::runtime::bulk;
use crate::runtime::notify::Notify;
use crate::shard::mesh::{MeshMsg, Reply};
use crate::shard::Shard;
use crate::stats;
use futures_lite::future;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// Resync requests waiting for shard 0's resync loop.
#[derive(Default)]
pub struct Trigger {
    /// A run is wanted (`true`: restore every replica, not only old-view
    /// ones). Requests coalesce.
    pending: Cell<Option<bool>>,
    wake: Notify,
    /// Runs started so far (shard 0).
    started: Cell<u64>,
}

impl Trigger {
    /// Ask for a run; returns the number of the run that will serve this
    /// request (the next one to start).
    pub fn request(&self, all_views: bool) -> u64 {
        let all = self.pending.get().unwrap_or(false) || all_views;
        self.pending.set(Some(all));
        self.wake.notify();
        self.started.get() + 1
    }
}

/// Shard 0's resync loop: one run per (coalesced) request, until shutdown.
pub async fn resync_loop(shard: Rc<Shard>) {
    assert_eq!(shard.base.id, 0, "the resync runs on shard 0");
    while !shard.base.gate.is_closing() {
        let Some(all_views) = shard.resync.trigger.pending.take() else {
            future::or(shard.resync.trigger.wake.wait(), shard.base.gate.closing()).await;
            continue;
        };
        let t = &shard.resync.trigger;
        t.started.set(t.started.get() + 1);
        run_recorded(&shard, all_views).await;
    }
}

/// One run, with its state and outcome in the stats and the log.
async fn run_recorded(shard: &Rc<Shard>, all_views: bool) {
    let s = shard.base.my_stats();
    s.resync_begin();
    let kind = if all_views { "restore" } else { "resync" };
    tracing::info!(target: "chronos::resync", "{kind} started");
    let started = Instant::now();
    // Each poll of a run is one stretch of the shard's thread without a
    // breath: measured (`GET /cluster`, "stretch-us-max").
    let mut result = bulk::metered(run(shard, all_views)).await;
    // A reload during the run: it starts again under the new view.
    while result.as_ref().is_err_and(|e| e == VIEW_CHANGED) && !shard.base.gate.is_closing() {
        tracing::warn!(target: "chronos::resync", "{kind}: {VIEW_CHANGED}; starting again");
        result = bulk::metered(run(shard, all_views)).await;
    }
    s.resync_peers_left.store(0, Relaxed);
    let ms = started.elapsed().as_millis();
    match result {
        Ok(()) => {
            tracing::info!(target: "chronos::resync", "{kind} complete in {ms} ms");
            *s.resync_error.lock().expect("not poisoned") = String::new();
            s.resync_end(stats::RESYNC_COMPLETE);
        }
        Err(e) => {
            tracing::error!(target: "chronos::resync", "{kind} failed after {ms} ms: {e}");
            s.resync_failed.fetch_add(1, Relaxed);
            *s.resync_error.lock().expect("not poisoned") = e;
            s.resync_end(stats::RESYNC_FAILED);
        }
    }
}

impl Shard {
    /// Ask for a resync from any shard: shard 0 runs it. The number of the
    /// run that will serve the request.
    pub async fn request_resync(&self, all_views: bool) -> Option<u64> {
        if self.base.id == 0 {
            return Some(self.resync.trigger.request(all_views));
        }
        let reply = self
            .base
            .mesh
            .ask(0, |reply| MeshMsg::StartResync { all_views, reply })
            .await;
        match reply {
            Some(Reply::ResyncRun(n)) => Some(n),
            _ => None,
        }
    }
}
