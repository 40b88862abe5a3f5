//! The pop loop: sleep until the wheel's next deadline (or until an earlier
//! timer arrives), take what is due, and hand each pop to its own callback
//! task. The loop itself never waits on the network. It holds the shard's
//! gate and ends as soon as shutdown begins.

use super::Shard;
use crate::runtime::clock;
use crate::runtime::notify::Notify;
use crate::stats::ShardStats;
use crate::timer::Timer;
use futures_lite::future;
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Pops taken from the wheel per turn before yielding to other tasks.
pub const POPS_PER_TURN_MAX: usize = 1024;
/// Longest sleep with nothing due (the wheel's deadline may move).
const IDLE_SLEEP_MS: u64 = 100;

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
}

/// Gives a callback slot back on every exit path of its task.
struct Slot(Rc<Shard>);

impl Drop for Slot {
    fn drop(&mut self) {
        let pop = &self.0.pop;
        assert!(pop.in_flight.get() > 0, "a slot was taken");
        pop.in_flight.set(pop.in_flight.get() - 1);
        if pop.blocked.replace(false) {
            pop.wake.notify();
        }
    }
}

impl Default for PopState {
    fn default() -> Self {
        PopState {
            wake: Notify::default(),
            blocked: Cell::new(false),
            armed_ms: Cell::new(u64::MAX),
            in_flight: Cell::new(0),
        }
    }
}

impl PopState {
    /// Wake the loop if `due_ms` is before the deadline it sleeps until.
    pub fn wake_if_before(&self, due_ms: u64) {
        if due_ms < self.armed_ms.get() {
            self.wake.notify();
        }
    }
}

pub async fn pop_loop(shard: Rc<Shard>) {
    let mut due: Vec<(u64, Timer)> = Vec::with_capacity(POPS_PER_TURN_MAX);
    let in_flight_max = shard.resolved.config.timers.callback_in_flight_max;
    let pop = &shard.pop;
    while !shard.gate.is_closing() {
        // Backpressure: with every callback slot taken, due timers stay in
        // the wheel (late, not lost) until a callback finishes.
        let room = in_flight_max.saturating_sub(pop.in_flight.get());
        if room == 0 {
            pop.blocked.set(true);
            let idle = glommio::timer::sleep(Duration::from_millis(IDLE_SLEEP_MS));
            future::or(future::or(pop.wake.wait(), idle), shard.gate.closing()).await;
            continue;
        }
        let limit = POPS_PER_TURN_MAX.min(room);
        let now = clock::now_ms();
        let fired = shard.store.borrow_mut().poll(now, limit, &mut due);
        assert!(fired <= limit && due.len() == fired);
        if fired > 0 {
            take_due(&shard, now, &mut due);
        }
        if fired == limit {
            glommio::yield_if_needed().await;
            continue;
        }
        let next = shard.store.borrow().next_deadline_ms();
        let wake_ms = next
            .unwrap_or(u64::MAX)
            .min(clock::now_ms() + IDLE_SLEEP_MS);
        pop.armed_ms.set(wake_ms);
        let sleep_for = clock::instant_of(wake_ms).saturating_duration_since(Instant::now());
        if !sleep_for.is_zero() {
            let sleep = future::or(glommio::timer::sleep(sleep_for), pop.wake.wait());
            future::or(sleep, shard.gate.closing()).await;
        }
        pop.armed_ms.set(u64::MAX);
    }
}

/// Dispatch every due timer and put repeating ones back at their next pop
/// (the final pop leaves a tombstone one more life, when there are peers).
fn take_due(shard: &Rc<Shard>, now: u64, due: &mut Vec<(u64, Timer)>) {
    let stats = shard.my_stats();
    let skew = shard.resolved.config.timers.replica_skew_ms;
    for (due_ms, mut timer) in due.drain(..) {
        if timer.is_tombstone() {
            // Lived out its interval, and any informational copy with it.
            ShardStats::add(&stats.tombstones_expired, 1);
            shard.store.borrow_mut().drop_info(timer.unique);
            continue;
        }
        ShardStats::add(&stats.timers_popped, 1);
        shard.record_latency(now.saturating_sub(due_ms) * 1000);
        dispatch(shard, &timer);
        timer.sequence += 1;
        if timer.has_next_pop() {
            let next = timer.next_pop_ms(skew);
            shard.store.borrow_mut().insert(next, timer);
        } else if shard.keeps_tombstones() {
            // The final pop: keep a tombstone one more interval, so a stale
            // message cannot bring the timer back.
            let tomb = timer.to_tombstone();
            let until = now + shard.tombstone_life_ms(&tomb);
            shard.store.borrow_mut().insert(until, tomb);
        }
    }
    shard.refresh_gauges(&shard.store.borrow());
}

/// Start the callback of one pop. The pop loop takes only as many due
/// timers as there are free slots, and the slot is taken here, before the
/// task exists. A pop waiting for a connection is late, not failed: the
/// last replica waits as long as it takes; one with a later replica waits
/// `callback-wait-ms` at most and then leaves the pop to that replica, so
/// the skew rule holds (tuning.md). On success the pop is replicated to
/// the other replicas; on failure this node's copy is dropped without
/// replicating, so the next replica pops.
fn dispatch(shard: &Rc<Shard>, timer: &Timer) {
    let pop = &shard.pop;
    let timers = &shard.resolved.config.timers;
    assert!(
        pop.in_flight.get() < timers.callback_in_flight_max,
        "the pop loop keeps the bound"
    );
    pop.in_flight.set(pop.in_flight.get() + 1);
    let slot = Slot(shard.clone());
    let sequence = timer.sequence + 1;
    let (unique, version) = (timer.unique, timer.version);
    let later_replica = timer.replica_index as usize + 1 < timer.replication_factor as usize;
    let sites = &shard.resolved.sites;
    let later_site =
        sites.replicating() && sites.names(timer.sites).len() > timer.site_index as usize + 1;
    let wait = ((later_replica && shard.has_peers()) || later_site)
        .then(|| Duration::from_millis(timers.callback_wait_ms));
    let (data, uri_at, uri_len) = timer.callback_data();
    glommio::spawn_local(async move {
        let shard = &slot.0;
        let started = Instant::now();
        let result = shard
            .client
            .callback(&data[uri_at..], uri_len, sequence, wait)
            .await;
        let stats = shard.my_stats();
        stats.record_callback_latency(started.elapsed().as_micros() as u64);
        match result {
            Ok(()) => {
                ShardStats::add(&stats.callbacks_succeeded, 1);
                shard.replicate_pop(unique, version, sequence);
            }
            Err(e) => {
                let counter = if e.waited_out {
                    &stats.callbacks_deferred
                } else {
                    &stats.callbacks_failed
                };
                ShardStats::add(counter, 1);
                tracing::debug!(target: "chronos::callback", "callback {sequence} failed: {e}");
                on_failure(shard, unique, version, sequence);
            }
        }
    })
    .detach();
}

/// A failed callback drops this node's live copy (without replicating), so
/// the next replica pops it: unless the timer has been replaced meanwhile.
fn on_failure(shard: &Shard, unique: u64, version: u64, sequence: u32) {
    let mut store = shard.store.borrow_mut();
    let same = store
        .get(unique)
        .is_some_and(|(_, t)| t.version == version && t.sequence == sequence && !t.is_tombstone());
    if same {
        store.remove(unique);
        shard.refresh_gauges(&store);
    }
}
