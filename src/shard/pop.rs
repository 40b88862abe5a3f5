//! The pop loop: sleep until the wheel's next deadline (or until an earlier
//! timer arrives), take what is due, and hand each pop to its own callback
//! task. The loop itself never waits on the network. It holds the shard's
//! gate and ends as soon as shutdown begins.

use super::targets::{target_of, Targets};
use super::Shard;
use crate::cluster::sites::Sites;
use crate::http::client::CallbackKey;
use crate::runtime::clock;
use crate::runtime::notify::Notify;
use crate::runtime::throttle::Throttle;
use crate::stats::ShardStats;
use crate::timer::Timer;
use futures_lite::future;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Pops taken from the wheel per turn before yielding to other tasks.
pub const POPS_PER_TURN_MAX: usize = 1024;
/// How long the pop loop waits before looking again while the timer log
/// is behind the disk (`[storage] pending-bytes-max`).
const LOG_BEHIND_WAIT_MS: u64 = 5;
/// Longest sleep with nothing due (the wheel's deadline may move).
const IDLE_SLEEP_MS: u64 = 100;
/// A held pop ([`super::targets`]) goes back into the wheel this far
/// ahead: it is normally promoted sooner, when its target's next callback
/// ends; this is the fallback (a full held queue, or a promotion that
/// found the store busy).
pub const HELD_FALLBACK_MS: u64 = 1000;

/// What the pop loop and the code that feeds it share.
pub struct PopState {
    /// Wakes the pop loop when a timer due before its current sleep arrives.
    wake: Notify,
    /// Set while the pop loop waits for a free callback slot.
    blocked: Cell<bool>,
    /// The deadline the pop loop sleeps until (`u64::MAX`: idle).
    armed_ms: Cell<u64>,
    /// Callback tasks spawned and not yet finished: counted at the spawn,
    /// so the bound holds before a task first runs.
    in_flight: Cell<usize>,
    /// Callbacks in flight and held pops per target.
    targets: Targets,
    /// Pops dispatched and not yet finished, per ID: the incarnation's
    /// version and how many of its pops are in flight. An operation that
    /// replaces or deletes the incarnation removes the entry, which
    /// withdraws its callbacks still waiting for a lane. At most
    /// `callback-in-flight-max` entries.
    dispatched: RefCell<HashMap<u64, Dispatched>>,
    /// Callback workers waiting for a pop, most recently idle last: at
    /// most [`IDLE_WORKERS_MAX`].
    idle: RefCell<Vec<Rc<Worker>>>,
    /// `[throttling]`'s bucket (the shard's share; `api` admits client
    /// requests by it): the pops' lateness steers it too.
    throttle: Option<Rc<Throttle>>,
}

/// A dispatched incarnation ([`PopState::dispatched`]).
struct Dispatched {
    version: u64,
    /// Its pops in flight.
    count: u32,
    /// With `[storage]`: the timer as it was before its first pop in
    /// flight, and its due time: what the log still holds for it (the
    /// outcome is logged when the pops end), and what a snapshot writes.
    before: Option<(u64, Timer)>,
}

/// Gives a callback slot (and its target's share) back on every exit
/// path of its task.
struct Slot {
    shard: Rc<Shard>,
    target: u64,
    /// The pop's incarnation, counted in `PopState::dispatched`.
    unique: u64,
    version: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let pop = &self.shard.pop;
        assert!(pop.in_flight.get() > 0, "a slot was taken");
        pop.in_flight.set(pop.in_flight.get() - 1);
        pop.targets.give_back(self.target);
        promote_held(&self.shard, self.target);
        if pop.forget_dispatched(self.unique, self.version) {
            // The log kept the pre-pop state until now: log the outcome
            // (never inside a store borrow: a miss re-pops after a crash).
            if let Ok(store) = self.shard.timers.store.try_borrow() {
                store.log_current(self.unique, self.shard.durable.log());
            }
        }
        if pop.blocked.replace(false) {
            pop.wake.notify();
        }
    }
}

