//! The one HTTP/1.1 client of a shard: callbacks, replication, and the
//! resync and cross-site traffic to come.
//!
//! Per shard, per target `ip:port`: a pool of keep-alive connections and at
//! most `per_host_max` connection permits (FIFO, `permits.rs`). A single
//! request ([`Client::request`]) waits for a permit within its timeout. A
//! callback ([`Client::callback`]) joins the target's queue; whichever
//! waiting callback gets a permit becomes a lane and sends the queue in
//! pipelined batches sized to the target's answer rate. A pipelined batch
//! ([`Client::pipeline`]) is written in one `write_all` on one pooled
//! connection and answered in order. Every
//! request has a connect timeout and a total timeout. Responses are framed
//! with `httparse` by one reader ([`read_response`]): Content-Length,
//! chunked, or close-delimited bodies, bounded in size.

use super::conn::GlommioConn;
use super::guard::Guard;
use super::permits::{Permit, Permits};
use super::tls::TlsConn;
use super::{format_u32, uri};
use crate::runtime::notify::Notify;
use crate::runtime::sleep::sleep;
use futures_lite::{future, AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Idle connections kept per target.
pub const IDLE_PER_HOST_MAX: usize = 64;
/// Requests waiting for a connection to a failing target; beyond it they fail at once.
pub const QUEUED_PER_HOST_MAX: usize = 1024;
/// How long after a failure a target counts as failing.
const FAILING_FOR: Duration = Duration::from_secs(2);
/// Targets with a pool; beyond it, pools with no busy connection are dropped.
pub const HOSTS_MAX: usize = 4096;
/// Resolved host names kept, and for how long.
pub const NAMES_MAX: usize = 1024;
const NAME_TTL: Duration = Duration::from_secs(30);
/// Largest response head and body read.
pub const RESPONSE_HEAD_MAX: usize = 16 * 1024;
pub const RESPONSE_BODY_MAX: usize = 4 * 1024 * 1024;
/// Buffers (and queued-request records) kept for reuse.
const SPARE_BUFFERS_MAX: usize = 256;
/// Lane batch vectors and batch buffers kept for reuse (one per lane or
/// pipelined batch running at once; each buffer at most 1 MiB).
const SPARE_BATCHES_MAX: usize = 64;
const READ_CHUNK: usize = 16 * 1024;
/// The first read of a response.
const FIRST_READ: usize = 1024;

/// A connection to a target: plain, or TLS over it (chosen once, when the
/// connection is made; a plain one runs glommio's stream as before).
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsConn<GlommioConn>>),
}

impl Stream {
    async fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf).await,
            Stream::Tls(s) => s.read_plain(buf).await,
        }
    }

    async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.write_all(data).await,
            Stream::Tls(s) => s.write_plain(data).await,
        }
    }
}

/// What a pool is for: an address, and for `https://` the server name its
/// certificate is verified for (the URI's host), so that two names on one
/// address never share a connection. A plain key allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PoolKey {
    addr: SocketAddr,
    tls: Option<Box<str>>,
    /// A peer (replication, resync, another site): TLS with the cluster's
    /// configuration, not the callbacks'.
    peer: bool,
}

struct HostPool {
    idle: RefCell<Vec<Stream>>,
    /// Requests waiting for a lane (callbacks), oldest first; entries a
    /// lane took out of order or whose caller withdrew them stay until
    /// they reach the front (every lane drops those first).
    jobs: RefCell<VecDeque<Rc<Job>>>,
    /// Jobs in `jobs` neither taken nor withdrawn.
    queued: Cell<usize>,
    /// Requests per pipelined batch to this target (adapted per batch).
    batch_limit: Cell<usize>,
    permits: Permits,
    /// Requests waiting for a connection permit.
    waiting: Cell<usize>,
    /// When a request to this target last failed (cleared by a success).
    failed_at: Cell<Option<Instant>>,
}

impl HostPool {
    /// `job` leaves the waiting state (taken or withdrawn): counted once.
    fn settle(&self, job: &Job) {
        if !job.taken.get() && !job.withdrawn.get() {
            assert!(self.queued.get() > 0, "a waiting job is counted");
            self.queued.set(self.queued.get() - 1);
        }
    }

    /// A target that has just failed takes at most `QUEUED_PER_HOST_MAX`
    /// waiting requests (`queued` now): beyond it they fail at once, so a
    /// dead target cannot hold every in-flight slot.
    fn admit_waiter(&self, addr: SocketAddr, queued: usize) -> Result<(), String> {
        let failing = self
            .failed_at
            .get()
            .is_some_and(|t| t.elapsed() < FAILING_FOR);
        if failing && queued >= QUEUED_PER_HOST_MAX {
            return Err(format!(
                "{addr} is failing and {QUEUED_PER_HOST_MAX} requests already wait for it"
            ));
        }
        Ok(())
    }

    /// Keep a connection that can be reused (up to `IDLE_PER_HOST_MAX`).
    fn give_back(&self, stream: Stream) {
        let mut idle = self.idle.borrow_mut();
        if idle.len() < IDLE_PER_HOST_MAX {
            idle.push(stream);
        }
    }
}

/// Requests per pipelined callback batch.
pub const LANE_BATCH_MAX: usize = 256;
/// Requests in the first batch to a target, before its speed is known.
const LANE_BATCH_FIRST: usize = 4;

/// What a queued callback is for, so that a lane can ask whether it is
/// still wanted just before sending it (a `DELETE` may have come since).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallbackKey {
    pub unique: u64,
    pub version: u64,
    pub sequence: u32,
    /// When the pop was due (engine ms), for [`Sent`].
    pub due_ms: u64,
}

/// Whether a queued callback should still be sent (set by the layer that
/// owns the timers; without one, every callback is).
pub type Wanted = Box<dyn Fn(&CallbackKey) -> bool>;

/// Told, for each callback, when its request's first byte was handed to
/// the socket (the pop lateness metric). It must not call the client.
pub type Sent = Box<dyn Fn(&CallbackKey, Instant)>;

/// A request queued for its target's lanes. Kept for reuse once its
/// caller is done with it ([`Client::give_job`]).
struct Job {
    request: RefCell<Vec<u8>>,
    key: Option<CallbackKey>,
    /// A lane took it (it is on the wire, or about to be).
    taken: Cell<bool>,
    /// Its caller gave up before a lane took it: lanes skip it.
    withdrawn: Cell<bool>,
    /// The status, or why there is none; set by the lane.
    result: RefCell<Option<Result<u16, Failure>>>,
    done: Notify,
}

impl Job {
    fn new(request: Vec<u8>, key: Option<CallbackKey>) -> Job {
        Job {
            request: RefCell::new(request),
            key,
            taken: Cell::new(false),
            withdrawn: Cell::new(false),
            result: RefCell::new(None),
            done: Notify::default(),
        }
    }
}

