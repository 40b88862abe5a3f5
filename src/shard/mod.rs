//! One shard: the timers it owns, and what happens to them.
//!
//! A shard runs on one pinned core and owns its wheel, its ID index, its tag
//! table and its callback client. Everything here is single-threaded
//! (`RefCell`, never held across an `.await`); other shards reach it only
//! through the cross-core mesh (`runtime::mesh`).
//!
//! The hot path: `api` parses a request → `create`/`update`/`delete` touch the
//! store → the pop loop (`pop_loop`) polls the wheel at each deadline → each
//! due timer's callback is dispatched on its own task (`callback`), so a slow
//! target never delays another timer's pop.

mod pop;
mod store;

pub use store::Store;

use crate::cluster::Cluster;
use crate::config::Resolved;
use crate::http::client::Client;
use crate::runtime::clock;
use crate::runtime::mesh::{Mesh, MeshMsg, Reply};
use crate::runtime::notify::Notify;
use crate::stats::ShardStats;
use crate::timer::{shard_of, Timer, TimerId, TimerSpec};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Set by the signal thread; every shard watches it.
pub static SHUTDOWN: AtomicBool = AtomicBool::new(false);

/// Why a timer operation failed: an HTTP status and a reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError {
    pub status: u16,
    pub reason: String,
}

impl OpError {
    pub fn new(status: u16, reason: impl Into<String>) -> Self {
        OpError {
            status,
            reason: reason.into(),
        }
    }
}

/// Everything one shard owns.
pub struct Shard {
    pub id: usize,
    pub shards: usize,
    pub resolved: Arc<Resolved>,
    pub store: RefCell<Store>,
    pub stats: Arc<[ShardStats]>,
    pub mesh: Mesh,
    pub client: Client,
    /// Wakes the pop loop when a timer due before its current sleep arrives.
    pub pop_wake: Notify,
    /// The deadline the pop loop sleeps until (`u64::MAX`: idle).
    pub pop_armed_ms: Cell<u64>,
    /// Wakes the accept loop at shutdown.
    pub accept_wake: Notify,
    /// Requests being handled right now (shutdown waits for them).
    pub busy: Cell<usize>,
    pub connections: Cell<usize>,
    pub shutting_down: Cell<bool>,
}

impl Shard {
    pub fn new(
        id: usize,
        resolved: Arc<Resolved>,
        stats: Arc<[ShardStats]>,
        mesh: Mesh,
    ) -> Rc<Shard> {
        let shards = resolved.shards;
        let store = Store::new(id, shards, resolved.instance_id, clock::now_ms());
        let client = Client::new(&resolved.config.timers);
        Rc::new(Shard {
            id,
            shards,
            store: RefCell::new(store),
            stats,
            mesh,
            client,
            pop_wake: Notify::default(),
            pop_armed_ms: Cell::new(u64::MAX),
            accept_wake: Notify::default(),
            busy: Cell::new(0),
            connections: Cell::new(0),
            shutting_down: Cell::new(false),
            resolved,
        })
    }

    pub fn my_stats(&self) -> &ShardStats {
        &self.stats[self.id]
    }

    pub fn cluster(&self) -> &Cluster {
        &self.resolved.cluster
    }

    fn skew_ms(&self) -> u64 {
        self.resolved.config.timers.replica_skew_ms
    }

    fn replication_factor(&self, spec: &TimerSpec) -> usize {
        let asked = spec
            .replication_factor
            .unwrap_or(self.resolved.config.timers.default_replication_factor);
        (asked as usize).min(self.cluster().nodes.len())
    }

    /// The replica list, bloom filter and this node's place in it for a unique ID.
    fn placement(&self, unique: u64, factor: usize) -> (u64, Option<u8>) {
        let cluster = self.cluster();
        let mut replicas = [0usize; crate::cluster::NODES_MAX];
        let n = cluster.replicas_into(unique, factor, &mut replicas);
        let bloom = cluster.bloom_of(&replicas[..n]);
        let index = cluster
            .local
            .and_then(|me| replicas[..n].iter().position(|r| *r == me))
            .map(|i| i as u8);
        (bloom, index)
    }

    /// `POST /timers`: a new timer with an ID owned by this shard.
    pub fn create(&self, spec: &TimerSpec) -> Result<TimerId, OpError> {
        let unique = self.store.borrow_mut().ids.next(clock::unix_ms());
        self.install(unique, spec, true)
    }

    /// `PUT /timers/<id>` for a timer this shard owns: replace it, or create it.
    pub fn update(&self, id: TimerId, spec: &TimerSpec) -> Result<TimerId, OpError> {
        debug_assert_eq!(shard_of(id.unique, self.shards), self.id);
        self.install(id.unique, spec, false)
    }

