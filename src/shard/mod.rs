//! One shard: the timers it owns, and what happens to them.
//!
//! A shard runs on one pinned core and owns its wheel, its ID index, its tag
//! table, its callback client and its replication queues. Everything here is
//! single-threaded (`RefCell`, never held across an `.await`); other shards
//! reach it only through the cross-core mesh ([`mesh`]).
//!
//! The hot path: `api` parses a request → [`ops`] (`create`/`update`/
//! `delete`) touch the [`store`] → the pop loop ([`pop`]) polls the wheel at
//! each deadline → each due timer's callback is dispatched on its own task,
//! so a slow target never delays another timer's pop → a successful pop is
//! replicated ([`replication`]).
//!
//! | file | concern |
//! |---|---|
//! | `base.rs` | the part `Base`: index, configuration, stats, mesh, gate |
//! | `timers.rs` | the part `Timers`: the store, the view, the version counter |
//! | `outbound.rs` | the part `Outbound`: the client, the replicators, the callback guard |
//! | `store.rs` | wheel + ID index + tags: the timers themselves |
//! | `error.rs` | `OpError`: why an operation failed (a leaf the mesh and the operations share) |
//! | `ops.rs` | timer operations: client create/update/delete, replica updates, `apply` |
//! | `conflict.rs` | the conflict rules between two incarnations (pure, unit-tested) |
//! | `replication.rs` | the replication body, built in one place, and pop replication |
//! | `view.rs` | the cluster view this shard works under, and replica placement |
//! | `pop.rs` | the pop loop, its state (the part `PopState`), callback dispatch |
//! | `targets.rs` | callback admission per target: in-flight shares, held pops promoted as the target's callbacks end |
//! | `resync/` | the part `Resync` (sessions, trigger); resync, both sides: serving GET pages and DELETE references; requesting: page every node, apply seed 003's rules |
//! | `mesh.rs` | the messages shards exchange |
//! | `lookup.rs` | `GET /timers/<id>`: a copy read on its owner shard and rendered as a client would write it, with its next pop, pops done, replicas and sites |
//! | `spill.rs` | a client's create, whole; and on a shard with room when this one is full (a node is full only when every shard is) |
//! | `durable.rs` | the part `Durable` (the log, its flusher); `[storage]`: recovery into the store, durability waits, compaction |

pub mod base;
pub mod conflict;
pub mod durable;
mod error;
pub mod handoff;
pub mod lookup;
pub mod mesh;
mod ops;
pub mod outbound;
mod pop;
mod repair;
mod replication;
mod resend;
pub mod resync;
pub mod retry;
mod room;
mod spill;
mod store;
mod targets;
pub mod timers;
mod view;

pub use error::OpError;
pub use mesh::{MeshMsg, Reply};
pub use ops::TOMBSTONE_MS_DEFAULT;
pub use outbound::authorization;
pub use pop::{pop_loop, PopState, POPS_PER_TURN_MAX};
pub use repair::{repair_loop, resend_deletes};
pub use retry::retry_loop;
pub use spill::SHARD_FULL;
pub use store::Store;

use crate::cluster::Cluster;
use crate::config::Resolved;
use crate::runtime::clock;
use crate::runtime::gate::Gate;
use crate::runtime::mesh::Mesh;
use crate::runtime::throttle::Throttle;
use crate::stats::{ShardStats, POP_LATENESS_BOUNDS_US};
use base::Base;
use outbound::Outbound;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use timers::Timers;

/// Everything one shard owns, as parts: each a type with its own state.
/// Only the operations that span parts (create, update, delete, apply,
/// the resync's steps) are `Shard`'s own.
pub struct Shard {
    /// Where it sits in the node: index, configuration, stats, mesh, gate.
    pub base: Base,
    /// The store, the cluster view, the version counter.
    pub timers: Timers,
    /// The client, the replicators, the callback guard.
    pub outbound: Outbound,
    /// The pop loop's state: callbacks in flight, held pops, the bucket
    /// its lateness steers.
    pub pop: PopState,
    /// The serving side's sessions, the requesting side's trigger.
    pub resync: resync::Resync,
    /// The timer log (`[storage]`) and its flusher.
    pub durable: durable::Durable,
    /// Pops with a delivery policy being retried or watched (issue 41).
    pub retries: retry::Retries,
}

