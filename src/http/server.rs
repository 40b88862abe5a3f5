//! The HTTP/1.1 server side: one listener per shard on the shared port
//! (`SO_REUSEPORT`), one task per connection. Sockets are driven by the
//! shard's network ring ([`crate::http::ring`], `[http] net-ring = true`,
//! the default) or by glommio's own `TcpStream` ([`accept_loop`], with
//! `net-ring = false` and where the ring cannot be set up).
//!
//! A connection reads into one buffer, answers every complete (pipelined)
//! request in it into one write buffer, and writes that buffer with a single
//! `write_all`: one read and one write per batch of requests.

use crate::api;
use crate::http::ring::{Acceptor, RingConn};
use crate::http::{parse_request, write_response, Parsed};
use crate::shard::Shard;
use crate::stats::ShardStats;
use futures_lite::{future, AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use std::future::Future;
use std::io;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Bytes read per `read` call (and the initial buffer size).
const READ_CHUNK: usize = 16 * 1024;

/// A connection as `serve` sees it.
pub trait Conn {
    /// Read into `buf`; `Ok(0)` at end of stream or idle timeout.
    fn read<'a>(&'a mut self, buf: &'a mut [u8]) -> impl Future<Output = io::Result<usize>> + 'a;
    /// Write all of `data`.
    fn write_all<'a>(&'a mut self, data: &'a [u8]) -> impl Future<Output = io::Result<()>> + 'a;
}

impl Conn for RingConn {
    fn read<'a>(&'a mut self, buf: &'a mut [u8]) -> impl Future<Output = io::Result<usize>> + 'a {
        RingConn::read(self, buf)
    }
    fn write_all<'a>(&'a mut self, data: &'a [u8]) -> impl Future<Output = io::Result<()>> + 'a {
        RingConn::write_all(self, data)
    }
}

/// glommio's stream, with the idle timeout as its read timeout.
pub struct GlommioConn(TcpStream);

impl Conn for GlommioConn {
    fn read<'a>(&'a mut self, buf: &'a mut [u8]) -> impl Future<Output = io::Result<usize>> + 'a {
        AsyncReadExt::read(&mut self.0, buf)
    }
    fn write_all<'a>(&'a mut self, data: &'a [u8]) -> impl Future<Output = io::Result<()>> + 'a {
        AsyncWriteExt::write_all(&mut self.0, data)
    }
}

/// The shard's side of the network ring: admission, shutdown, idle timeout.
pub struct ShardAcceptor(pub Rc<Shard>);

impl Acceptor for ShardAcceptor {
    fn accept(&self, conn: RingConn) {
        if !self.0.shutting_down.get() {
            admit(&self.0, conn);
        }
    }
    fn stopping(&self) -> bool {
        self.0.shutting_down.get()
    }
    fn in_hand(&self) -> bool {
        self.0.busy.get() > 0
    }
    fn stop_wait(&self) -> impl Future<Output = ()> + '_ {
        // The accept loop's wake-up; that loop does not run beside the ring.
        self.0.accept_wake.wait()
    }
    fn idle_timeout_ms(&self) -> u64 {
        self.0.resolved.config.http.idle_timeout_ms
    }
}

/// Beyond `connections-max`, answer `503` and close; otherwise count the
/// connection and serve it on its own task.
fn admit<C: Conn + 'static>(shard: &Rc<Shard>, conn: C) {
    if shard.connections.get() >= shard.resolved.config.http.connections_max {
        ShardStats::add(&shard.my_stats().connections_rejected, 1);
        glommio::spawn_local(reject(conn)).detach();
        return;
    }
    let shard = shard.clone();
    shard.connections.set(shard.connections.get() + 1);
    shard
        .my_stats()
        .connections_open
        .fetch_add(1, Ordering::Relaxed);
    glommio::spawn_local(async move {
        serve(&shard, conn).await;
        shard.connections.set(shard.connections.get() - 1);
        shard
            .my_stats()
            .connections_open
            .fetch_sub(1, Ordering::Relaxed);
    })
    .detach();
}

/// Accept until shutdown (glommio's sockets).
pub async fn accept_loop(shard: Rc<Shard>, listener: TcpListener) {
    loop {
        let accepted = future::or(async { Some(listener.accept().await) }, async {
            shard.accept_wake.wait().await;
            None
        })
        .await;
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
        if shard.shutting_down.get() {
            return;
        }
        let _ = stream.set_nodelay(true);
        let idle = Duration::from_millis(shard.resolved.config.http.idle_timeout_ms);
        let _ = stream.set_read_timeout(Some(idle));
        admit(&shard, GlommioConn(stream));
    }
}

async fn reject<C: Conn>(mut stream: C) {
    let mut out = Vec::new();
    write_response(&mut out, 503, &[], b"too many connections", true);
    let _ = stream.write_all(&out).await;
}

/// Serve one connection until it closes, errs, idles out, or shutdown.
async fn serve<C: Conn>(shard: &Shard, mut stream: C) {
    let cfg = &shard.resolved.config.http;
    // Whole requests must fit: head + body, plus one read of slack.
    let buf_max = cfg.header_bytes_max + cfg.body_bytes_max + READ_CHUNK;
    let mut buf = vec![0u8; READ_CHUNK];
    let (mut start, mut end) = (0usize, 0usize);
    let mut out: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut continue_sent = false;
    loop {
        let mut close = false;
        // Answer every complete request in the buffer.
        while start < end {
            match parse_request(&buf[start..end], cfg.header_bytes_max, cfg.body_bytes_max) {
                Parsed::Complete(req, used) => {
                    let close_after = !req.keep_alive || shard.shutting_down.get();
                    shard.busy.set(shard.busy.get() + 1);
                    let status = api::handle(shard, &req, &mut out, close_after).await;
                    shard.busy.set(shard.busy.get() - 1);
                    let stats = shard.my_stats();
                    ShardStats::add(&stats.http_requests, 1);
                    if status >= 400 {
                        ShardStats::add(&stats.http_errors, 1);
                    }
                    start += used;
                    continue_sent = false;
                    if close_after {
                        close = true;
                        break;
                    }
                }
                Parsed::Partial { expect_continue } => {
                    if expect_continue && !continue_sent {
                        out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                        continue_sent = true;
                    }
                    break;
                }
                Parsed::Error(e) => {
                    let stats = shard.my_stats();
                    ShardStats::add(&stats.http_requests, 1);
                    ShardStats::add(&stats.http_errors, 1);
                    write_response(&mut out, e.status, &[], e.reason.as_bytes(), true);
                    close = true;
                    break;
                }
            }
        }
        if !out.is_empty() {
            if stream.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if close {
            return;
        }
        // Make room for the next read.
        if start == end {
            start = 0;
            end = 0;
        } else if start > 0 && buf.len() - end < READ_CHUNK {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
        }
        if buf.len() - end < READ_CHUNK {
            if buf.len() >= buf_max {
                // Cannot happen for a well-framed request (the parser bounds
                // head and body); guard anyway.
                write_response(&mut out, 413, &[], b"request too large", true);
                let _ = stream.write_all(&out).await;
                return;
            }
            let grown = (buf.len() * 2).min(buf_max).max(end + READ_CHUNK);
            buf.resize(grown, 0);
        }
        match stream.read(&mut buf[end..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => end += n,
        }
        if shard.shutting_down.get() && start == end {
            return;
        }
    }
}
