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
pub mod resync;
mod store;

pub use store::Store;

use crate::cluster::replicate::{Body, Replicator};
use crate::cluster::{address_bloom, Cluster, NODES_MAX};
use crate::config::Resolved;
use crate::http::client::Client;
use crate::runtime::clock;
use crate::runtime::mesh::{Mesh, MeshMsg, Reply};
use crate::runtime::notify::Notify;
use crate::stats::ShardStats;
use crate::timer::spec::TAGS_MAX;
use crate::timer::{shard_of, view_fingerprint, Timer, TimerHead, TimerId, TimerSpec};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Set by the signal thread; every shard watches it.
pub static SHUTDOWN: AtomicBool = AtomicBool::new(false);

/// How long a tombstone lives when nobody told it the timer's interval.
pub const TOMBSTONE_MS_DEFAULT: u64 = 10_000;

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

/// Where a timer's replicas are under the current cluster.
struct Placement {
    /// Member indices, primary first.
    replicas: [usize; NODES_MAX],
    count: usize,
    bloom: u64,
    /// This node's place in `replicas`.
    my_index: Option<u8>,
}

impl Placement {
    fn mask(&self) -> u64 {
        self.replicas[..self.count]
            .iter()
            .fold(0, |m, &r| m | (1u64 << r))
    }
}

/// Every node's `(address, socket)` in the cluster's peer order: the
/// replicator's peer list.
fn replication_peers(cluster: &Cluster) -> Vec<(String, std::net::SocketAddr)> {
    cluster
        .all_nodes()
        .map(|n| (n.address.clone(), n.socket))
        .collect()
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
    pub replicator: Replicator,
    /// Wakes the pop loop when a timer due before its current sleep arrives.
    pub pop_wake: Notify,
    /// Set while the pop loop waits for a free callback slot.
    pub pop_blocked: Cell<bool>,
    /// The deadline the pop loop sleeps until (`u64::MAX`: idle).
    pub pop_armed_ms: Cell<u64>,
    /// Wakes the accept loop at shutdown.
    pub accept_wake: Notify,
    /// Requests being handled right now (shutdown waits for them).
    pub busy: Cell<usize>,
    pub connections: Cell<usize>,
    pub shutting_down: Cell<bool>,
    /// The delay queue's shared state, when `[queue]` is configured (for
    /// readiness; the queue's tasks own their shard part).
    pub queue_shared: RefCell<Option<Arc<crate::queue::QueueShared>>>,
    /// The last version handed out (strictly increasing per shard).
    last_version_us: Cell<u64>,
    /// The cluster as this shard knows it (replaced by a reload, SIGHUP),
    /// this node's peer index in it, and its view's fingerprint.
    cluster: RefCell<Rc<Cluster>>,
    local_peer: Cell<Option<usize>>,
    view: Cell<u32>,
    /// Fingerprints of the views this shard held before, newest first
    /// (`0`: none): a message of one of these is from an older view. A view
    /// in neither list may be a newer one a peer reloaded to first.
    past_views: Cell<[u32; PAST_VIEWS_MAX]>,
}

