//! Delete: rows whose publish the broker acknowledged (or that can never
//! be published), each by its ID and the incarnation published (its
//! deadline, this node as its holder; `pg.rs`, `delete_sql`), in batches of at most [`DELETE_BATCH_MAX`] IDs per
//! statement. An ID stays in the shard's in-hand bound until its delete
//! is done. At shutdown the task deletes what is in hand, then ends.

use super::deadline::system_time_of;
use super::pg::retry_query;
use super::{id_bytes, QueueShard};
use crate::stats::Stage;
use std::rc::Rc;
use std::time::{Instant, SystemTime};

/// IDs deleted per statement.
const DELETE_BATCH_MAX: usize = 5000;

impl QueueShard {
    pub(super) async fn delete_loop(self: Rc<Self>) {
        loop {
            if self.to_delete.borrow().is_empty() {
                if self.gate.is_closing() {
                    return;
                }
                futures_lite::future::or(self.delete_wake.wait(), self.gate.closing()).await;
                continue;
            }
            // Left in `to_delete` (only this task removes from it, others
            // only append) until deleted, so that the refresh keeps them
            // fresh however long the delete is retried.
            let (ids, deadlines): (Vec<String>, Vec<SystemTime>) = {
                let all = self.to_delete.borrow();
                all[..all.len().min(DELETE_BATCH_MAX)]
                    .iter()
                    .map(|(id, deadline_us)| (id.clone(), system_time_of(*deadline_us)))
                    .unzip()
            };
            assert!(
                !ids.is_empty() && ids.len() <= DELETE_BATCH_MAX,
                "a delete batch is taken only when non-empty, within its bound"
            );
            assert_eq!(ids.len(), deadlines.len(), "an incarnation per ID");
            let started = Instant::now();
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                [&ids, &deadlines, &self.shared.node_id];
            let Some(rows) = retry_query(&self.pg_delete, |c| &c.delete, &params).await else {
                return;
            };
            {
                let mut all = self.to_delete.borrow_mut();
                let n = ids.len().min(all.len());
                all.drain(..n);
            }
            self.stats().record_pg_batch(started.elapsed());
            self.stats()
                .record_queue_stage(Stage::Delete, started.elapsed());
            let bytes: usize = ids.iter().map(|id| id_bytes(id)).sum();
            self.in_hand.sub(ids.len(), bytes);
            if rows.len() < ids.len() {
                let gone: std::collections::HashSet<String> = rows
                    .iter()
                    .filter_map(|r| r.try_get::<_, String>(0).ok())
                    .collect();
                for id in ids.iter().filter(|id| !gone.contains(*id)) {
                    tracing::warn!(target: "chronos::queue", "message {id} was not deleted: its row is gone, or is no longer the one this node published (taken over by a peer after a suspected failure, or replaced by a newer message with its ID)");
                }
            }
        }
    }
}
