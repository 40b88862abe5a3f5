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
    loop {
        if shard.shutting_down.get() || SHUTDOWN.load(Ordering::Relaxed) {
            return;
        }
        let now = clock::now_ms();
        let fired = shard
            .store
            .borrow_mut()
            .poll(now, POPS_PER_TURN_MAX, &mut due);
        if fired > 0 {
            ShardStats::add(&shard.my_stats().timers_popped, fired as u64);
            for (_, mut timer) in due.drain(..) {
                dispatch(&shard, &timer);
                timer.sequence += 1;
                if timer.has_next_pop() {
                    let next = timer.next_pop_ms(skew);
                    shard.store.borrow_mut().insert(next, timer);
                }
            }
            let pending = shard.store.borrow().len() as i64;
            shard
                .my_stats()
                .timers_pending
                .store(pending, Ordering::Relaxed);
        }
        if fired == POPS_PER_TURN_MAX {
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

/// Start the callback of one pop, bounded by the in-flight limit.
fn dispatch(shard: &Rc<Shard>, timer: &Timer) {
    if timer.is_tombstone() {
        return;
    }
    let stats = shard.my_stats();
    if shard.client.in_flight() >= shard.resolved.config.timers.callback_in_flight_max {
        ShardStats::add(&stats.callbacks_dropped, 1);
        ShardStats::add(&stats.callbacks_failed, 1);
        tracing::warn!(target: "chronos::callback", "callback in-flight bound reached; pop counted as failed");
        on_failure(shard, timer.unique, timer.start_ms, timer.sequence + 1);
        return;
    }
    let (data, uri_len) = timer.data();
    let sequence = timer.sequence + 1;
    let (unique, start_ms) = (timer.unique, timer.start_ms);
    let shard = shard.clone();
    glommio::spawn_local(async move {
        let started = Instant::now();
        let result = shard.client.callback(&data, uri_len, sequence).await;
        let stats = shard.my_stats();
        stats.record_callback_latency(started.elapsed().as_micros() as u64);
        match result {
            Ok(()) => ShardStats::add(&stats.callbacks_succeeded, 1),
            Err(e) => {
                ShardStats::add(&stats.callbacks_failed, 1);
                tracing::debug!(target: "chronos::callback", "callback {sequence} failed: {e}");
                on_failure(&shard, unique, start_ms, sequence);
            }
        }
    })
    .detach();
}

/// A failed callback drops this node's copy (without replicating), so the
/// next replica pops it: unless the client has replaced the timer meanwhile.
fn on_failure(shard: &Shard, unique: u64, start_ms: u64, sequence: u32) {
    let mut store = shard.store.borrow_mut();
    let same = store
        .get(unique)
        .is_some_and(|(_, t)| t.start_ms == start_ms && t.sequence == sequence);
    if same {
        store.remove(unique);
        let pending = store.len() as i64;
        shard
            .my_stats()
            .timers_pending
            .store(pending, Ordering::Relaxed);
    }
}
