//! Failure detection (shard 0 of each node): rows readied longer than the
//! hold time ago are reset so that any node claims them again, earliest
//! deadline first, and each is logged as `suspected failure of <node> for
//! message <id>`. At most [`STUCK_BATCH_MAX`] rows per statement; a full
//! batch is followed by the next at once. This node's own rows are reset
//! too: the rows it holds (in a wheel, being published, retried until
//! acknowledged, or waiting for their delete) are kept fresh by the
//! refresh below, so the only own rows
//! that come up are rows it lost, such as a claim whose reply never
//! arrived (committed, then the connection was cut): nobody else would
//! ever publish those (issue 25). A restarted node has a new node ID, so
//! its predecessor's rows are reset as any other node's.
//!
//! Every `readied_at` is the server's clock (the claim and the refresh
//! write `now()`, detection compares with it), so a statement retried
//! through a Postgres stall stamps the time it ran, and the nodes' clocks
//! never meet.
//!
//! Liveness (every shard): every quarter of the hold time a shard refreshes
//! `readied_at` of the rows it holds that may be older than that, so no
//! detection (another node's or its own) takes them for lost while it is
//! alive, however long a broker outage keeps them in its hands. Without it,
//! two nodes holding rows through an outage longer than the hold time
//! reset each other's rows (80 of 80 in
//! `a_broker_outage_past_the_hold_time_resets_no_live_node_s_rows`).
//!
//! A row's `readied_at` is never older than its deadline minus the
//! look-ahead (it was claimed at or after that), so rows due further ahead
//! than the refresh period minus the look-ahead need no refresh: in a
//! free-flowing queue (rows fire within the look-ahead) a pass updates
//! nothing. After each pass every held row's `readied_at` is at most one
//! period old, so it is at most two periods (half the hold time) old, plus
//! the refresh statement's own time, when detection looks.
//!
//! Postgres stalled (the consumer thread, each turn): past `[queue]
//! postgres-stall-leave-ms` without an answer on some shard, the node
//! leaves the consumer group, so that another node takes its partitions;
//! it joins again once every shard's Postgres answers.

use super::pg::retry_query;
use super::{Kind, QueueShard, QueueShared};
use crate::stats::ShardStats;
use rdkafka::consumer::Consumer;
use std::rc::Rc;
use std::time::SystemTime;

/// Rows reset per failure-detection statement.
const STUCK_BATCH_MAX: i64 = 10_000;

impl QueueShard {
    /// The refresh period: a quarter of the hold time.
    fn refresh_period_ms(&self) -> u64 {
        (self.cfg().hold_time_ms / 4).max(50)
    }

    pub(super) async fn refresh_loop(self: Rc<Self>) {
        let period_ms = self.refresh_period_ms();
        loop {
            self.pause(period_ms).await;
            if self.gate.is_closing() {
                return;
            }
            let ids = self.held_ids_to_refresh(SystemTime::now());
            if ids.is_empty() {
                continue;
            }
            // `readied_at` becomes the server's time when the statement
            // runs (at each attempt), as in the claim.
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
                [&ids, &self.shared.node_id];
            // On the connection that runs failure detection: this node's
            // detection never runs ahead of its own refresh queued behind
            // a slow claim (it would reset rows the node still holds).
            if retry_query(&self.pg_delete, |c| &c.refresh, &params)
                .await
                .is_none()
            {
                return;
            }
        }
    }

    /// The IDs of the rows this shard holds (waiting in its wheel, or being
    /// published; bounded by the claim bound) whose `readied_at` may be
    /// older than one refresh period: those due before `now - period +
    /// look-ahead`; and every row published and waiting for its delete
    /// (its deadline is not kept; a delete held up by Postgres must not
    /// let detection reset and publish it again).
    fn held_ids_to_refresh(&self, now: SystemTime) -> Vec<String> {
        let now_us = super::deadline::unix_us_of(now);
        let skew_us = (self.cfg().look_ahead_ms as i64 - self.refresh_period_ms() as i64) * 1000;
        let due_before_us = now_us.saturating_add(skew_us);
        let mut ids = Vec::new();
        self.held.borrow().for_each(|_, _, h| {
            if h.deadline_us < due_before_us {
                ids.push(h.id.clone());
            }
        });
        for p in self.pending.borrow().values() {
            if let Kind::Held { id, deadline_us } = &p.kind {
                if *deadline_us < due_before_us {
                    ids.push(id.clone());
                }
            }
        }
        ids.extend(self.to_delete.borrow().iter().map(|(id, _)| id.clone()));
        ids
    }

