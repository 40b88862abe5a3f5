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
//! it reads the table's dead-row count from `pg_stat_user_tables` and, when
//! `vacuum-dead-rows` more have piled up than the last vacuum left behind,
//! runs `VACUUM` on the table.
//!
//! - On a connection of its own ([`Pg::maintenance`](super::pg::Pg::maintenance)): `VACUUM` cannot run
//!   in a transaction, may take longer than `statement-timeout-ms`, and
//!   must not hold up the shard's inserts, claims or deletes.
//! - Rows an older snapshot may still see (a long transaction anywhere on
//!   the server, a standby's feedback, a replication slot) cannot be
//!   removed: counting from what the last vacuum left, not from zero,
//!   keeps the node from vacuuming back to back while they stay.
//! - A lock held by another node's vacuum (or autovacuum) is waited on at
//!   most [`LOCK_WAIT_MS`], then the round is skipped (and not counted), so
//!   several nodes never pile up on one table.
//! - Bounded: one statement at a time per node, each given at most
//!   [`VACUUM_TIMEOUT_MS`]; at shutdown or past the limit the connection is
//!   dropped, and Postgres (14 and later, `client_connection_check_interval`)
//!   ends the vacuum within a second (its finished work is kept).
//! - Failures are logged at most once per [`LOG_EVERY`] and retried the
//!   next round; they never touch readiness: a queue whose vacuum fails
//!   only runs slower.

use super::pg::{describe, within, Maintenance};
use super::QueueShard;
use crate::stats::ShardStats;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio_postgres::error::SqlState;

/// A `VACUUM` is given this long (its session's `statement_timeout`).
const VACUUM_TIMEOUT_MS: u64 = 600_000;
/// The dead-row look-up is given this long.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// A lock held by another vacuum (another node's, autovacuum) is waited
/// on at most this long; then the round is skipped.
const LOCK_WAIT_MS: u64 = 100;
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
        // Dead rows the last vacuum left (0 until one ran).
        let mut left = 0;
        let mut logged: Option<Instant> = None;
        loop {
            self.pause(every_ms).await;
            if self.gate.is_closing() {
                return;
            }
            let round = self.vacuum_round(&mut session, &mut left, dead_rows_min);
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

    /// One round: (re)connect if needed, read the dead rows, vacuum when
    /// at least `dead_rows_min` more have piled up than the last vacuum
    /// left behind (`left`). `Err` drops the session.
    async fn vacuum_round(
        &self,
        session: &mut Option<Maintenance>,
        left: &mut u64,
        dead_rows_min: u64,
    ) -> Result<(), String> {
        if session.as_ref().is_none_or(Maintenance::is_broken) {
            *session = Some(self.vacuum_session().await?);
        }
        let s = session.as_ref().expect("made above");
        let dead_rows = self.dead_rows(s).await?;
        if dead_rows < left.saturating_add(dead_rows_min) {
            return Ok(());
        }
        let started = Instant::now();
        let sql = format!("VACUUM {}", self.cfg().table);
        let limit = Duration::from_millis(VACUUM_TIMEOUT_MS) + super::pg::TIMEOUT_GRACE;
        let done = within(limit, s.client.batch_execute(&sql))
            .await
            .ok_or("VACUUM not answered")?;
        match done {
            Ok(()) => {}
            // Another vacuum holds the table: this round is skipped.
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => return Ok(()),
            Err(e) => return Err(format!("VACUUM: {}", describe(&e))),
        }
        // What this vacuum could not remove (rows an older snapshot may
        // still see): reported by the vacuum itself, so read at once.
        *left = self.dead_rows(s).await?;
        ShardStats::add(&self.stats().queue_vacuums, 1);
        tracing::debug!(target: "chronos::queue", dead_rows, left = *left, took_ms = started.elapsed().as_millis() as u64, "vacuumed the queue table");
        Ok(())
    }

    /// The maintenance session, set up for vacuuming: a lock held by
    /// another vacuum is waited on at most [`LOCK_WAIT_MS`]; and Postgres
    /// checks every second that the client is still there (14 and later:
    /// an older server only ignores it), so a vacuum this node gave up
    /// (shutdown, the timeout) ends with its connection.
    async fn vacuum_session(&self) -> Result<Maintenance, String> {
        let s = self.pg_delete.maintenance(VACUUM_TIMEOUT_MS).await?;
        let set = format!("SET lock_timeout = {LOCK_WAIT_MS}");
        within(LOOKUP_TIMEOUT, s.client.batch_execute(&set))
            .await
            .ok_or("session set-up not answered")?
            .map_err(|e| describe(&e))?;
        let check = "SET client_connection_check_interval = 1000";
        let _ = within(LOOKUP_TIMEOUT, s.client.batch_execute(check)).await;
        Ok(s)
    }

    /// The table's dead rows as Postgres's statistics report them.
    async fn dead_rows(&self, s: &Maintenance) -> Result<u64, String> {
        let table = &self.cfg().table;
        let row = within(
            LOOKUP_TIMEOUT,
            s.client.query_one(dead_rows_sql(), &[table]),
        )
        .await
        .ok_or("dead-row look-up not answered")?
        .map_err(|e| format!("dead-row look-up: {}", describe(&e)))?;
        let dead_rows: i64 = row.get(0);
        Ok(dead_rows.max(0) as u64)
    }
}