impl Shard {
    pub fn new(
        id: usize,
        resolved: Arc<Resolved>,
        stats: Arc<[ShardStats]>,
        mesh: Mesh<MeshMsg>,
        gate: Rc<Gate>,
        throttle: Option<Rc<Throttle>>,
    ) -> Rc<Shard> {
        let shards = resolved.shards;
        assert!(
            id < shards && stats.len() == shards,
            "shard {id} of {shards}"
        );
        let store = Store::new(id, shards, resolved.instance_id, clock::now_ms());
        let shard = Rc::new(Shard {
            timers: Timers::new(store, &resolved.cluster),
            outbound: Outbound::new(&resolved, &gate, &stats, id),
            pop: PopState::new(throttle),
            resync: resync::Resync::default(),
            durable: durable::Durable::default(),
            retries: retry::Retries::default(),
            base: Base {
                id,
                shards,
                resolved,
                stats,
                mesh,
                gate,
            },
        });
        shard.hook_client();
        shard
    }

    /// What the client asks of the shard and tells it: the callback guard,
    /// whether a queued callback is still wanted, when one went out.
    fn hook_client(self: &Rc<Shard>) {
        self.outbound.set_guard(self.base.resolved.guard.clone());
        // `chronos_pop_lateness_seconds`: due time to the first byte sent.
        let (stats, me) = (self.base.stats.clone(), self.base.id);
        self.outbound.client.set_sent(Box::new(move |key, at| {
            if key.attempt > 1 {
                // A retry: due at its back-off, not at the pop's time.
                return;
            }
            let due = clock::instant_of(key.due_ms);
            let late = at.saturating_duration_since(due);
            stats[me]
                .pop_lateness
                .record_duration(&POP_LATENESS_BOUNDS_US, late);
        }));
        // Whether a callback still waiting for its lane should be sent: no
        // operation has replaced or deleted its incarnation since its pop
        // was taken (`PopState::dispatched`). Weak: the client belongs to
        // the shard.
        let weak = Rc::downgrade(self);
        self.outbound.client.set_wanted(Box::new(move |key| {
            weak.upgrade().is_none_or(|s| match key.attempt {
                0 | 1 => s.pop.is_wanted(key.unique, key.version),
                _ => s.retries.is_wanted((key.unique, key.sequence), key.version),
            })
        }));
    }

    /// Take a new cluster view (a reload): replicas, replication peers and
    /// the conflict rules follow it from now on. Timers already stored keep
    /// their placement until their next pop or update re-places them
    /// (passive rebalancing, seed 001).
    pub fn set_cluster(&self, cluster: &Cluster) {
        self.outbound.set_peers(cluster);
        self.timers.view.set(cluster);
        // A joiner watches the pops being retried from now on.
        self.report_owned();
    }

    /// Whether any other node exists: only then are there replicas to
    /// tell, and stale messages for tombstones to stop.
    pub fn has_peers(&self) -> bool {
        let cluster = self.timers.cluster();
        cluster.nodes.len() + cluster.leaving.len() > 1
    }

    /// Whether stale messages can come from elsewhere (other nodes, or
    /// other sites), so that deletes and final pops leave tombstones.
    pub fn keeps_tombstones(&self) -> bool {
        self.has_peers() || self.base.resolved.sites.replicating()
    }

    pub fn refresh_gauges(&self, store: &Store) {
        let stats = self.base.my_stats();
        stats
            .timers_pending
            .store(store.len() as i64, Ordering::Relaxed);
        stats
            .tombstones
            .store(store.tombstones() as i64, Ordering::Relaxed);
        stats
            .informational
            .store(store.info_len() as i64, Ordering::Relaxed);
    }

    /// Readiness of the timer service: every shard listening. `Err` says
    /// how many are not.
    pub fn readiness(&self) -> Result<(), String> {
        let down = self
            .base
            .stats
            .iter()
            .filter(|s| !s.up.load(Ordering::Relaxed))
            .count();
        if let Some(why) = self.storage_failure() {
            return Err(format!("storage failed: {why}; this node is stopping"));
        }
        if self.recovering() {
            return Err("recovering: replaying the timer log".into());
        }
        if self.base.stats[0].catching_up.load(Ordering::Acquire) {
            return Err(
                "catching up: taking the replication the peers owe this node before popping".into(),
            );
        }
        match down {
            0 => Ok(()),
            n => Err(format!("{n} shard(s) not listening")),
        }
    }

    /// Per-tag gauges of every shard, merged (for `/metrics`).
    pub async fn all_tags(&self) -> Vec<(String, i64)> {
        let mut merged: std::collections::BTreeMap<String, i64> = Default::default();
        for (name, v) in self.timers.store.borrow().tag_values() {
            *merged.entry(name).or_default() += v;
        }
        for peer in (0..self.base.shards).filter(|p| *p != self.base.id) {
            if let Some(Reply::Tags(list)) = self
                .base
                .mesh
                .ask(peer, |reply| MeshMsg::Tags { reply })
                .await
            {
                for (name, v) in list {
                    *merged.entry(name).or_default() += v;
                }
            }
        }
        merged.into_iter().collect()
    }
}
