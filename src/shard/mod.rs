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
//! | `store.rs` | wheel + ID index + tags: the timers themselves |
//! | `ops.rs` | timer operations: client create/update/delete, replica updates, `apply` |
//! | `conflict.rs` | the conflict rules between two incarnations (pure, unit-tested) |
//! | `replication.rs` | the replication body, built in one place, and pop replication |
//! | `view.rs` | the cluster view this shard works under, and replica placement |
//! | `pop.rs` | the pop loop, its state, callback dispatch |
//! | `targets.rs` | callback admission per target: in-flight shares, held pops promoted as the target's callbacks end |
//! | `resync/` | resync, both sides: serving GET pages and DELETE references; requesting: page every node, apply seed 003's rules |
//! | `mesh.rs` | the messages shards exchange |
//! | `durable.rs` | `[storage]`: recovery into the store, durability waits, compaction |

pub mod conflict;
pub mod durable;
pub mod handoff;
pub mod mesh;
mod ops;
mod pop;
mod repair;
mod replication;
mod resend;
pub mod resync;
mod room;
mod store;
mod targets;
mod view;

pub use mesh::{MeshMsg, Reply};
pub use ops::{OpError, TOMBSTONE_MS_DEFAULT};
pub use pop::{pop_loop, PopState, POPS_PER_TURN_MAX};
pub use repair::{repair_loop, resend_deletes};
pub use store::Store;

use crate::cluster::replicate::{Replicator, ReplicatorConfig};
use crate::cluster::Cluster;
use crate::config::Resolved;
use crate::http::client::{CallbackKey, Client, ClientConfig};
use crate::http::guard::Guard;
use crate::http::tls;
use crate::runtime::clock;
use crate::runtime::gate::Gate;
use crate::runtime::mesh::Mesh;
use crate::runtime::throttle::{Throttle, ThrottleConfig};
use crate::stats::{ShardStats, POP_LATENESS_BOUNDS_US};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use view::View;

/// Everything one shard owns.
pub struct Shard {
    pub id: usize,
    pub shards: usize,
    pub resolved: Arc<Resolved>,
    pub store: RefCell<Store>,
    pub stats: Arc<[ShardStats]>,
    pub mesh: Mesh<MeshMsg>,
    /// The HTTP client: callbacks, and (through the replicator) replication.
    pub client: Rc<Client>,
    pub replicator: Replicator,
    /// Cross-site (GR) replication: one queue per remote site.
    pub sites_out: Replicator,
    /// Closed at shutdown; the pop loop and the replication senders hold it.
    pub gate: Rc<Gate>,
    pub pop: PopState,
    view: View,
    /// The serving side's resync sessions.
    sessions: resync::session::Sessions,
    /// The requesting side's resync trigger (used on shard 0).
    pub rebalance: resync::trigger::Trigger,
    /// Admission of client requests (`[throttling]`), `None` when off.
    pub throttle: Option<Throttle>,
    /// The last version handed out (strictly increasing per shard).
    last_version_us: Cell<u64>,
    /// The timer log (`[storage]`), set once recovery has opened it.
    log: std::cell::OnceCell<Rc<crate::storage::Log>>,
    /// The log's flusher task (awaited at shutdown: it writes what is left).
    flusher: RefCell<Option<glommio::Task<()>>>,
    /// `[timers] callback-allow` (a reload replaces it); `None`: callbacks
    /// may go anywhere.
    guard: RefCell<Option<Arc<Guard>>>,
}

