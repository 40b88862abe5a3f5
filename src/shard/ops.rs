//! Timer operations on a shard: what a client's `POST`/`PUT`/`DELETE` and
//! another node's replication `PUT` do, and `apply`, which stores one
//! incarnation on the shard that owns its ID under the conflict rules.

use super::conflict::{self, Source};
use super::error::OpError;
use super::mesh::{MeshMsg, Reply};
use super::replication::{body_of, ext_of, TOMBSTONE};
use super::view::Placement;
use super::Shard;
use crate::cluster::acks::Ticket;
use crate::cluster::sites::{Sites, SITES_NONE};
use crate::cluster::{address_bloom, NODES_MAX};
use crate::runtime::clock;
use crate::stats::ShardStats;
use crate::timer::spec::TAGS_MAX;
use crate::timer::timing::{first_cursor, TimingKind, CURSOR_NONE};
use crate::timer::{shard_of, view_fingerprint, Timer, TimerHead, TimerId, TimerSpec};
use std::time::Duration;

/// How long a tombstone lives when nobody told it the timer's interval.
pub const TOMBSTONE_MS_DEFAULT: u64 = 10_000;
/// A replication body's bytes besides its callback, tags and replicas
/// (timing, version, view, field names), over-estimated.
const BODY_BYTES_BASE: usize = 512;

impl Shard {
    /// The factor a client asked for (or the default). It is kept with
    /// the timer; placement caps it at the cluster size of the moment.
    pub(super) fn factor_requested(&self, spec: &TimerSpec) -> u8 {
        spec.replication_factor
            .unwrap_or(self.default_factor())
            .max(1)
    }

    /// `default-replication-factor`, capped as the codec caps a requested
    /// one (no cluster has more nodes; a timer record keeps 7 bits).
    pub(super) fn default_factor(&self) -> u8 {
        let factor = self.base.resolved.config.timers.default_replication_factor;
        factor.min(crate::timer::NODES_MAX as u8)
    }

    pub(super) fn placement(&self, unique: u64, factor: usize) -> Placement {
        Placement::of(&self.timers.cluster(), unique, factor)
    }

    pub(super) fn without_me(&self, mask: u64) -> u64 {
        self.timers.view.without_me(mask)
    }

    /// The head of a client's incarnation; `now_us`: the wall clock
    /// (`clock::unix_us`) the version comes from.
    fn client_head(&self, id: TimerId, spec: &TimerSpec, pl: &Placement, now_us: u64) -> TimerHead {
        let factor_requested = self.factor_requested(spec);
        assert!(
            pl.count <= factor_requested as usize,
            "placement caps the factor"
        );
        let mut head = TimerHead {
            id,
            start_ms: clock::now_ms_ceil(),
            version: self.timers.next_version_at(now_us),
            interval_ms: spec.interval_ms,
            repeat_for_ms: spec.repeat_for_ms,
            sequence: 0,
            view: self.timers.view(),
            replica_index: pl.my_index.unwrap_or(0),
            replication_factor: pl.count as u8,
            factor_requested,
            site_index: 0,
            sites: self.base.resolved.sites.own_list(),
        };
        if spec.timing.is_some() {
            timed_head(&mut head, spec);
        }
        head
    }

    // ---- client operations (this node took the request) ----

    /// `POST /timers`: a new timer with an ID owned by this shard, stored
    /// here if this node is a replica and replicated to the other replicas.
    /// A node that is not a replica keeps nothing: the ID is new, so there
    /// is nothing here for a tombstone to supersede; the answer then waits
    /// for a replica ([`Shard::replica_acked`] with the ticket returned;
    /// 0 when this node is a replica).
    pub fn create(&self, spec: &TimerSpec) -> Result<(TimerId, Ticket), OpError> {
        // One wall-clock read for the ID's ms and the version's µs.
        let now_us = clock::unix_us();
        let unique = self.timers.store.borrow_mut().ids.next(now_us / 1000);
        assert_eq!(
            shard_of(unique, self.base.shards),
            self.base.id,
            "a POST never hops"
        );
        let mut pl = Placement::empty();
        pl.fill(
            &self.timers.cluster(),
            unique,
            self.factor_requested(spec) as usize,
        );
        let id = TimerId {
            unique,
            bloom: pl.bloom,
        };
        let head = self.client_head(id, spec, &pl, now_us);
        self.check_backed(&pl, spec)?;
        if pl.my_index.is_some() {
            self.apply(head, Some(spec), Source::Client)?;
        } else {
            ShardStats::add(&self.base.my_stats().timers_created, 1);
        }
        let ticket = self.open_ticket(pl.my_index.is_none());
        self.replicate_spec(&head, spec, &pl, self.without_me(pl.mask()), true);
        self.outbound.replicator.acks().close_queueing();
        Ok((id, ticket))
    }

