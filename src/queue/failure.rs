//! Failure detection (shard 0 of each node): rows readied longer than the
//! hold time ago are reset so that any node claims them again, and each is
//! logged as `suspected failure of <node> for message <id>`. At most
//! [`STUCK_BATCH_MAX`] rows per pass. Rows this node readied are never
//! reset by it: it still holds every one of them (held in a wheel or being
//! published, retried until acknowledged), even when a broker outage keeps
//! them past the hold time; resetting them would publish them twice. A
//! restarted node has a new node ID, so its predecessor's rows are reset.
//!
//! Liveness (every shard): every third of the hold time a shard refreshes
//! `readied_at` of the rows it holds, so no other node's detection takes it
//! for dead while it is alive, however long a broker outage keeps the rows
//! in its hands. Without it, two nodes holding rows through an outage
//! longer than the hold time reset each other's rows (80 of 80 in
//! `a_broker_outage_past_the_hold_time_resets_no_live_node_s_rows`).

use super::pg::retry_query;
use super::{Kind, QueueShard};
use crate::stats::ShardStats;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

/// Rows examined per failure-detection pass.
const STUCK_BATCH_MAX: i64 = 1000;

impl QueueShard {
    pub(super) async fn refresh_loop(self: Rc<Self>) {
        let period_ms = (self.cfg().hold_time_ms / 3).max(50);
        loop {
            self.pause(period_ms).await;
            if self.gate.is_closing() {
                return;
            }
            let ids = self.held_ids();
            if ids.is_empty() {
                continue;
            }
            let now = SystemTime::now();
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                [&now, &ids, &self.shared.node_id];
            if retry_query(&self.pg, |c| &c.refresh, &params)
                .await
                .is_none()
            {
                return;
            }
        }
    }

    /// The IDs of the rows this shard holds: waiting in its wheel, or
    /// being published (bounded by the claim bound).
    fn held_ids(&self) -> Vec<String> {
        let mut ids = Vec::new();
        self.held
            .borrow()
            .for_each(|_, _, h| ids.push(h.id.clone()));
        for p in self.pending.borrow().values() {
            if let Kind::Held { id, .. } = &p.kind {
                ids.push(id.clone());
            }
        }
        ids
    }

    pub(super) async fn failure_detection_loop(self: Rc<Self>) {
        let cfg = self.cfg().clone();
        loop {
            let jitter = self.jitter_ms(cfg.failure_detection_interval_ms / 10);
            self.pause(cfg.failure_detection_interval_ms + jitter).await;
            if self.gate.is_closing() {
                return;
            }
            let cutoff = SystemTime::now() - Duration::from_millis(cfg.hold_time_ms);
            let Some(rows) = retry_query(
                &self.pg,
                |c| &c.stuck,
                &[&cutoff, &STUCK_BATCH_MAX, &self.shared.node_id],
            )
            .await
            else {
                return;
            };
            assert!(
                rows.len() as i64 <= STUCK_BATCH_MAX,
                "the stuck statement has a LIMIT"
            );
            if rows.is_empty() {
                continue;
            }
            let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            let by: Vec<String> = rows.iter().map(|r| r.get(1)).collect();
            let at: Vec<SystemTime> = rows.iter().map(|r| r.get(2)).collect();
            let Some(reset) = retry_query(&self.pg, |c| &c.reset, &[&ids, &by, &at]).await else {
                return;
            };
            for r in &reset {
                let id: String = r.get(0);
                let node: String = r.get(1);
                tracing::warn!(target: "chronos::queue", "suspected failure of {node} for message {id}");
            }
            ShardStats::add(&self.stats().queue_reset, reset.len() as u64);
        }
    }
}
