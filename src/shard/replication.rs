//! Replication from this shard: the body of the internal `PUT /timers/<id>`
//! is built in exactly one place ([`Shard::send_replication`]) from one
//! incarnation's head, callback, tags and replica list, whichever operation
//! sends it (create, update, delete, pop).

use super::view::Placement;
use super::Shard;
use crate::cluster::replicate::Body;
use crate::cluster::sites::{Sites, SITES_NONE};
use crate::cluster::Cluster;
use crate::runtime::clock;
use crate::timer::spec::TAGS_MAX;
use crate::timer::{Timer, TimerHead, TimerId, TimerSpec};

/// A timer's callback as a body carries it: URI, opaque data, extensions
/// (`timer::extras`). All empty: a tombstone.
pub(super) type Cb<'a> = (&'a str, &'a str, &'a [u8]);
/// A tombstone's callback.
pub(super) const TOMBSTONE: Cb<'static> = ("", "", &[]);

/// A spec's extensions (`timer::extras`) for the incarnation `head`: no
/// allocation without a delivery policy or a timing. A timing's start is
/// the body's, or, for a client's operation, fixed from its version (the
/// same instant `ops.rs` starts the head at).
pub(super) fn ext_of(spec: &TimerSpec, head: &TimerHead) -> Vec<u8> {
    let mut ext = Vec::new();
    if let Some(d) = &spec.delivery {
        d.push_ext(&mut ext);
    }
    if let Some(t) = &spec.timing {
        let start_unix_ms = t.start_unix_ms((head.version / 1000) as i64, spec.interval_ms);
        t.push_ext(&mut ext, start_unix_ms);
    }
    ext
}

/// The replication body of one incarnation, its start as seen from now
/// (`replicas` empty: for another site; `sites` empty: none).
pub(super) fn body_of<'a>(
    head: &TimerHead,
    callback: Cb<'a>,
    tags: &'a [(&'a str, u32)],
    replicas: &'a [&'a str],
    sites: &'a [&'a str],
    view_id: u64,
) -> Body<'a> {
    Body {
        interval_ms: head.interval_ms,
        repeat_for_ms: head.repeat_for_ms,
        start_time_delta_ms: head.start_ms as i64 - clock::now_ms() as i64,
        sequence: head.sequence,
        version_us: head.version,
        uri: callback.0,
        opaque: callback.1,
        view_id,
        replicas,
        sites,
        factor_requested: head.factor_requested,
        tags,
        start_time_unix_ms: None,
        only_newer: false,
        ext: callback.2,
        attempt: None,
    }
}

impl Shard {
    /// Queue the replication `PUT` of one incarnation to every peer in
    /// `targets`. An empty `callback` ([`TOMBSTONE`]) is a tombstone.
    pub(super) fn send_replication(
        &self,
        cluster: &Cluster,
        head: &TimerHead,
        callback: Cb<'_>,
        tags: &[(&str, u32)],
        replicas: &[&str],
        targets: u64,
    ) {
        assert!(
            !replicas.is_empty() || callback.0.is_empty(),
            "a live timer has replicas"
        );
        assert!(tags.len() <= TAGS_MAX, "the codec keeps to TAGS_MAX");
        if targets == 0 {
            // Nothing to queue: no site list, no body, no clock read (a
            // resync calls this twice per applied timer, mostly for no one).
            return;
        }
        let sites = self.base.resolved.sites.names(head.sites);
        let body = body_of(head, callback, tags, replicas, &sites, cluster.view_id);
        self.send_body(head.id, &body, targets);
    }

    /// Queue one built body for every peer in `targets`.
    pub(super) fn send_body(&self, id: TimerId, body: &Body<'_>, targets: u64) {
        let mut rest = targets;
        while rest != 0 {
            let peer = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            self.outbound.replicator.send(peer, id, body);
        }
    }

    /// Cross-site (GR): queue one incarnation for a node of each other
    /// site in its list, as a body without `replicas` (that site places
    /// it among its own nodes). Only for what this site originates (a
    /// client operation, a pop), never for what another node or site sent.
    pub(super) fn send_to_sites(&self, head: &TimerHead, callback: Cb<'_>, tags: &[(&str, u32)]) {
        if !self.sends_to_sites(head) {
            return;
        }
        let names = self.base.resolved.sites.names(head.sites);
        let body = body_of(
            head,
            callback,
            tags,
            &[],
            &names,
            self.timers.cluster().view_id,
        );
        for slot in Sites::remote_in(head.sites) {
            self.outbound.sites_out.send(slot - 1, head.id, &body);
        }
    }

    /// Whether [`Shard::send_to_sites`] sends `head` anywhere.
    pub(super) fn sends_to_sites(&self, head: &TimerHead) -> bool {
        self.base.resolved.sites.replicating() && head.sites != SITES_NONE
    }