/// Withdraws a job not yet taken when its caller stops waiting.
struct Withdraw<'a>(&'a Job, &'a HostPool);

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if !self.0.taken.get() {
            self.1.settle(self.0);
            self.0.withdrawn.set(true);
        }
    }
}

/// What a queued request's wait ended with.
enum Turn<'p> {
    /// A permit: this caller runs a lane.
    Lane(Permit<'p>),
    /// A lane answered it.
    Served,
    /// `wait` passed.
    WaitedOut,
}

/// The lane's own job first (so its caller's wait ends with this batch),
/// then live jobs from the front of `pool`'s queue, up to the target's
/// batch limit; each marked taken. A job no longer `wanted` is withdrawn
/// instead, and its caller told so.
fn take_jobs(pool: &HostPool, own: &Rc<Job>, wanted: &Option<Wanted>, batch: &mut Vec<Rc<Job>>) {
    assert!(batch.is_empty());
    let limit = pool.batch_limit.get();
    assert!((1..=LANE_BATCH_MAX).contains(&limit));
    let take = |job: &Rc<Job>, batch: &mut Vec<Rc<Job>>| {
        if job.withdrawn.get() || job.taken.get() {
            return;
        }
        let unwanted = job.key.zip(wanted.as_ref()).is_some_and(|(k, w)| !w(&k));
        pool.settle(job);
        if unwanted {
            job.withdrawn.set(true);
            *job.result.borrow_mut() = Some(Err(Failure::Withdrawn));
            job.done.notify();
            return;
        }
        job.taken.set(true);
        batch.push(job.clone());
    };
    take(own, batch);
    let mut jobs = pool.jobs.borrow_mut();
    // Entries taken out of order or withdrawn, at the front: gone first,
    // so the queue holds no more than the jobs behind its oldest live one.
    while jobs
        .front()
        .is_some_and(|j| j.taken.get() || j.withdrawn.get())
    {
        jobs.pop_front();
    }
    while batch.len() < limit {
        let Some(job) = jobs.pop_front() else { break };
        take(&job, batch);
    }
}

/// Why a queued request got no status.
#[derive(Clone, Debug)]
enum Failure {
    /// On the wire, and no answer came (or the connection failed).
    Sent(String),
    /// Withdrawn unsent: the callback was no longer wanted.
    Withdrawn,
}

/// One request to send.
struct Request<'a> {
    host: &'a str,
    port: u16,
    /// `https://`: over TLS, the certificate verified for `host`.
    tls: bool,
    authority: &'a str,
    method: &'a str,
    path: &'a str,
    headers: &'a [(&'a str, &'a [u8])],
    body: &'a [u8],
    want_body: bool,
}

/// Why a request failed, and whether it reached the wire (`sent: false`:
/// the target never saw it, so it may be handed elsewhere).
#[derive(Debug)]
pub struct RequestError {
    pub sent: bool,
    /// Not sent because no connection came free within the caller's wait.
    pub waited_out: bool,
    /// Not sent because it was no longer wanted (its timer was deleted or
    /// replaced while it waited).
    pub withdrawn: bool,
    /// Not sent because the callback guard (`[timers] callback-allow`)
    /// refuses the address its host resolved to now.
    pub refused: bool,
    pub reason: String,
}

impl RequestError {
    fn unsent(reason: String) -> RequestError {
        RequestError {
            sent: false,
            waited_out: false,
            withdrawn: false,
            refused: false,
            reason,
        }
    }

    fn sent(reason: String) -> RequestError {
        RequestError {
            sent: true,
            ..RequestError::unsent(reason)
        }
    }