    /// A ticket for the replication queued next, when this node is not a
    /// replica (`needed`); 0 otherwise.
    fn open_ticket(&self, needed: bool) -> Ticket {
        match needed && self.has_peers() {
            true => self.outbound.replicator.acks().open(),
            false => 0,
        }
    }

    /// Wait until a replica took a message of `ticket` (0: at once): a
    /// node that is not one of a timer's replicas answers a client's
    /// change only once a replica holds it (issue 37). Bounded by twice
    /// `replication-timeout-ms` (a batch's timeout and a retry's); a `503`
    /// after it says the change is still queued for the replicas.
    pub async fn replica_acked(&self, id: TimerId, ticket: Ticket) -> Result<(), OpError> {
        if ticket == 0 {
            return Ok(());
        }
        let bound_ms = 2 * self.base.resolved.config.cluster.replication_timeout_ms;
        // A reused timer: no allocation on this path when it goes well.
        let limit = crate::runtime::sleep::sleep(Duration::from_millis(bound_ms));
        let acked = async { Some(self.outbound.replicator.acks().wait(ticket).await) };
        let timed_out = async {
            limit.await;
            None
        };
        let outcome = futures_lite::future::or(acked, timed_out).await;
        let id = || String::from_utf8_lossy(&id.to_hex()).into_owned();
        match outcome {
            Some(Ok(())) => Ok(()),
            Some(Err(())) => Err(OpError::new(
                503,
                format!("timer {}: this node is not one of its replicas, and every replica refused its replication or it could not be queued: not stored; retry later", id()),
            )),
            None => Err(OpError::new(
                503,
                format!("timer {}: this node is not one of its replicas, and none acknowledged its replication within {bound_ms} ms; it stays queued for them and may still take effect (repeat it, or DELETE the ID, to be sure)", id()),
            )),
        }
    }

    /// A node that is not one of a timer's replicas keeps nothing of it
    /// that pops, and cannot repair a replica from what it keeps, so its
    /// client's change must reach every replica's replication queue:
    /// refuse (503) rather than answer 200 for a change a replica could
    /// miss for good (issue 37's review: 19 of 24 deletes through a
    /// non-replica were dropped at a full queue and undone).
    fn check_backed(&self, pl: &Placement, spec: &TimerSpec) -> Result<(), OpError> {
        // The body's size, over-estimated (escapes, tags, replica list).
        // JSON escapes take at most 6 bytes per byte (`\u00XX`).
        let bytes = BODY_BYTES_BASE
            + 6 * spec.uri.len()
            + 6 * spec.opaque.len()
            + 64 * spec.tags.len()
            + 32 * pl.count
            + spec
                .timing
                .as_ref()
                .map_or(0, |t| 64 + 6 * (t.text.len() + t.zone.len()));
        self.check_queued(pl, bytes)
    }

    /// [`Shard::check_backed`] for a message of about `bytes`.
    fn check_queued(&self, pl: &Placement, bytes: usize) -> Result<(), OpError> {
        let replicas = self.without_me(pl.mask());
        if pl.my_index.is_some()
            || replicas == 0
            || self.outbound.replicator.can_queue(replicas, bytes)
        {
            return Ok(());
        }
        Err(OpError::new(
            503,
            "this node is not one of the timer's replicas and the replication queue to one of them is full (replication-queue-max, replication-queue-bytes-max): not stored; retry later",
        ))
    }

