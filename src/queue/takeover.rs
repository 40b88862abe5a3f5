//! Takeover (shard 0 of each node): the claimed rows of a node that died
//! are reset within about a second, not after the whole hold time.
//!
//! Every node names its Postgres connections `chronos-<node ID>`
//! (`application_name`), and shard 0 registers the node's ID in
//! `<table>_nodes` ([`register_sql`]) at start and every second after, on
//! a session of its own: a Postgres role that may not create or write the
//! registry costs only the fast takeover (logged; the hold time still
//! applies), never the queue's own connections. A process that dies, `kill -9`
//! included, has its sockets closed by the kernel, and Postgres drops its
//! sessions from `pg_stat_activity` at once. So every
//! [`TAKEOVER_CHECK_MS`] shard 0 lists the registered nodes of its own
//! Postgres role with no session at all ([`gone_sql`]); a node missing in
//! every look for `[queue] takeover-after-ms` is dead: its claimed rows
//! are reset ([`take_over_sql`], in batches, each statement checking again
//! that the node has no session and that the row is still its claim, so
//! that neither a node that came back nor another node's fresh claim of a
//! row reset by a peer is touched), logged (`suspected failure
//! of <node> for message <id>`, as failure detection does) and counted as
//! a failure detection's, and its registration removed.
//!
//! A live node is never robbed for being slow: however slow, it keeps its
//! sessions. What the rule cannot see is kept for the hold-time rule
//! (`failure.rs`), which stays: a machine that vanished without closing
//! its sockets (Postgres notices after its TCP keepalive), nodes of
//! another role (their sessions may be hidden from this one), and nodes
//! of an earlier version. A node cut off from Postgres longer than
//! `takeover-after-ms` (every one of its connections down) is taken for
//! dead: what it still publishes from memory is a duplicate, as at least
//! once allows (its deletes name its own claims only), never a loss. This
//! node's own looks start again after any gap in them (a Postgres restart
//! drops every session; the others get the time to come back).

use super::pg::{describe, within, Maintenance, TIMEOUT_GRACE};
use super::QueueShard;
use crate::stats::ShardStats;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio_postgres::Statement;

/// How often shard 0 looks for registered nodes without a session.
pub const TAKEOVER_CHECK_MS: u64 = 50;
/// Rows reset per statement.
const TAKEOVER_BATCH_MAX: i64 = 10_000;
/// A gap between two looks longer than this (a slow or failed statement)
/// starts the absence counts again.
const LOOK_GAP_MAX: Duration = Duration::from_millis(1000);

/// The registry of nodes, beside the message table.
pub fn registry(table: &str) -> String {
    format!("{table}_nodes")
}

/// Created by the first node that looks, under the advisory lock the
/// table's own creation takes (`pg.rs`, `schema`: nodes starting together
/// do not race on the catalog), once the catalog says it is missing.
pub fn registry_schema(table: &str) -> String {
    let r = registry(table);
    format!(
        "BEGIN;
         SELECT pg_advisory_xact_lock(7253004);
         DO $chronos$ BEGIN
         IF to_regclass('{r}') IS NULL THEN
             CREATE TABLE {r} (node uuid PRIMARY KEY, role name NOT NULL, since timestamp NOT NULL);
         END IF;
         END $chronos$;
         COMMIT;"
    )
}

/// This node is registered (`node_id` is a UUID this process made, safe
/// to inline).
pub fn register_sql(table: &str, node_id: &str) -> String {
    let r = registry(table);
    format!(
        "INSERT INTO {r} (node, role, since) VALUES ('{node_id}', current_user, now() AT TIME ZONE 'UTC')
         ON CONFLICT (node) DO NOTHING;\n"
    )
}

/// The registered nodes of this role, other than `$1`, with no session.
pub fn gone_sql(table: &str) -> String {
    let r = registry(table);
    format!(
        "SELECT n.node::text FROM {r} n
         WHERE n.node <> $1::text::uuid AND n.role = current_user
           AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                           WHERE a.application_name = 'chronos-' || n.node::text)"
    )
}

/// No session of node `$1` (checked again in each statement that acts).
const NO_SESSION: &str = "NOT EXISTS (SELECT 1 FROM pg_stat_activity
                                WHERE application_name = 'chronos-' || $1::text)";