    fn of(failure: Failure) -> RequestError {
        match failure {
            Failure::Sent(reason) => RequestError::sent(reason),
            Failure::Withdrawn => RequestError {
                withdrawn: true,
                ..RequestError::unsent("withdrawn: its timer was deleted or replaced".to_string())
            },
        }
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// A response: status and (when asked for) the body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// A lane's batch of jobs and their statuses.
type LaneVecs = (Vec<Rc<Job>>, Vec<u16>);

pub struct Client {
    timeout: Duration,
    connect_timeout: Duration,
    per_host_max: usize,
    pools: RefCell<HashMap<PoolKey, Rc<HostPool>>>,
    /// For `https://` targets: the shard's own rustls configuration, so
    /// its session store (resumption) is the shard's alone.
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `[cluster] tls`: peers are reached over TLS with this (the
    /// cluster's CA, and this node's client certificate when set).
    peer_tls: Option<Arc<rustls::ClientConfig>>,
    /// Host name → the port it was resolved with, its address, when.
    names: RefCell<HashMap<String, (u16, SocketAddr, Instant)>>,
    spare: RefCell<Vec<Vec<u8>>>,
    /// Queued requests no caller holds, kept for reuse.
    spare_jobs: RefCell<Vec<Rc<Job>>>,
    /// Batch buffers kept for reuse ([`Client::take_batch_buffer`]).
    spare_batch_buffers: RefCell<Vec<Vec<u8>>>,
    /// A lane's batch and its statuses, kept for reuse (emptied).
    spare_batches: RefCell<Vec<LaneVecs>>,
    /// Asked by lanes before a callback is sent.
    wanted: RefCell<Option<Wanted>>,
    /// Told by lanes when a batch of callbacks went on the wire.
    sent: RefCell<Option<Sent>>,
    /// `[timers] callback-allow`: checked on the address a callback is
    /// about to use (`None`: every address).
    guard: RefCell<Option<Arc<Guard>>>,
}

/// A client's timeouts and bounds.
#[derive(Clone, Copy, Debug)]
pub struct ClientConfig {
    /// Total time for one request, counted from when it is sent.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Connections open at once per target for single requests.
    pub per_host_max: usize,
}

impl Client {
    pub fn new(cfg: ClientConfig) -> Client {
        assert!(cfg.per_host_max > 0, "at least one connection per target");
        Client {
            timeout: cfg.timeout,
            connect_timeout: cfg.connect_timeout.min(cfg.timeout),
            per_host_max: cfg.per_host_max,
            pools: RefCell::new(HashMap::new()),
            names: RefCell::new(HashMap::new()),
            spare: RefCell::new(Vec::new()),
            spare_jobs: RefCell::new(Vec::new()),
            spare_batches: RefCell::new(Vec::new()),
            spare_batch_buffers: RefCell::new(Vec::new()),
            wanted: RefCell::new(None),
            sent: RefCell::new(None),
            tls: None,
            peer_tls: None,
            guard: RefCell::new(None),
        }
    }

    /// Set what lanes tell when callbacks go on the wire.
    pub fn set_sent(&self, sent: Sent) {
        *self.sent.borrow_mut() = Some(sent);
    }

    /// Reach `https://` targets with `tls` (without it they fail, saying so).
    pub fn with_tls(mut self, tls: Option<Arc<rustls::ClientConfig>>) -> Client {
        self.tls = tls;
        self
    }

    /// Reach peers (`pipeline`, `request`) over TLS with `tls`, each
    /// verified for its address (an IP SAN).
    pub fn with_peer_tls(mut self, tls: Option<Arc<rustls::ClientConfig>>) -> Client {
        self.peer_tls = tls;
        self
    }

    /// Set (or clear) the callback guard; a reload calls it again.
    pub fn set_guard(&self, guard: Option<Arc<Guard>>) {
        *self.guard.borrow_mut() = guard;
    }

    /// Set the check lanes make before sending a queued callback.
    pub fn set_wanted(&self, wanted: Wanted) {
        *self.wanted.borrow_mut() = Some(wanted);
    }

    /// Deliver one pop: `POST <uri>` with the opaque data, `X-Sequence-Number`
    /// and `Content-Type: application/octet-stream`. Ok on any 2xx. `wait`:
    /// how long it may wait for a connection to the target (its name
    /// resolved included) before it is sent (`None`: as long as it takes;
    /// the caller bounds the count). `key`: asked of the `wanted` check
    /// before it is sent.
    pub async fn callback(
        &self,
        uri: &str,
        opaque: &[u8],
        key: CallbackKey,
        wait: Option<Duration>,
    ) -> Result<(), RequestError> {
        let unsent = RequestError::unsent;
        let target = uri::parse(uri).map_err(unsent)?;
        let mut seq_buf = [0u8; 10];
        let seq = format_u32(&mut seq_buf, key.sequence);
        let headers: [(&str, &[u8]); 2] = [
            ("Content-Type", b"application/octet-stream"),
            ("X-Sequence-Number", seq),
        ];
        let request = Request {
            host: target.host,
            port: target.port,
            tls: target.tls,
            authority: target.authority,
            method: "POST",
            path: target.path,
            headers: &headers,
            body: opaque,
            want_body: false,
        };
        let status = self.send_queued(&request, key, wait).await?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(RequestError::sent(format!("callback answered {status}")))
        }
    }

    /// Queue `r` for its target's lanes and wait for its status. Whichever
    /// waiting request gets a connection permit becomes a lane: it sends
    /// one pipelined batch on one connection, its own request first and
    /// then the oldest queued ones (up to the target's batch limit), and
    /// lets the permit go. So a burst to one target costs one write and a
    /// few reads per batch, not per request, and at most `per_host_max`
    /// connections; and a lane's caller is done within one batch (at most
    /// the timeout) of getting its permit, whatever else is queued: the
    /// skew rule counts on it. A request not taken by a lane within `wait`
    /// is withdrawn, unsent.
    async fn send_queued(
        &self,
        r: &Request<'_>,
        key: CallbackKey,
        wait: Option<Duration>,
    ) -> Result<u16, RequestError> {
        let unsent = RequestError::unsent;
        let wait_until = wait.map(|w| Instant::now() + w);
        let resolve_for = wait.map_or(self.timeout, |w| w.min(self.timeout));
        let addr = self
            .resolve_for(r.host, r.port, resolve_for)
            .await
            .map_err(unsent)?;
        // The address this callback will connect to, as resolved now: a
        // name allowed at create time may point elsewhere since.
        if let Some(guard) = &*self.guard.borrow() {
            guard
                .decide(r.host, addr.ip())
                .map_err(|reason| RequestError {
                    refused: true,
                    ..unsent(reason)
                })?;
        }
        let to = pool_key(addr, r);
        let pool = self.pool(&to);
        pool.admit_waiter(addr, pool.queued.get()).map_err(unsent)?;
        let mut request = self.take_buffer();
        build_request(
            &mut request,
            r.method,
            r.path,
            r.authority,
            r.headers,
            r.body,
        );
        let job = self.take_job(request, Some(key));
        pool.jobs.borrow_mut().push_back(job.clone());
        pool.queued.set(pool.queued.get() + 1);
        let result = {
            let _withdraw = Withdraw(&job, &pool);
            self.await_turn(&pool, &to, &job, wait_until).await
        };
        self.give_job(job);
        result.map_err(|e| match e {
            Some(failure) => RequestError::of(failure),
            None => RequestError {
                waited_out: true,
                ..unsent(format!(
                    "no connection to {addr} free within {} ms",
                    wait.unwrap_or_default().as_millis()
                ))
            },
        })
    }

    /// Wait until `job` has its status: run lanes while this caller holds
    /// a permit, or let one serve it. `Err(None)`: `wait_until` passed
    /// before a lane took it.
    async fn await_turn(
        &self,
        pool: &HostPool,
        key: &PoolKey,
        job: &Rc<Job>,
        wait_until: Option<Instant>,
    ) -> Result<u16, Option<Failure>> {
        loop {
            let result = job.result.borrow_mut().take();
            if let Some(result) = result {
                self.give_buffer(job.request.take());
                return result.map_err(Some);
            }
            if job.taken.get() {
                job.done.wait().await;
                continue;
            }
            match self.lane_or_served(pool, job, wait_until).await {
                Turn::Lane(permit) => {
                    self.run_lane(pool, key, job).await;
                    drop(permit);
                }
                Turn::Served => {}
                Turn::WaitedOut if job.taken.get() => {}
                Turn::WaitedOut => return Err(None),
            }
        }
    }

    /// A queued request for `request`: a spare job, or a new one.
    fn take_job(&self, request: Vec<u8>, key: Option<CallbackKey>) -> Rc<Job> {
        let spare = self.spare_jobs.borrow_mut().pop();
        match spare {
            Some(mut job) => {
                let fresh = Rc::get_mut(&mut job).expect("a spare job has no other holder");
                *fresh = Job::new(request, key);
                job
            }
            None => Rc::new(Job::new(request, key)),
        }
    }

    /// Keep `job` for reuse if no queue or lane holds it any more.
    fn give_job(&self, mut job: Rc<Job>) {
        if Rc::get_mut(&mut job).is_none() {
            return;
        }
        let mut spare = self.spare_jobs.borrow_mut();
        if spare.len() < SPARE_BUFFERS_MAX {
            spare.push(job);
        }
    }

    /// Wait for a lane's permit, for a lane to serve `job`, or for
    /// `wait_until`, whichever comes first.
    async fn lane_or_served<'p>(
        &self,
        pool: &'p HostPool,
        job: &Job,
        wait_until: Option<Instant>,
    ) -> Turn<'p> {
        let lane = async { Turn::Lane(pool.permits.acquire().await) };
        let served = async {
            job.done.wait().await;
            Turn::Served
        };
        let deadline = async {
            match wait_until {
                Some(t) => sleep(t.saturating_duration_since(Instant::now())).await,
                None => future::pending::<()>().await,
            }
            Turn::WaitedOut
        };
        future::or(future::or(served, lane), deadline).await
    }

