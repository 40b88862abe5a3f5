//! The HTTP/1.1 server side: one accept loop per shard on its own
//! `SO_REUSEPORT` listener, one task per connection.
//!
//! A connection reads into one buffer, answers every complete (pipelined)
//! request in it into one write buffer, and writes that buffer with a single
//! `write_all`: one read and one write per batch of requests.

use crate::api;
use crate::http::{parse_request, write_response, Parsed};
use crate::shard::Shard;
use crate::stats::ShardStats;
use futures_lite::{future, AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Bytes read per `read` call (and the initial buffer size).
const READ_CHUNK: usize = 16 * 1024;

/// Accept until shutdown.
pub async fn accept_loop(shard: Rc<Shard>, listener: TcpListener) {
    let max = shard.resolved.config.http.connections_max;
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
        let stats = shard.my_stats();
        if shard.connections.get() >= max {
            ShardStats::add(&stats.connections_rejected, 1);
            glommio::spawn_local(reject(stream)).detach();
            continue;
        }
        shard.connections.set(shard.connections.get() + 1);
        stats.connections_open.fetch_add(1, Ordering::Relaxed);
        let shard = shard.clone();
        glommio::spawn_local(async move {
            serve(&shard, stream).await;
            shard.connections.set(shard.connections.get() - 1);
            shard
                .my_stats()
                .connections_open
                .fetch_sub(1, Ordering::Relaxed);
        })
        .detach();
    }
}

async fn reject(mut stream: TcpStream) {
    let mut out = Vec::new();
    write_response(&mut out, 503, &[], b"too many connections", true);
    let _ = stream.write_all(&out).await;
}

/// Serve one connection until it closes, errs, idles out, or shutdown.
async fn serve(shard: &Shard, mut stream: TcpStream) {
    let cfg = &shard.resolved.config.http;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(cfg.idle_timeout_ms)));
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