/// Reset up to `$2` rows claimed by node `$1`, if it still has no session.
/// The outer condition repeats the claim: Postgres re-checks a row another
/// statement changed meanwhile against the outer condition only, so
/// without it a live node's fresh claim of the row (after a peer's
/// takeover reset it) was reset too.
pub fn take_over_sql(table: &str) -> String {
    format!(
        "UPDATE {table} SET readied_at = NULL, readied_by = NULL
         WHERE id = ANY(ARRAY(SELECT id FROM {table}
                              WHERE readied_at IS NOT NULL AND readied_by = $1::text::uuid
                              LIMIT $2))
           AND readied_at IS NOT NULL AND readied_by = $1::text::uuid AND {NO_SESSION}
         RETURNING id"
    )
}

/// Forget node `$1` (its rows were all reset), if it still has no session:
/// a node that came back keeps its registration.
pub fn forget_sql(table: &str) -> String {
    format!(
        "DELETE FROM {} WHERE node = $1::text::uuid AND {NO_SESSION}",
        registry(table)
    )
}

/// What shard 0 saw of the other nodes' sessions.
#[derive(Default)]
struct Absences {
    /// Each node missing in every look since (this node's clock).
    since: HashMap<String, Instant>,
    last_look: Option<Instant>,
}

impl Absences {
    /// A look at `now` found `gone` without a session; the nodes missing
    /// for `after` or longer are returned (and forgotten here).
    fn looked(&mut self, gone: Vec<String>, now: Instant, after: Duration) -> Vec<String> {
        let gap = self
            .last_look
            .is_none_or(|t| now.saturating_duration_since(t) > LOOK_GAP_MAX);
        self.last_look = Some(now);
        if gap {
            self.since.clear();
        }
        self.since.retain(|node, _| gone.contains(node));
        for node in gone {
            self.since.entry(node).or_insert(now);
        }
        let dead: Vec<String> = self
            .since
            .iter()
            .filter(|(_, &t)| now.saturating_duration_since(t) >= after)
            .map(|(node, _)| node.clone())
            .collect();
        for node in &dead {
            self.since.remove(node);
        }
        dead
    }
}

/// The takeover's own session and its statements.
struct Session {
    conn: Maintenance,
    gone: Statement,
    take_over: Statement,
    forget: Statement,
    /// When this node last registered itself.
    registered: Option<Instant>,
}

/// Each statement of the takeover must be answered within this.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// This node registers itself again this often (a peer's takeover may
/// have forgotten it while all its sessions were down).
const REGISTER_EVERY: Duration = Duration::from_secs(1);
/// A failed look (Postgres away, or no right to the registry) is tried
/// again after this long, on a new session.
const RETRY_AFTER_MS: u64 = 5_000;
/// At most one "takeover unavailable" line this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