    /// Send one pipelined batch for the target, `own` first (see
    /// `send_queued`), handing each job its status or the failure.
    async fn run_lane(&self, pool: &HostPool, key: &PoolKey, own: &Rc<Job>) {
        let spare = self.spare_batches.borrow_mut().pop();
        let (mut batch, mut statuses) = spare.unwrap_or_else(|| {
            let n = LANE_BATCH_MAX;
            (Vec::with_capacity(n), Vec::with_capacity(n))
        });
        assert!(
            batch.is_empty() && statuses.is_empty(),
            "spare batches are empty"
        );
        take_jobs(pool, own, &self.wanted.borrow(), &mut batch);
        if batch.is_empty() {
            self.give_batch(batch, statuses);
            return;
        }
        let mut bytes = self.take_batch_buffer();
        for job in &batch {
            bytes.extend_from_slice(&job.request.borrow());
        }
        let sent_at = Instant::now();
        let on_wire = Cell::new(None);
        let result = self
            .pipeline_on(
                key,
                &bytes,
                batch.len(),
                self.timeout,
                &mut statuses,
                &on_wire,
            )
            .await;
        if let (Some(at), Some(sent)) = (on_wire.get(), &*self.sent.borrow()) {
            for callback in batch.iter().filter_map(|job| job.key.as_ref()) {
                sent(callback, at);
            }
        }
        pool.failed_at.set(result.is_err().then(Instant::now));
        self.adapt_batch(pool, batch.len(), sent_at.elapsed(), result.is_ok());
        for (i, job) in batch.drain(..).enumerate() {
            let outcome = match (statuses.get(i), &result) {
                (Some(&status), _) => Ok(status),
                (None, Err(e)) => Err(Failure::Sent(e.clone())),
                (None, Ok(())) => Err(Failure::Sent("no answer".to_string())),
            };
            *job.result.borrow_mut() = Some(outcome);
            job.done.notify();
        }
        self.give_batch_buffer(bytes);
        self.give_batch(batch, statuses);
    }

    /// Keep a lane's (emptied) batch vectors for the next lane.
    fn give_batch(&self, mut batch: Vec<Rc<Job>>, mut statuses: Vec<u16>) {
        batch.clear();
        statuses.clear();
        let mut spare = self.spare_batches.borrow_mut();
        if spare.len() < SPARE_BATCHES_MAX {
            spare.push((batch, statuses));
        }
    }

    /// Size the target's next batches so that one is answered well within
    /// the timeout: a pipelined request waits for the ones before it, and
    /// its timeout counts from the send. The aim is an eighth of the
    /// timeout at the answer rate just seen; it at most doubles per batch,
    /// and halves on a failure. (A target that takes 20 ms per request gets
    /// batches of about 9 at the default 1.5 s; nginx gets 256.)
    fn adapt_batch(&self, pool: &HostPool, count: usize, took: Duration, ok: bool) {
        let old = pool.batch_limit.get();
        let next = if ok {
            let per_request_us = (took.as_micros() as u64 / count as u64).max(1);
            let aim_us = self.timeout.as_micros() as u64 / 8;
            ((aim_us / per_request_us) as usize).min(old * 2)
        } else {
            old / 2
        };
        pool.batch_limit.set(next.clamp(1, LANE_BATCH_MAX));
    }

