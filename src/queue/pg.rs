//! One Postgres connection per shard, driven on the shard's own executor:
//! `tokio-postgres` over a glommio socket (through the futures→tokio I/O
//! compat adapter and `connect_raw`; no tokio runtime).
//!
//! Every statement is prepared once per connection and works on a batch
//! (`UNNEST` arrays, `= ANY($1)`). A failed connection is dropped and
//! re-made with an exponential backoff (`BACKOFF_MS_MIN`..`BACKOFF_MS_MAX`);
//! callers retry their batch, so nothing is lost while Postgres is away.

use super::QueueConfig;
use crate::runtime::gate::Gate;
use std::cell::{Cell, RefCell};
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};
use tokio_util::compat::FuturesAsyncReadCompatExt;

pub const BACKOFF_MS_MIN: u64 = 100;
pub const BACKOFF_MS_MAX: u64 = 5_000;
/// At most one "still unreachable" log line per this long.
const LOG_EVERY: Duration = Duration::from_secs(30);

/// The schema of seed 004, created if missing. `message_key` is `bytea` (not
/// `varchar(128)`) so that binary and long keys are relayed byte for byte.
pub fn schema(table: &str) -> String {
    // One creator at a time (an advisory lock), so that nodes and shards
    // starting together do not race on the catalog.
    format!(
        "SET client_min_messages TO warning;
        BEGIN;
        SELECT pg_advisory_xact_lock(7253004);
        CREATE TABLE IF NOT EXISTS {table} (
            id varchar(128) PRIMARY KEY,
            deadline timestamp NOT NULL,
            readied_at timestamp,
            readied_by uuid,
            message_headers jsonb,
            message_key bytea,
            message_value bytea
        );
        CREATE INDEX IF NOT EXISTS {table}_waiting_idx ON {table} (deadline) WHERE readied_at IS NULL;
        CREATE INDEX IF NOT EXISTS {table}_readied_idx ON {table} (readied_at) WHERE readied_at IS NOT NULL;
        COMMIT;"
    )
}

/// A connected client and its prepared statements.
pub struct Conn {
    pub client: Client,
    pub insert: Statement,
    pub exists: Statement,
    pub ready: Statement,
    pub delete: Statement,
    pub stuck: Statement,
    pub reset: Statement,
    pub refresh: Statement,
    /// Set when the connection task ends.
    broken: Rc<Cell<bool>>,
}

/// A message claimed from the table.
pub struct Claimed {
    pub id: String,
    pub deadline: SystemTime,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// `[{"name": "value"}, ...]` as stored.
    pub headers: Option<String>,
}

pub struct Pg {
    config: tokio_postgres::Config,
    table: String,
    conn: RefCell<Option<Rc<Conn>>>,
    /// Serialises (re)connection attempts.
    connecting: glommio::sync::Semaphore,
    failing_since: Cell<Option<Instant>>,
    last_log: Cell<Option<Instant>>,
    /// Where `pg_up` (readiness, read by any shard) is kept.
    stats: std::sync::Arc<[crate::stats::ShardStats]>,
    shard: usize,
    /// Retries stop when it closes.
    gate: Rc<Gate>,
}

impl Pg {
    pub fn new(
        q: &QueueConfig,
        stats: std::sync::Arc<[crate::stats::ShardStats]>,
        shard: usize,
        gate: Rc<Gate>,
    ) -> Pg {
        assert!(shard < stats.len(), "shard {shard} has no stats");
        Pg {
            stats,
            shard,
            gate,
            config: q.postgres_url.parse().expect("validated at config load"),
            table: q.table.clone(),
            conn: RefCell::new(None),
            connecting: glommio::sync::Semaphore::new(1),
            failing_since: Cell::new(None),
            last_log: Cell::new(None),
        }
    }

    fn set_up(&self, up: bool) {
        self.stats[self.shard].pg_up.store(up, Ordering::Relaxed);
    }