impl QueueShard {
    pub(super) async fn takeover_loop(self: Rc<Self>) {
        let after = Duration::from_millis(self.cfg().takeover_after_ms);
        assert!(!after.is_zero(), "started only when takeover is on");
        let mut absences = Absences::default();
        let mut session: Option<Session> = None;
        let mut logged: Option<Instant> = None;
        loop {
            self.pause(TAKEOVER_CHECK_MS).await;
            if self.gate.is_closing() {
                return;
            }
            let look = self.look(&mut session, &mut absences, after);
            let Some(result) = self.gate.unless_closing(look).await else {
                return;
            };
            if let Err(e) = result {
                session = None;
                if logged.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
                    logged = Some(Instant::now());
                    tracing::warn!(target: "chronos::queue", "fast takeover unavailable, retried (a dead node's claimed rows wait for hold-time-ms instead): {e}");
                }
                self.pause(RETRY_AFTER_MS).await;
            }
        }
    }

    /// One look: (re)connect and register when due, list the registered
    /// nodes without a session, and take over those missing long enough.
    async fn look(
        &self,
        session: &mut Option<Session>,
        absences: &mut Absences,
        after: Duration,
    ) -> Result<(), String> {
        if session.as_ref().is_none_or(|s| s.conn.is_broken()) {
            *session = Some(self.takeover_session().await?);
        }
        let s = session.as_mut().expect("made above");
        let me = &self.shared.node_id;
        if s.registered.is_none_or(|t| t.elapsed() >= REGISTER_EVERY) {
            let register = register_sql(&self.cfg().table, me);
            bounded(s.conn.client.batch_execute(&register)).await?;
            s.registered = Some(Instant::now());
        }
        let rows = bounded(s.conn.client.query(&s.gone, &[me])).await?;
        let gone = rows.iter().filter_map(|r| r.try_get(0).ok()).collect();
        for node in absences.looked(gone, Instant::now(), after) {
            self.take_over(s, &node, after).await?;
        }
        Ok(())
    }

    /// A session of its own (`Pg::maintenance`, named as this node's), the
    /// registry created if missing, the statements prepared.
    async fn takeover_session(&self) -> Result<Session, String> {
        let timeout_ms = STATEMENT_TIMEOUT.as_millis() as u64;
        let conn = self.pg_delete.maintenance(timeout_ms).await?;
        let t = &self.cfg().table;
        bounded(conn.client.batch_execute(&registry_schema(t))).await?;
        let gone = bounded(conn.client.prepare(&gone_sql(t))).await?;
        let take_over = bounded(conn.client.prepare(&take_over_sql(t))).await?;
        let forget = bounded(conn.client.prepare(&forget_sql(t))).await?;
        Ok(Session {
            conn,
            gone,
            take_over,
            forget,
            registered: None,
        })
    }

    /// Reset every row `node` claimed, then forget it.
    async fn take_over(&self, s: &Session, node: &String, after: Duration) -> Result<(), String> {
        let mut taken = 0usize;
        loop {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
                [node, &TAKEOVER_BATCH_MAX];
            let rows = bounded(s.conn.client.query(&s.take_over, &params)).await?;
            if rows.len() as i64 > TAKEOVER_BATCH_MAX {
                // Postgres's answer: logged, never a crash.
                tracing::error!(target: "chronos::queue", "the takeover returned {} rows past its LIMIT", rows.len());
            }
            taken += rows.len();
            for r in &rows {
                let id: String = r.try_get(0).unwrap_or_default();
                tracing::warn!(target: "chronos::queue", "suspected failure of {node} for message {id} (no connection to Postgres for {} ms)", after.as_millis());
            }
            ShardStats::add(&self.stats().queue_reset, rows.len() as u64);
            if (rows.len() as i64) < TAKEOVER_BATCH_MAX {
                break;
            }
        }
        bounded(s.conn.client.execute(&s.forget, &[node])).await?;
        self.claim_wake.notify();
        tracing::warn!(target: "chronos::queue", "node {node} had no connection to Postgres for {} ms: {taken} claimed messages taken over", after.as_millis());
        Ok(())
    }
}

/// A statement of the takeover's session, answered within
/// [`STATEMENT_TIMEOUT`] (plus the grace), its error described.
async fn bounded<T>(
    f: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, String> {
    within(STATEMENT_TIMEOUT + TIMEOUT_GRACE, f)
        .await
        .ok_or_else(|| "a takeover statement was not answered in time".to_string())?
        .map_err(|e| describe(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_dead_only_when_missing_in_every_look_for_the_whole_time() {
        let mut a = Absences::default();
        let after = Duration::from_millis(500);
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let gone = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(a.looked(gone(&["x", "y"]), ms(0), after).is_empty());
        assert!(a.looked(gone(&["x"]), ms(300), after).is_empty());
        // y came back in between: its count starts again.
        assert!(a.looked(gone(&["x", "y"]), ms(400), after).is_empty());
        assert_eq!(a.looked(gone(&["x", "y"]), ms(500), after), ["x"]);
        assert!(a.looked(gone(&["y"]), ms(800), after).is_empty());
        assert_eq!(a.looked(gone(&["y"]), ms(900), after), ["y"]);
        // A gap in the looks (this node's Postgres away) starts again.
        assert!(a.looked(gone(&["z"]), ms(1000), after).is_empty());
        assert!(a.looked(gone(&["z"]), ms(3000), after).is_empty());
        assert!(a.looked(gone(&["z"]), ms(3400), after).is_empty());
        assert_eq!(a.looked(gone(&["z"]), ms(3500), after), ["z"]);
    }
}