/// The part of `callback-in-flight-max` (a quarter) kept from targets
/// past their share.
const RESERVE_DIVISOR: usize = 4;
/// In the reserve, a target takes a slot only while its callbacks in
/// flight are fewer than the free slots over this: many targets under
/// their share (many hanging ones) cannot drain it, and one with nothing
/// in flight can always take the last slot.
const RESERVE_SPREAD: usize = 8;

/// Whether a callback to `target` may start now. Free for all while more
/// than the reserve is free (a burst to one healthy target keeps its
/// parallelism); in the reserve, only for a target under its share
/// (`callback-in-flight-per-target-max`) with few in flight next to the
/// free slots.
fn may_start(shard: &Shard, target: u64) -> bool {
    let timers = &shard.base.resolved.config.timers;
    let max = timers.callback_in_flight_max;
    let taken = shard.pop.in_flight.get();
    if taken + max / RESERVE_DIVISOR < max {
        return true;
    }
    let free = max.saturating_sub(taken);
    let mine = shard.pop.targets.in_flight(target);
    mine < timers.callback_in_flight_per_target_max && mine * RESERVE_SPREAD < free
}

/// Held IDs looked at per ended callback (a held ID whose timer was
/// deleted or updated since is passed over).
const PROMOTE_TRIES_MAX: usize = 8;

/// One of `target`'s callbacks ended: put its oldest held pop that is
/// still held back into the wheel as due now.
fn promote_held(shard: &Shard, target: u64) {
    for _ in 0..PROMOTE_TRIES_MAX {
        let Some((unique, held_due_ms)) = shard.pop.targets.next_held(target) else {
            return;
        };
        // Never inside a borrow of the store (a slot is dropped at the end
        // of its task); the fallback time covers a busy store anyway.
        let Ok(mut store) = shard.timers.store.try_borrow_mut() else {
            return;
        };
        let now = clock::now_ms();
        // Still the held pop: at the fallback time it was put back at (an
        // update, a replicated pop or its own fallback has moved it
        // otherwise: a pop is never promoted ahead of its schedule).
        let held = store.get(unique).is_some_and(|(due, t)| {
            due == held_due_ms && due > now && !t.is_tombstone() && target_of(t.uri()) == target
        });
        if held {
            // Logged (a snapshot may not see a timer that moves unlogged).
            let timer = store
                .remove(unique, shard.durable.log())
                .expect("just found");
            store.insert(now, timer, shard.durable.log());
            drop(store);
            shard.pop.wake_if_before(now);
            return;
        }
    }
    shard.pop.targets.drop_held_if_idle(target);
}

impl PopState {
    pub fn new(throttle: Option<Rc<Throttle>>) -> Self {
        PopState {
            wake: Notify::default(),
            blocked: Cell::new(false),
            armed_ms: Cell::new(u64::MAX),
            in_flight: Cell::new(0),
            targets: Targets::default(),
            dispatched: RefCell::new(HashMap::new()),
            idle: RefCell::new(Vec::new()),
            throttle,
        }
    }
}

impl PopState {
    /// A pop's lateness, which the bucket steers by (what a timer service
    /// promises), as it does by a client request's latency.
    fn record_lateness(&self, late_us: u64) {
        if let Some(t) = &self.throttle {
            t.record(late_us, Instant::now());
        }
    }

    /// Wake the loop if `due_ms` is before the deadline it sleeps until.
    pub fn wake_if_before(&self, due_ms: u64) {
        if due_ms < self.armed_ms.get() {
            self.wake.notify();
        }
    }

    /// An operation stores incarnation `version` of `unique`: the pops of
    /// any other incarnation still waiting for a lane are no longer wanted.
    pub fn replaced(&self, unique: u64, version: u64) {
        let mut dispatched = self.dispatched.borrow_mut();
        if dispatched
            .get(&unique)
            .is_some_and(|d| d.version != version)
        {
            dispatched.remove(&unique);
        }
    }

    /// Whether a pop of incarnation `version` of `unique` is still wanted:
    /// dispatched, and not replaced or deleted since.
    pub fn is_wanted(&self, unique: u64, version: u64) -> bool {
        self.dispatched
            .borrow()
            .get(&unique)
            .is_some_and(|d| d.version == version)
    }

