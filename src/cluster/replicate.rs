//! Replication to other nodes: the internal `PUT /timers/<id>` of seed 000.
//!
//! Each shard has one `Replicator` with a queue per peer node. Enqueueing is
//! synchronous and never waits (the pop loop and request handlers call it);
//! one sender task per peer drains the queue in batches of up to
//! `BATCH_MAX` requests, written in one `write_all` on a keep-alive
//! connection and answered in order (HTTP/1.1 pipelining).
//!
//! Bounds, per shard and peer: `queue_max` messages waiting (beyond it a
//! message is dropped and counted), one connection, one batch in flight,
//! a timeout per batch (beyond it the batch is counted as failed and the
//! connection closed), and an exponential reconnect backoff
//! (`BACKOFF_MS_MIN`..`BACKOFF_MS_MAX`). Failed messages are not retried:
//! replication is best-effort by design (the reference does the same), and
//! the skewed backups cover a lost pop replication with a late duplicate.

use crate::runtime::notify::Notify;
use crate::shard::SHUTDOWN;
use crate::stats::ShardStats;
use crate::timer::TimerId;
use futures_lite::{future, AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::Write;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Requests per pipelined write.
pub const BATCH_MAX: usize = 256;
/// Reconnect backoff after a failed connect or batch.
pub const BACKOFF_MS_MIN: u64 = 50;
pub const BACKOFF_MS_MAX: u64 = 2_000;
/// Largest response head accepted from a peer.
const RESPONSE_HEAD_MAX: usize = 16 * 1024;
/// Spare segment buffers kept per peer.
const SPARE_SEGMENTS_MAX: usize = 8;
/// How often an idle sender checks for shutdown.
const IDLE_CHECK: Duration = Duration::from_millis(200);

/// What one replication message says about a timer.
pub struct Body<'a> {
    pub interval_ms: u32,
    pub repeat_for_ms: u32,
    /// Start of the incarnation relative to the sender's now (≤ 0 normally).
    pub start_time_delta_ms: i64,
    pub sequence: u32,
    pub version_us: u64,
    /// Empty URI and opaque: a tombstone.
    pub uri: &'a str,
    pub opaque: &'a str,
    pub view_id: u64,
    pub replicas: &'a [&'a str],
    /// `(tag, count)`.
    pub tags: &'a [(&'a str, u32)],
}

/// Seconds with millisecond resolution, as the codec reads them.
fn write_seconds(out: &mut Vec<u8>, ms: u32) {
    if ms.is_multiple_of(1000) {
        let _ = write!(out, "{}", ms / 1000);
    } else {
        let _ = write!(out, "{}.{:03}", ms / 1000, ms % 1000);
    }
}

fn write_json_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
}

/// The JSON body of a replication `PUT`.
pub fn encode_body(out: &mut Vec<u8>, b: &Body<'_>) {
    out.extend_from_slice(b"{\"timing\":{\"interval\":");
    write_seconds(out, b.interval_ms);
    out.extend_from_slice(b",\"repeat-for\":");
    write_seconds(out, b.repeat_for_ms);
    let _ = write!(
        out,
        ",\"start-time-delta\":{},\"sequence-number\":{},\"version\":{}}},\"callback\":",
        b.start_time_delta_ms, b.sequence, b.version_us
    );
    if b.uri.is_empty() {
        out.extend_from_slice(b"{}");
    } else {
        out.extend_from_slice(b"{\"http\":{\"uri\":");
        write_json_str(out, b.uri);
        out.extend_from_slice(b",\"opaque\":");
        write_json_str(out, b.opaque);
        out.extend_from_slice(b"}}");
    }
    let _ = write!(
        out,
        ",\"reliability\":{{\"cluster-view-id\":\"{}\",\"replicas\":[",
        b.view_id
    );
    for (i, r) in b.replicas.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_json_str(out, r);
    }
    out.extend_from_slice(b"]}");
    if !b.tags.is_empty() {
        out.extend_from_slice(b",\"statistics\":{\"tag-info\":[");
        for (i, (tag, count)) in b.tags.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"type\":");
            write_json_str(out, tag);
            let _ = write!(out, ",\"count\":{count}}}");
        }
        out.extend_from_slice(b"]}");
    }
    out.push(b'}');
}

