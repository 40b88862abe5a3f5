//! The HTTP/1.1 server side: one listener per shard on the shared port
//! (`SO_REUSEPORT`), one task per connection. Sockets are driven by the
//! shard's network ring ([`crate::http::ring`], `[http] net-ring = true`,
//! the default) or by glommio's own `TcpStream` (`net-ring = false`, and
//! where the ring cannot be set up). The server knows no routes: a
//! [`Handler`] from the composition root answers each request.
//!
//! A connection reads into one buffer, answers the complete (pipelined)
//! requests in it into one write buffer, and hands that buffer over with a
//! single `write_buf` (on the ring a swap, no copy): one read and one write
//! per batch of requests. A batch stops early once its answers reach
//! [`OUT_BYTES_MAX`] or it ran for [`BREATHE_AFTER`]: the connection writes
//! what it has, lets the reactor turn, and answers the rest before reading
//! again. A write that makes no progress for `[http] write-timeout-ms` (the
//! client stopped reading) closes the connection.

use crate::http::conn::{Conn, GlommioConn};
use crate::http::ring::{Acceptor, NetRing, RingConn};
use crate::http::tls::TlsConn;
use crate::http::{parse_request, write_response, Method, Parsed, Request};
use crate::runtime::gate::Gate;
use crate::runtime::loglimit::{log_due, LogLimit};
use crate::stats::ShardStats;
use futures_lite::future;
use glommio::net::TcpListener;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes read per `read` call (and the initial buffer size).
const READ_CHUNK: usize = 16 * 1024;
/// Connection slots the network ring keeps beyond `connections-max`, so
/// that connections over the limit still get their `503`.
const REFUSE_SLACK: usize = 64;
/// Answers a connection gathers before it writes them: a batch of
/// pipelined requests stops once its output reaches this, so a
/// connection's write buffer holds at most this plus one response (and
/// reading waits until the write is taken).
const OUT_BYTES_MAX: usize = 1024 * 1024;
/// At most one log line per this period for failed TLS handshakes.
const TLS_LOG_EVERY: Duration = Duration::from_secs(10);

/// What answers requests: the composition root hands one to the server.
pub trait Handler: 'static {
    /// Answer one request into `out` (`close`: say `Connection: close`);
    /// returns the status written.
    fn handle<'a>(
        &'a self,
        req: &'a Request<'a>,
        out: &'a mut Vec<u8>,
        close: bool,
    ) -> impl Future<Output = u16> + 'a;
}

/// The server's limits (from `[http]`).
#[derive(Clone, Debug)]
pub struct Limits {
    pub connections_max: usize,
    /// Open connections per peer address on this shard.
    pub connections_per_source_max: usize,
    pub header_bytes_max: usize,
    pub body_bytes_max: usize,
    pub idle_timeout_ms: u64,
    /// From a request's first byte to its complete head.
    pub header_timeout: Duration,
    /// From a complete head to the complete body.
    pub body_timeout: Duration,
    /// Queued output without progress for this long closes the connection.
    pub write_timeout: Duration,
    /// How long shutdown waits for requests in hand.
    pub drain: Duration,
    /// `[http] tls-certificate`: every connection speaks TLS, its handshake
    /// within `header_timeout`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// One shard's HTTP server: admission (connections open, requests in
/// hand) and the connection loop, answering through `H`.
pub struct Server<H: Handler> {
    handler: H,
    limits: Limits,
    gate: Rc<Gate>,
    stats: Arc<[ShardStats]>,
    shard: usize,
    /// Requests being handled right now (shutdown waits for them).
    busy: Cell<usize>,
    connections: Cell<usize>,
    /// Open connections per peer address (entries only for open ones, so
    /// at most `connections_max`).
    per_source: RefCell<HashMap<IpAddr, usize>>,
    /// Failed TLS handshakes (a client can provoke them at will).
    tls_log: LogLimit,
}

/// The server's side of the network ring: admission, shutdown, idle timeout.
struct RingAcceptor<H: Handler>(Rc<Server<H>>);

impl<H: Handler> Acceptor for RingAcceptor<H> {
    fn accept(&self, conn: RingConn) {
        if !self.0.gate.is_closing() {
            self.0.admit(conn);
        }
    }
    fn stopping(&self) -> bool {
        self.0.gate.is_closing()
    }
    fn in_hand(&self) -> bool {
        self.0.busy.get() > 0
    }
    fn stop_wait(&self) -> impl Future<Output = ()> + '_ {
        self.0.gate.closing()
    }
    fn idle_timeout_ms(&self) -> u64 {
        self.0.limits.idle_timeout_ms
    }
    fn write_timeout_ms(&self) -> u64 {
        u64::try_from(self.0.limits.write_timeout.as_millis()).unwrap_or(u64::MAX)
    }
}