    /// Send the replication message for a client operation to `targets`
    /// and to the other sites.
    pub(super) fn replicate_spec(
        &self,
        head: &TimerHead,
        spec: &TimerSpec,
        pl: &Placement,
        targets: u64,
        sites: bool,
    ) {
        // Nothing to send (one node, one site): no replica names and tag
        // table to fill (1.8 KiB of arrays per POST).
        let sites = sites && self.sends_to_sites(head);
        if targets == 0 && !sites {
            return;
        }
        let cluster = self.timers.cluster();
        let (names, n) = pl.names(&cluster);
        let mut tags = [("", 0u32); TAGS_MAX];
        let tag_count = spec.tags.len().min(TAGS_MAX);
        for (slot, (name, count)) in tags.iter_mut().zip(&spec.tags) {
            *slot = (name.as_ref(), *count);
        }
        let ext = ext_of(spec, head);
        let callback = (spec.uri.as_ref(), spec.opaque.as_ref(), &ext[..]);
        if targets != 0 {
            self.send_replication(
                &cluster,
                head,
                callback,
                &tags[..tag_count],
                &names[..n],
                targets,
            );
        }
        if sites {
            self.send_to_sites(head, callback, &tags[..tag_count]);
        }
    }

    /// After a successful callback: tell the other replicas that pop
    /// `popped.sequence` is done (or, after the final pop, send them a
    /// tombstone), so that they skip it. `popped` is the timer as that pop
    /// took it: a later pop may have been taken since (a callback slower
    /// than the interval), and is not reported done before its own
    /// callback succeeds. Nothing is sent when the timer has since been
    /// replaced or deleted: that operation replicated itself.
    ///
    /// Passive rebalancing (seed 001): the message goes to the timer's
    /// replicas under the current cluster view and to every node its ID
    /// names, and this node's own copy is re-placed under the current view:
    /// a tombstone if this node is no longer one of its replicas, re-skewed
    /// if its place in the list changed.
    pub fn replicate_pop(&self, popped: &Timer) {
        if !self.keeps_tombstones() {
            return;
        }
        let unique = popped.unique;
        let Some(pl) = self.send_pop(popped) else {
            return;
        };
        let mut store = self.timers.store.borrow_mut();
        let Some((_, t)) = store.get(unique) else {
            return;
        };
        let view = self.timers.view();
        let placed = t.view == view
            && t.bloom == pl.bloom
            && pl.my_index == Some(t.replica_index())
            && t.replication_factor() as usize == pl.count;
        if placed || t.is_tombstone() {
            return;
        }
        let mut timer = store
            .remove(unique, self.durable.log())
            .expect("just found");
        timer.view = view;
        timer.bloom = pl.bloom;
        timer.set_replication_factor(pl.count as u8);
        let due_ms = match pl.my_index {
            Some(index) => {
                timer.set_replica_index(index);
                timer.next_pop_ms(self.base.skew_ms())
            }
            None => {
                // No longer a replica: a tombstone of the current view, so
                // a late message from a node still on the old view cannot
                // bring the timer back here.
                timer = timer.to_tombstone();
                clock::now_ms() + self.tombstone_life_ms(&timer)
            }
        };
        store.insert(due_ms, timer, self.durable.log());
        self.pop.wake_if_before(due_ms);
        self.refresh_gauges(&store);
    }

    /// The replication half of [`Shard::replicate_pop`]: the placement
    /// under the current view, or `None` if the timer has moved on.
    fn send_pop(&self, popped: &Timer) -> Option<Placement> {
        let store = self.timers.store.borrow();
        let (_, stored) = store.get(popped.unique)?;
        if stored.version != popped.version || stored.sequence < popped.sequence {
            return None;
        }
        // The stored copy when it is this pop's, else the pop as it was
        // taken: live, at its sequence. A tombstone goes out only for the
        // final pop: a same-incarnation tombstone stored for another reason
        // (a resync's, for a node no longer a replica) must not end the
        // timer on every replica.
        let final_pop = !popped.has_next_pop();
        let own = stored.sequence == popped.sequence && (final_pop || !stored.is_tombstone());
        let t = if own { stored } else { popped };
        let unique = t.unique;
        let pl = self.placement(unique, t.factor_requested() as usize);
        let targets = self.without_me(pl.mask() | self.timers.cluster().bloom_matches(t.bloom));
        let cluster = self.timers.cluster();
        let (names, n) = pl.names(&cluster);
        let mut tags = [("", 0u32); TAGS_MAX];
        let tag_count = store.tag_pairs(t, &mut tags);
        let mut head = t.head();
        let callback = (t.uri(), t.opaque(), t.ext());
        if targets != 0 {
            self.send_replication(
                &cluster,
                &head,
                callback,
                &tags[..tag_count],
                &names[..n],
                targets,
            );
        }
        // Other sites: sites no longer known dropped, new ones appended.
        head.sites = self.base.resolved.sites.refreshed(head.sites);
        self.send_to_sites(&head, callback, &tags[..tag_count]);
        Some(pl)
    }
}