/// One contiguous run of encoded requests.
struct Segment {
    bytes: Vec<u8>,
    count: usize,
}

/// The queue and connection state for one peer node.
struct Peer {
    address: String,
    socket: SocketAddr,
    segments: RefCell<VecDeque<Segment>>,
    queued: Cell<usize>,
    spare: RefCell<Vec<Vec<u8>>>,
    wake: Notify,
    running: Cell<bool>,
    /// No longer a peer (a reload dropped it): its sender stops once the
    /// queue is empty.
    retired: Cell<bool>,
}

impl Peer {
    fn new(address: &str, socket: SocketAddr) -> Rc<Peer> {
        Rc::new(Peer {
            address: address.to_string(),
            socket,
            segments: RefCell::new(VecDeque::new()),
            queued: Cell::new(0),
            spare: RefCell::new(Vec::new()),
            wake: Notify::default(),
            running: Cell::new(false),
            retired: Cell::new(false),
        })
    }
}

/// A shard's replication client.
pub struct Replicator {
    /// In cluster peer order; replaced as a whole by a reload.
    peers: RefCell<Vec<Rc<Peer>>>,
    queue_max: usize,
    timeout: Duration,
    connect_timeout: Duration,
    stats: Arc<[ShardStats]>,
    shard: usize,
    /// Reused body buffer.
    scratch: RefCell<Vec<u8>>,
}

impl Replicator {
    /// `peers`: every node's `(address, socket)` in cluster order (`nodes`
    /// then `leaving`); the local node's entry is simply never used.
    pub fn new(
        peers: &[(String, SocketAddr)],
        queue_max: usize,
        timeout: Duration,
        connect_timeout: Duration,
        stats: Arc<[ShardStats]>,
        shard: usize,
    ) -> Replicator {
        Replicator {
            peers: RefCell::new(
                peers
                    .iter()
                    .map(|(address, socket)| Peer::new(address, *socket))
                    .collect(),
            ),
            queue_max: queue_max.max(1),
            timeout,
            connect_timeout: connect_timeout.min(timeout),
            stats,
            shard,
            scratch: RefCell::new(Vec::with_capacity(1024)),
        }
    }

    fn stats(&self) -> &ShardStats {
        &self.stats[self.shard]
    }

    /// A new peer list (a cluster reload), in the new cluster's peer order.
    /// A peer that stays keeps its queue and connection; a peer that goes
    /// is retired: its sender delivers what is queued, then stops.
    pub fn set_peers(&self, peers: &[(String, SocketAddr)]) {
        let mut current = self.peers.borrow_mut();
        let next: Vec<Rc<Peer>> = peers
            .iter()
            .map(|(address, socket)| {
                match current
                    .iter()
                    .find(|p| p.address == *address && p.socket == *socket)
                {
                    Some(p) => p.clone(),
                    None => Peer::new(address, *socket),
                }
            })
            .collect();
        for old in current.iter() {
            if !next.iter().any(|p| Rc::ptr_eq(p, old)) {
                old.retired.set(true);
                old.wake.notify();
            }
        }
        *current = next;
    }