impl<H: Handler> Server<H> {
    pub fn new(
        handler: H,
        limits: Limits,
        gate: Rc<Gate>,
        stats: Arc<[ShardStats]>,
        shard: usize,
    ) -> Rc<Server<H>> {
        assert!(shard < stats.len(), "shard {shard} has no stats");
        assert!(
            limits.connections_max > 0,
            "the configuration's checks keep a connection bound"
        );
        Rc::new(Server {
            handler,
            limits,
            gate,
            stats,
            shard,
            busy: Cell::new(0),
            connections: Cell::new(0),
            per_source: RefCell::new(HashMap::new()),
            tls_log: Cell::new((None, 0)),
        })
    }

    fn my_stats(&self) -> &ShardStats {
        &self.stats[self.shard]
    }

    /// Serve `listener` until the gate closes and the requests in hand are
    /// answered (or the drain time passed): on the network ring when
    /// `net_ring` and the ring can be set up, else on glommio's sockets.
    pub async fn run(self: Rc<Self>, listener: OwnedFd, net_ring: bool) {
        let ring = if net_ring {
            let slots = self.limits.connections_max + REFUSE_SLACK;
            let in_bytes_high = self.limits.header_bytes_max + self.limits.body_bytes_max;
            match NetRing::new(listener.as_raw_fd(), slots, in_bytes_high) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(target: "chronos::http", "shard {}: network ring unavailable ({e}); using glommio sockets", self.shard);
                    None
                }
            }
        } else {
            None
        };
        let drain = self.limits.drain;
        match ring {
            // Returns once shutdown has drained (or the drain time passed).
            Some(ring) => ring.run(Rc::new(RingAcceptor(self.clone())), drain).await,
            None => {
                // SAFETY: the fd is a bound, listening TCP socket we own.
                let listener = unsafe { TcpListener::from_raw_fd(listener.into_raw_fd()) };
                self.accept_loop(listener).await;
                let started = Instant::now();
                while self.busy.get() > 0 && started.elapsed() < drain {
                    glommio::timer::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }

    /// Beyond `connections-max`, answer `503` and close; otherwise count the
    /// connection and serve it on its own task.
    fn admit<C: Conn + 'static>(self: &Rc<Self>, conn: C) {
        let ip = conn.peer_ip();
        let from_ip = ip.map_or(0, |ip| {
            self.per_source.borrow().get(&ip).copied().unwrap_or(0)
        });
        if self.connections.get() >= self.limits.connections_max
            || from_ip >= self.limits.connections_per_source_max
        {
            ShardStats::add(&self.my_stats().connections_rejected, 1);
            let why = if from_ip >= self.limits.connections_per_source_max {
                "too many connections from this address (connections-per-source-max)"
            } else {
                "too many connections: the limit (connections-max) is reached"
            };
            crate::runtime::spawn::spawn_local(reject(conn, why)).detach();
            return;
        }
        if let Some(ip) = ip {
            *self.per_source.borrow_mut().entry(ip).or_default() += 1;
        }
        self.connections.set(self.connections.get() + 1);
        self.my_stats()
            .connections_open
            .fetch_add(1, Ordering::Relaxed);
        let server = self.clone();
        crate::runtime::spawn::spawn_local(async move {
            // Once per connection: a plain one runs the plain code.
            match server.limits.tls.clone() {
                None => server.serve(conn).await,
                Some(tls) => server.serve_tls(conn, &tls).await,
            }
            if let Some(ip) = ip {
                let mut per = server.per_source.borrow_mut();
                let n = per.get_mut(&ip).expect("counted at admission");
                *n -= 1;
                if *n == 0 {
                    per.remove(&ip);
                }
            }
            assert!(
                server.connections.get() > 0,
                "a connection ends only once counted"
            );
            server.connections.set(server.connections.get() - 1);
            server
                .my_stats()
                .connections_open
                .fetch_sub(1, Ordering::Relaxed);
        })
        .detach();
    }

    /// Run the TLS handshake within `header-timeout-ms`, then serve the
    /// connection over it; a handshake that fails or does not finish is
    /// counted, logged (rate-limited) and closes the connection.
    async fn serve_tls<C: Conn>(&self, conn: C, tls: &Arc<rustls::ServerConfig>) {
        let peer = conn.peer_ip();
        let limit = self.limits.header_timeout;
        let shaken = future::or(TlsConn::accept(conn, tls), async {
            glommio::timer::sleep(limit).await;
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the handshake did not finish within header-timeout-ms",
            ))
        })
        .await;
        match shaken {
            Ok(conn) => {
                let idle = Duration::from_millis(self.limits.idle_timeout_ms);
                self.serve(conn.with_plain_wait_max(idle)).await
            }
            Err(e) => {
                ShardStats::add(&self.my_stats().tls_handshakes_failed, 1);
                if let Some(quiet) = log_due(&self.tls_log, Instant::now(), TLS_LOG_EVERY) {
                    tracing::warn!(target: "chronos::http", "shard {}: TLS handshake from {} failed: {e} ({quiet} more since the last such line)", self.shard, peer.map_or("?".to_string(), |p| p.to_string()));
                }
            }
        }
    }

    /// Accept until shutdown (glommio's sockets).
    async fn accept_loop(self: &Rc<Self>, listener: TcpListener) {
        loop {
            let accepted = self.gate.unless_closing(listener.accept()).await;
            let stream = match accepted {
                None => return,
                Some(Ok(stream)) => stream,
                Some(Err(e)) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    tracing::warn!(target: "chronos::http", "accept failed: {e}");
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            if self.gate.is_closing() {
                return;
            }
            let _ = stream.set_nodelay(true);
            let idle = Duration::from_millis(self.limits.idle_timeout_ms);
            let _ = stream.set_read_timeout(Some(idle));
            let _ = stream.set_write_timeout(Some(self.limits.write_timeout));
            self.admit(GlommioConn(stream));
        }
    }
}