    /// One request with the total timeout applied. `want_body`: keep the body.
    /// It waits for a connection permit at most the timeout.
    #[allow(clippy::too_many_arguments)]
    pub async fn request(
        &self,
        host: &str,
        port: u16,
        authority: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &[u8])],
        body: &[u8],
        want_body: bool,
    ) -> Result<Response, String> {
        let request = Request {
            host,
            port,
            tls: self.peer_tls.is_some(),
            authority,
            method,
            path,
            headers,
            body,
            want_body,
        };
        self.send(&request, Some(self.timeout))
            .await
            .map_err(|e| e.reason)
    }

    /// Resolve, wait for a connection permit (at most `wait`), then send
    /// within the total timeout, counted from the send.
    async fn send(
        &self,
        r: &Request<'_>,
        wait: Option<Duration>,
    ) -> Result<Response, RequestError> {
        let unsent = RequestError::unsent;
        let addr = self.resolve_within(r.host, r.port).await.map_err(unsent)?;
        let key = PoolKey {
            peer: true,
            ..pool_key(addr, r)
        };
        let pool = self.pool(&key);
        let _permit = self.permit(&pool, addr, wait).await.map_err(unsent)?;
        // The timeout of the request itself starts when it is sent (seed
        // 000: a callback must complete within 2 s of being sent).
        let deadline = Instant::now() + self.timeout;
        let mut out = self.take_buffer();
        build_request(&mut out, r.method, r.path, r.authority, r.headers, r.body);
        let (head_only, want_body) = (r.method == "HEAD", r.want_body);
        let mut received = self.take_batch_buffer();
        let work = async {
            // A pooled connection may have been closed by the peer: one retry
            // on a fresh connection when nothing at all came back.
            for attempt in 0..2 {
                let (mut stream, reused) = self.take_connection(&pool, &key, deadline).await?;
                match exchange(&mut stream, &out, head_only, want_body, &mut received).await {
                    Ok((response, keep)) => {
                        if keep {
                            pool.give_back(stream);
                        }
                        return Ok(response);
                    }
                    Err(Exchange::NothingBack(_)) if reused && attempt == 0 => continue,
                    Err(Exchange::NothingBack(e)) | Err(Exchange::Failed(e)) => return Err(e),
                }
            }
            unreachable!("the second attempt returns")
        };
        let result = future::or(work, self.expire(deadline)).await;
        self.give_buffer(out);
        self.give_batch_buffer(received);
        pool.failed_at.set(result.is_err().then(Instant::now));
        result.map_err(RequestError::sent)
    }

    /// A pipelined batch: `requests` holds `count` complete requests, written
    /// at once on one pooled connection to `addr` and answered in order.
    /// `statuses` receives the status of each request answered, in order;
    /// `Err` says why the rest went unanswered. A connection kept idle that
    /// gives nothing back is retried once on a fresh one. It takes no
    /// connection permit: its caller bounds its batches (a replication
    /// sender sends one at a time; a callback lane holds a permit).
    pub async fn pipeline(
        &self,
        addr: SocketAddr,
        requests: &[u8],
        count: usize,
        timeout: Duration,
        statuses: &mut Vec<u16>,
    ) -> Result<(), String> {
        let key = self.peer_key(addr);
        let on_wire = Cell::new(None);
        self.pipeline_on(&key, requests, count, timeout, statuses, &on_wire)
            .await
    }

    /// [`Client::pipeline`] to `key`'s pool; `on_wire` gets when the
    /// batch's first byte was handed to the connection (a callback lane's
    /// pop lateness).
    async fn pipeline_on(
        &self,
        key: &PoolKey,
        requests: &[u8],
        count: usize,
        timeout: Duration,
        statuses: &mut Vec<u16>,
        on_wire: &Cell<Option<Instant>>,
    ) -> Result<(), String> {
        assert!(count > 0 && !requests.is_empty(), "a batch has requests");
        statuses.clear();
        let pool = self.pool(key);
        let deadline = Instant::now() + timeout;
        let mut received = self.take_batch_buffer();
        let work = async {
            for attempt in 0..2 {
                let (mut stream, reused) = self.take_connection(&pool, key, deadline).await?;
                if on_wire.get().is_none() {
                    on_wire.set(Some(Instant::now()));
                }
                match exchange_batch(&mut stream, requests, count, statuses, &mut received).await {
                    Ok(keep) => {
                        if keep {
                            pool.give_back(stream);
                        }
                        return Ok(());
                    }
                    Err(Exchange::NothingBack(_))
                        if reused && attempt == 0 && statuses.is_empty() =>
                    {
                        continue
                    }
                    Err(Exchange::NothingBack(e) | Exchange::Failed(e)) => return Err(e),
                }
            }
            unreachable!("the second attempt returns")
        };
        let expire = async {
            sleep(deadline.saturating_duration_since(Instant::now())).await;
            Err(format!("no answer within {} ms", timeout.as_millis()))
        };
        let result = future::or(work, expire).await;
        self.give_batch_buffer(received);
        assert!(statuses.len() <= count);
        result
    }

    /// Resolve `host`, within the timeout.
    async fn resolve_within(&self, host: &str, port: u16) -> Result<SocketAddr, String> {
        self.resolve_for(host, port, self.timeout).await
    }

    /// Resolve `host`, within `limit`.
    async fn resolve_for(
        &self,
        host: &str,
        port: u16,
        limit: Duration,
    ) -> Result<SocketAddr, String> {
        future::or(self.resolve(host, port), async {
            sleep(limit).await;
            Err(format!(
                "cannot resolve {host} within {} ms",
                limit.as_millis()
            ))
        })
        .await
    }

    /// Wait for a connection permit: bounded in time by `wait` (`None`: the
    /// caller bounds how many wait) and, for a target that has just failed,
    /// in count (`QUEUED_PER_HOST_MAX`), so a dead target fails fast instead
    /// of taking every in-flight slot from the others, while a busy live one
    /// is waited for.
    async fn permit<'p>(
        &self,
        pool: &'p HostPool,
        addr: SocketAddr,
        wait: Option<Duration>,
    ) -> Result<Permit<'p>, String> {
        pool.admit_waiter(addr, pool.waiting.get())?;
        pool.waiting.set(pool.waiting.get() + 1);
        let permit = future::or(async { Ok(pool.permits.acquire().await) }, async {
            let Some(wait) = wait else {
                return future::pending().await;
            };
            sleep(wait).await;
            Err(format!(
                "no connection to {addr} free within {} ms",
                wait.as_millis()
            ))
        })
        .await;
        pool.waiting.set(pool.waiting.get() - 1);
        permit
    }

    /// An idle pooled connection (`true`: reused), or a new one.
    async fn take_connection(
        &self,
        pool: &HostPool,
        key: &PoolKey,
        deadline: Instant,
    ) -> Result<(Stream, bool), String> {
        // Take the idle connection before awaiting anything: no RefCell
        // borrow may live across an await.
        let idle = pool.idle.borrow_mut().pop();
        match idle {
            Some(s) => Ok((s, true)),
            None => Ok((self.connect(key, deadline).await?, false)),
        }
    }

    async fn expire<T>(&self, deadline: Instant) -> Result<T, String> {
        sleep(deadline.saturating_duration_since(Instant::now())).await;
        Err(format!("no answer within {} ms", self.timeout.as_millis()))
    }

    /// A new connection for `key`: TCP, and for `https://` the TLS
    /// handshake (within the caller's deadline, which races the work).
    async fn connect(&self, key: &PoolKey, deadline: Instant) -> Result<Stream, String> {
        let addr = key.addr;
        let left = deadline.saturating_duration_since(Instant::now());
        let limit = self.connect_timeout.min(left).max(Duration::from_millis(1));
        let stream = TcpStream::connect_timeout(addr, limit)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let Some(host) = &key.tls else {
            return Ok(Stream::Plain(stream));
        };
        let config = match key.peer {
            true => self.peer_tls.as_ref(),
            false => self.tls.as_ref(),
        };
        let config = config.ok_or("https:// is not available here")?;
        let name = server_name(host)?;
        let tls = TlsConn::connect(GlommioConn(stream), config, name)
            .await
            .map_err(|e| format!("TLS handshake with {host} ({addr}): {e}"))?;
        Ok(Stream::Tls(Box::new(tls)))
    }

    /// The pool key of peer `addr`: TLS (its IP as the server name) with
    /// `[cluster] tls`.
    fn peer_key(&self, addr: SocketAddr) -> PoolKey {
        PoolKey {
            addr,
            tls: self
                .peer_tls
                .is_some()
                .then(|| addr.ip().to_string().into()),
            peer: true,
        }
    }

    fn pool(&self, key: &PoolKey) -> Rc<HostPool> {
        let mut pools = self.pools.borrow_mut();
        if let Some(p) = pools.get(key) {
            return p.clone();
        }
        if pools.len() >= HOSTS_MAX {
            // Drop pools nobody is using (their idle connections close).
            pools.retain(|_, p| Rc::strong_count(p) > 1);
        }
        let pool = Rc::new(HostPool {
            idle: RefCell::new(Vec::new()),
            permits: Permits::new(self.per_host_max),
            jobs: RefCell::new(VecDeque::new()),
            queued: Cell::new(0),
            batch_limit: Cell::new(LANE_BATCH_FIRST),
            waiting: Cell::new(0),
            failed_at: Cell::new(None),
        });
        pools.insert(key.clone(), pool.clone());
        pool
    }

    async fn resolve(&self, host: &str, port: u16) -> Result<SocketAddr, String> {
        let literal = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = literal.parse::<IpAddr>() {
            return Ok(SocketAddr::new(ip, port));
        }
        // Keyed by the host alone (looked up without a copy of it); the
        // entry holds the port it was resolved with.
        if let Some((at_port, addr, at)) = self.names.borrow().get(host) {
            if *at_port == port && at.elapsed() < NAME_TTL {
                return Ok(*addr);
            }
        }
        let lookup = format!("{host}:{port}");
        let found = glommio::executor()
            .spawn_blocking(move || lookup.to_socket_addrs().map(|mut it| it.next()))
            .await
            .map_err(|e| format!("cannot resolve {host}: {e}"))?
            .ok_or_else(|| format!("{host} has no address"))?;
        let mut names = self.names.borrow_mut();
        if names.len() >= NAMES_MAX {
            names.clear();
        }
        names.insert(host.to_string(), (port, found, Instant::now()));
        Ok(found)
    }

    fn take_buffer(&self) -> Vec<u8> {
        self.spare
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(1024))
    }

    /// A buffer for a batch (requests sent together, or answers received):
    /// kept apart from the requests' own, so that each kind keeps the
    /// capacity it grew to instead of growing the other's again.
    fn take_batch_buffer(&self) -> Vec<u8> {
        let spare = self.spare_batch_buffers.borrow_mut().pop();
        spare.unwrap_or_else(|| Vec::with_capacity(FIRST_READ))
    }

    fn give_batch_buffer(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut spare = self.spare_batch_buffers.borrow_mut();
        if spare.len() < SPARE_BATCHES_MAX && buf.capacity() <= 1 << 20 {
            spare.push(buf);
        }
    }

    fn give_buffer(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut spare = self.spare.borrow_mut();
        if spare.len() < SPARE_BUFFERS_MAX && buf.capacity() <= 64 * 1024 {
            spare.push(buf);
        }
    }
}