    /// A pop of `before` (as it was before the pop, due at `due_ms`) is
    /// dispatched; `logged`: keep its pre-pop state for snapshots.
    fn add_dispatched(&self, due_ms: u64, before: &Timer, logged: bool) {
        let mut dispatched = self.dispatched.borrow_mut();
        let version = before.version;
        let image = || logged.then(|| (due_ms, before.share()));
        let entry = dispatched.entry(before.unique).or_insert(Dispatched {
            version,
            count: 0,
            before: image(),
        });
        if entry.version != version {
            // A newer incarnation: the older one's pops are not wanted.
            *entry = Dispatched {
                version,
                count: 0,
                before: image(),
            };
        }
        entry.count += 1;
    }

    /// A pop's callback ended; `true` when it was the incarnation's last
    /// in flight (its outcome is then what the store holds).
    fn forget_dispatched(&self, unique: u64, version: u64) -> bool {
        let mut dispatched = self.dispatched.borrow_mut();
        let Some(entry) = dispatched.get_mut(&unique) else {
            return false;
        };
        if entry.version != version {
            return false;
        }
        entry.count -= 1;
        if entry.count > 0 {
            return false;
        }
        dispatched.remove(&unique);
        true
    }

    /// Visit the pre-pop state of every timer with pops in flight (what
    /// a snapshot writes for them, so that it matches the log).
    pub fn each_before_pop(&self, mut visit: impl FnMut(u64, &Timer)) {
        for d in self.dispatched.borrow().values() {
            if let Some((due, t)) = &d.before {
                visit(*due, t);
            }
        }
    }
}

pub async fn pop_loop(shard: Rc<Shard>) {
    let mut due: Vec<(u64, Timer)> = Vec::with_capacity(POPS_PER_TURN_MAX);
    let in_flight_max = shard.base.resolved.config.timers.callback_in_flight_max;
    let pop = &shard.pop;
    // One timer for every sleep of the loop, re-armed (no allocation per
    // sleep).
    let mut timer = glommio::timer::Timer::new(Duration::from_millis(IDLE_SLEEP_MS));
    while !shard.base.gate.is_closing() {
        // Backpressure: with every callback slot taken, due timers stay in
        // the wheel (late, not lost) until a callback finishes; with the
        // timer log behind the disk, until it catches up.
        let room = in_flight_max.saturating_sub(pop.in_flight.get());
        if shard.storage_failed() {
            // Fail-stop (issue 38): a pop that cannot be logged may be
            // repeated; the node is stopping, and the other replicas pop
            // at their skew.
            shard.base.gate.closing().await;
            break;
        }
        if shard.durable.log().is_some_and(|l| l.is_behind()) {
            let wait = rearm(&mut timer, Duration::from_millis(LOG_BEHIND_WAIT_MS));
            future::or(wait, shard.base.gate.closing()).await;
            continue;
        }
        if room == 0 {
            pop.blocked.set(true);
            let idle = rearm(&mut timer, Duration::from_millis(IDLE_SLEEP_MS));
            future::or(future::or(pop.wake.wait(), idle), shard.base.gate.closing()).await;
            continue;
        }
        let limit = POPS_PER_TURN_MAX.min(room);
        let now = clock::now_ms();
        let fired = shard.timers.store.borrow_mut().poll(now, limit, &mut due);
        assert!(
            fired <= limit && due.len() == fired,
            "the wheel's poll keeps to its limit and hands every timer it fired"
        );
        if fired > 0 {
            take_due(&shard, now, &mut due);
        }
        if fired == limit {
            glommio::yield_if_needed().await;
            continue;
        }
        let next = shard.timers.store.borrow().next_deadline_ms();
        let wake_ms = next
            .unwrap_or(u64::MAX)
            .min(clock::now_ms() + IDLE_SLEEP_MS);
        pop.armed_ms.set(wake_ms);
        let sleep_for = clock::instant_of(wake_ms).saturating_duration_since(Instant::now());
        if !sleep_for.is_zero() {
            let sleep = future::or(rearm(&mut timer, sleep_for), pop.wake.wait());
            future::or(sleep, shard.base.gate.closing()).await;
        }
        pop.armed_ms.set(u64::MAX);
    }
}