    fn install(&self, unique: u64, spec: &TimerSpec, fresh: bool) -> Result<TimerId, OpError> {
        let factor = self.replication_factor(spec);
        let (bloom, replica_index) = self.placement(unique, factor);
        let id = TimerId { unique, bloom };
        let now = clock::now_ms_ceil();
        let (start_ms, sequence, replica_index) = match &spec.replication {
            // A replica's copy from another node: its clock offset and progress.
            Some(r) => {
                let index = r
                    .replicas
                    .iter()
                    .position(|a| *a == self.cluster().local_address)
                    .map(|i| i as u8)
                    .or(replica_index)
                    .unwrap_or(0);
                let start = (now as i64 + r.start_time_delta_ms).max(0) as u64;
                (start, r.sequence_number, index)
            }
            None => (now, 0, replica_index.unwrap_or(0)),
        };
        let mut timer = Timer::new(
            id,
            start_ms,
            spec.interval_ms,
            spec.repeat_for_ms,
            sequence,
            replica_index,
            factor as u8,
            &spec.uri,
            &spec.opaque,
        );
        let mut store = self.store.borrow_mut();
        if !spec.tags.is_empty() {
            timer.tags = Some(store.intern_tags(&spec.tags));
        }
        let replaced = store.remove(unique);
        let stats = self.my_stats();
        debug_assert!(!(fresh && replaced.is_some()), "a fresh ID is never in use");
        if replaced.is_some() {
            ShardStats::add(&stats.timers_updated, 1);
        } else {
            ShardStats::add(&stats.timers_created, 1);
        }
        if spec.is_tombstone() || !timer.has_next_pop() {
            // Nothing will ever pop (repeat-for below interval, or a tombstone
            // on a single node): the answer is still 200, as in the reference.
            stats
                .timers_pending
                .store(store.len() as i64, Ordering::Relaxed);
            return Ok(id);
        }
        if store.len() >= self.resolved.config.timers.timers_per_shard_max {
            return Err(OpError::new(
                503,
                "timer capacity of this shard is exhausted",
            ));
        }
        let due = timer.next_pop_ms(self.skew_ms());
        store.insert(due, timer);
        stats
            .timers_pending
            .store(store.len() as i64, Ordering::Relaxed);
        drop(store);
        if due < self.pop_armed_ms.get() {
            self.pop_wake.notify();
        }
        Ok(id)
    }

    /// `DELETE /timers/<id>` for a timer this shard owns. Idempotent.
    pub fn delete(&self, id: TimerId) {
        let mut store = self.store.borrow_mut();
        if store.remove(id.unique).is_some() {
            ShardStats::add(&self.my_stats().timers_deleted, 1);
        }
        self.my_stats()
            .timers_pending
            .store(store.len() as i64, Ordering::Relaxed);
    }

    /// Run a `PUT` where the timer lives: here, or on its owner over the mesh.
    pub async fn route_update(&self, id: TimerId, spec: TimerSpec<'_>) -> Result<TimerId, OpError> {
        let owner = shard_of(id.unique, self.shards);
        if owner == self.id {
            return self.update(id, &spec);
        }
        ShardStats::add(&self.my_stats().mesh_forwarded, 1);
        match self
            .mesh
            .ask(owner, |reply| MeshMsg::Update {
                id,
                spec: spec.into_owned(),
                reply,
            })
            .await
        {
            Some(Reply::Timer(r)) => r,
            _ => Err(OpError::new(503, "owning shard is unavailable")),
        }
    }

    /// Run a `DELETE` where the timer lives.
    pub async fn route_delete(&self, id: TimerId) -> Result<(), OpError> {
        let owner = shard_of(id.unique, self.shards);
        if owner == self.id {
            self.delete(id);
            return Ok(());
        }
        ShardStats::add(&self.my_stats().mesh_forwarded, 1);
        match self
            .mesh
            .ask(owner, |reply| MeshMsg::Delete { id, reply })
            .await
        {
            Some(Reply::Done) => Ok(()),
            _ => Err(OpError::new(503, "owning shard is unavailable")),
        }
    }

    /// Per-tag gauges of every shard, merged (for `/metrics`).
    pub async fn all_tags(&self) -> Vec<(String, i64)> {
        let mut merged: std::collections::BTreeMap<String, i64> = Default::default();
        for (name, v) in self.store.borrow().tag_values() {
            *merged.entry(name).or_default() += v;
        }
        for peer in 0..self.shards {
            if peer == self.id {
                continue;
            }
            if let Some(Reply::Tags(list)) =
                self.mesh.ask(peer, |reply| MeshMsg::Tags { reply }).await
            {
                for (name, v) in list {
                    *merged.entry(name).or_default() += v;
                }
            }
        }
        merged.into_iter().collect()
    }

    /// Serve one message from another shard.
    pub fn handle_mesh(&self, msg: MeshMsg) {
        match msg {
            MeshMsg::Update { id, spec, reply } => {
                let _ = reply.send(Reply::Timer(self.update(id, &spec)));
            }
            MeshMsg::Delete { id, reply } => {
                self.delete(id);
                let _ = reply.send(Reply::Done);
            }
            MeshMsg::Tags { reply } => {
                let _ = reply.send(Reply::Tags(self.store.borrow().tag_values()));
            }
        }
    }
}

pub use pop::pop_loop;
