//! Three Postgres connections per shard (and on shard 0 a fourth for the
//! vacuum and a fifth for the takeover, [`Pg::maintenance`]), driven on the shard's own executor:
//! `tokio-postgres` over a glommio socket (through the futures→tokio I/O
//! compat adapter and `connect_raw`; no tokio runtime). [`Role::Input`]
//! carries the inserts (and the late messages' look-up), each committed
//! durably before the input offsets are stored; the statements over rows
//! already stored commit with `synchronous_commit = off`: [`Role::Claim`]
//! the claims, [`Role::Delete`] the deletes, the liveness refresh and
//! failure detection (the refresh beside detection: behind a slow claim it
//! would let this node's own detection reset rows the node holds). Postgres runs one connection's statements one after
//! another, each with its own commit: on one connection a claim waited
//! behind an insert and its fdatasync, an insert behind a claim and a
//! delete, and a claim behind a delete (perf/README, issue 22). A claim,
//! delete or refresh whose commit is lost in a Postgres crash (the last few
//! hundred ms of them) is only undone: the row is claimed again or reset by
//! failure detection, and published again, a duplicate as at-least-once
//! allows, never a loss.
//!
//! Every statement is prepared once per connection and works on a batch
//! (`UNNEST` arrays, `= ANY($1)`). A failed connection is dropped and
//! re-made with an exponential backoff (`BACKOFF_MS_MIN`..`BACKOFF_MS_MAX`);
//! callers retry their batch, so nothing is lost while Postgres is away.
//!
//! A Postgres that stops answering is noticed, not waited on: every
//! statement and every handshake must be answered within `[queue]
//! statement-timeout-ms` (plus [`TIMEOUT_GRACE`], so that Postgres's own
//! `statement_timeout`, set to the same value, reports a slow statement
//! first); the sockets have TCP keepalives. A connection that misses it is
//! replaced (its task cancelled). Until a statement succeeds again the
//! shard counts as unusable: `/ready` says so, and past `[queue]
//! postgres-stall-leave-ms` the consumer thread leaves the group
//! ([`Health`]).

use super::sql::{delete_sql, insert_sql, SERVER_NOW};
use super::QueueShared;
use crate::runtime::clock;
use crate::runtime::gate::Gate;
use crate::stats::PG_CONNECTIONS;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};
use tokio_util::compat::FuturesAsyncReadCompatExt;

pub const BACKOFF_MS_MIN: u64 = 100;
pub const BACKOFF_MS_MAX: u64 = 5_000;
/// At most one "still unreachable" log line per this long.
const LOG_EVERY: Duration = Duration::from_secs(30);
/// The client waits this much longer than Postgres's `statement_timeout`.
pub const TIMEOUT_GRACE: Duration = Duration::from_millis(1000);
/// TCP connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Keepalive probes before the kernel gives the connection up.
const KEEPALIVE_PROBES: u32 = 3;

/// What a shard's connection carries (see the module's doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Input = 0,
    Claim = 1,
    Delete = 2,
}

/// Per-connection Postgres health (slot `shard * PG_CONNECTIONS + role`),
/// shared with the consumer thread: the Unix ms of the first failure since
/// the last success (0: usable).
pub struct Health {
    since_ms: Box<[AtomicU64]>,
}