    /// A working connection, waiting (with backoff) until there is one.
    /// `None` only at shutdown.
    pub async fn get(&self) -> Option<Rc<Conn>> {
        let mut backoff_ms = BACKOFF_MS_MIN;
        loop {
            let current = self.conn.borrow().clone();
            if let Some(c) = current {
                if !c.broken.get() {
                    return Some(c);
                }
                self.conn.borrow_mut().take();
                self.set_up(false);
            }
            if self.gate.is_closing() {
                return None;
            }
            let Ok(_permit) = self.connecting.acquire_permit(1).await else {
                return None;
            };
            if self.conn.borrow().as_ref().is_some_and(|c| !c.broken.get()) {
                continue;
            }
            match self.connect().await {
                Ok(c) => {
                    if let Some(since) = self.failing_since.take() {
                        tracing::info!(target: "chronos::queue", "Postgres reachable again after {:?}", since.elapsed());
                    }
                    self.set_up(true);
                    *self.conn.borrow_mut() = Some(c.clone());
                    return Some(c);
                }
                Err(e) => {
                    self.failed(&e);
                    self.pause(backoff_ms).await;
                    backoff_ms = (backoff_ms * 2).min(BACKOFF_MS_MAX);
                }
            }
        }
    }

    /// Sleep `ms`, or less if shutdown begins.
    async fn pause(&self, ms: u64) {
        let sleep = glommio::timer::sleep(Duration::from_millis(ms));
        futures_lite::future::or(sleep, self.gate.closing()).await;
    }

    /// Report a failed statement: the connection is dropped and re-made.
    pub fn reset(&self, e: &tokio_postgres::Error) {
        self.failed(&describe(e));
        if let Some(c) = self.conn.borrow_mut().take() {
            c.broken.set(true);
        }
        self.set_up(false);
    }

    fn failed(&self, e: &str) {
        let now = Instant::now();
        if self.failing_since.get().is_none() {
            self.failing_since.set(Some(now));
        }
        let due = self
            .last_log
            .get()
            .is_none_or(|at| now.duration_since(at) >= LOG_EVERY);
        if due {
            self.last_log.set(Some(now));
            tracing::warn!(target: "chronos::queue", "Postgres unavailable, retrying with backoff: {e}");
        }
    }

    async fn connect(&self) -> Result<Rc<Conn>, String> {
        let addr = self.address().await?;
        let stream = glommio::net::TcpStream::connect_timeout(addr, Duration::from_secs(2))
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (client, connection) = self
            .config
            .connect_raw(stream.compat(), NoTls)
            .await
            .map_err(|e| format!("Postgres handshake: {e}"))?;
        let broken = Rc::new(Cell::new(false));
        let flag = broken.clone();
        glommio::spawn_local(async move {
            if let Err(e) = connection.await {
                tracing::debug!(target: "chronos::queue", "Postgres connection ended: {e}");
            }
            flag.set(true);
        })
        .detach();
        // Idempotent; two shards racing on the catalog retry via backoff.
        let t = &self.table;
        client
            .batch_execute(&schema(t))
            .await
            .map_err(|e| format!("create table {t}: {}", describe(&e)))?;
        prepare(client, t, broken).await.map(Rc::new)
    }

    async fn address(&self) -> Result<SocketAddr, String> {
        let host = self
            .config
            .get_hosts()
            .iter()
            .find_map(|h| match h {
                tokio_postgres::config::Host::Tcp(name) => Some(name.clone()),
                #[allow(unreachable_patterns)]
                _ => None,
            })
            .ok_or("postgres-url names no TCP host")?;
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            return Ok(SocketAddr::new(ip, port));
        }
        glommio::executor()
            .spawn_blocking(move || {
                (host.as_str(), port)
                    .to_socket_addrs()
                    .map(|mut a| a.next())
            })
            .await
            .map_err(|e| format!("resolve Postgres host: {e}"))?
            .ok_or_else(|| "Postgres host has no address".to_string())
    }
}

/// An error with the server's message when there is one.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// Why a statement over input data gave up.
#[derive(Debug)]
pub enum QueryError {
    /// Shutdown began while it was retrying.
    Shutdown,
    /// Postgres refused the data itself (see [`is_permanent`]): the same
    /// statement with the same data would fail again.
    Permanent(String),
}

/// Errors that retrying cannot fix, because the data is at fault: data
/// exceptions (class 22: a NUL in `text`, a value out of range, bad JSON),
/// integrity violations (23) and program limits (54, e.g. a row too
/// large). Everything else (connection loss, class 08; serialization, 40;
/// resources, 53; a dropped table, 42, which the reconnect re-creates) is
/// retried.
pub fn is_permanent(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| matches!(&db.code().code()[..2], "22" | "23" | "54"))
}