/// `timer` set to fire `after` from now, to be awaited.
async fn rearm(timer: &mut glommio::timer::Timer, after: Duration) {
    timer.reset(after);
    timer.await;
}

/// Dispatch every due timer and put repeating ones back at their next pop
/// (the final pop leaves a tombstone one more life, when there are peers).
fn take_due(shard: &Rc<Shard>, now: u64, due: &mut Vec<(u64, Timer)>) {
    let stats = shard.base.my_stats();
    let pop = &shard.pop;
    let logged = shard.durable.log().is_some();
    let skew = shard.base.resolved.config.timers.replica_skew_ms;
    for (due_ms, timer) in due.drain(..) {
        if timer.is_tombstone() && shard.tombstone_owed(&timer) {
            // Its delete is still queued for a member, or a member it was
            // dropped for is owed a repair (issue 37): kept one more life,
            // logged, so a restart or the repair sends it again.
            ShardStats::add(&stats.tombstones_kept, 1);
            let until = now + shard.tombstone_life_ms(&timer);
            shard
                .timers
                .store
                .borrow_mut()
                .insert(until, timer, shard.durable.log());
            continue;
        }
        if timer.is_tombstone() {
            // Lived out its interval, and any informational copy with it.
            ShardStats::add(&stats.tombstones_expired, 1);
            let mut store = shard.timers.store.borrow_mut();
            store.drop_info(timer.unique);
            store.log_current(timer.unique, shard.durable.log());
            continue;
        }
        let target = target_of(timer.uri());
        let scheduled_ms = due_ms.min(timer.next_pop_ms(skew));
        let late_ms = now.saturating_sub(scheduled_ms);
        let Some(wait) = pop_wait(shard, &timer, target, late_ms) else {
            hold_back(shard, now, late_ms, target, timer);
            continue;
        };
        ShardStats::add(&stats.timers_popped, 1);
        shard.pop.record_lateness(late_ms * 1000);
        // This pop as it is taken: what its callback sends and its success
        // replicates, even when the next pop has been taken by then (a
        // callback slower than the interval).
        let mut popped = timer.share();
        popped.step(skew, || clock::engine_to_unix(now) as i64);
        pop.add_dispatched(due_ms, &timer, logged);
        // The store first: the callback's task may ask it at once whether
        // the callback is still wanted.
        advance(shard, now, timer);
        dispatch(shard, popped, target, wait, scheduled_ms);
    }
    shard.refresh_gauges(&shard.timers.store.borrow());
}

/// Put `timer` back after its pop was taken (here, or left to the next
/// replica): at its next pop, or, after its final pop, as a tombstone one
/// more life when there are peers (a stale message cannot bring it back).
fn advance(shard: &Shard, now: u64, mut timer: Timer) {
    let skew = shard.base.resolved.config.timers.replica_skew_ms;
    // A cron timer's cursor moves to its next occurrence, by the misfire
    // rule after an outage (`timer/timing.rs`).
    timer.step(skew, || clock::engine_to_unix(now) as i64);
    if timer.has_next_pop() {
        let next = timer.next_pop_ms(skew);
        shard.timers.store.borrow_mut().insert_unlogged(next, timer);
    } else if shard.keeps_tombstones() {
        let tomb = timer.to_tombstone();
        let until = now + shard.tombstone_life_ms(&tomb);
        shard.timers.store.borrow_mut().insert_unlogged(until, tomb);
    }
}