impl Health {
    pub fn new(shards: usize) -> Health {
        Health {
            since_ms: (0..shards).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn set(&self, slot: usize, since_ms: u64) {
        if let Some(s) = self.since_ms.get(slot) {
            s.store(since_ms, Ordering::Relaxed);
        }
    }

    /// How long the longest-failing connection has been unusable (0: none
    /// is).
    pub fn stalled_ms(&self) -> u64 {
        let now = clock::unix_ms();
        self.since_ms
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .filter(|&since| since > 0)
            .map(|since| now.saturating_sub(since))
            .max()
            .unwrap_or(0)
    }
}

/// Cancels a connection's task when dropped before the connection is
/// ready (a handshake given up), so that a stalled socket is closed, not
/// kept.
struct TaskGuard(Option<glommio::task::JoinHandle<()>>);

impl TaskGuard {
    /// The connection is ready: its task is kept (a [`Conn`] cancels it
    /// when given up; dropped, its client gone, the task ends by itself
    /// after telling Postgres).
    fn keep(mut self) -> glommio::task::JoinHandle<()> {
        self.0.take().expect("kept once")
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.cancel();
        }
    }
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
    /// Set when the connection task ends or the connection is given up.
    broken: Rc<Cell<bool>>,
    /// The connection task, cancelled when the connection is given up.
    task: glommio::task::JoinHandle<()>,
}

impl Conn {
    fn give_up(&self) {
        self.broken.set(true);
        self.task.cancel();
    }
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
    /// The first failure since the last success.
    failing_since: Cell<Option<Instant>>,
    last_log: Cell<Option<Instant>>,
    /// Where `pg_up` (readiness, read by any shard) is kept.
    stats: std::sync::Arc<[crate::stats::ShardStats]>,
    /// The same for the consumer thread, with the time.
    health: Arc<Health>,
    shard: usize,
    role: Role,
    /// Postgres's `statement_timeout`, ms.
    statement_timeout_ms: u64,
    /// A statement or handshake not answered within this is given up.
    timeout: Duration,
    keepalive: Duration,
    /// Retries stop when it closes.
    gate: Rc<Gate>,
}

/// A maintenance connection ([`Pg::maintenance`]); its task is cancelled
/// when it is dropped.
pub struct Maintenance {
    pub client: Client,
    broken: Rc<Cell<bool>>,
    _task: TaskGuard,
}

impl Maintenance {
    /// The connection has ended (make a new one).
    pub fn is_broken(&self) -> bool {
        self.broken.get()
    }
}

/// The schema of seed 004, created if missing. `message_key` is `bytea` (not
/// `varchar(128)`) so that binary and long keys are relayed byte for byte.
///
/// Each object is created only when `to_regclass` finds it missing: a
/// `CREATE INDEX IF NOT EXISTS` takes a share lock on the table before it
/// looks, so a connection re-made under load waited behind every write in
/// flight and held up the ones after it. A new table gets its own
/// autovacuum settings (a dead-row threshold, no scale factor, no cost
/// delay): every message leaves two dead rows (its claim and its delete),
/// and a claim walks the waiting index past every dead entry not yet
/// vacuumed (`vacuum.rs`, the node's own vacuum, does not rely on them).
pub fn schema(table: &str) -> String {
    // One creator at a time (an advisory lock), so that nodes and shards
    // starting together do not race on the catalog. `table` is a plain
    // identifier (checked at config load), so quoting it inside the
    // block's string literals is safe.
    format!(
        "SET client_min_messages TO warning;
        BEGIN;
        SELECT pg_advisory_xact_lock(7253004);
        DO $chronos$
        BEGIN
        IF to_regclass('{table}') IS NULL THEN
            CREATE TABLE {table} (
                id varchar(128) PRIMARY KEY,
                deadline timestamp NOT NULL,
                readied_at timestamp,
                readied_by uuid,
                message_headers jsonb,
                message_key bytea,
                message_value bytea
            ) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = {AUTOVACUUM_DEAD_ROWS},
                    autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = {AUTOVACUUM_DEAD_ROWS},
                    autovacuum_vacuum_cost_delay = 0);
        END IF;
        IF to_regclass('{table}_waiting_idx') IS NULL THEN
            CREATE INDEX {table}_waiting_idx ON {table} (deadline) WHERE readied_at IS NULL;
        END IF;
        IF to_regclass('{table}_readied_idx') IS NULL THEN
            CREATE INDEX {table}_readied_idx ON {table} (readied_at) WHERE readied_at IS NOT NULL;
        END IF;
        END $chronos$;
        COMMIT;"
    )
}

/// Every execution of a prepared statement is planned for its own
/// parameters and the table as it is then (Postgres 12 and later; an older
/// server skips it). A generic plan is cached after five executions, and
/// one cached while the table was empty scans it whole: the claim's outer
/// `UPDATE ... WHERE id = ANY(...)` (and the delete, the refresh) then
/// compared every row with every claimed ID. Nothing re-planned it before
/// the first vacuum or analyze (none, with autovacuum off, while claims
/// that slow made no dead rows): at 40 k messages/s a fresh table's claims
/// took seconds each (perf/README, issue 22). Planning a batch statement
/// costs well under a millisecond.
const CUSTOM_PLANS: &str = "SELECT set_config('plan_cache_mode', 'force_custom_plan', false)
    WHERE current_setting('server_version_num')::int >= 120000;\n";

