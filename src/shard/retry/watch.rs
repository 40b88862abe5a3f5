//! The state of a pop's attempts beyond this shard: logged (`[storage]`),
//! reported to the timer's other replicas and sites, taken from their
//! reports (a watched entry), written into a snapshot and recovered.

use super::attempt::outcome_of_code;
use super::book::Entry;
use crate::runtime::clock;
use crate::shard::replication::body_of;
use crate::shard::Shard;
use crate::storage::record::Image;
use crate::storage::snapshot::Encoder;
use crate::timer::spec::{AttemptState, TAGS_MAX};
use crate::timer::{Timer, TimerHead};

impl Shard {
    /// Log one pop's state (nothing without `[storage]`); `owned`: this
    /// shard sends its attempts. An `Err` of the log is the log's failure,
    /// which stops the node (`durable.rs`).
    pub(super) fn log_attempt(&self, timer: &Timer, s: &AttemptState, owned: bool) {
        let Some(log) = self.durable.log() else {
            return;
        };
        let store = self.timers.store.borrow();
        let mut pairs = [("", 0u32); TAGS_MAX];
        let n = store.tag_pairs(timer, &mut pairs);
        let image = image_of(timer);
        let _ = log.delivery(s, owned, &image, pairs[..n].iter().copied());
    }

    /// Tell the timer's other replicas (and sites) how its pop stands: a
    /// replication body of the pop's timer with `delivery-state`.
    pub(super) fn report_attempt(&self, timer: &Timer, s: &AttemptState) {
        let unique = timer.unique;
        let cluster = self.timers.cluster();
        let pl = self.placement(unique, timer.factor_requested() as usize);
        let targets = self.without_me(pl.mask() | cluster.bloom_matches(timer.bloom));
        let sites = self.sends_to_sites(&timer.head());
        if targets == 0 && !sites {
            return;
        }
        let (names, n) = pl.names(&cluster);
        let store = self.timers.store.borrow();
        let mut tags = [("", 0u32); TAGS_MAX];
        let tag_count = store.tag_pairs(timer, &mut tags);
        let mut head = timer.head();
        // The copy's own pops done when they are past this pop's (a
        // repeating timer popped on meanwhile): a replica without a copy
        // stores it from this body, and must not pop them again. A cron
        // timer's cursor goes with its sequence: the retried pop's own
        // cursor beside a later sequence made a backup pop a past
        // occurrence again, under a sequence the owner had used.
        let copy = store
            .get(unique)
            .filter(|(_, t)| t.version == timer.version)
            .map(|(_, t)| (t.sequence, t.interval_ms));
        (head.sequence, head.interval_ms) = match copy {
            Some((sequence, cursor)) if sequence >= s.sequence => (sequence, cursor),
            _ => (s.sequence, timer.cursor_at(s.sequence)),
        };
        let callback = (timer.uri(), timer.opaque(), timer.ext());
        let tags = &tags[..tag_count];
        if targets != 0 {
            let names = &names[..n];
            let mut body = body_of(&head, callback, tags, names, &[], cluster.view_id);
            let site_names = self.base.resolved.sites.names(head.sites);
            body.sites = &site_names;
            body.attempt = Some(*s);
            self.send_body(head.id, &body, targets);
        }
        if sites {
            self.report_to_sites(&head, callback, tags, s);
        }
    }

    fn report_to_sites(
        &self,
        head: &TimerHead,
        callback: super::super::replication::Cb<'_>,
        tags: &[(&str, u32)],
        s: &AttemptState,
    ) {
        let names = self.base.resolved.sites.names(head.sites);
        let view_id = self.timers.cluster().view_id;
        let mut body = body_of(head, callback, tags, &[], &names, view_id);
        body.attempt = Some(*s);
        for slot in crate::cluster::sites::Sites::remote_in(head.sites) {
            self.outbound.sites_out.send(slot - 1, head.id, &body);
        }
    }

    /// Another replica's report of a pop's attempts (a replication body
    /// with `delivery-state`), for this replica's copy `timer` (built from
    /// the body, at the pop's sequence): watch it, or end the watch.
    pub(in crate::shard) fn watch_report(&self, timer: Timer, s: AttemptState) {
        let key = (timer.unique, s.sequence);
        let newer_copy = self
            .timers
            .store
            .borrow()
            .get(timer.unique)
            .is_some_and(|(_, t)| t.version > timer.version);
        let ahead = self
            .retries
            .with(key, |e| {
                e.sending
                    || e.timer.version > timer.version
                    || (e.owned && e.timer.version == timer.version && e.attempts > s.attempts)
            })
            .unwrap_or(false);
        if newer_copy || ahead {
            // This shard is sending an attempt, or has sent later ones
            // itself: its own outcome is the newer state.
            return;
        }
        if s.done {
            if self.retries.take(key).is_some() {
                self.log_attempt(&timer, &s, false);
            }
            return;
        }
        if !self.retries.has_room(key) {
            crate::stats::ShardStats::add(&self.base.my_stats().delivery_book_full, 1);
            return;
        }
        let entry = self.entry_of(timer, &s, false);
        let t = entry.timer.share();
        self.retries.put(entry);
        self.log_attempt(&t, &s, false);
    }