    /// `PUT /timers/<id>` from a client: the new replicas get the timer, and
    /// every other node that may hold a copy (see [`Shard::holders`]) gets
    /// it as a tombstone (passive rebalancing, seed 001). Applied first on
    /// the owner shard, whose stored copy names the factor it was placed
    /// with.
    pub async fn client_update(
        &self,
        id: TimerId,
        spec: TimerSpec<'_>,
    ) -> Result<TimerId, OpError> {
        let pl = self.placement(id.unique, self.factor_requested(&spec) as usize);
        let new_id = TimerId {
            unique: id.unique,
            bloom: pl.bloom,
        };
        let head = self.client_head(new_id, &spec, &pl, clock::unix_us());
        self.check_backed(&pl, &spec)?;
        let local = pl.my_index.map(|_| spec.clone());
        let stored_factor = self.route_apply(head, local, Source::Client).await?;
        // A reload may have come during the await: the replicas are placed
        // and named under the view of now (a placement of the old view
        // named members the new one no longer had: a panic in the soak).
        let pl = self.placement(id.unique, self.factor_requested(&spec) as usize);
        // The ticket covers the new replicas' messages only: a holder that
        // is no longer one keeps a tombstone, which holds nothing to pop.
        let replicas = self.without_me(pl.mask());
        let others = self.without_me(self.holders(id, stored_factor)) & !replicas;
        let ticket = self.open_ticket(pl.my_index.is_none());
        self.replicate_spec(&head, &spec, &pl, replicas, true);
        self.outbound.replicator.acks().close_queueing();
        self.replicate_spec(&head, &spec, &pl, others, false);
        self.replica_acked(new_id, ticket).await?;
        Ok(new_id)
    }

    /// `DELETE /timers/<id>` from a client: a tombstone here and on every
    /// node that may hold a copy (see [`Shard::holders`]). Idempotent. A
    /// node that is not one of the timer's replicas answers once a replica
    /// took it, and refuses (503) when a replica's queue is full.
    pub async fn client_delete(&self, id: TimerId) -> Result<(), OpError> {
        let head = TimerHead {
            id,
            start_ms: clock::now_ms_ceil(),
            version: self.timers.next_version(),
            interval_ms: 0,
            repeat_for_ms: 0,
            sequence: 0,
            view: self.timers.view(),
            replica_index: 0,
            replication_factor: 1,
            factor_requested: self.default_factor(),
            site_index: 0,
            sites: self.base.resolved.sites.own_list(),
        };
        let named = self.timers.cluster().bloom_matches(id.bloom);
        let guess = self.default_factor().max(named.count_ones() as u8) as usize;
        self.check_queued(
            &self.placement(id.unique, guess),
            BODY_BYTES_BASE + 32 * NODES_MAX,
        )?;
        let stored_factor = self.route_apply(head, None, Source::Client).await?;
        let factor = self.default_factor().max(stored_factor) as usize;
        let pl = self.placement(id.unique, factor);
        let holders = self.holders(id, stored_factor);
        let replicas = self.without_me(pl.mask());
        // The ticket covers the replicas' messages only (as an update's).
        let ticket = self.open_ticket(pl.my_index.is_none());
        self.send_delete(&head, holders, replicas);
        self.outbound.replicator.acks().close_queueing();
        self.send_delete(&head, holders, self.without_me(holders) & !replicas);
        self.send_to_sites(&head, TOMBSTONE, &[]);
        self.replica_acked(id, ticket).await
    }

    /// Queue a delete's tombstone for `targets`, naming `holders`.
    fn send_delete(&self, head: &TimerHead, holders: u64, targets: u64) {
        if targets == 0 {
            return;
        }
        let cluster = self.timers.cluster();
        let mut names = [""; NODES_MAX];
        let mut n = 0;
        for (i, node) in cluster.all_nodes().enumerate() {
            if holders & (1u64 << i) != 0 {
                names[n] = &node.address;
                n += 1;
            }
        }
        self.send_replication(&cluster, head, TOMBSTONE, &[], &names[..n], targets);
    }