    /// Queue a replication `PUT /timers/<id>` to `peer`. Never waits: a
    /// full queue drops the message (counted).
    pub fn send(&self, peer: usize, id: TimerId, body: &Body<'_>) {
        let peers = self.peers.borrow();
        let Some(p) = peers.get(peer) else {
            // Not a peer of the current view (a reload raced the caller).
            ShardStats::add(&self.stats().replication_dropped, 1);
            return;
        };
        if p.queued.get() >= self.queue_max {
            ShardStats::add(&self.stats().replication_dropped, 1);
            return;
        }
        ShardStats::add(&self.stats().replication_enqueued, 1);
        let mut scratch = self.scratch.borrow_mut();
        scratch.clear();
        encode_body(&mut scratch, body);
        let mut segments = p.segments.borrow_mut();
        if segments.back().is_none_or(|s| s.count >= BATCH_MAX) {
            let bytes = p
                .spare
                .borrow_mut()
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(64 * 1024));
            segments.push_back(Segment { bytes, count: 0 });
        }
        let seg = segments.back_mut().expect("just ensured");
        let out = &mut seg.bytes;
        out.extend_from_slice(b"PUT /timers/");
        out.extend_from_slice(&id.to_hex());
        let _ = write!(
            out,
            " HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            p.address,
            scratch.len()
        );
        out.extend_from_slice(&scratch);
        seg.count += 1;
        p.queued.set(p.queued.get() + 1);
        drop(segments);
        if !p.running.get() {
            p.running.set(true);
            let peer = p.clone();
            let timeout = self.timeout;
            let connect_timeout = self.connect_timeout;
            let stats = self.stats.clone();
            let shard = self.shard;
            glommio::spawn_local(async move {
                sender(peer, timeout, connect_timeout, stats, shard).await;
            })
            .detach();
        }
        p.wake.notify();
    }
}

/// Drain one peer's queue until shutdown.
async fn sender(
    peer: Rc<Peer>,
    timeout: Duration,
    connect_timeout: Duration,
    stats: Arc<[ShardStats]>,
    shard: usize,
) {
    let stats = &stats[shard];
    let mut conn: Option<TcpStream> = None;
    let mut backoff_ms = 0u64;
    let mut rbuf: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        let next = peer.segments.borrow_mut().pop_front();
        let Some(mut seg) = next else {
            if SHUTDOWN.load(Ordering::Relaxed) || peer.retired.get() {
                peer.running.set(false);
                return;
            }
            future::or(peer.wake.wait(), glommio::timer::sleep(IDLE_CHECK)).await;
            continue;
        };
        peer.queued.set(peer.queued.get() - seg.count);
        let deadline = Instant::now() + timeout;
        let outcome = future::or(
            deliver(&peer, &mut conn, &seg, &mut rbuf, connect_timeout, deadline),
            async {
                glommio::timer::sleep(timeout).await;
                Err((0, format!("no answer within {} ms", timeout.as_millis())))
            },
        )
        .await;
        match outcome {
            Ok(rejected) => {
                ShardStats::add(&stats.replication_sent, (seg.count - rejected) as u64);
                ShardStats::add(&stats.replication_failed, rejected as u64);
                backoff_ms = 0;
            }
            Err((answered, e)) => {
                conn = None;
                ShardStats::add(&stats.replication_sent, answered as u64);
                ShardStats::add(&stats.replication_failed, (seg.count - answered) as u64);
                tracing::debug!(target: "chronos::replication", "to {}: {} messages lost: {e}", peer.address, seg.count - answered);
                backoff_ms = (backoff_ms * 2).clamp(BACKOFF_MS_MIN, BACKOFF_MS_MAX);
            }
        }
        seg.bytes.clear();
        seg.count = 0;
        {
            let mut spare = peer.spare.borrow_mut();
            if spare.len() < SPARE_SEGMENTS_MAX && seg.bytes.capacity() <= 1 << 20 {
                spare.push(seg.bytes);
            }
        }
        if backoff_ms > 0 {
            glommio::timer::sleep(Duration::from_millis(backoff_ms)).await;
        }
    }
}

/// Send one segment and read its answers. Ok: how many were rejected (non-2xx).
/// Err: how many were answered 2xx before the failure, and why.
async fn deliver(
    peer: &Peer,
    conn: &mut Option<TcpStream>,
    seg: &Segment,
    rbuf: &mut Vec<u8>,
    connect_timeout: Duration,
    deadline: Instant,
) -> Result<usize, (usize, String)> {
    // A kept connection may have been closed by the peer while idle: when
    // nothing at all comes back on it, retry once on a fresh one.
    for attempt in 0..2 {
        let reused = conn.is_some();
        if conn.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let limit = connect_timeout.min(left).max(Duration::from_millis(1));
            let stream = TcpStream::connect_timeout(peer.socket, limit)
                .await
                .map_err(|e| (0, format!("connect: {e}")))?;
            let _ = stream.set_nodelay(true);
            *conn = Some(stream);
        }
        let stream = conn.as_mut().expect("connected above");
        rbuf.clear();
        let result = async {
            stream
                .write_all(&seg.bytes)
                .await
                .map_err(|e| (0, format!("send: {e}")))?;
            read_answers(stream, seg.count, rbuf).await
        }
        .await;
        match result {
            Err((0, e)) if reused && attempt == 0 && rbuf.is_empty() => {
                tracing::trace!(target: "chronos::replication", "stale connection to {}: {e}", peer.address);
                *conn = None;
                continue;
            }
            other => return other,
        }
    }
    unreachable!("the loop returns on its second attempt")
}