impl Shard {
    pub fn new(
        id: usize,
        resolved: Arc<Resolved>,
        stats: Arc<[ShardStats]>,
        mesh: Mesh<MeshMsg>,
        gate: Rc<Gate>,
    ) -> Rc<Shard> {
        let shards = resolved.shards;
        assert!(
            id < shards && stats.len() == shards,
            "shard {id} of {shards}"
        );
        let store = Store::new(id, shards, resolved.instance_id, clock::now_ms());
        let timers = &resolved.config.timers;
        let client = Rc::new(
            Client::new(ClientConfig {
                timeout: Duration::from_millis(timers.callback_timeout_ms),
                connect_timeout: Duration::from_millis(timers.callback_connect_timeout_ms),
                per_host_max: timers.callback_connections_per_host_max,
            })
            .with_tls(resolved.callback_tls.as_ref().map(tls::for_shard))
            .with_peer_tls(resolved.peer_tls.as_ref().map(tls::for_shard)),
        );
        let c = &resolved.config.cluster;
        let replicator = Replicator::new(
            &replication_peers(&resolved.cluster),
            ReplicatorConfig {
                queue_max: c.replication_queue_max,
                queue_bytes_max: c.replication_queue_bytes_max,
                deliver_within: Duration::from_millis(c.replication_deliver_within_ms),
                timeout: Duration::from_millis(c.replication_timeout_ms),
                sites: false,
                authorization: authorization(&resolved),
            },
            client.clone(),
            gate.clone(),
            stats.clone(),
            id,
        );
        let sites_out = sites_replicator(&resolved, &client, &gate, &stats, id);
        let shard = Rc::new(Shard {
            id,
            shards,
            store: RefCell::new(store),
            stats,
            mesh,
            client,
            replicator,
            sites_out,
            gate,
            pop: PopState::default(),
            view: View::new(&resolved.cluster),
            sessions: resync::session::Sessions::default(),
            throttle: throttle(&resolved),
            rebalance: resync::trigger::Trigger::default(),
            last_version_us: Cell::new(0),
            log: std::cell::OnceCell::new(),
            flusher: RefCell::new(None),
            guard: RefCell::new(None),
            resolved,
        });
        shard.hook_client();
        shard
    }

    /// What the client asks of the shard and tells it: the callback guard,
    /// whether a queued callback is still wanted, when one went out.
    fn hook_client(self: &Rc<Shard>) {
        self.set_guard(self.resolved.guard.clone());
        // `chronos_pop_lateness_seconds`: due time to the first byte sent.
        let (stats, me) = (self.stats.clone(), self.id);
        self.client.set_sent(Box::new(move |key, at| {
            let due = clock::instant_of(key.due_ms);
            let late = at.saturating_duration_since(due);
            stats[me]
                .pop_lateness
                .record_duration(&POP_LATENESS_BOUNDS_US, late);
        }));
        // Weak: the client belongs to the shard.
        let weak = Rc::downgrade(self);
        self.client.set_wanted(Box::new(move |key| {
            weak.upgrade().is_none_or(|s| s.callback_wanted(key))
        }));
    }

    /// Take a new cluster view (a reload): replicas, replication peers and
    /// the conflict rules follow it from now on. Timers already stored keep
    /// their placement until their next pop or update re-places them
    /// (passive rebalancing, seed 001).
    pub fn set_cluster(&self, cluster: &Cluster) {
        self.replicator.set_peers(&replication_peers(cluster));
        self.view.set(cluster);
    }

    /// Take a callback guard (at start, and at each reload): checked when
    /// a client creates or updates a timer, and by the client on the
    /// address each callback is about to use.
    pub fn set_guard(&self, guard: Option<Arc<Guard>>) {
        self.client.set_guard(guard.clone());
        *self.guard.borrow_mut() = guard;
    }

    /// The callback guard now (`None`: none configured).
    pub fn guard(&self) -> Option<Arc<Guard>> {
        self.guard.borrow().clone()
    }

    /// The current view's fingerprint (stored with every incarnation).
    pub(crate) fn view(&self) -> u32 {
        self.view.fingerprint()
    }

    pub fn my_stats(&self) -> &ShardStats {
        &self.stats[self.id]
    }

    pub fn cluster(&self) -> Rc<Cluster> {
        self.view.cluster()
    }

    fn skew_ms(&self) -> u64 {
        self.resolved.config.timers.replica_skew_ms
    }

    /// Whether any other node exists: only then are there replicas to
    /// tell, and stale messages for tombstones to stop.
    pub fn has_peers(&self) -> bool {
        let cluster = self.cluster();
        cluster.nodes.len() + cluster.leaving.len() > 1
    }

    /// Whether stale messages can come from elsewhere (other nodes, or
    /// other sites), so that deletes and final pops leave tombstones.
    /// Whether a callback still waiting for its lane should be sent: no
    /// operation has replaced or deleted its incarnation since its pop
    /// was taken (`PopState::dispatched`).
    pub fn callback_wanted(&self, key: &CallbackKey) -> bool {
        self.pop.is_wanted(key.unique, key.version)
    }

    pub fn keeps_tombstones(&self) -> bool {
        self.has_peers() || self.resolved.sites.replicating()
    }

    fn next_version(&self) -> u64 {
        self.next_version_at(clock::unix_us())
    }

    /// [`Shard::next_version`] with the wall clock (µs) already read.
    fn next_version_at(&self, now_us: u64) -> u64 {
        let v = now_us.max(self.last_version_us.get() + 1);
        assert!(v > self.last_version_us.get(), "versions strictly increase");
        self.last_version_us.set(v);
        v
    }

