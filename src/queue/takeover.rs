//! Takeover (shard 0 of each node): the claimed rows of a node that died
//! are reset within about a second, not after the whole hold time.
//!
//! Every node names its Postgres connections `chronos-<node ID>`
//! (`application_name`) and registers its ID in `<table>_nodes` on each
//! connection it makes ([`register_sql`]). A process that dies, `kill -9`
//! included, has its sockets closed by the kernel, and Postgres drops its
//! sessions from `pg_stat_activity` at once. So every
//! [`TAKEOVER_CHECK_MS`] shard 0 lists the registered nodes of its own
//! Postgres role with no session at all ([`gone_sql`]); a node missing in
//! every look for `[queue] takeover-after-ms` is dead: its claimed rows
//! are reset ([`take_over_sql`], in batches), logged (`suspected failure
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

use super::pg::retry_query;
use super::QueueShard;
use crate::stats::ShardStats;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

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

/// The session name of a node's connections.
pub fn session_name(node_id: &str) -> String {
    format!("chronos-{node_id}")
}

/// Created with the table (`pg.rs`, `schema`), inside its `DO` block.
pub fn registry_schema(table: &str) -> String {
    let r = registry(table);
    format!(
        "IF to_regclass('{r}') IS NULL THEN
            CREATE TABLE {r} (node uuid PRIMARY KEY, role name NOT NULL, since timestamp NOT NULL);
        END IF;"
    )
}

/// Run on each new connection: this node is registered (`node_id` is a
/// UUID this process made, safe to inline).
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

/// Reset up to `$2` rows claimed by node `$1`.
pub fn take_over_sql(table: &str) -> String {
    format!(
        "UPDATE {table} SET readied_at = NULL, readied_by = NULL
         WHERE id = ANY(ARRAY(SELECT id FROM {table}
                              WHERE readied_at IS NOT NULL AND readied_by = $1::text::uuid
                              LIMIT $2))
         RETURNING id"
    )
}

/// Forget node `$1` (its rows were all reset).
pub fn forget_sql(table: &str) -> String {
    format!(
        "DELETE FROM {} WHERE node = $1::text::uuid",
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

impl QueueShard {
    pub(super) async fn takeover_loop(self: Rc<Self>) {
        let after = Duration::from_millis(self.cfg().takeover_after_ms);
        assert!(!after.is_zero(), "started only when takeover is on");
        let mut absences = Absences::default();
        loop {
            self.pause(TAKEOVER_CHECK_MS).await;
            if self.gate.is_closing() {
                return;
            }
            let me = &self.shared.node_id;
            let Some(rows) = retry_query(&self.pg_delete, |c| &c.gone, &[me]).await else {
                return;
            };
            let gone = rows.iter().filter_map(|r| r.try_get(0).ok()).collect();
            for node in absences.looked(gone, Instant::now(), after) {
                if !self.take_over(&node, after).await {
                    return;
                }
            }
        }
    }

    /// Reset every row `node` claimed, then forget it; `false` only at
    /// shutdown.
    async fn take_over(&self, node: &String, after: Duration) -> bool {
        let mut taken = 0usize;
        loop {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
                [node, &TAKEOVER_BATCH_MAX];
            let Some(rows) = retry_query(&self.pg_delete, |c| &c.take_over, &params).await else {
                return false;
            };
            assert!(
                rows.len() as i64 <= TAKEOVER_BATCH_MAX,
                "the statement has a LIMIT"
            );
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
        if retry_query(&self.pg_delete, |c| &c.forget, &[node])
            .await
            .is_none()
        {
            return false;
        }
        self.claim_wake.notify();
        tracing::warn!(target: "chronos::queue", "node {node} had no connection to Postgres for {} ms: {taken} claimed messages taken over", after.as_millis());
        true
    }
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