async fn reject<C: Conn>(mut stream: C, why: &str) {
    let mut out = Vec::new();
    write_response(&mut out, 503, &[], why.as_bytes(), true);
    let _ = stream.write_all(&out).await;
}

/// A connection's input buffer: bytes `start..end` are unanswered.
struct Input {
    /// The connection's peer address (handed to the handler with each
    /// request).
    peer: Option<IpAddr>,
    /// The peer's TLS client certificate was verified.
    certified: bool,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Whole requests must fit: head + body, plus one read of slack.
    max: usize,
    /// `100 Continue` already sent for the request being read.
    continue_sent: bool,
    /// What the unanswered bytes are, and since when.
    phase: Phase,
    phase_since: Instant,
}

/// Where the request being read stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing unanswered: the keep-alive idle timeout applies.
    Idle,
    /// Part of a head: `header_timeout` from its first byte.
    Head,
    /// A complete head, part of its body: `body_timeout` from the head.
    Body,
}

impl Input {
    /// Enter `phase` (its clock starts now unless it is the current one;
    /// `Idle` has no deadline and reads no clock).
    fn enter(&mut self, phase: Phase) {
        if phase != self.phase {
            self.phase = phase;
            if phase != Phase::Idle {
                self.phase_since = Instant::now();
            }
        }
    }
}

impl Input {
    /// `n` bytes were read (`waited`: the read suspended the task): start
    /// the head's clock if a request begins, and say whether the task must
    /// breathe, having run [`BREATHE_AFTER`] since `breath` without
    /// waiting. The one clock read of a request in steady state.
    fn arrived(&mut self, n: usize, waited: bool, breath: &mut Instant) -> bool {
        self.end += n;
        let now = Instant::now();
        if self.phase == Phase::Idle {
            self.phase = Phase::Head;
            self.phase_since = now;
        }
        if waited {
            *breath = now;
            return false;
        }
        now.saturating_duration_since(*breath) >= BREATHE_AFTER
    }