/// Earlier cluster views a shard remembers (reloads).
const PAST_VIEWS_MAX: usize = 4;

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
        let cluster = &resolved.cluster;
        let c = &resolved.config.cluster;
        let replicator = Replicator::new(
            &replication_peers(cluster),
            c.replication_queue_max,
            Duration::from_millis(c.replication_timeout_ms),
            Duration::from_millis(resolved.config.timers.callback_connect_timeout_ms),
            stats.clone(),
            id,
        );
        let local_peer = cluster.local_peer();
        let view = view_fingerprint(cluster.view_id);
        let cluster = Rc::new(cluster.clone());
        Rc::new(Shard {
            id,
            shards,
            store: RefCell::new(store),
            stats,
            mesh,
            client,
            replicator,
            pop_wake: Notify::default(),
            pop_blocked: Cell::new(false),
            pop_armed_ms: Cell::new(u64::MAX),
            accept_wake: Notify::default(),
            busy: Cell::new(0),
            connections: Cell::new(0),
            shutting_down: Cell::new(false),
            queue_shared: RefCell::new(None),
            last_version_us: Cell::new(0),
            cluster: RefCell::new(cluster),
            local_peer: Cell::new(local_peer),
            view: Cell::new(view),
            past_views: Cell::new([0; PAST_VIEWS_MAX]),
            resolved,
        })
    }

    /// Take a new cluster view (a reload): replicas, replication peers and
    /// the conflict rules follow it from now on. Timers already stored keep
    /// their placement until their next pop or update re-places them
    /// (passive rebalancing, seed 001).
    pub fn set_cluster(&self, cluster: &Cluster) {
        self.replicator.set_peers(&replication_peers(cluster));
        self.local_peer.set(cluster.local_peer());
        let (old, new) = (self.view.get(), view_fingerprint(cluster.view_id));
        if old != new {
            let mut past = self.past_views.get();
            past.rotate_right(1);
            past[0] = old;
            // A view returned to is current again, not past.
            for v in past.iter_mut().filter(|v| **v == new) {
                *v = 0;
            }
            self.past_views.set(past);
        }
        self.view.set(new);
        *self.cluster.borrow_mut() = Rc::new(cluster.clone());
    }

    /// The current view's fingerprint (stored with every incarnation).
    pub(crate) fn view(&self) -> u32 {
        self.view.get()
    }

    pub fn my_stats(&self) -> &ShardStats {
        &self.stats[self.id]
    }

    pub fn cluster(&self) -> Rc<Cluster> {
        self.cluster.borrow().clone()
    }

    fn skew_ms(&self) -> u64 {
        self.resolved.config.timers.replica_skew_ms
    }

    /// Whether any other node exists: only then are there replicas to
    /// tell, and stale messages for tombstones to stop.
    pub fn has_peers(&self) -> bool {
        self.cluster().nodes.len() + self.cluster().leaving.len() > 1
    }

    /// The addresses of a replica list (member indices), in order.
    fn replica_names<'c>(cluster: &'c Cluster, replicas: &[usize]) -> [&'c str; NODES_MAX] {
        let mut names = [""; NODES_MAX];
        for (slot, &r) in names.iter_mut().zip(replicas) {
            *slot = &cluster.nodes[r].address;
        }
        names
    }

    fn next_version(&self) -> u64 {
        let v = clock::unix_us().max(self.last_version_us.get() + 1);
        self.last_version_us.set(v);
        v
    }

    fn replication_factor(&self, spec: &TimerSpec) -> usize {
        let asked = spec
            .replication_factor
            .unwrap_or(self.resolved.config.timers.default_replication_factor);
        (asked as usize).clamp(1, self.cluster().nodes.len())
    }

    fn placement(&self, unique: u64, factor: usize) -> Placement {
        let cluster = self.cluster();
        let mut replicas = [0usize; NODES_MAX];
        let count = cluster.replicas_into(unique, factor, &mut replicas);
        let bloom = cluster.bloom_of(&replicas[..count]);
        let my_index = cluster
            .local
            .and_then(|me| replicas[..count].iter().position(|r| *r == me))
            .map(|i| i as u8);
        Placement {
            replicas,
            count,
            bloom,
            my_index,
        }
    }

    fn without_me(&self, mask: u64) -> u64 {
        match self.local_peer.get() {
            Some(me) => mask & !(1u64 << me),
            None => mask,
        }
    }

    fn client_head(&self, id: TimerId, spec: &TimerSpec, pl: &Placement) -> TimerHead {
        TimerHead {
            id,
            start_ms: clock::now_ms_ceil(),
            version: self.next_version(),
            interval_ms: spec.interval_ms,
            repeat_for_ms: spec.repeat_for_ms,
            sequence: 0,
            view: self.view(),
            replica_index: pl.my_index.unwrap_or(0),
            replication_factor: pl.count as u8,
        }
    }

    // ---- client operations (this node took the request) ----

    /// `POST /timers`: a new timer with an ID owned by this shard, stored
    /// here if this node is a replica (a tombstone otherwise) and replicated
    /// to the other replicas.
    pub fn create(&self, spec: &TimerSpec) -> Result<TimerId, OpError> {
        let unique = self.store.borrow_mut().ids.next(clock::unix_ms());
        let pl = self.placement(unique, self.replication_factor(spec));
        let id = TimerId {
            unique,
            bloom: pl.bloom,
        };
        let head = self.client_head(id, spec, &pl);
        let local = pl.my_index.map(|_| spec);
        self.apply(head, local, true)?;
        self.replicate_spec(&head, spec, &pl, self.without_me(pl.mask()));
        Ok(id)
    }

    /// `PUT /timers/<id>` from a client: the new replicas get the timer, and
    /// old replicas named by the ID's bloom filter that are no longer
    /// replicas get it as a tombstone (passive rebalancing, seed 001).
    pub async fn client_update(
        &self,
        id: TimerId,
        spec: TimerSpec<'_>,
    ) -> Result<TimerId, OpError> {
        let pl = self.placement(id.unique, self.replication_factor(&spec));
        let new_id = TimerId {
            unique: id.unique,
            bloom: pl.bloom,
        };
        let head = self.client_head(new_id, &spec, &pl);
        let targets = self.without_me(pl.mask() | self.cluster().bloom_matches(id.bloom));
        self.replicate_spec(&head, &spec, &pl, targets);
        let local = pl.my_index.map(|_| spec);
        self.route_apply(head, local, true).await?;
        Ok(new_id)
    }

    /// `DELETE /timers/<id>` from a client: a tombstone here and on every
    /// node the ID names. Idempotent.
    pub async fn client_delete(&self, id: TimerId) -> Result<(), OpError> {
        let head = TimerHead {
            id,
            start_ms: clock::now_ms_ceil(),
            version: self.next_version(),
            interval_ms: 0,
            repeat_for_ms: 0,
            sequence: 0,
            view: self.view(),
            replica_index: 0,
            replication_factor: 1,
        };
        let named = self.cluster().bloom_matches(id.bloom);
        let targets = self.without_me(named);
        if targets != 0 {
            let cluster = self.cluster();
            let mut names = [""; NODES_MAX];
            let mut n = 0;
            for (i, node) in cluster.all_nodes().enumerate() {
                if named & (1u64 << i) != 0 {
                    names[n] = &node.address;
                    n += 1;
                }
            }
            let body = Body {
                interval_ms: 0,
                repeat_for_ms: 0,
                start_time_delta_ms: 0,
                sequence: 0,
                version_us: head.version,
                uri: "",
                opaque: "",
                view_id: cluster.view_id,
                replicas: &names[..n],
                tags: &[],
            };
            self.send_to(targets, id, &body);
        }
        self.route_apply(head, None, true).await
    }

    /// A replication `PUT` from another node (the body names `replicas`):
    /// applied here under the conflict rules, never forwarded again.
    pub async fn replica_update(
        &self,
        id: TimerId,
        spec: TimerSpec<'_>,
    ) -> Result<TimerId, OpError> {
        let r = spec
            .replication
            .as_ref()
            .expect("replica_update is called for replication bodies");
        let cluster = self.cluster();
        let now = clock::now_ms_ceil();
        let start_ms = (now as i64 + r.start_time_delta_ms).max(0) as u64;
        let version = r.version_us.unwrap_or_else(|| {
            (clock::unix_us() as i64 + r.start_time_delta_ms * 1000).max(0) as u64
        });
        let my_index = r
            .replicas
            .iter()
            .position(|a| *a == cluster.local_address)
            .map(|i| i as u8);
        let bloom = r.replicas.iter().fold(0u64, |b, a| {
            b | cluster
                .peer_of(a)
                .map(|p| cluster.node_at(p).bloom)
                .unwrap_or_else(|| address_bloom(a))
        });
        let view = match r.cluster_view_id.as_deref() {
            None => self.view(),
            Some(text) => text.parse::<u64>().map(view_fingerprint).unwrap_or(0),
        };
        let head = TimerHead {
            id: TimerId {
                unique: id.unique,
                bloom,
            },
            start_ms,
            version,
            interval_ms: spec.interval_ms,
            repeat_for_ms: spec.repeat_for_ms,
            sequence: r.sequence_number,
            view,
            replica_index: my_index.unwrap_or(0),
            replication_factor: r.replicas.len().min(u8::MAX as usize) as u8,
        };
        ShardStats::add(&self.my_stats().replication_received, 1);
        let local = if my_index.is_some() && !spec.is_tombstone() {
            Some(spec)
        } else {
            None
        };
        self.route_apply(head, local, false).await?;
        Ok(head.id)
    }

    /// Send the replication message for a client operation to `targets`.
    fn replicate_spec(&self, head: &TimerHead, spec: &TimerSpec, pl: &Placement, targets: u64) {
        if targets == 0 {
            return;
        }
        let cluster = self.cluster();
        let names = Self::replica_names(&cluster, &pl.replicas[..pl.count]);
        let mut tags = [("", 0u32); TAGS_MAX];
        let tag_count = spec.tags.len().min(TAGS_MAX);
        for (slot, (name, count)) in tags.iter_mut().zip(&spec.tags) {
            *slot = (name.as_ref(), *count);
        }
        let body = Body {
            interval_ms: head.interval_ms,
            repeat_for_ms: head.repeat_for_ms,
            start_time_delta_ms: head.start_ms as i64 - clock::now_ms() as i64,
            sequence: head.sequence,
            version_us: head.version,
            uri: &spec.uri,
            opaque: &spec.opaque,
            view_id: cluster.view_id,
            replicas: &names[..pl.count],
            tags: &tags[..tag_count],
        };
        self.send_to(targets, head.id, &body);
    }

    fn send_to(&self, targets: u64, id: TimerId, body: &Body<'_>) {
        let mut rest = targets;
        while rest != 0 {
            let peer = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            self.replicator.send(peer, id, body);
        }
    }

    /// After a successful callback: tell the other replicas that pop
    /// `sequence` is done (or, after the final pop, send them a tombstone),
    /// so that they skip it. Nothing is sent when the timer has since been
    /// replaced or deleted: that operation replicated itself.
    ///
    /// Passive rebalancing (seed 001): the message goes to the timer's
    /// replicas under the current cluster view and to every node its ID
    /// names, and this node's own copy is re-placed under the current view:
    /// a tombstone if this node is no longer one of its replicas, re-skewed
    /// if its place in the list changed.
    pub fn replicate_pop(&self, unique: u64, version: u64, sequence: u32) {
        if !self.has_peers() {
            return;
        }
        let Some(pl) = self.send_pop(unique, version, sequence) else {
            return;
        };
        let mut store = self.store.borrow_mut();
        let Some((_, t)) = store.get(unique) else {
            return;
        };
        let view = self.view();
        let placed = t.view == view && t.bloom == pl.bloom && pl.my_index == Some(t.replica_index);
        if placed || t.is_tombstone() {
            return;
        }
        let mut timer = store.remove(unique).expect("just found");
        timer.view = view;
        timer.bloom = pl.bloom;
        let due_ms = match pl.my_index {
            Some(index) => {
                timer.replica_index = index;
                timer.next_pop_ms(self.skew_ms())
            }
            None => {
                // No longer a replica: a tombstone of the current view, so
                // a late message from a node still on the old view cannot
                // bring the timer back here.
                timer = timer.to_tombstone();
                clock::now_ms() + self.tombstone_life_ms(&timer)
            }
        };
        store.insert(due_ms, timer);
        if due_ms < self.pop_armed_ms.get() {
            self.pop_wake.notify();
        }
        self.refresh_gauges(&store);
    }

    /// The replication half of [`Shard::replicate_pop`]: the placement
    /// under the current view, or `None` if the timer has moved on.
    fn send_pop(&self, unique: u64, version: u64, sequence: u32) -> Option<Placement> {
        let store = self.store.borrow();
        let (_, t) = store.get(unique)?;
        if t.version != version || t.sequence != sequence {
            return None;
        }
        let pl = self.placement(unique, t.replication_factor as usize);
        let targets = self.without_me(pl.mask() | self.cluster().bloom_matches(t.bloom));
        if targets == 0 {
            return Some(pl);
        }
        let cluster = self.cluster();
        let names = Self::replica_names(&cluster, &pl.replicas[..pl.count]);
        let mut tags = [("", 0u32); TAGS_MAX];
        let mut tag_count = 0;
        for (slot, (index, count)) in tags.iter_mut().zip(t.tags()) {
            *slot = (store.tag_name(index), count);
            tag_count += 1;
        }
        let body = Body {
            interval_ms: t.interval_ms,
            repeat_for_ms: t.repeat_for_ms,
            start_time_delta_ms: t.start_ms as i64 - clock::now_ms() as i64,
            sequence: t.sequence,
            version_us: t.version,
            uri: t.uri(),
            opaque: t.opaque(),
            view_id: cluster.view_id,
            replicas: &names[..pl.count],
            tags: &tags[..tag_count],
        };
        self.send_to(targets, t.id(), &body);
        Some(pl)
    }

    // ---- the store (runs on the owning shard) ----

    /// The conflict rules between a stored incarnation and an incoming one
    /// from another node: the current cluster view beats one this shard
    /// held before (a view it never held may be newer, and is not judged by
    /// view); then the newer version (client operation) wins; then the higher sequence
    /// (more pops done); at a tie a tombstone beats a live copy. A client
    /// operation on this node always wins and does not come here.
    fn replaces(&self, new: &TimerHead, new_tomb: bool, old: &TimerHead, old_tomb: bool) -> bool {
        if new.view != old.view {
            if new.view == self.view() {
                return true;
            }
            // The current view beats an older one. A view this shard never
            // held may be newer (a peer reloaded first): the version and
            // sequence decide, so a pop replicated in the window between two
            // nodes' reloads is not popped again.
            let past = self.past_views.get();
            if old.view == self.view() && (new.view == 0 || past.contains(&new.view)) {
                return false;
            }
        }
        if new.version != old.version {
            return new.version > old.version;
        }
        if new.sequence != old.sequence {
            return new.sequence > old.sequence;
        }
        new_tomb && !old_tomb
    }

    /// How long a tombstone is kept: one more interval, plus every
    /// replica's skew, so stale messages from slower replicas find it.
    pub fn tombstone_life_ms(&self, t: &Timer) -> u64 {
        let interval = if t.interval_ms == 0 {
            TOMBSTONE_MS_DEFAULT
        } else {
            t.interval_ms as u64
        };
        interval + self.skew_ms() * t.replication_factor.max(1) as u64
    }

    /// Store an incarnation (`spec: None` or an empty callback: a tombstone)
    /// on the shard that owns its ID.
    pub fn apply(
        &self,
        head: TimerHead,
        spec: Option<&TimerSpec>,
        from_client: bool,
    ) -> Result<(), OpError> {
        debug_assert_eq!(shard_of(head.id.unique, self.shards), self.id);
        let unique = head.id.unique;
        let tombstone = spec.is_none_or(|s| s.is_tombstone());
        let mut store = self.store.borrow_mut();
        let stats = self.my_stats();
        let existing = store
            .get(unique)
            .map(|(due, t)| (due, t.head(), t.is_tombstone()));
        if let Some((_, old, old_tomb)) = &existing {
            if !from_client && !self.replaces(&head, tombstone, old, *old_tomb) {
                ShardStats::add(&stats.replication_stale, 1);
                return Ok(());
            }
        } else if store.len() >= self.resolved.config.timers.timers_per_shard_max {
            return Err(OpError::new(
                503,
                "timer capacity of this shard is exhausted",
            ));
        }
        let mut timer = match spec {
            Some(s) if !tombstone => {
                let mut tags = [(0u32, 0u32); TAGS_MAX];
                let n = if s.tags.is_empty() {
                    0
                } else {
                    store.intern_tags(&s.tags, &mut tags)
                };
                Timer::new(head, &s.uri, &s.opaque, &tags[..n])
            }
            _ => Timer::new(head, "", "", &[]),
        };
        let old = if existing.is_some() {
            store.remove(unique)
        } else {
            None
        };
        let old_live = old.as_ref().is_some_and(|t| !t.is_tombstone());
        if from_client {
            match (tombstone, old_live) {
                (false, false) => ShardStats::add(&stats.timers_created, 1),
                (false, true) => ShardStats::add(&stats.timers_updated, 1),
                (true, true) => ShardStats::add(&stats.timers_deleted, 1),
                (true, false) => {}
            }
        }
        let now = clock::now_ms();
        let due = if timer.is_tombstone() || !timer.has_next_pop() {
            if !self.has_peers() {
                self.refresh_gauges(&store);
                return Ok(());
            }
            if !timer.is_tombstone() {
                timer = timer.to_tombstone();
            }
            if timer.interval_ms == 0 {
                if let Some(o) = &old {
                    timer.interval_ms = o.interval_ms;
                    timer.repeat_for_ms = o.repeat_for_ms;
                    timer.replication_factor = o.replication_factor;
                }
            }
            let old_due = existing.map(|(d, _, _)| d).unwrap_or(0);
            old_due.max(now) + self.tombstone_life_ms(&timer)
        } else {
            timer.next_pop_ms(self.skew_ms())
        };
        store.insert(due, timer);
        self.refresh_gauges(&store);
        drop(store);
        if due < self.pop_armed_ms.get() {
            self.pop_wake.notify();
        }
        Ok(())
    }

    pub fn refresh_gauges(&self, store: &Store) {
        let stats = self.my_stats();
        stats
            .timers_pending
            .store(store.len() as i64, Ordering::Relaxed);
        stats
            .tombstones
            .store(store.tombstones() as i64, Ordering::Relaxed);
    }

    /// Apply where the timer lives: here, or on its owner over the mesh.
    pub async fn route_apply(
        &self,
        head: TimerHead,
        spec: Option<TimerSpec<'_>>,
        from_client: bool,
    ) -> Result<(), OpError> {
        let owner = shard_of(head.id.unique, self.shards);
        if owner == self.id {
            return self.apply(head, spec.as_ref(), from_client);
        }
        ShardStats::add(&self.my_stats().mesh_forwarded, 1);
        match self
            .mesh
            .ask(owner, |reply| MeshMsg::Apply {
                head,
                spec: spec.map(|s| Box::new(s.into_owned())),
                from_client,
                reply,
            })
            .await
        {
            Some(Reply::Applied(r)) => r,
            _ => Err(OpError::new(503, "owning shard is unavailable")),
        }
    }

    /// Readiness: every shard listening and, with `[queue]`, every shard's
    /// Postgres connection up and the broker answering. `Err` lists what
    /// is not ready.
    pub fn readiness(&self) -> Result<(), String> {
        let mut missing = Vec::new();
        let down = self
            .stats
            .iter()
            .filter(|s| !s.up.load(Ordering::Relaxed))
            .count();
        if down > 0 {
            missing.push(format!("{down} shard(s) not listening"));
        }
        if let Some(q) = self.queue_shared.borrow().as_ref() {
            let pg_down = self
                .stats
                .iter()
                .filter(|s| !s.pg_up.load(Ordering::Relaxed))
                .count();
            if pg_down > 0 {
                missing.push(format!("Postgres not connected on {pg_down} shard(s)"));
            }
            if !q.kafka_up.load(Ordering::Relaxed) {
                missing.push("Kafka broker not answering".to_string());
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("; "))
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
            MeshMsg::Apply {
                head,
                spec,
                from_client,
                reply,
            } => {
                let _ = reply.send(Reply::Applied(self.apply(
                    head,
                    spec.as_deref(),
                    from_client,
                )));
            }
            MeshMsg::Resync { query, reply } => {
                let _ = reply.send(Reply::Resync(self.resync_local(query)));
            }
            MeshMsg::DropReference { unique, reply } => {
                let _ = reply.send(Reply::Dropped(self.drop_reference(unique)));
            }
            MeshMsg::Tags { reply } => {
                let _ = reply.send(Reply::Tags(self.store.borrow().tag_values()));
            }
        }
    }
}

pub use pop::pop_loop;
