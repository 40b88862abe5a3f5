//! Claim and fire: rows whose deadline is within the look-ahead are claimed
//! (`readied_at`/`readied_by`, `FOR UPDATE SKIP LOCKED`, at most one claim
//! batch per statement), held in the shard's queue wheel, and published at
//! `deadline - timing advance`, so jitter is the wheel's, not the poll's.

use super::deadline::unix_us_of;
use super::headers::parse_headers_json;
use super::pg::retry_query;
use super::{Held, Kind, Pending, QueueShard, CLAIMED_IN_HAND_BATCHES};
use crate::runtime::clock;
use crate::stats::Stage;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

/// Messages published per turn of the fire task.
const FIRE_PER_TURN_MAX: usize = 1024;

/// The claimed rows' bytes as the claim counts them (its last column).
fn claimed_bytes(rows: &[tokio_postgres::Row]) -> i64 {
    rows.iter()
        .map(|r| r.try_get::<_, i64>(5).unwrap_or(0))
        .fold(0, i64::saturating_add)
}

impl QueueShard {
    pub(super) async fn claim_loop(self: Rc<Self>) {
        let cfg = self.cfg().clone();
        // Claimed messages held, being published or yet to be deleted stay
        // below this, in messages and in bytes (one claim takes at least
        // one row, so the bytes may pass the bound by one row): while the
        // broker is away, claims stop instead of piling up in memory.
        let in_hand_max = cfg.claim_batch_max * CLAIMED_IN_HAND_BATCHES;
        while !self.gate.is_closing() {
            let in_hand = self.in_hand.count.get();
            let in_hand_bytes = self.in_hand.bytes.get();
            if in_hand >= in_hand_max || in_hand_bytes >= cfg.in_hand_bytes_max {
                self.pause(cfg.poll_interval_ms).await;
                continue;
            }
            let now = SystemTime::now();
            let horizon = now + Duration::from_millis(cfg.look_ahead_ms);
            let limit = cfg.claim_batch_max.min(in_hand_max - in_hand) as i64;
            assert!(limit > 0, "claims only with room in hand");
            let started = Instant::now();
            let node_id = &self.shared.node_id;
            let room = cfg.in_hand_bytes_max - in_hand_bytes;
            let bytes_max = cfg.claim_batch_bytes_max.min(room) as i64;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                [node_id, &horizon, &limit, &bytes_max];
            let Some(rows) = retry_query(&self.pg_claim, |c| &c.ready, &params).await else {
                return;
            };
            self.stats().record_pg_batch(started.elapsed());
            self.stats()
                .record_queue_stage(Stage::Claim, started.elapsed());
            let claimed = rows.len();
            if claimed as i64 > limit {
                // Postgres's answer, not this code's invariant: never a
                // crash; the rows are held all the same (the bound is
                // passed by what came back, and nothing is stranded).
                tracing::error!(target: "chronos::queue", "the claim returned {claimed} rows past its LIMIT {limit}");
            }
            let cut_short = claimed > 0 && claimed_bytes(&rows) >= bytes_max;
            if claimed > 0 {
                self.hold(rows);
            }
            // Full, or cut short by the byte bound (the rows' bytes reached
            // it: a row may have been left out): claim again at once, while
            // there is room.
            if claimed as i64 == limit || cut_short {
                glommio::yield_if_needed().await;
                continue;
            }
            // The poll interval, with a little jitter (up to 10%).
            let jitter = self.jitter_ms(cfg.poll_interval_ms / 10);
            let spent = started.elapsed().as_millis() as u64;
            // Or at once when a takeover reset rows (`takeover.rs`).
            let wait = (cfg.poll_interval_ms + jitter).saturating_sub(spent);
            futures_lite::future::or(self.pause(wait), self.claim_wake.wait()).await;
        }
    }

    /// Put claimed rows in the wheel, each at `deadline - advance` on the
    /// engine clock (rounded up: never early).
    fn hold(&self, rows: Vec<tokio_postgres::Row>) {
        let now_ms = clock::now_ms();
        let now_unix_us = clock::unix_us() as i64;
        let advance_us = self.cfg().timing_advance_ms as i64 * 1000;
        let stats = self.stats();
        let mut held = self.held.borrow_mut();
        for row in rows {
            let deadline: SystemTime = row.get(1);
            let deadline_us = unix_us_of(deadline);
            let headers: Option<String> = row.get(4);
            let h = Held {
                id: row.get(0),
                key: row.get(2),
                value: row.get(3),
                headers: headers
                    .as_deref()
                    .map(parse_headers_json)
                    .unwrap_or_default(),
                deadline_us,
            };
            self.in_hand.add(1, h.bytes());
            let ahead_us = deadline_us - advance_us - now_unix_us;
            let late_us = ahead_us.min(0).unsigned_abs();
            stats.record_queue_stage(Stage::ClaimedLate, Duration::from_micros(late_us));
            let wait_us = ahead_us.max(0) as u64;
            held.insert(now_ms + wait_us.div_ceil(1000), h);
        }
        drop(held);
        self.held_wake.notify();
    }

    pub(super) async fn fire_loop(self: Rc<Self>) {
        let mut due: Vec<(u64, Held)> = Vec::with_capacity(FIRE_PER_TURN_MAX);
        while !self.gate.is_closing() {
            let now = clock::now_ms();
            let fired = self
                .held
                .borrow_mut()
                .poll(now, FIRE_PER_TURN_MAX, |_, at_ms, h| due.push((at_ms, h)));
            assert!(
                fired <= FIRE_PER_TURN_MAX,
                "the wheel's poll keeps to its bound"
            );
            let stats = self.stats();
            for (at_ms, h) in due.drain(..) {
                let late_ms = clock::now_ms().saturating_sub(at_ms);
                stats.record_queue_stage(Stage::FireLate, Duration::from_millis(late_ms));
                self.publish(Pending {
                    kind: Kind::Held {
                        id: h.id,
                        deadline_us: h.deadline_us,
                    },
                    key: h.key,
                    value: h.value,
                    headers: h.headers,
                    attempts: 0,
                    alone: false,
                    sent: Instant::now(),
                });
            }
            if fired == FIRE_PER_TURN_MAX {
                glommio::yield_if_needed().await;
                continue;
            }
            let next = self.held.borrow().next_deadline_ms();
            let wake = next.unwrap_or(u64::MAX).min(clock::now_ms() + 100);
            let sleep = clock::instant_of(wake).saturating_duration_since(Instant::now());
            if !sleep.is_zero() {
                let wait =
                    futures_lite::future::or(glommio::timer::sleep(sleep), self.held_wake.wait());
                futures_lite::future::or(wait, self.gate.closing()).await;
            }
        }
    }
}