    /// Make room for one more read: compact, then grow up to `max`.
    /// `false` when the buffer is full (cannot happen for a well-framed
    /// request, since the parser bounds head and body; guarded anyway).
    fn make_room(&mut self) -> bool {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 && self.buf.len() - self.end < READ_CHUNK {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < READ_CHUNK {
            if self.buf.len() >= self.max {
                return false;
            }
            let grown = (self.buf.len() * 2)
                .min(self.max)
                .max(self.end + READ_CHUNK);
            self.buf.resize(grown, 0);
        }
        assert!(
            self.start <= self.end && self.end < self.buf.len(),
            "the unread span lies in the buffer"
        );
        true
    }
}

/// How long a connection's task may run without letting the reactor turn.
const BREATHE_AFTER: Duration = Duration::from_micros(500);

/// Why [`Server::answer_buffered`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answered {
    /// Every complete request is answered: read more.
    NeedInput,
    /// Stopped at [`OUT_BYTES_MAX`] or [`BREATHE_AFTER`]: write, breathe,
    /// and answer the requests still buffered before reading.
    Paused,
    /// Close once the output is written.
    Close,
}

impl<H: Handler> Server<H> {
    /// Serve one connection until it closes, errs, idles out, or shutdown.
    async fn serve<C: Conn>(&self, mut stream: C) {
        let l = &self.limits;
        let mut input = Input {
            peer: stream.peer_ip(),
            certified: stream.peer_certified(),
            buf: vec![0u8; READ_CHUNK],
            start: 0,
            end: 0,
            max: l.header_bytes_max + l.body_bytes_max + READ_CHUNK,
            continue_sent: false,
            phase: Phase::Idle,
            phase_since: Instant::now(),
        };
        // At most OUT_BYTES_MAX plus one response (`answer_buffered`).
        let mut out: Vec<u8> = Vec::with_capacity(READ_CHUNK);
        // Since when this task has run without waiting (a read that had to
        // wait lets the other tasks and the reactor run).
        let mut breath = Instant::now();
        loop {
            let answered = self.answer_buffered(&mut input, &mut out).await;
            if !out.is_empty() {
                // Fails once the write made no progress for write-timeout-ms.
                if stream.write_buf(&mut out).await.is_err() {
                    stream.reset_on_close();
                    return;
                }
            }
            if answered == Answered::Close {
                return;
            }
            if answered == Answered::Paused {
                // Ran for BREATHE_AFTER (or filled OUT_BYTES_MAX).
                crate::runtime::bulk::breathe().await;
                breath = Instant::now();
                continue;
            }
            if !input.make_room() {
                write_response(&mut out, 413, &[], b"request too large", true);
                let _ = stream.write_all(&out).await;
                return;
            }
            let (read, waited) = self.read_within(&mut stream, &mut input).await;
            let Some(read) = read else {
                self.timed_out(&mut stream, input.phase, &mut out).await;
                return;
            };
            let n = match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if input.arrived(n, waited, &mut breath) {
                // A peer that keeps the input full (pipelined replication
                // at a resync's pace) would keep this task runnable, and
                // the pops of this shard waiting, for glommio's whole
                // 100 ms quantum.
                crate::runtime::bulk::breathe().await;
                breath = Instant::now();
            }
            if self.gate.is_closing() && input.start == input.end {
                return;
            }
        }
    }

    /// A request not complete within its deadline: `408` naming it.
    async fn timed_out<C: Conn>(&self, stream: &mut C, phase: Phase, out: &mut Vec<u8>) {
        let (what, key) = match phase {
            Phase::Body => ("body", "body-timeout-ms"),
            _ => ("head", "header-timeout-ms"),
        };
        let reason = format!("request {what} not complete within {key}");
        self.count(408);
        write_response(out, 408, &[], reason.as_bytes(), true);
        let _ = stream.write_all(out).await;
    }