/// The pool for `r` at `addr`: by address, and for `https://` also by
/// the server name.
fn pool_key(addr: SocketAddr, r: &Request<'_>) -> PoolKey {
    PoolKey {
        addr,
        tls: r.tls.then(|| r.host.into()),
        peer: false,
    }
}

/// The name a TLS peer's certificate must carry: a DNS name, or an IP
/// literal (bracketed for IPv6 in a URI), matched against IP SANs.
fn server_name(host: &str) -> Result<rustls::pki_types::ServerName<'static>, String> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    rustls::pki_types::ServerName::try_from(bare.to_string())
        .map_err(|e| format!("{host:?} is not a usable TLS server name: {e}"))
}

fn build_request(
    out: &mut Vec<u8>,
    method: &str,
    path: &str,
    authority: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
) {
    // `http://host?q` has the path `?q`: the request target is `/?q`.
    let slash = if path.starts_with('?') { "/" } else { "" };
    let _ = write!(
        out,
        "{method} {slash}{path} HTTP/1.1\r\nHost: {authority}\r\n"
    );
    for (name, value) in headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    let _ = write!(out, "Content-Length: {}\r\n\r\n", body.len());
    out.extend_from_slice(body);
}

enum Exchange {
    /// The connection failed before any response byte: safe to retry.
    NothingBack(String),
    Failed(String),
}

/// Bytes received on a connection and not yet consumed: a response may
/// arrive in pieces, and pipelined responses back to back.
/// The buffer is the caller's (a pooled one, reused per batch).
struct Recv<'b> {
    buf: &'b mut Vec<u8>,
    pos: usize,
    /// Bytes received in all (zero: nothing came back yet).
    total: usize,
}

impl<'b> Recv<'b> {
    fn new(buf: &'b mut Vec<u8>) -> Recv<'b> {
        buf.clear();
        Recv {
            buf,
            pos: 0,
            total: 0,
        }
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    fn consume(&mut self, n: usize) {
        assert!(n <= self.buf.len() - self.pos, "consume what was received");
        self.pos += n;
    }

    /// Read once more; end of stream is an error. The failure is
    /// `NothingBack` only when nothing at all was received.
    async fn fill(&mut self, stream: &mut Stream) -> Result<(), Exchange> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        // Read straight into the buffer: a small first read (most answers
        // are a few hundred bytes), full chunks once more is coming. (A
        // zeroed 16 KiB stack chunk per callback was 6% of a shard's time
        // in the 100 k pop burst.)
        let want = if self.total == 0 {
            FIRST_READ
        } else {
            READ_CHUNK
        };
        let start = self.buf.len();
        self.buf.resize(start + want, 0);
        let fail = |total: usize, e: String| {
            if total == 0 {
                Exchange::NothingBack(e)
            } else {
                Exchange::Failed(e)
            }
        };
        let read = stream.read(&mut self.buf[start..]).await;
        let n = *read.as_ref().unwrap_or(&0);
        self.buf.truncate(start + n);
        let n = read.map_err(|e| fail(self.total, format!("receive: {e}")))?;
        if n == 0 {
            return Err(fail(
                self.total,
                "connection closed before a full response".into(),
            ));
        }
        self.total += n;
        Ok(())
    }
}

/// Send one request and read its response. Returns the response and whether
/// the connection can be reused.
async fn exchange(
    stream: &mut Stream,
    request: &[u8],
    head_only: bool,
    want_body: bool,
    buf: &mut Vec<u8>,
) -> Result<(Response, bool), Exchange> {
    stream
        .write_all(request)
        .await
        .map_err(|e| Exchange::NothingBack(format!("send: {e}")))?;
    let mut recv = Recv::new(buf);
    let (response, keep) = read_response(stream, &mut recv, head_only, want_body).await?;
    // Unexpected extra bytes: do not reuse.
    Ok((response, keep && recv.pending().is_empty()))
}

/// Send a pipelined batch and read `count` responses, pushing each status
/// onto `statuses`. Ok: whether the connection can be reused.
async fn exchange_batch(
    stream: &mut Stream,
    requests: &[u8],
    count: usize,
    statuses: &mut Vec<u16>,
    buf: &mut Vec<u8>,
) -> Result<bool, Exchange> {
    stream
        .write_all(requests)
        .await
        .map_err(|e| Exchange::NothingBack(format!("send: {e}")))?;
    let mut recv = Recv::new(buf);
    let mut keep = true;
    while statuses.len() < count {
        let (response, reusable) = read_response(stream, &mut recv, false, false).await?;
        keep = reusable;
        statuses.push(response.status);
        if !keep && statuses.len() < count {
            return Err(Exchange::Failed("peer closed mid-batch".into()));
        }
    }
    assert_eq!(statuses.len(), count);
    Ok(keep && recv.pending().is_empty())
}

/// A response head: status, length, body framing, keep-alive.
struct Head {
    status: u16,
    len: usize,
    framing: Framing,
    keep: bool,
}

/// Read one response from `recv` (reading more as needed), leaving any
/// bytes after it in `recv`. Returns it and whether the connection may be
/// kept.
async fn read_response(
    stream: &mut Stream,
    recv: &mut Recv<'_>,
    head_only: bool,
    want_body: bool,
) -> Result<(Response, bool), Exchange> {
    let head = loop {
        if let Some(head) = parse_head(recv.pending(), head_only)? {
            break head;
        }
        recv.fill(stream).await?;
    };
    recv.consume(head.len);
    let mut keep = head.keep;
    // A body not wanted is read past, never copied.
    let body = match head.framing {
        Framing::Length(len) => read_length(stream, recv, len, want_body).await?,
        Framing::Chunked => read_chunked(stream, recv, want_body).await?,
        Framing::UntilClose => {
            keep = false;
            read_until_close(stream, recv, want_body).await?
        }
    };
    Ok((
        Response {
            status: head.status,
            body,
        },
        keep,
    ))
}

/// Frame one response held whole in `buf` with the same head parser and
/// chunk decoder the client reads with: `Ok(Some((status, body, used)))`,
/// `Ok(None)` when more bytes are needed. For fuzzing and tests; the
/// client itself reads from a socket ([`read_response`]).
pub fn frame_response(buf: &[u8]) -> Result<Option<(u16, Vec<u8>, usize)>, String> {
    let fail = |e: Exchange| match e {
        Exchange::NothingBack(e) | Exchange::Failed(e) => e,
    };
    let Some(head) = parse_head(buf, false).map_err(fail)? else {
        return Ok(None);
    };
    let mut pos = head.len;
    assert!(pos <= buf.len(), "a head lies within its buffer");
    let body = match head.framing {
        Framing::Length(len) if len > RESPONSE_BODY_MAX => {
            return Err("response body too large".into())
        }
        Framing::Length(len) if buf.len() - pos < len => return Ok(None),
        Framing::Length(len) => {
            pos += len;
            buf[head.len..pos].to_vec()
        }
        Framing::UntilClose => {
            pos = buf.len();
            buf[head.len..].to_vec()
        }
        Framing::Chunked => {
            let mut decoded = Vec::new();
            loop {
                match decode_chunk(&buf[pos..]) {
                    ChunkStep::Data { skip, data: (a, b) } => {
                        if decoded.len() + (b - a) > RESPONSE_BODY_MAX {
                            return Err("response body too large".into());
                        }
                        decoded.extend_from_slice(&buf[pos + a..pos + b]);
                        pos += skip;
                    }
                    ChunkStep::End { skip } => break pos += skip,
                    ChunkStep::More => return Ok(None),
                    ChunkStep::Bad => return Err("malformed chunked body".into()),
                }
            }
            decoded
        }
    };
    assert!(pos <= buf.len());
    Ok(Some((head.status, body, pos)))
}

/// The head at the start of `buf`, `None` if incomplete.
fn parse_head(buf: &[u8], head_only: bool) -> Result<Option<Head>, Exchange> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() <= RESPONSE_HEAD_MAX => return Ok(None),
        Ok(httparse::Status::Partial) => {
            return Err(Exchange::Failed("response head too large".into()))
        }
        Err(e) => return Err(Exchange::Failed(format!("malformed response: {e}"))),
    };
    let status = resp.code.unwrap_or(0);
    let mut keep = resp.version == Some(1);
    let (mut length, mut coding): (Option<usize>, Option<&[u8]>) = (None, None);
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            // As strict as the server's reading of a request's: one length,
            // `1*DIGIT`; two that differ are an error (RFC 9112 6.3).
            let n = super::content_length(h.value)
                .filter(|n| length.is_none_or(|l| l == *n))
                .ok_or_else(|| Exchange::Failed("bad Content-Length in response".into()))?;
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // Several fields are one list: a field's last coding, if it
            // has one, follows the earlier fields'.
            coding = last_coding(h.value).or(coding).or(Some(b""));
        } else if h.name.eq_ignore_ascii_case("connection") {
            if h.value.eq_ignore_ascii_case(b"close") {
                keep = false;
            } else if h.value.eq_ignore_ascii_case(b"keep-alive") {
                keep = true;
            }
        }
    }
    // Transfer-Encoding overrides Content-Length: its last coding decides
    // (chunked, or else the body runs until the close); with no coding
    // in it, the length frames the body.
    let final_coding = coding.filter(|c| !c.is_empty());
    let mut framing = match (final_coding, length) {
        (Some(c), _) if c.eq_ignore_ascii_case(b"chunked") => Framing::Chunked,
        (Some(_), _) | (None, None) => Framing::UntilClose,
        (None, Some(n)) => Framing::Length(n),
    };
    if head_only || status == 204 || status == 304 || (100..200).contains(&status) {
        framing = Framing::Length(0);
    }
    if matches!(framing, Framing::UntilClose) || (coding.is_some() && length.is_some()) {
        // Either the close ends the body, or the framing was ambiguous
        // (a smuggling pattern): no second exchange on this connection.
        keep = false;
    }
    Ok(Some(Head {
        status,
        len,
        framing,
        keep,
    }))
}