/// Every statement of the node looks rows up by an index (the primary key,
/// the waiting or the readied index); none is meant to read the table
/// whole, nor to sort what it found. With `random_page_cost` at its disk
/// default and statistics that lag a fast-growing table (autovacuum off,
/// or not yet run), the planner chose otherwise (perf/README, issue 22,
/// 2026-11-25, at 40 k messages/s): a sequential scan for the delete of
/// ~650 IDs among 110,000 rows (45-280 ms each), and for the claim a
/// bitmap scan of *every* due row, sorted by deadline (spilling to disk)
/// to keep the first 2,000, so that a claim took longer the further the
/// queue was behind. So sequential and bitmap scans are priced out of the
/// node's sessions: the claim walks the waiting index in deadline order
/// and stops at its limit, the others probe the primary key (a statement
/// with no index path still gets a scan).
const INDEX_PLANS: &str = "SET enable_seqscan = off;\nSET enable_bitmapscan = off;\n";

/// The per-table autovacuum threshold (dead rows) set on a new table.
const AUTOVACUUM_DEAD_ROWS: u64 = 10_000;

impl Pg {
    pub fn new(
        q: &QueueShared,
        stats: std::sync::Arc<[crate::stats::ShardStats]>,
        (shard, role): (usize, Role),
        gate: Rc<Gate>,
    ) -> Pg {
        assert!(shard < stats.len(), "shard {shard} has no stats");
        let cfg = &q.config;
        let mut config: tokio_postgres::Config =
            cfg.postgres_url.parse().expect("validated at config load");
        // Takeover tells a live node's sessions by this name.
        config.application_name(session_name(&q.node_id));
        Pg {
            stats,
            shard,
            role,
            gate,
            health: q.pg_health.clone(),
            config,
            table: cfg.table.clone(),
            conn: RefCell::new(None),
            connecting: glommio::sync::Semaphore::new(1),
            failing_since: Cell::new(None),
            last_log: Cell::new(None),
            statement_timeout_ms: cfg.statement_timeout_ms,
            timeout: Duration::from_millis(cfg.statement_timeout_ms) + TIMEOUT_GRACE,
            keepalive: Duration::from_millis(cfg.postgres_keepalive_ms),
        }
    }

    fn set_up(&self, up: bool) {
        self.stats[self.shard].pg_up[self.role as usize].store(up, Ordering::Relaxed);
    }

    /// This connection's slot in [`Health`].
    fn slot(&self) -> usize {
        self.shard * PG_CONNECTIONS + self.role as usize
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
            let started = Instant::now();
            match within(self.timeout, self.connect()).await {
                Some(Ok(c)) => {
                    self.succeeded();
                    *self.conn.borrow_mut() = Some(c.clone());
                    return Some(c);
                }
                Some(Err(e)) => self.failed(&e, Instant::now()),
                None => self.failed(&self.unanswered("connection handshake"), started),
            }
            self.pause(backoff_ms).await;
            backoff_ms = (backoff_ms * 2).min(BACKOFF_MS_MAX);
        }
    }

    /// Sleep `ms`, or less if shutdown begins.
    async fn pause(&self, ms: u64) {
        let sleep = glommio::timer::sleep(Duration::from_millis(ms));
        futures_lite::future::or(sleep, self.gate.closing()).await;
    }

    fn unanswered(&self, what: &str) -> String {
        format!(
            "{what} not answered within {} ms (statement-timeout-ms + {} ms)",
            self.timeout.as_millis(),
            TIMEOUT_GRACE.as_millis()
        )
    }

    /// A statement on `conn` failed (at `at`): the connection is given up
    /// and re-made by the next [`Pg::get`].
    fn reset(&self, conn: &Rc<Conn>, why: &str, at: Instant) {
        self.failed(why, at);
        self.discard(conn);
    }

    /// Give `conn` up without counting a failure (Postgres closed it after
    /// refusing a message).
    fn discard(&self, conn: &Rc<Conn>) {
        conn.give_up();
        let current = self
            .conn
            .borrow()
            .as_ref()
            .is_some_and(|c| Rc::ptr_eq(c, conn));
        if current {
            self.conn.borrow_mut().take();
            self.set_up(false);
        }
    }

    /// Postgres answered: usable (again).
    fn succeeded(&self) {
        if let Some(since) = self.failing_since.take() {
            tracing::info!(target: "chronos::queue", "Postgres usable again after {:?}", since.elapsed());
            self.last_log.set(None);
        }
        self.health.set(self.slot(), 0);
        self.set_up(true);
    }

    /// A failure noticed now, which began at `at` (a statement's start,
    /// for one that was never answered).
    fn failed(&self, e: &str, at: Instant) {
        let now = Instant::now();
        self.set_up(false);
        if self.failing_since.get().is_none() {
            self.failing_since.set(Some(at));
            let ago = now.saturating_duration_since(at).as_millis() as u64;
            self.health
                .set(self.slot(), clock::unix_ms().saturating_sub(ago).max(1));
        }
        let due = self
            .last_log
            .get()
            .is_none_or(|t| now.duration_since(t) >= LOG_EVERY);
        if due {
            self.last_log.set(Some(now));
            tracing::warn!(target: "chronos::queue", shard = self.shard, connection = ?self.role, "Postgres unavailable, retrying with backoff: {e}");
        }
    }
}

