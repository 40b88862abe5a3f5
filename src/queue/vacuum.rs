//! The node's own vacuum of the queue table (shard 0 of each node).
//!
//! Every message leaves two dead rows behind: the claim's update and the
//! delete. Until they are vacuumed, each claim walks the waiting index past
//! their entries, so a claim's cost grows with the dead rows, not the live
//! ones. Postgres's autovacuum visits a database at most once per
//! `autovacuum_naptime` (a minute by default) and may be off altogether (it
//! is on the CI machine): at 40 k messages/s that is millions of dead rows
//! between visits, and the claims fell seconds behind (perf/README, issue
//! 22). So the node does not rely on it: every `[queue] vacuum-check-ms`
//! it reads the table's dead-row count from `pg_stat_user_tables` and, at
//! `vacuum-dead-rows` or more, runs `VACUUM (SKIP_LOCKED)` on the table.
//!
//! - On a connection of its own ([`Pg::maintenance`](super::pg::Pg::maintenance)): `VACUUM` cannot run
//!   in a transaction, may take longer than `statement-timeout-ms`, and
//!   must not hold up the shard's inserts, claims or deletes.
//! - `SKIP_LOCKED`: when another node's vacuum (or autovacuum) holds the
//!   table, this round is skipped rather than queued behind it, so several
//!   nodes never pile up on one table.
//! - Bounded: one statement at a time per node, each given at most
//!   [`VACUUM_TIMEOUT_MS`]; shutdown drops it (the connection closes and
//!   Postgres ends the vacuum; a vacuum's finished work is kept).
//! - Failures are logged at most once per [`LOG_EVERY`] and retried the
//!   next round; they never touch readiness: a queue whose vacuum fails
//!   only runs slower.

use super::pg::{describe, within, Maintenance};
use super::QueueShard;
use crate::stats::ShardStats;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// A `VACUUM` is given this long (its session's `statement_timeout`).
const VACUUM_TIMEOUT_MS: u64 = 600_000;
/// The dead-row look-up is given this long.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// At most one log line about a failing vacuum per this long.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The dead rows of `table` Postgres's statistics report (0 when it has
/// none yet). Reported with a lag of about a second (the backends flush
/// their counts at most once a second).
fn dead_rows_sql() -> &'static str {
    "SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables
                      WHERE relid = to_regclass($1::text)), 0)"
}

impl QueueShard {
    /// The vacuum task (shard 0 only; see the module doc). Returns at
    /// shutdown, or at once when `vacuum-dead-rows` is 0 (off).
    pub(super) async fn vacuum_loop(self: Rc<Self>) {
        let dead_rows_min = self.cfg().vacuum_dead_rows;
        if dead_rows_min == 0 {
            return;
        }
        let every_ms = self.cfg().vacuum_check_ms;
        assert!(every_ms > 0, "vacuum-check-ms is checked at config load");
        let mut session: Option<Maintenance> = None;
        let mut logged: Option<Instant> = None;
        loop {
            self.pause(every_ms).await;
            if self.gate.is_closing() {
                return;
            }
            let round = self.vacuum_round(&mut session, dead_rows_min);
            let Some(result) = futures_lite::future::or(async { Some(round.await) }, async {
                self.gate.closing().await;
                None
            })
            .await
            else {
                return;
            };
            if let Err(e) = result {
                session = None;
                if logged.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
                    logged = Some(Instant::now());
                    tracing::warn!(target: "chronos::queue", table = %self.cfg().table, "queue table vacuum failed (retried every vacuum-check-ms; the queue runs, slower as dead rows grow): {e}");
                }
            }
        }
    }

    /// One round: (re)connect if needed, read the dead rows, vacuum at
    /// `dead_rows_min` or more. `Err` drops the session.
    async fn vacuum_round(
        &self,
        session: &mut Option<Maintenance>,
        dead_rows_min: u64,
    ) -> Result<(), String> {
        if session.as_ref().is_none_or(Maintenance::is_broken) {
            *session = Some(self.pg_delete.maintenance(VACUUM_TIMEOUT_MS).await?);
        }
        let s = session.as_ref().expect("made above");
        let table = &self.cfg().table;
        let row = within(
            LOOKUP_TIMEOUT,
            s.client.query_one(dead_rows_sql(), &[table]),
        )
        .await
        .ok_or("dead-row look-up not answered")?
        .map_err(|e| format!("dead-row look-up: {}", describe(&e)))?;
        let dead_rows: i64 = row.get(0);
        if dead_rows < 0 || (dead_rows as u64) < dead_rows_min {
            return Ok(());
        }
        let started = Instant::now();
        let sql = format!("VACUUM (SKIP_LOCKED) {table}");
        let limit = Duration::from_millis(VACUUM_TIMEOUT_MS) + super::pg::TIMEOUT_GRACE;
        within(limit, s.client.batch_execute(&sql))
            .await
            .ok_or("VACUUM not answered")?
            .map_err(|e| format!("VACUUM: {}", describe(&e)))?;
        let stats = self.stats();
        ShardStats::add(&stats.queue_vacuums, 1);
        tracing::debug!(target: "chronos::queue", dead_rows, took_ms = started.elapsed().as_millis() as u64, "vacuumed the queue table");
        Ok(())
    }
}