/// Whether a pop `late_ms` after its schedule may start now, and how
/// long its callback may then wait for a connection: `Some(None)` as long
/// as it takes (no later replica or site), `Some(Some(w))` what is left
/// of `callback-wait-ms` (the skew rule counts the wait from the
/// schedule, not from the dispatch), `None` not now: its target has its
/// share of the callback slots in flight (`callback-in-flight-per-target-max`)
/// and the shard's reserve is reached, or it is too late to start before
/// the next replica's turn.
fn pop_wait(shard: &Shard, timer: &Timer, target: u64, late_ms: u64) -> Option<Option<Duration>> {
    let timers = &shard.base.resolved.config.timers;
    let later = has_later_pop_elsewhere(shard, timer);
    if later && late_ms >= timers.callback_wait_ms {
        return None;
    }
    if !may_start(shard, target) {
        return None;
    }
    Some(later.then(|| Duration::from_millis(timers.callback_wait_ms - late_ms)))
}

/// A pop that may not start now ([`pop_wait`]): left to the next replica
/// once it is `callback-wait-ms` late (this pop only: the timer stays for
/// its later pops), else held ([`super::targets`]): back in the wheel until its
/// target's next callback ends (or its fallback time), so a slow or
/// hanging target never holds up other targets' pops. Late, not lost.
fn hold_back(shard: &Rc<Shard>, now: u64, late_ms: u64, target: u64, timer: Timer) {
    let stats = shard.base.my_stats();
    let wait_ms = shard.base.resolved.config.timers.callback_wait_ms;
    let later = has_later_pop_elsewhere(shard, &timer);
    if later && late_ms >= wait_ms {
        // Too late to start before the next replica's turn: this pop is
        // left to it (counted popped and deferred), and this node keeps
        // the timer for its later pops.
        ShardStats::add(&stats.timers_popped, 1);
        ShardStats::add(&stats.callbacks_deferred, 1);
        let unique = timer.unique;
        advance(shard, now, timer);
        shard
            .timers
            .store
            .borrow()
            .log_current(unique, shard.durable.log());
        return;
    }
    ShardStats::add(&stats.callbacks_held, 1);
    // With a later replica, come back by the time it is to be left to it.
    let fallback_ms = if later {
        HELD_FALLBACK_MS.min(wait_ms - late_ms)
    } else {
        HELD_FALLBACK_MS
    };
    let due_ms = now + fallback_ms;
    shard.pop.targets.hold(target, timer.unique, due_ms);
    // Logged: the pop has not happened, and a snapshot may not see a
    // timer that moves unlogged.
    shard
        .timers
        .store
        .borrow_mut()
        .insert(due_ms, timer, shard.durable.log());
}

/// Whether another replica (or site) pops `timer` after this node.
pub(super) fn has_later_pop_elsewhere(shard: &Shard, timer: &Timer) -> bool {
    let later_replica = timer.replica_index() as usize + 1 < timer.replication_factor() as usize;
    let sites = &shard.base.resolved.sites;
    let later_site =
        sites.replicating() && Sites::count(timer.sites) > timer.site_index() as usize + 1;
    (later_replica && shard.has_peers()) || later_site
}

/// Start the callback of one pop. The pop loop takes only as many due
/// timers as there are free slots, and the slot is taken here, before the
/// callback runs. A pop waiting for a connection is late, not failed: the
/// last replica waits as long as it takes; one with a later replica waits
/// `callback-wait-ms` at most and then leaves the pop to that replica, so
/// the skew rule holds (tuning.md). On success the pop is replicated to
/// the other replicas; on failure this node's copy is dropped without
/// replicating, so the next replica pops. The callback runs on an idle
/// [`Worker`], or on a new one (no task is spawned per pop).
fn dispatch(
    shard: &Rc<Shard>,
    popped: Timer,
    target: u64,
    wait: Option<Duration>,
    scheduled_ms: u64,
) {
    let pop = &shard.pop;
    let timers = &shard.base.resolved.config.timers;
    assert!(
        pop.in_flight.get() < timers.callback_in_flight_max,
        "the pop loop keeps the bound"
    );
    pop.in_flight.set(pop.in_flight.get() + 1);
    pop.targets.take(target);
    let slot = Slot {
        shard: shard.clone(),
        target,
        unique: popped.unique,
        version: popped.version,
    };
    let job = PopJob {
        slot,
        popped,
        wait,
        scheduled_ms,
    };
    let idle = pop.idle.borrow_mut().pop();
    match idle {
        Some(worker) => {
            assert!(worker.job.replace(Some(job)).is_none(), "an idle worker");
            worker.wake.notify();
        }
        None => {
            // Every worker is busy: with `in_flight` callbacks running and
            // one worker per callback, there are at most
            // `callback-in-flight-max` workers.
            let worker = Rc::new(Worker {
                job: Cell::new(Some(job)),
                wake: Notify::default(),
            });
            crate::runtime::spawn::spawn_local(work(shard.clone(), worker)).detach();
        }
    }
}

