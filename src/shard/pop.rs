//! The pop loop: sleep until the wheel's next deadline (or until an earlier
//! timer arrives), take what is due, and hand each pop to its own callback
//! task. The loop itself never waits on the network.

use super::{Shard, SHUTDOWN};
use crate::runtime::clock;
use crate::stats::ShardStats;
use crate::timer::Timer;
use futures_lite::future;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Pops taken from the wheel per turn before yielding to other tasks.
pub const POPS_PER_TURN_MAX: usize = 1024;
/// Longest sleep with nothing due, so shutdown is noticed promptly.
const IDLE_SLEEP_MS: u64 = 100;

pub async fn pop_loop(shard: Rc<Shard>) {
    let mut due: Vec<(u64, Timer)> = Vec::with_capacity(POPS_PER_TURN_MAX);
    let skew = shard.resolved.config.timers.replica_skew_ms;
    let in_flight_max = shard.resolved.config.timers.callback_in_flight_max;
    loop {
        if shard.shutting_down.get() || SHUTDOWN.load(Ordering::Relaxed) {
            return;
        }
        // Backpressure: with every callback slot taken, due timers stay in
        // the wheel (late, not lost) until a callback finishes.
        let room = in_flight_max.saturating_sub(shard.client.in_flight());
        if room == 0 {
            shard.pop_blocked.set(true);
            future::or(
                shard.pop_wake.wait(),
                glommio::timer::sleep(std::time::Duration::from_millis(IDLE_SLEEP_MS)),
            )
            .await;
            continue;
        }
        let limit = POPS_PER_TURN_MAX.min(room);
        let now = clock::now_ms();
        let fired = shard.store.borrow_mut().poll(now, limit, &mut due);
        if fired > 0 {
            let stats = shard.my_stats();
            for (_, mut timer) in due.drain(..) {
                if timer.is_tombstone() {
                    // Lived out its interval.
                    ShardStats::add(&stats.tombstones_expired, 1);
                    continue;
                }
                ShardStats::add(&stats.timers_popped, 1);
                dispatch(&shard, &timer);
                timer.sequence += 1;
                if timer.has_next_pop() {
                    let next = timer.next_pop_ms(skew);
                    shard.store.borrow_mut().insert(next, timer);
                } else if shard.has_peers() {
                    // The final pop: keep a tombstone one more interval, so
                    // a stale message cannot bring the timer back.
                    let tomb = timer.to_tombstone();
                    let until = now + shard.tombstone_life_ms(&tomb);
                    shard.store.borrow_mut().insert(until, tomb);
                }
            }
            shard.refresh_gauges(&shard.store.borrow());
        }
        if fired == limit {
            glommio::yield_if_needed().await;
            continue;
        }
        let next = shard.store.borrow().next_deadline_ms();
        let wake_ms = next
            .unwrap_or(u64::MAX)
            .min(clock::now_ms() + IDLE_SLEEP_MS);
        shard.pop_armed_ms.set(wake_ms);
        let sleep_for = clock::instant_of(wake_ms).saturating_duration_since(Instant::now());
        if !sleep_for.is_zero() {
            future::or(glommio::timer::sleep(sleep_for), shard.pop_wake.wait()).await;
        }
        shard.pop_armed_ms.set(u64::MAX);
    }
}

/// Start the callback of one pop, bounded by the in-flight limit (the pop
/// loop only takes as many due timers as there are free slots). On
/// success the pop is replicated to the other replicas; on failure this
/// node's copy is dropped without replicating, so the next replica pops.
fn dispatch(shard: &Rc<Shard>, timer: &Timer) {
    let stats = shard.my_stats();
    let sequence = timer.sequence + 1;
    let (unique, version) = (timer.unique, timer.version);
    if shard.client.in_flight() >= shard.resolved.config.timers.callback_in_flight_max {
        ShardStats::add(&stats.callbacks_dropped, 1);
        ShardStats::add(&stats.callbacks_failed, 1);
        tracing::warn!(target: "chronos::callback", "callback in-flight bound reached; pop counted as failed");
        on_failure(shard, unique, version, sequence);
        return;
    }
    let (data, uri_at, uri_len) = timer.callback_data();
    let shard = shard.clone();
    glommio::spawn_local(async move {
        let started = Instant::now();
        let result = shard
            .client
            .callback(&data[uri_at..], uri_len, sequence)
            .await;
        let stats = shard.my_stats();
        stats.record_callback_latency(started.elapsed().as_micros() as u64);
        if shard.pop_blocked.replace(false) {
            shard.pop_wake.notify();
        }
        match result {
            Ok(()) => {
                ShardStats::add(&stats.callbacks_succeeded, 1);
                shard.replicate_pop(unique, version, sequence);
            }
            Err(e) => {
                ShardStats::add(&stats.callbacks_failed, 1);
                tracing::debug!(target: "chronos::callback", "callback {sequence} failed: {e}");
                on_failure(&shard, unique, version, sequence);
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