/// Run one statement, reconnecting and retrying with backoff until it
/// succeeds. `None` only at shutdown. For statements over the table's own
/// rows, which Postgres has already accepted once.
pub async fn retry_query(
    pg: &Pg,
    pick: impl Fn(&Conn) -> &Statement,
    params: &[&(dyn ToSql + Sync)],
) -> Option<Vec<Row>> {
    loop {
        match query_input(pg, &pick, params).await {
            Ok(rows) => return Some(rows),
            Err(QueryError::Shutdown) => return None,
            Err(QueryError::Permanent(e)) => {
                // Not expected over stored rows; never spin on it.
                tracing::error!(target: "chronos::queue", "statement refused, retrying: {e}");
                pg.pause(BACKOFF_MS_MAX).await;
            }
        }
    }
}

/// Run one statement over input data: transient errors are retried with
/// backoff (reconnecting); a permanent one is returned at once.
pub async fn query_input(
    pg: &Pg,
    pick: impl Fn(&Conn) -> &Statement,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, QueryError> {
    let mut backoff_ms = BACKOFF_MS_MIN;
    loop {
        let conn = pg.get().await.ok_or(QueryError::Shutdown)?;
        match conn.client.query(pick(&conn), params).await {
            Ok(rows) => return Ok(rows),
            Err(e) if is_permanent(&e) => return Err(QueryError::Permanent(describe(&e))),
            Err(e) => {
                pg.reset(&e);
                pg.pause(backoff_ms).await;
                if pg.gate.is_closing() {
                    return Err(QueryError::Shutdown);
                }
                backoff_ms = (backoff_ms * 2).min(BACKOFF_MS_MAX);
            }
        }
    }
}

/// Prepare the queue's statements on a fresh connection.
async fn prepare(client: Client, t: &str, broken: Rc<Cell<bool>>) -> Result<Conn, String> {
    let prep = |sql: String| {
        let client = &client;
        async move {
            client
                .prepare(&sql)
                .await
                .map_err(|e| format!("prepare: {}", describe(&e)))
        }
    };
    let insert = prep(format!(
        "INSERT INTO {t} (id, deadline, message_headers, message_key, message_value)
         SELECT i, d, h::jsonb, k, v
         FROM UNNEST($1::text[], $2::timestamp[], $3::text[], $4::bytea[], $5::bytea[]) AS m(i, d, h, k, v)
         ON CONFLICT (id) DO NOTHING"
    ))
    .await?;
    let exists = prep(format!("SELECT id FROM {t} WHERE id = ANY($1::text[])")).await?;
    let ready = prep(format!(
        "UPDATE {t} SET readied_at = $1, readied_by = $2::text::uuid
         WHERE id IN (SELECT id FROM {t} WHERE deadline <= $3 AND readied_at IS NULL
                      ORDER BY deadline LIMIT $4 FOR UPDATE SKIP LOCKED)
         RETURNING id, deadline, message_key, message_value, message_headers::text"
    ))
    .await?;
    let delete = prep(format!(
        "DELETE FROM {t} WHERE id = ANY($1::text[]) RETURNING id"
    ))
    .await?;
    let stuck = prep(format!(
        "SELECT id, readied_by::text, readied_at FROM {t}
         WHERE readied_at < $1 AND readied_by <> $3::text::uuid LIMIT $2"
    ))
    .await?;
    let reset = prep(format!(
        "UPDATE {t} AS t SET readied_at = NULL, readied_by = NULL
         FROM UNNEST($1::text[], $2::text[], $3::timestamp[]) AS s(i, b, a)
         WHERE t.id = s.i AND t.readied_by = s.b::uuid AND t.readied_at = s.a
         RETURNING t.id, s.b"
    ))
    .await?;
    let refresh = prep(format!(
        "UPDATE {t} SET readied_at = $1
         WHERE id = ANY($2::text[]) AND readied_by = $3::text::uuid"
    ))
    .await?;
    Ok(Conn {
        client,
        refresh,
        insert,
        exists,
        ready,
        delete,
        stuck,
        reset,
        broken,
    })
}