    /// Pops of another incarnation than the one just stored, taken out of
    /// the book by `Retries::drop_other_versions`: logged as done, so a
    /// restart does not bring a deleted timer's pop back.
    pub(in crate::shard) fn log_dropped(&self, dropped: Vec<Entry>) {
        for e in dropped {
            let s = AttemptState {
                done: true,
                ..state_of(&e)
            };
            self.log_attempt(&e.timer, &s, e.owned);
        }
    }

    /// Report every pop this shard owns again, to the replicas of the
    /// current view (a new view: a joiner watches them from now on).
    pub fn report_owned(&self) {
        let mut owned = Vec::new();
        self.retries.each(|e| {
            if e.owned {
                owned.push((e.timer.share(), state_of(e)));
            }
        });
        for (timer, s) in owned {
            self.report_attempt(&timer, &s);
        }
    }

    /// The state of `unique`'s earliest pop in the book, of incarnation
    /// `version`, for a resync entry.
    pub fn attempt_of(&self, unique: u64, version: u64) -> Option<AttemptState> {
        let mut first: Option<AttemptState> = None;
        self.retries.each_of(unique, |e| {
            let earlier = first.is_none_or(|f| e.timer.sequence < f.sequence);
            if e.timer.version == version && earlier {
                first = Some(state_of(e));
            }
        });
        first
    }

    /// Every entry of the book into a snapshot of the log.
    pub fn snapshot_attempts(&self, enc: &mut Encoder) {
        let store = self.timers.store.borrow();
        self.retries.each(|e| {
            let s = state_of(e);
            let mut pairs = [("", 0u32); TAGS_MAX];
            let n = store.tag_pairs(&e.timer, &mut pairs);
            let image = image_of(&e.timer);
            enc.delivery(&s, e.owned, &image, pairs[..n].iter().copied());
        });
    }

    /// A recovered pop's attempts back into the book (after the timers).
    pub fn recover_attempt(&self, s: &AttemptState, owned: bool, image: &Image<'_>) {
        let key = (image.head.id.unique, s.sequence);
        let replaced = self
            .timers
            .store
            .borrow()
            .get(key.0)
            .is_some_and(|(_, t)| t.version != image.head.version);
        if replaced || !self.retries.has_room(key) {
            return;
        }
        let timer = self.timers.store.borrow_mut().timer_of_image(image);
        let entry = self.entry_of(timer, s, owned);
        self.retries.put(entry);
    }

    /// The book's entry for `timer`'s pop in state `s`: due at its next
    /// attempt (owned), or its takeover (watched).
    fn entry_of(&self, timer: Timer, s: &AttemptState, owned: bool) -> Entry {
        let mut due_ms = clock::unix_to_engine(s.next_unix_ms);
        if !owned {
            due_ms += turn_of(&timer) * self.base.skew_ms();
        }
        Entry {
            timer,
            attempts: s.attempts,
            first_unix_ms: s.first_unix_ms,
            next_unix_ms: s.next_unix_ms,
            due_ms,
            last: outcome_of_code(s.last_outcome),
            owned,
            sending: false,
        }
    }
}

/// How many skews after the owner's next attempt this replica takes a
/// watched pop over: its place among every site's replicas, as its own
/// pops are skewed (`Timer::next_pop_ms`), and at least one.
fn turn_of(t: &Timer) -> u64 {
    let site_turns = u64::from(t.site_index()) * u64::from(t.factor_requested().max(1));
    (u64::from(t.replica_index()) + site_turns).max(1)
}

/// An entry's state as a report or a record carries it.
fn state_of(e: &Entry) -> AttemptState {
    AttemptState {
        sequence: e.timer.sequence,
        attempts: e.attempts,
        first_unix_ms: e.first_unix_ms,
        next_unix_ms: e.next_unix_ms,
        last_outcome: super::attempt::code_of(e.last),
        done: false,
    }
}

/// A pop's timer as the log keeps it: wall-clock times, no due time of
/// its own (the state has it).
fn image_of(t: &Timer) -> Image<'_> {
    let mut head = t.head();
    head.start_ms = clock::engine_to_unix(head.start_ms);
    let mut image = Image::new(0, head, t.uri(), t.opaque());
    image.ext = t.ext();
    image
}