async fn read_length(
    stream: &mut Stream,
    recv: &mut Recv<'_>,
    len: usize,
    want_body: bool,
) -> Result<Vec<u8>, Exchange> {
    if len > RESPONSE_BODY_MAX {
        return Err(Exchange::Failed("response body too large".into()));
    }
    while recv.pending().len() < len {
        recv.fill(stream).await.map_err(mid_body)?;
    }
    let body = if want_body {
        recv.pending()[..len].to_vec()
    } else {
        Vec::new()
    };
    recv.consume(len);
    Ok(body)
}

async fn read_chunked(
    stream: &mut Stream,
    recv: &mut Recv<'_>,
    want_body: bool,
) -> Result<Vec<u8>, Exchange> {
    let mut decoded = Vec::new();
    let mut decoded_len = 0usize;
    loop {
        match decode_chunk(recv.pending()) {
            ChunkStep::Data { skip, data: (a, b) } => {
                if decoded_len + (b - a) > RESPONSE_BODY_MAX {
                    return Err(Exchange::Failed("response body too large".into()));
                }
                decoded_len += b - a;
                if want_body {
                    decoded.extend_from_slice(&recv.pending()[a..b]);
                }
                recv.consume(skip);
            }
            ChunkStep::End { skip } => {
                recv.consume(skip);
                return Ok(decoded);
            }
            ChunkStep::More => {
                if recv.pending().len() > RESPONSE_BODY_MAX + READ_CHUNK {
                    return Err(Exchange::Failed("response chunk too large".into()));
                }
                recv.fill(stream).await.map_err(mid_body)?;
            }
            ChunkStep::Bad => return Err(Exchange::Failed("malformed chunked body".into())),
        }
    }
}