    /// One read, within the current request's deadline (`None`: past it),
    /// and whether it had to wait (the task was suspended).
    async fn read_within<C: Conn>(
        &self,
        stream: &mut C,
        input: &mut Input,
    ) -> (Option<io::Result<usize>>, bool) {
        let limit = match input.phase {
            Phase::Idle => None,
            Phase::Head => Some(self.limits.header_timeout),
            Phase::Body => Some(self.limits.body_timeout),
        };
        let mut read = std::pin::pin!(stream.read(&mut input.buf[input.end..]));
        let mut waited = false;
        let read = std::future::poll_fn(|cx| {
            let polled = read.as_mut().poll(cx);
            waited |= polled.is_pending();
            polled
        });
        let Some(limit) = limit else {
            let got = read.await;
            return (Some(got), waited);
        };
        let left = (input.phase_since + limit).saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (None, waited);
        }
        let got = future::or(async { Some(read.await) }, async {
            glommio::timer::sleep(left).await;
            None
        })
        .await;
        (got, waited)
    }

    /// Answer the complete (pipelined) requests in `input` into `out`,
    /// stopping early ([`Answered::Paused`]) with requests left once `out`
    /// reaches [`OUT_BYTES_MAX`] or [`BREATHE_AFTER`] has passed since the
    /// first answer: so `out` grows by at most one response beyond the
    /// bound, and a batch runs for at most one request beyond the breath.
    async fn answer_buffered(&self, input: &mut Input, out: &mut Vec<u8>) -> Answered {
        let l = &self.limits;
        // When the first answer was done (a batch of one reads no clock).
        let mut first_done: Option<Instant> = None;
        while input.start < input.end {
            let buf = &input.buf[input.start..input.end];
            match parse_request(buf, l.header_bytes_max, l.body_bytes_max) {
                Parsed::Complete(mut req, used) => {
                    req.peer = input.peer;
                    req.peer_certified = input.certified;
                    let close_after = !req.keep_alive || self.gate.is_closing();
                    self.busy.set(self.busy.get() + 1);
                    let at = out.len();
                    let status = self.handler.handle(&req, out, close_after).await;
                    if req.method == Method::Head {
                        head_only(out, at);
                    }
                    self.busy.set(self.busy.get() - 1);
                    self.count(status);
                    input.start += used;
                    input.continue_sent = false;
                    // The next request's clock starts at its first byte.
                    input.enter(Phase::Idle);
                    if close_after {
                        return Answered::Close;
                    }
                    if input.start < input.end {
                        input.enter(Phase::Head);
                        // `enter` just read the clock: no second read.
                        let now = input.phase_since;
                        let ran = now.saturating_duration_since(*first_done.get_or_insert(now));
                        if stop_batch(out.len(), ran) {
                            return Answered::Paused;
                        }
                    }
                }
                Parsed::Partial {
                    head_complete,
                    expect_continue,
                } => {
                    input.enter(if head_complete {
                        Phase::Body
                    } else {
                        Phase::Head
                    });
                    if expect_continue && !input.continue_sent {
                        out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                        input.continue_sent = true;
                    }
                    return Answered::NeedInput;
                }
                Parsed::Error(e) => {
                    self.count(e.status);
                    write_response(out, e.status, &[], e.reason.as_bytes(), true);
                    return Answered::Close;
                }
            }
        }
        Answered::NeedInput
    }

    fn count(&self, status: u16) {
        let stats = self.my_stats();
        ShardStats::add(&stats.http_requests, 1);
        if status >= 400 {
            ShardStats::add(&stats.http_errors, 1);
        }
    }
}

/// Cut the body off the response that starts at `at` in `out`: an answer
/// to `HEAD` has none (RFC 9110 9.3.2; its `Content-Length` stays), or a
/// kept-alive client reads the body as the start of its next answer.
fn head_only(out: &mut Vec<u8>, at: usize) {
    let head_len = out[at..].windows(4).position(|w| w == b"\r\n\r\n");
    assert!(head_len.is_some(), "a handler writes a whole response");
    if let Some(len) = head_len {
        out.truncate(at + len + 4);
    }
}

/// Whether a batch that has written `out_bytes` and run for `ran` stops
/// before its next request.
fn stop_batch(out_bytes: usize, ran: Duration) -> bool {
    out_bytes >= OUT_BYTES_MAX || ran >= BREATHE_AFTER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_answer_keeps_its_head_and_loses_its_body() {
        let mut out = b"earlier".to_vec();
        write_response(&mut out, 405, &[("Allow", b"GET")], b"not allowed", false);
        head_only(&mut out, 7);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("earlierHTTP/1.1 405 "), "{text}");
        assert!(text.ends_with("Content-Length: 11\r\n\r\n"), "{text}");
    }

    #[test]
    fn a_batch_stops_at_the_output_bound_or_the_breath() {
        assert!(!stop_batch(0, Duration::ZERO));
        assert!(!stop_batch(OUT_BYTES_MAX - 1, BREATHE_AFTER / 2));
        assert!(stop_batch(OUT_BYTES_MAX, Duration::ZERO));
        assert!(stop_batch(10, BREATHE_AFTER));
    }
}