    /// Every node of the current view that may hold a copy of `id`, as a
    /// peer mask: the nodes the ID names (its first replicas), and its
    /// replicas under the current view and under the view before the last
    /// reload, placed with the largest factor it may have: the default,
    /// the count the ID names, and `stored_factor` (what this node's copy
    /// asked for; 0 if none). A resync places a timer with its own factor,
    /// so a delete placed with the default alone missed the replicas a
    /// grow gave a timer of a larger factor (issue 37).
    pub(super) fn holders(&self, id: TimerId, stored_factor: u8) -> u64 {
        let cluster = self.timers.cluster();
        let named = cluster.bloom_matches(id.bloom);
        let factor = self
            .default_factor()
            .max(stored_factor)
            .max(named.count_ones() as u8) as usize;
        let mut mask = named | self.placement(id.unique, factor).mask();
        if let Some(before) = self.timers.view.previous() {
            for r in Placement::of(&before, id.unique, factor).members() {
                let address = &before.node_at(*r).address;
                if let Some(peer) = cluster.peer_of(address) {
                    mask |= 1u64 << peer;
                }
            }
        }
        mask
    }

    /// A replication `PUT` from another node (the body names `replicas`):
    /// applied here under the conflict rules, never forwarded again.
    pub async fn replica_update(
        &self,
        id: TimerId,
        spec: TimerSpec<'_>,
    ) -> Result<TimerId, OpError> {
        let (head, is_replica) = self.replica_head(id, &spec);
        ShardStats::add(&self.base.my_stats().replication_received, 1);
        let source = source_of(&spec);
        let local = (is_replica && !spec.is_tombstone()).then_some(spec);
        self.route_apply(head, local, source).await?;
        Ok(head.id)
    }

    /// A `PUT` from another site (GR: the body names `sites` but not
    /// `replicas`): this site places the timer among its own nodes under
    /// its current view, replicates it to them, and keeps it if this node
    /// is one of them. Never sent on to another site. Deletes and pops
    /// arrive the same way; the conflict rules sort them out.
    pub async fn site_update(&self, id: TimerId, spec: TimerSpec<'_>) -> Result<TimerId, OpError> {
        let default = self.default_factor();
        let factor = spec.replication_factor.unwrap_or(default).max(1);
        // A tombstone names no factor worth trusting: reach every replica
        // the default factor would have.
        let factor = if spec.is_tombstone() {
            factor.max(default)
        } else {
            factor
        };
        let pl = self.placement(id.unique, factor as usize);
        let (mut head, _) = self.replica_head(id, &spec);
        head.id.bloom = pl.bloom;
        head.view = self.timers.view();
        head.replica_index = pl.my_index.unwrap_or(0);
        head.replication_factor = pl.count as u8;
        head.factor_requested = factor;
        ShardStats::add(&self.base.my_stats().site_received, 1);
        let mut targets = pl.mask();
        if spec.is_tombstone() {
            targets |= self.timers.cluster().bloom_matches(id.bloom);
        }
        let cluster = self.timers.cluster();
        let (names, n) = pl.names(&cluster);
        let tags: Vec<(&str, u32)> = spec.tags.iter().map(|(t, c)| (t.as_ref(), *c)).collect();
        let ext = ext_of(&spec, &head);
        let callback = (spec.uri.as_ref(), spec.opaque.as_ref(), &ext[..]);
        let targets = self.without_me(targets);
        let source = source_of(&spec);
        if targets != 0 {
            let sites = self.base.resolved.sites.names(head.sites);
            let mut body = body_of(&head, callback, &tags, &names[..n], &sites, cluster.view_id);
            body.only_newer = source == Source::PeerIfNewer;
            // Another site's report of a pop's attempts: every replica
            // here watches it.
            body.attempt = spec
                .replication
                .as_ref()
                .and_then(|r| r.attempt.as_deref().copied());
            self.send_body(head.id, &body, targets);
        }
        if pl.my_index.is_some() {
            self.route_apply(head, Some(spec), source).await?;
        }
        Ok(head.id)
    }