impl Pg {
    /// Connect, set the session up (Postgres's `statement_timeout`; the
    /// table and indexes if missing) and prepare the statements.
    async fn connect(&self) -> Result<Rc<Conn>, String> {
        let (client, broken, task) = self.open().await?;
        // Idempotent; two shards racing on the catalog retry via backoff.
        let t = &self.table;
        // Only the inserts commit durably (module doc).
        let commit = match self.role {
            Role::Input => "",
            Role::Claim | Role::Delete => "SET synchronous_commit = off;\n",
        };
        let setup = format!(
            "SET statement_timeout = {};\n{commit}{INDEX_PLANS}{CUSTOM_PLANS}{}",
            self.statement_timeout_ms,
            schema(t)
        );
        client
            .batch_execute(&setup)
            .await
            .map_err(|e| format!("create table {t}: {}", describe(&e)))?;
        prepare(client, t, broken, task).await.map(Rc::new)
    }

    /// A new connection to this `Pg`'s server: the client, a flag set when
    /// the connection ends, and its task (cancelled if the guard is
    /// dropped). Not counted in [`Health`] or readiness.
    async fn open(&self) -> Result<(Client, Rc<Cell<bool>>, TaskGuard), String> {
        let addr = self.address().await?;
        let stream = glommio::net::TcpStream::connect_timeout(addr, CONNECT_TIMEOUT)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        if let Err(e) = keepalive(&stream, self.keepalive) {
            tracing::debug!(target: "chronos::queue", "Postgres TCP keepalive: {e}");
        }
        let (client, connection) = self
            .config
            .connect_raw(stream.compat(), NoTls)
            .await
            .map_err(|e| format!("Postgres handshake: {e}"))?;
        let broken = Rc::new(Cell::new(false));
        let flag = broken.clone();
        let task = TaskGuard(Some(
            crate::runtime::spawn::spawn_local(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(target: "chronos::queue", "Postgres connection ended: {e}");
                }
                flag.set(true);
            })
            .detach(),
        ));
        Ok((client, broken, task))
    }

    /// A connection of its own for maintenance (the node's vacuum): not
    /// one of the shard's three, not counted in [`Health`] or readiness,
    /// with `statement_timeout` set to `statement_timeout_ms`. Bounded in
    /// time by the handshake limit.
    pub async fn maintenance(&self, statement_timeout_ms: u64) -> Result<Maintenance, String> {
        let (client, broken, task) = within(self.timeout, self.open())
            .await
            .unwrap_or_else(|| Err(self.unanswered("connection handshake")))?;
        let setup =
            format!("SET statement_timeout = {statement_timeout_ms}; SET synchronous_commit = off");
        within(self.timeout, client.batch_execute(&setup))
            .await
            .ok_or_else(|| self.unanswered("session set-up"))?
            .map_err(|e| describe(&e))?;
        Ok(Maintenance {
            client,
            broken,
            _task: task,
        })
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

/// TCP keepalives on a Postgres socket: idle `every`, then a probe each
/// `every`, given up after [`KEEPALIVE_PROBES`] unanswered.
fn keepalive(stream: &glommio::net::TcpStream, every: Duration) -> std::io::Result<()> {
    use std::os::fd::{AsRawFd, BorrowedFd};
    // SAFETY: the descriptor belongs to `stream`, which outlives this
    // borrow; socket2 only calls setsockopt on it.
    let fd = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
    let ka = socket2::TcpKeepalive::new()
        .with_time(every)
        .with_interval(every)
        .with_retries(KEEPALIVE_PROBES);
    socket2::SockRef::from(&fd).set_tcp_keepalive(&ka)
}

/// `f`, unless `limit` passes first (`None`; `f` is dropped).
pub(super) async fn within<T>(limit: Duration, f: impl Future<Output = T>) -> Option<T> {
    let work = async { Some(f.await) };
    let timer = async {
        glommio::timer::sleep(limit).await;
        None
    };
    futures_lite::future::or(work, timer).await
}

/// The session name (`application_name`) of a node's connections: the
/// takeover (`takeover.rs`) finds a node's sessions in `pg_stat_activity`
/// by it, as `'chronos-' || node`.
pub fn session_name(node_id: &str) -> String {
    format!("chronos-{node_id}")
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

/// Postgres refused the message itself (`08P01`, protocol violation: a
/// message over its 1 GB limit), then closed the connection.
fn is_refused_message(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.code().code() == "08P01")
}

/// Errors that retrying cannot fix, because the data is at fault: data
/// exceptions (class 22: a NUL in `text`, a value out of range, bad JSON),
/// integrity violations (23), program limits (54, e.g. a row too large)
/// and a message Postgres refuses (`08P01`: over its 1 GB limit); callers
/// split the batch. Everything else (connection loss, the rest of class
/// 08; serialization, 40; resources, 53; a statement cancelled by
/// `statement_timeout`, 57; a dropped table, 42, which the reconnect
/// re-creates) is retried.
pub fn is_permanent(e: &tokio_postgres::Error) -> bool {
    is_refused_message(e)
        || e.as_db_error()
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

/// Run one statement over input data: transient errors (and a statement
/// not answered within the timeout) are retried with backoff on a new
/// connection; a permanent one is returned at once.
pub async fn query_input(
    pg: &Pg,
    pick: impl Fn(&Conn) -> &Statement,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, QueryError> {
    let mut backoff_ms = BACKOFF_MS_MIN;
    loop {
        let conn = pg.get().await.ok_or(QueryError::Shutdown)?;
        let started = Instant::now();
        match within(pg.timeout, conn.client.query(pick(&conn), params)).await {
            Some(Ok(rows)) => {
                pg.succeeded();
                return Ok(rows);
            }
            Some(Err(e)) if is_permanent(&e) => {
                if is_refused_message(&e) {
                    pg.discard(&conn);
                } else {
                    pg.succeeded();
                }
                return Err(QueryError::Permanent(describe(&e)));
            }
            Some(Err(e)) => pg.reset(&conn, &describe(&e), Instant::now()),
            None => pg.reset(&conn, &pg.unanswered("statement"), started),
        }
        pg.pause(backoff_ms).await;
        if pg.gate.is_closing() {
            return Err(QueryError::Shutdown);
        }
        backoff_ms = (backoff_ms * 2).min(BACKOFF_MS_MAX);
    }
}

/// The claim: rows due within the look-ahead and not readied, earliest
/// first, at most `$4` rows and (beyond the first) `$5` bytes of keys,
/// values and headers. The candidates are locked (`SKIP LOCKED`: another
/// node's claim passes them by) in an `ARRAY(...)` init plan, so that the
/// update finds them by primary key; an `IN (SELECT ...)` planned as a
/// hash semi-join over a sequential scan of the whole table (perf/README).
///
/// `readied_at` is the server's clock ([`SERVER_NOW`]), as in the refresh
/// and failure detection: each attempt of a retried statement takes the
/// time anew, and the nodes' clocks never meet. The last column is each
/// row's size as counted here (so that the caller knows whether the byte
/// bound cut the claim short).
fn claim_sql(t: &str) -> String {
    format!(
        "UPDATE {t} SET readied_at = {SERVER_NOW}, readied_by = $1::text::uuid
         WHERE id = ANY(ARRAY(
             SELECT id FROM (
                 SELECT id, sum(size) OVER (ORDER BY deadline ROWS UNBOUNDED PRECEDING) - size AS before
                 FROM (SELECT id, deadline, {ROW_SIZE} AS size
                       FROM {t} WHERE deadline <= $2 AND readied_at IS NULL
                       ORDER BY deadline LIMIT $3 FOR UPDATE SKIP LOCKED) AS candidates
             ) AS sized WHERE before < $4::bigint))
         RETURNING id, deadline, message_key, message_value, message_headers::text, {ROW_SIZE}"
    )
}

/// A row's bytes in the claim's byte bound (as `bigint`: two large columns
/// may pass 2 GB).
const ROW_SIZE: &str = "(coalesce(octet_length(message_value), 0)::bigint
    + coalesce(octet_length(message_key), 0)
    + coalesce(pg_column_size(message_headers), 0))";

/// Prepare the queue's statements on a fresh connection.
async fn prepare(
    client: Client,
    t: &str,
    broken: Rc<Cell<bool>>,
    task: TaskGuard,
) -> Result<Conn, String> {
    let prep = |sql: String| {
        let client = &client;
        async move {
            client
                .prepare(&sql)
                .await
                .map_err(|e| format!("prepare: {}", describe(&e)))
        }
    };
    let insert = prep(insert_sql(t)).await?;
    // Only a row still waiting holds a late message back: one claimed may
    // be published already, its delete on the way (issue 39).
    let exists = prep(format!(
        "SELECT id FROM {t} WHERE id = ANY($1::text[]) AND readied_at IS NULL"
    ))
    .await?;
    let ready = prep(claim_sql(t)).await?;
    let delete = prep(delete_sql(t)).await?;
    // Earliest deadlines first; this node's own rows too: the ones it
    // holds are refreshed, so only the ones it lost come up.
    // `$1`: the hold time in ms, on the server's clock as the claim.
    let stuck = prep(format!(
        "SELECT id, readied_by::text, readied_at FROM {t}
         WHERE readied_at < {SERVER_NOW} - $1::bigint * interval '1 millisecond'
         ORDER BY deadline LIMIT $2"
    ))
    .await?;
    let reset = prep(format!(
        "UPDATE {t} AS t SET readied_at = NULL, readied_by = NULL
         FROM UNNEST($1::text[], $2::text[], $3::timestamp[]) AS s(i, b, a)
         WHERE t.id = s.i AND t.readied_by IS NOT DISTINCT FROM s.b::uuid AND t.readied_at = s.a
         RETURNING t.id, s.b"
    ))
    .await?;
    let refresh = prep(format!(
        "UPDATE {t} SET readied_at = {SERVER_NOW}
         WHERE id = ANY($1::text[]) AND readied_by = $2::text::uuid"
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
        task: task.keep(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_reports_the_longest_stall() {
        let h = Health::new(3);
        assert_eq!(h.stalled_ms(), 0);
        let now = clock::unix_ms();
        h.set(1, now - 5_000);
        h.set(2, now - 1_000);
        let stalled = h.stalled_ms();
        assert!((5_000..6_000).contains(&stalled), "{stalled}");
        h.set(1, 0);
        assert!(h.stalled_ms() < 2_000);
        h.set(7, now); // no such shard: ignored
        h.set(2, 0);
        assert_eq!(h.stalled_ms(), 0);
    }

    #[test]
    fn the_claim_caps_rows_and_bytes_and_uses_the_primary_key() {
        let sql = claim_sql("t");
        assert!(sql.contains("id = ANY(ARRAY("));
        assert!(sql.contains("LIMIT $3 FOR UPDATE SKIP LOCKED"));
        assert!(sql.contains("before < $4::bigint"));
    }

    /// Finding 3: the claim takes the server's time at each attempt, not
    /// a parameter fixed before the first.
    #[test]
    fn the_claim_stamps_the_server_s_clock() {
        let sql = claim_sql("t");
        assert!(sql.contains(&format!("readied_at = {SERVER_NOW}")), "{sql}");
        assert!(!sql.contains("readied_at = $"), "{sql}");
    }
}