/// One pop's callback, handed to a [`Worker`].
struct PopJob {
    /// Given back when the callback ends, whatever the outcome.
    slot: Slot,
    /// The pop as it was taken.
    popped: Timer,
    wait: Option<Duration>,
    /// When it was due (engine ms): its lateness is counted from here.
    scheduled_ms: u64,
}

/// Idle workers a shard keeps for the next pops; a worker finishing its
/// callback while this many wait ends (a burst of thousands of callbacks
/// must not keep thousands of tasks alive afterwards).
const IDLE_WORKERS_MAX: usize = 256;

/// A long-lived callback task: runs one pop's callback at a time, then
/// waits on the shard's idle list for the next. Workers are made only
/// while every one is busy, so a shard has at most
/// `callback-in-flight-max` of them, of which at most [`IDLE_WORKERS_MAX`]
/// idle; each ends at shutdown.
pub(super) struct Worker {
    job: Cell<Option<PopJob>>,
    wake: Notify,
}

async fn work(shard: Rc<Shard>, me: Rc<Worker>) {
    loop {
        if let Some(job) = me.job.take() {
            run_callback(job).await;
        }
        if shard.base.gate.is_closing() {
            return;
        }
        if shard.pop.idle.borrow().len() >= IDLE_WORKERS_MAX {
            // Past a burst the extra workers end: one keeps its task's
            // memory (kilobytes) for good while idle.
            return;
        }
        shard.pop.idle.borrow_mut().push(me.clone());
        future::or(me.wake.wait(), shard.base.gate.closing()).await;
        let job = me.job.take();
        match job {
            Some(job) => me.job.set(Some(job)),
            None => {
                // Shutdown, no job: off the idle list, so none comes.
                shard.pop.idle.borrow_mut().retain(|w| !Rc::ptr_eq(w, &me));
                return;
            }
        }
    }
}

/// Send one pop's callback and act on its outcome.
async fn run_callback(job: PopJob) {
    let PopJob {
        slot,
        popped,
        wait,
        scheduled_ms,
    } = job;
    let shard = &slot.shard;
    let (unique, version, sequence) = (popped.unique, popped.version, popped.sequence);
    let key = CallbackKey {
        unique,
        bloom: popped.bloom,
        version,
        sequence,
        due_ms: scheduled_ms,
        // A timer with a delivery policy: its first attempt.
        attempt: u8::from(popped.delivery().is_some()),
    };
    let started = Instant::now();
    let started_unix_ms = clock::unix_ms();
    let result = shard
        .outbound
        .client
        .callback(popped.uri(), popped.opaque().as_bytes(), key, wait)
        .await;
    let stats = shard.base.my_stats();
    stats.record_callback_latency(started.elapsed().as_micros() as u64);
    // A first attempt that never went out (no connection within the wait)
    // is a late pop, left to the next replica as any other.
    let waited_out = matches!(&result, Err(e) if e.waited_out);
    if key.attempt == 1 && !waited_out {
        count_outcome(stats, &result);
        // Before the slot's drop logs the stored copy: the attempt's
        // state is logged first.
        shard.first_attempt_ended(popped, started_unix_ms, result);
        drop(slot);
        return;
    }
    match result {
        Ok(()) => {
            ShardStats::add(&stats.callbacks_succeeded, 1);
            shard.replicate_pop(&popped);
        }
        Err(e) if e.withdrawn => ShardStats::add(&stats.callbacks_withdrawn, 1),
        Err(e) if e.refused => {
            ShardStats::add(&stats.callbacks_refused, 1);
            log_refused(&popped, sequence, &e.reason);
            on_failure(shard, unique, version, sequence, &e.reason);
        }
        Err(e) => {
            let counter = if e.waited_out {
                &stats.callbacks_deferred
            } else {
                &stats.callbacks_failed
            };
            ShardStats::add(counter, 1);
            tracing::debug!(target: "chronos::callback", "callback {sequence} failed: {e}");
            on_failure(shard, unique, version, sequence, &e.reason);
        }
    }
    drop(slot);
}