/// Read `count` pipelined responses. Ok: rejected count.
async fn read_answers(
    stream: &mut TcpStream,
    count: usize,
    rbuf: &mut Vec<u8>,
) -> Result<usize, (usize, String)> {
    let mut pos = 0usize;
    let mut ok = 0usize;
    let mut rejected = 0usize;
    let mut chunk = [0u8; 16 * 1024];
    while ok + rejected < count {
        // Parse what is buffered.
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&rbuf[pos..]) {
            Ok(httparse::Status::Complete(head)) => {
                let mut len = 0usize;
                for h in resp.headers.iter() {
                    if h.name.eq_ignore_ascii_case("content-length") {
                        len = std::str::from_utf8(h.value)
                            .ok()
                            .and_then(|s| s.trim().parse().ok())
                            .ok_or((ok, "bad Content-Length from peer".to_string()))?;
                    }
                }
                if rbuf.len() - pos >= head + len {
                    let status = resp.code.unwrap_or(0);
                    if (200..300).contains(&status) {
                        ok += 1;
                    } else {
                        rejected += 1;
                    }
                    pos += head + len;
                    continue;
                }
            }
            Ok(httparse::Status::Partial) => {
                if rbuf.len() - pos > RESPONSE_HEAD_MAX {
                    return Err((ok, "response head too large".into()));
                }
            }
            Err(e) => return Err((ok, format!("malformed response: {e}"))),
        }
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| (ok, format!("receive: {e}")))?;
        if n == 0 {
            return Err((ok, "connection closed".into()));
        }
        if pos > 0 && pos == rbuf.len() {
            rbuf.clear();
            pos = 0;
        }
        rbuf.extend_from_slice(&chunk[..n]);
    }
    Ok(rejected)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timer::spec;

    #[test]
    fn bodies_parse_back() {
        let replicas = ["10.0.0.1:7253", "10.0.0.2:7253"];
        let tags = [("CALL", 2u32), ("q\"uote", 1)];
        let body = Body {
            interval_ms: 1500,
            repeat_for_ms: 6000,
            start_time_delta_ms: -250,
            sequence: 3,
            version_us: 1_700_000_000_123_456,
            uri: "http://127.0.0.1:9/cb",
            opaque: "o\"p\\aque\n",
            view_id: 90691053180028962,
            replicas: &replicas,
            tags: &tags,
        };
        let mut out = Vec::new();
        encode_body(&mut out, &body);
        let s = spec::parse(&out).unwrap();
        assert_eq!((s.interval_ms, s.repeat_for_ms), (1500, 6000));
        assert_eq!(s.uri, "http://127.0.0.1:9/cb");
        assert_eq!(s.opaque, "o\"p\\aque\n");
        assert_eq!(s.tags.len(), 2);
        assert_eq!(s.tags[1].0, "q\"uote");
        let r = s.replication.unwrap();
        assert_eq!(r.start_time_delta_ms, -250);
        assert_eq!(r.sequence_number, 3);
        assert_eq!(r.version_us, Some(1_700_000_000_123_456));
        assert_eq!(r.cluster_view_id.as_deref(), Some("90691053180028962"));
        assert_eq!(r.replicas, vec!["10.0.0.1:7253", "10.0.0.2:7253"]);

        let tomb = Body {
            uri: "",
            opaque: "",
            tags: &[],
            interval_ms: 0,
            repeat_for_ms: 0,
            ..body
        };
        out.clear();
        encode_body(&mut out, &tomb);
        let s = spec::parse(&out).unwrap();
        assert!(s.is_tombstone());
    }
}