async fn read_until_close(
    stream: &mut Stream,
    recv: &mut Recv<'_>,
    want_body: bool,
) -> Result<Vec<u8>, Exchange> {
    let mut chunk = [0u8; READ_CHUNK];
    let mut len = recv.pending().len();
    let mut body = if want_body {
        recv.pending().to_vec()
    } else {
        Vec::new()
    };
    recv.consume(len);
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| Exchange::Failed(format!("receive: {e}")))?;
        if n == 0 {
            return Ok(body);
        }
        if len + n > RESPONSE_BODY_MAX {
            return Err(Exchange::Failed("response body too large".into()));
        }
        len += n;
        if want_body {
            body.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Any failure once the head arrived is not retryable.
fn mid_body(e: Exchange) -> Exchange {
    match e {
        Exchange::NothingBack(e) | Exchange::Failed(e) => Exchange::Failed(e),
    }
}

#[derive(Debug, PartialEq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

#[derive(Debug, PartialEq)]
enum ChunkStep {
    /// A data chunk: bytes to skip in total, and the data's range.
    Data {
        skip: usize,
        data: (usize, usize),
    },
    /// The last chunk and trailers: bytes to skip.
    End {
        skip: usize,
    },
    More,
    Bad,
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// The last coding of a `Transfer-Encoding` field value: empty list items
/// and `identity` are not codings (RFC 9110 5.6.1).
fn last_coding(value: &[u8]) -> Option<&[u8]> {
    value
        .rsplit(|&b| b == b',')
        .map(super::trim_ows)
        .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity"))
}

/// A chunk's size: `1*HEXDIG` (RFC 9112 7.1), SP and HTAB around it
/// ignored; no sign, no other space, nothing past `usize`.
fn chunk_size(text: &[u8]) -> Option<usize> {
    let digits = super::trim_ows(text);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0usize, |n, &d| {
        let v = char::from(d).to_digit(16)?;
        n.checked_mul(16)?.checked_add(v as usize)
    })
}

fn decode_chunk(buf: &[u8]) -> ChunkStep {
    let Some(line_end) = find_crlf(buf) else {
        return if buf.len() > 1024 {
            ChunkStep::Bad
        } else {
            ChunkStep::More
        };
    };
    let line = &buf[..line_end];
    let size_text = line.split(|b| *b == b';').next().unwrap_or_default();
    let Some(size) = chunk_size(size_text) else {
        return ChunkStep::Bad;
    };
    let data_start = line_end + 2;
    if size == 0 {
        // Trailers end with an empty line.
        let mut pos = data_start;
        loop {
            match find_crlf(&buf[pos..]) {
                Some(0) => return ChunkStep::End { skip: pos + 2 },
                Some(n) => pos += n + 2,
                None => return ChunkStep::More,
            }
        }
    }
    if size > RESPONSE_BODY_MAX {
        return ChunkStep::Bad;
    }
    if buf.len() < data_start + size + 2 {
        return ChunkStep::More;
    }
    if &buf[data_start + size..data_start + size + 2] != b"\r\n" {
        return ChunkStep::Bad;
    }
    ChunkStep::Data {
        skip: data_start + size + 2,
        data: (data_start, data_start + size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_decoding() {
        assert_eq!(
            decode_chunk(b"5\r\nhello\r\n"),
            ChunkStep::Data {
                skip: 10,
                data: (3, 8)
            }
        );
        assert_eq!(decode_chunk(b"5\r\nhel"), ChunkStep::More);
        assert_eq!(decode_chunk(b"0\r\n\r\n"), ChunkStep::End { skip: 5 });
        assert_eq!(
            decode_chunk(b"0\r\nX-T: 1\r\n\r\n"),
            ChunkStep::End { skip: 13 }
        );
        assert_eq!(decode_chunk(b"zz\r\n"), ChunkStep::Bad);
        assert_eq!(decode_chunk(b"2\r\nabXX"), ChunkStep::Bad);
        // A chunk size is 1*HEXDIG: no sign, no Unicode space around it.
        assert_eq!(decode_chunk(b"+5\r\nhello\r\n"), ChunkStep::Bad);
        assert_eq!(
            decode_chunk("\u{a0}5\r\nhello\r\n".as_bytes()),
            ChunkStep::Bad
        );
        assert_eq!(decode_chunk(b"\r\n\r\n"), ChunkStep::Bad);
        assert_eq!(
            decode_chunk(b"5 ;x=1\r\nhello\r\n"),
            ChunkStep::Data {
                skip: 15,
                data: (8, 13)
            }
        );
    }

    /// How a callback target's response head is framed: `(head fields,
    /// framing, keep-alive)`, `None` for a response refused as malformed.
    use Framing::{Chunked, Length, UntilClose};
    const FRAMING_CASES: &[(&str, Option<(Framing, bool)>)] = &[
        ("Content-Length: 5", Some((Length(5), true))),
        ("Content-Length:  5\t", Some((Length(5), true))),
        ("Content-Length: +5", None),
        ("Content-Length: \u{a0}5", None),
        ("Content-Length: 5, 5", None),
        ("Content-Length: -1", None),
        (
            "Content-Length: 5\r\nContent-Length: 5",
            Some((Length(5), true)),
        ),
        ("Content-Length: 5\r\nContent-Length: 6", None),
        ("Transfer-Encoding: chunked", Some((Chunked, true))),
        ("Transfer-Encoding: gzip, chunked", Some((Chunked, true))),
        // Transfer-Encoding overrides Content-Length (RFC 9112 6.3),
        // and such a response ends its connection.
        (
            "Content-Length: 5\r\nTransfer-Encoding: chunked",
            Some((Chunked, false)),
        ),
        (
            "Transfer-Encoding: chunked\r\nContent-Length: 5",
            Some((Chunked, false)),
        ),
        // Not chunked last: the body runs until the connection closes.
        ("Transfer-Encoding: notchunked", Some((UntilClose, false))),
        (
            "Transfer-Encoding: chunked, gzip",
            Some((UntilClose, false)),
        ),
        (
            "Connection: close\r\nContent-Length: 0",
            Some((Length(0), false)),
        ),
        ("", Some((UntilClose, false))),
        // Empty list items and `identity` are not codings (RFC 9110
        // 5.6.1): what is left decides; nothing left, the length does.
        ("Transfer-Encoding: chunked,", Some((Chunked, true))),
        ("Transfer-Encoding: chunked , ,", Some((Chunked, true))),
        (
            "Transfer-Encoding: identity\r\nContent-Length: 2",
            Some((Length(2), false)),
        ),
        (
            "Transfer-Encoding: chunked, identity",
            Some((Chunked, true)),
        ),
        (
            "Transfer-Encoding: ,\r\nContent-Length: 2",
            Some((Length(2), false)),
        ),
        ("Transfer-Encoding: identity", Some((UntilClose, false))),
        (
            "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked",
            Some((Chunked, true)),
        ),
        (
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip",
            Some((UntilClose, false)),
        ),
        (
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: ,",
            Some((Chunked, true)),
        ),
    ];

    #[test]
    fn response_framing_table() {
        let cases = FRAMING_CASES;
        for (fields, want) in cases {
            let head = format!("HTTP/1.1 200 OK\r\n{fields}\r\n\r\n");
            let got = match parse_head(head.as_bytes(), false) {
                Ok(Some(h)) => Some((h.framing, h.keep)),
                Ok(None) => panic!("{fields:?}: a whole head read as partial"),
                Err(_) => None,
            };
            assert_eq!(&got, want, "{fields:?}");
        }
        // No body by its status: the connection stays usable.
        let head = parse_head(b"HTTP/1.1 204 No Content\r\n\r\n", false);
        let head = head.ok().flatten().expect("a whole head");
        assert_eq!((head.framing, head.keep), (Framing::Length(0), true));
    }
}