/// The callback counters for a pop with a delivery policy (its retries
/// and given-up pops are counted by `shard/retry`).
fn count_outcome(stats: &ShardStats, result: &Result<(), crate::http::client::RequestError>) {
    let counter = match result {
        Ok(()) => &stats.callbacks_succeeded,
        Err(e) if e.withdrawn => &stats.callbacks_withdrawn,
        Err(e) if e.refused => &stats.callbacks_refused,
        Err(e) if e.waited_out => &stats.callbacks_deferred,
        Err(_) => &stats.callbacks_failed,
    };
    ShardStats::add(counter, 1);
}

/// A failed callback drops this node's live copy (without replicating), so
/// the next replica pops it: unless the timer has been replaced meanwhile.
/// Where no later replica or site pops it (a single node, the last
/// replica), that ends a repeating timer: logged at warn with the ID and
/// the reason, at most once per [`ENDED_LOG_EVERY`] per shard.
fn on_failure(shard: &Shard, unique: u64, version: u64, sequence: u32, reason: &str) {
    let mut store = shard.timers.store.borrow_mut();
    let Some((_, t)) = store.get(unique) else {
        return;
    };
    if t.version != version || t.sequence != sequence || t.is_tombstone() {
        return;
    }
    // The stored copy waits for a later pop of its own: a repeating timer.
    let ended = (!has_later_pop_elsewhere(shard, t)).then(|| t.id());
    store.remove(unique, shard.durable.log());
    shard.refresh_gauges(&store);
    drop(store);
    if let Some(id) = ended {
        log_ended(id.to_hex_string(), sequence, reason);
    }
}

/// The least time between two "ends a repeating timer" lines of a shard.
pub const ENDED_LOG_EVERY: Duration = Duration::from_secs(10);

thread_local! {
    /// This shard's "ends a repeating timer" line (a shard is a thread).
    static ENDED_LOGGED: crate::runtime::loglimit::LogLimit = const { Cell::new((None, 0)) };
}

thread_local! {
    /// This shard's "callback refused by the guard" line.
    static REFUSED_LOGGED: crate::runtime::loglimit::LogLimit = const { Cell::new((None, 0)) };
}

/// A callback the guard refused at connect time, logged at warn at most
/// once per [`ENDED_LOG_EVERY`] per shard (a client can make many).
fn log_refused(popped: &Timer, sequence: u32, reason: &str) {
    REFUSED_LOGGED.with(|limit| {
        let Some(quiet) = crate::runtime::loglimit::log_due(limit, Instant::now(), ENDED_LOG_EVERY) else {
            return;
        };
        let more = match quiet {
            0 => String::new(),
            n => format!(" ({n} more refused since the last such line)"),
        };
        let id = popped.id().to_hex_string();
        tracing::warn!(target: "chronos::callback", "timer {id}: callback {sequence} not sent: {reason}; counted as failed (chronos_callbacks_refused_total){more}");
    });
}

fn log_ended(id: String, sequence: u32, reason: &str) {
    ENDED_LOGGED.with(|limit| {
        let Some(quiet) = crate::runtime::loglimit::log_due(limit, Instant::now(), ENDED_LOG_EVERY) else {
            return;
        };
        let more = match quiet {
            0 => String::new(),
            n => format!(" ({n} more ended since the last such line)"),
        };
        tracing::warn!(target: "chronos::callback", "timer {id}: callback {sequence} failed ({reason}) and no later replica or site pops it: the repeating timer ends here, its later pops are dropped{more}");
    });
}