    pub(super) async fn failure_detection_loop(self: Rc<Self>) {
        let cfg = self.cfg().clone();
        loop {
            let jitter = self.jitter_ms(cfg.failure_detection_interval_ms / 10);
            self.pause(cfg.failure_detection_interval_ms + jitter).await;
            loop {
                if self.gate.is_closing() {
                    return;
                }
                let Some(full) = self.reset_stuck(cfg.hold_time_ms).await else {
                    return;
                };
                if !full {
                    break;
                }
                glommio::yield_if_needed().await;
            }
        }
    }

    /// Reset up to [`STUCK_BATCH_MAX`] rows readied longer than the hold
    /// time ago, earliest deadline first: `Some(true)` if the batch was
    /// full; `None` only at shutdown.
    async fn reset_stuck(&self, hold_time_ms: u64) -> Option<bool> {
        // On the server's clock, as the claim and the refresh.
        let hold_ms = i64::try_from(hold_time_ms).unwrap_or(i64::MAX);
        let rows =
            retry_query(&self.pg_delete, |c| &c.stuck, &[&hold_ms, &STUCK_BATCH_MAX]).await?;
        if rows.len() as i64 > STUCK_BATCH_MAX {
            // Postgres's answer: logged, never a crash; all are reset.
            tracing::error!(target: "chronos::queue", "failure detection's look-up returned {} rows past its LIMIT", rows.len());
        }
        if rows.is_empty() {
            return Some(false);
        }
        let mut ids: Vec<String> = Vec::with_capacity(rows.len());
        let mut by: Vec<Option<String>> = Vec::with_capacity(rows.len());
        let mut at: Vec<SystemTime> = Vec::with_capacity(rows.len());
        for r in &rows {
            // `readied_at` is not NULL here; a row that is not as expected
            // is left alone rather than trusted.
            if let (Ok(i), Ok(b), Ok(a)) = (r.try_get(0), r.try_get(1), r.try_get(2)) {
                ids.push(i);
                by.push(b);
                at.push(a);
            }
        }
        let reset = retry_query(&self.pg_delete, |c| &c.reset, &[&ids, &by, &at]).await?;
        for r in &reset {
            let id: String = r.try_get(0).unwrap_or_default();
            let node: Option<String> = r.try_get(1).unwrap_or_default();
            let node = node.as_deref().unwrap_or("an unknown node");
            tracing::warn!(target: "chronos::queue", "suspected failure of {node} for message {id}");
        }
        ShardStats::add(&self.stats().queue_reset, reset.len() as u64);
        Some(rows.len() as i64 == STUCK_BATCH_MAX)
    }
}

/// The consumer thread's side of a Postgres stall. While the node is out
/// of the group, every message polled (and every one waiting for room) is
/// dropped, so that the thread keeps polling and the leave completes. That
/// loses nothing: no message after a dropped one reaches a shard, so no
/// offset past it is stored, and whoever owns the partition next reads it
/// again from the committed offset.
#[derive(Default)]
pub struct StallWatch {
    /// Whether the node left the group because of a stall.
    left: bool,
}

impl StallWatch {
    /// Whether the node is out of the group (messages are dropped).
    pub fn is_out(&self) -> bool {
        self.left
    }

    /// Called by the consumer thread each turn: leave the consumer group
    /// while some shard's Postgres has been unusable longer than `[queue]
    /// postgres-stall-leave-ms`, join again once every shard's answers.
    /// `true` when it just left: drop what waits for room.
    pub fn check(&mut self, shared: &QueueShared) -> bool {
        let stalled_ms = shared.pg_health.stalled_ms();
        let bound = shared.config.postgres_stall_leave_ms;
        if !self.left && stalled_ms > bound {
            tracing::warn!(target: "chronos::queue", "Postgres unusable for {stalled_ms} ms (postgres-stall-leave-ms = {bound}): leaving the consumer group, so that another node takes this node's partitions");
            shared.consumer.unsubscribe();
            self.left = true;
            return true;
        }
        if self.left && stalled_ms == 0 {
            let topic = shared.config.input_topic.as_str();
            match shared.consumer.subscribe(&[topic]) {
                Ok(()) => {
                    tracing::info!(target: "chronos::queue", "Postgres usable again: joining the consumer group");
                    self.left = false;
                }
                Err(e) => {
                    tracing::warn!(target: "chronos::queue", "joining the consumer group again: {e}")
                }
            }
        }
        false
    }

    /// Hand `m` to its shard's inbox (which has room), or drop it while
    /// the node is out of the group; `false` when the inbox is closed.
    pub fn hand_over(
        &mut self,
        inbox: &async_channel::Sender<super::Inbound>,
        m: super::Inbound,
    ) -> bool {
        if self.left {
            return true;
        }
        match inbox.try_send(m) {
            Ok(()) => true,
            Err(async_channel::TrySendError::Closed(_)) => false,
            Err(async_channel::TrySendError::Full(m)) => inbox.send_blocking(m).is_ok(),
        }
    }
}