    pub fn refresh_gauges(&self, store: &Store) {
        let stats = self.my_stats();
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
        if self.stats[0].catching_up.load(Ordering::Acquire) {
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
        for (name, v) in self.store.borrow().tag_values() {
            *merged.entry(name).or_default() += v;
        }
        for peer in (0..self.shards).filter(|p| *p != self.id) {
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
}

/// A shard's token bucket (with `[throttling]`): the configured bucket
/// split evenly between the shards (each admits the requests it takes).
fn throttle(resolved: &Resolved) -> Option<Throttle> {
    let t = resolved.config.throttling.as_ref()?;
    let n = resolved.shards as f64;
    let per = |v: u64| (v as f64 / n).max(1.0);
    let max_rate = match t.max_token_rate {
        0 => f64::INFINITY,
        m => per(m),
    };
    let cfg = ThrottleConfig {
        target_latency_us: t.target_latency,
        max_tokens: per(t.max_tokens),
        initial_rate: per(t.initial_token_rate),
        min_rate: per(t.min_token_rate).min(max_rate),
        max_rate,
    };
    Some(Throttle::new(cfg, Instant::now()))
}

impl Shard {
    /// Admit a client request (`false`: refuse it with 503).
    pub fn admit_client(&self) -> bool {
        let Some(t) = &self.throttle else {
            return true;
        };
        let admitted = t.admit(Instant::now());
        let s = self.my_stats();
        s.throttle_tokens
            .store(t.tokens() as i64, Ordering::Relaxed);
        s.throttle_rate.store(t.rate() as i64, Ordering::Relaxed);
        if !admitted {
            ShardStats::add(&s.throttled, 1);
        }
        admitted
    }

    /// A latency the bucket steers by: a client request's, or a pop's
    /// lateness (what a timer service promises).
    pub fn record_latency(&self, latency_us: u64) {
        if let Some(t) = &self.throttle {
            t.record(latency_us, Instant::now());
        }
    }

    /// The start of a client operation whose latency the throttle takes;
    /// `None` without a throttle (`[throttling]` off), so that no clock
    /// is read for a latency nothing uses (two reads per `POST`).
    pub fn latency_start(&self) -> Option<Instant> {
        self.throttle.as_ref().map(|_| Instant::now())
    }

    /// The throttle takes the latency since `started` ([`Shard::latency_start`]),
    /// with one clock read for both the latency and its time.
    pub fn record_latency_since(&self, started: Option<Instant>) {
        if let (Some(t), Some(started)) = (&self.throttle, started) {
            let now = Instant::now();
            let latency_us = now.saturating_duration_since(started).as_micros() as u64;
            t.record(latency_us, now);
        }
    }
}

/// The `Authorization` value internal requests carry: made once per
/// process and kept for its life (replicators hold it as `&'static`).
pub fn authorization(resolved: &Resolved) -> Option<&'static str> {
    static VALUE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let secret = resolved.config.cluster.shared_secret.as_ref();
    VALUE.get_or_init(|| secret.map(|s| s.bearer())).as_deref()
}

/// A shard's replicator to the remote sites (GR): a queue per site, with
/// the sites' own timeout.
fn sites_replicator(
    resolved: &Resolved,
    client: &Rc<Client>,
    gate: &Rc<Gate>,
    stats: &Arc<[ShardStats]>,
    id: usize,
) -> Replicator {
    let c = &resolved.config.cluster;
    let site_peers: Vec<(String, std::net::SocketAddr)> = resolved
        .sites
        .remote
        .iter()
        .map(|r| (r.address.clone(), r.socket))
        .collect();
    Replicator::new(
        &site_peers,
        ReplicatorConfig {
            queue_max: c.replication_queue_max,
            queue_bytes_max: c.replication_queue_bytes_max,
            deliver_within: Duration::from_millis(resolved.config.sites.site_deliver_within_ms),
            timeout: Duration::from_millis(resolved.config.sites.site_timeout_ms),
            sites: true,
            authorization: authorization(resolved),
        },
        client.clone(),
        gate.clone(),
        stats.clone(),
        id,
    )
}

/// Every node's `(address, socket)` in the cluster's peer order: the
/// replicator's peer list.
fn replication_peers(cluster: &Cluster) -> Vec<(String, std::net::SocketAddr)> {
    cluster
        .all_nodes()
        .map(|n| (n.address.clone(), n.socket))
        .collect()
}