    /// The head a replication body describes, as this node stores it, and
    /// whether this node is one of the `replicas` it names.
    pub(super) fn replica_head(&self, id: TimerId, spec: &TimerSpec) -> (TimerHead, bool) {
        let r = spec
            .replication
            .as_ref()
            .expect("replica_update is called for replication bodies");
        let cluster = self.timers.cluster();
        let now = clock::now_ms_ceil();
        let delta_ms = r
            .start_time_delta_ms
            .clamp(-(now as i64), i64::MAX - now as i64);
        let start_ms = (now as i64 + delta_ms).max(0) as u64;
        let version = r.version_us.unwrap_or_else(|| {
            let delta_us = delta_ms.saturating_mul(1000);
            (clock::unix_us() as i64).saturating_add(delta_us).max(0) as u64
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
            None => self.timers.view(),
            Some(text) => text.parse::<u64>().map(view_fingerprint).unwrap_or(0),
        };
        let mut head = TimerHead {
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
            factor_requested: spec
                .replication_factor
                .unwrap_or(r.replicas.len().min(u8::MAX as usize) as u8),
            site_index: 0,
            sites: SITES_NONE,
        };
        if let Some(start) = spec.timing.as_ref().and_then(|t| t.start_unix_ms) {
            // An absolute start (issue 42): no drift by the transit.
            // Bounded as a delta's start is, so no due time overflows.
            head.start_ms = clock::unix_to_engine(start.clamp(0, i64::MAX / 4) as u64);
        }
        let sites = &self.base.resolved.sites;
        if !r.sites.is_empty() {
            head.sites = sites.pack_names(r.sites.iter().map(|s| s.as_ref()));
            head.site_index = Sites::local_position(head.sites).unwrap_or(r.sites.len() as u8);
        }
        (head, my_index.is_some())
    }

    // ---- the store (runs on the owning shard) ----

    /// How long a tombstone is kept: one more interval, plus every
    /// replica's skew, so stale messages from slower replicas find it; and
    /// never less than the latest a replication message can still arrive
    /// (`replication-deliver-within-ms` + `replication-timeout-ms`), so a
    /// create retried behind a delete cannot bring the timer back.
    pub fn tombstone_life_ms(&self, t: &Timer) -> u64 {
        let interval = if t.interval_ms == 0 {
            TOMBSTONE_MS_DEFAULT
        } else {
            t.interval_ms as u64
        };
        // Another node's or site's create can be retried this long behind
        // a delete.
        let late_ms_max = self.replication_late_ms_max();
        (interval + self.base.skew_ms() * t.replication_factor().max(1) as u64).max(late_ms_max)
    }

    /// Store an incarnation (`spec: None` or an empty callback: a tombstone)
    /// on the shard that owns its ID. Returns the replication factor the
    /// copy stored before asked for (0: none), which tells a client's
    /// update or delete where a resync may have placed the timer.
    pub fn apply(
        &self,
        head: TimerHead,
        spec: Option<&TimerSpec>,
        source: Source,
    ) -> Result<u8, OpError> {
        assert_eq!(
            shard_of(head.id.unique, self.base.shards),
            self.base.id,
            "applied on its owner"
        );
        let unique = head.id.unique;
        let tombstone = spec.is_none_or(|s| s.is_tombstone());
        self.watch_if_reported(&head, spec);
        let mut store = self.timers.store.borrow_mut();
        let existing = store
            .get(unique)
            .map(|(due, t)| (due, t.head(), t.is_tombstone()));
        if let Some((_, old, old_tomb)) = &existing {
            let (current, past) = (self.timers.view(), self.timers.view.past());
            if !conflict::admits(source, (&head, tombstone), (old, *old_tomb), current, &past) {
                ShardStats::add(&self.base.my_stats().replication_stale, 1);
                return Ok(old.factor_requested);
            }
        } else if store.len() >= self.base.resolved.config.timers.timers_per_shard_max {
            return Err(OpError::new(503, super::spill::SHARD_FULL));
        }
        // Applied: a callback of another incarnation still waiting for its
        // lane is withdrawn (a delete or an update came after its pop).
        self.pop.replaced(unique, head.version);
        let dropped = self.retries.drop_other_versions(unique, head.version);
        let timer = match spec {
            Some(s) if !tombstone => timer_in(&mut store, head, s),
            _ => Timer::new(head, "", "", &[]),
        };
        let stored_factor = existing
            .as_ref()
            .map_or(0, |(_, old, _)| old.factor_requested);
        let old_due = existing.map(|(due, _, _)| due);
        let old = old_due.and_then(|_| store.remove(unique, self.durable.log()));
        if let Some(o) = &old {
            self.keep_informational(&mut store, o, &head);
        }
        if source == Source::Client {
            self.count_client_op(tombstone, old.as_ref().is_some_and(|t| !t.is_tombstone()));
        }
        let placed = self.place(&mut store, timer, old.as_ref(), old_due);
        self.refresh_gauges(&store);
        drop(store);
        if !dropped.is_empty() {
            self.log_dropped(dropped);
        }
        if let Some(due) = placed {
            self.pop.wake_if_before(due);
        }
        if source != Source::Client && head.sequence == 0 && head.view != self.timers.view() {
            self.pass_on(&head);
        }
        Ok(stored_factor)
    }

    /// A client's change (sequence 0) that came from a node on another
    /// cluster view (a rolling reload: it has not reloaded yet) names the
    /// replicas of its view; those of this node's view it could not name
    /// (a joiner it has not heard of) get it from here, as it now stands,
    /// `only-newer` (issue 37: a delete through a node not yet reloaded
    /// missed the joiner, which popped the timer). A node of the same view
    /// receiving it does not pass it on again.
    fn pass_on(&self, head: &TimerHead) {
        let cluster = self.timers.cluster();
        let factor = self.default_factor().max(head.factor_requested) as usize;
        let named = cluster.bloom_matches(head.id.bloom);
        let mine = self.placement(head.id.unique, factor).mask();
        let targets = self.without_me(mine) & !named;
        if targets != 0 {
            self.resend_to(head.id.unique, targets, 0);
        }
    }

    /// Seed 003's informational timers: when an old-view live copy that
    /// not every new replica is known to have is replaced by the same
    /// incarnation under another view (a resync's replication or
    /// tombstone), it is kept outside the wheel so that later resync GETs
    /// still list it. A newer client operation drops any such copy.
    fn keep_informational(&self, store: &mut super::Store, old: &Timer, new: &TimerHead) {
        if new.version != old.version {
            store.drop_info(old.unique);
            return;
        }
        let moved = old.view != self.timers.view() && new.view != old.view;
        if moved && !old.is_tombstone() && old.informed() != 0 {
            let kept = store.keep_info(old.share());
            ShardStats::add(&self.base.my_stats().resync_informational, kept as u64);
        }
    }

    fn count_client_op(&self, tombstone: bool, old_live: bool) {
        let stats = self.base.my_stats();
        match (tombstone, old_live) {
            (false, false) => ShardStats::add(&stats.timers_created, 1),
            (false, true) => ShardStats::add(&stats.timers_updated, 1),
            (true, true) => ShardStats::add(&stats.timers_deleted, 1),
            (true, false) => {}
        }
    }

    /// Put `timer` in the wheel: at its next pop, or as a tombstone kept
    /// one more life (nothing at all without peers: no stale message can
    /// come). Returns the due time, if stored.
    fn place(
        &self,
        store: &mut super::Store,
        mut timer: Timer,
        old: Option<&Timer>,
        old_due: Option<u64>,
    ) -> Option<u64> {
        if !timer.is_tombstone() && timer.has_next_pop() {
            let due = timer.next_pop_ms(self.base.skew_ms());
            store.insert(due, timer, self.durable.log());
            return Some(due);
        }
        if !self.keeps_tombstones() {
            return None;
        }
        if !timer.is_tombstone() {
            timer = timer.to_tombstone();
        }
        if timer.interval_ms == 0 {
            if let Some(o) = old {
                // A cron timer's interval is its cursor, not a period.
                timer.interval_ms = if o.is_cron() { 0 } else { o.interval_ms };
                timer.repeat_for_ms = o.repeat_for_ms;
                timer.set_replication_factor(o.replication_factor());
                timer.set_factor_requested(o.factor_requested());
            }
        }
        let due = old_due.unwrap_or(0).max(clock::now_ms()) + self.tombstone_life_ms(&timer);
        store.insert(due, timer, self.durable.log());
        Some(due)
    }

    /// Apply where the timer lives: here, or on its owner over the mesh.
    /// Returns what [`Shard::apply`] does.
    pub async fn route_apply(
        &self,
        head: TimerHead,
        spec: Option<TimerSpec<'_>>,
        source: Source,
    ) -> Result<u8, OpError> {
        let owner = shard_of(head.id.unique, self.base.shards);
        if owner == self.base.id {
            let stored_factor = self.apply(head, spec.as_ref(), source)?;
            self.settle().await?;
            return Ok(stored_factor);
        }
        ShardStats::add(&self.base.my_stats().mesh_forwarded, 1);
        let reply = self
            .base
            .mesh
            .ask(owner, |reply| MeshMsg::Apply {
                head,
                spec: spec.map(|s| Box::new(s.into_owned())),
                source,
                reply,
            })
            .await;
        match reply {
            Some(Reply::Applied(r)) => r,
            _ => Err(OpError::new(503, "owning shard is unavailable")),
        }
    }
}

/// `spec` as a timer record of `store` (its tags interned there).
/// Inlined: the record is built in place, not returned through a copy.
#[inline(always)]
fn timer_in(store: &mut super::Store, head: TimerHead, s: &TimerSpec) -> Timer {
    let mut tags = [(0u32, 0u32); TAGS_MAX];
    let n = if s.tags.is_empty() {
        0
    } else {
        store.intern_tags(&s.tags, &mut tags)
    };
    if s.delivery.is_none() && s.timing.is_none() {
        return Timer::new(head, &s.uri, &s.opaque, &tags[..n]);
    }
    let ext = ext_of(s, &head);
    Timer::with_ext(head, &s.uri, &s.opaque, &tags[..n], &ext)
}

/// A client's head for a timer with `at`, `start-at` or `cron` (issue
/// 42): its start at the absolute instant (`Timing::start_unix_ms`, the
/// operation's time being its version's), and a cron timer's first
/// cursor.
fn timed_head(head: &mut TimerHead, spec: &TimerSpec) {
    let Some(t) = spec.timing.as_deref() else {
        return;
    };
    let start_unix_ms = t.start_unix_ms((head.version / 1000) as i64, spec.interval_ms);
    head.start_ms = clock::unix_to_engine(start_unix_ms.max(0) as u64);
    if t.kind == TimingKind::Cron {
        head.interval_ms = match t.to_ref(start_unix_ms).calendar() {
            Ok((schedule, zone)) => {
                first_cursor(&schedule, &zone, start_unix_ms, head.repeat_for_ms)
            }
            Err(_) => CURSOR_NONE,
        };
    }
}

impl Shard {
    /// A replication body reporting a pop's attempts (`delivery-state`)
    /// of a timer with a policy: watch the pop (`shard/retry`).
    fn watch_if_reported(&self, head: &TimerHead, spec: Option<&TimerSpec>) {
        let Some(s) = spec.filter(|s| !s.is_tombstone() && s.delivery.is_some()) else {
            return;
        };
        let Some(a) = s
            .replication
            .as_ref()
            .and_then(|r| r.attempt.as_deref().copied())
        else {
            return;
        };
        // The pop's own sequence: a resync entry's head carries the
        // copy's, which may be later.
        let pop_head = TimerHead {
            sequence: a.sequence,
            ..*head
        };
        let timer = self.timer_of_spec(pop_head, s);
        self.watch_report(timer, a);
    }

    /// `spec` (live) as a timer record of this shard's store.
    fn timer_of_spec(&self, head: TimerHead, spec: &TimerSpec) -> Timer {
        timer_in(&mut self.timers.store.borrow_mut(), head, spec)
    }
}

/// The rules a replication body passes: a re-send's only over an older
/// version.
fn source_of(spec: &TimerSpec) -> Source {
    match spec.replication.as_ref().is_some_and(|r| r.only_newer) {
        true => Source::PeerIfNewer,
        false => Source::Peer,
    }
}
