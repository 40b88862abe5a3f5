//! The HTTP/1.1 client a shard uses for callbacks (and, later, replication).
//!
//! Per shard, per target `ip:port`: a pool of keep-alive connections, at most
//! `callback-connections-per-host-max` open at once (further requests wait
//! for one, within their total timeout). Every request has a connect timeout
//! and a total timeout. Responses are framed with `httparse`: Content-Length,
//! chunked, or close-delimited bodies, bounded in size.

use crate::config::TimersConfig;
use crate::timer::spec::parse_uri;
use futures_lite::{future, AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use glommio::sync::Semaphore;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::rc::Rc;
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
/// Buffers kept for reuse.
const SPARE_BUFFERS_MAX: usize = 256;
const READ_CHUNK: usize = 16 * 1024;

struct HostPool {
    idle: RefCell<Vec<TcpStream>>,
    permits: Semaphore,
    /// Requests waiting for a connection permit.
    waiting: Cell<usize>,
    /// When a request to this target last failed (cleared by a success).
    failed_at: Cell<Option<Instant>>,
}

/// A response: status and (when asked for) the body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

pub struct Client {
    timeout: Duration,
    connect_timeout: Duration,
    per_host_max: usize,
    in_flight: Cell<usize>,
    pools: RefCell<HashMap<SocketAddr, Rc<HostPool>>>,
    names: RefCell<HashMap<String, (SocketAddr, Instant)>>,
    spare: RefCell<Vec<Vec<u8>>>,
}

/// Keeps `in_flight` honest on every exit path.
struct InFlight<'a>(&'a Cell<usize>);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

impl Client {
    pub fn new(cfg: &TimersConfig) -> Client {
        Client {
            timeout: Duration::from_millis(cfg.callback_timeout_ms),
            connect_timeout: Duration::from_millis(
                cfg.callback_connect_timeout_ms.min(cfg.callback_timeout_ms),
            ),
            per_host_max: cfg.callback_connections_per_host_max,
            in_flight: Cell::new(0),
            pools: RefCell::new(HashMap::new()),
            names: RefCell::new(HashMap::new()),
            spare: RefCell::new(Vec::new()),
        }
    }

    /// Requests currently in flight on this shard.
    pub fn in_flight(&self) -> usize {
        self.in_flight.get()
    }

    /// Deliver one pop: `POST <uri>` with the opaque data, `X-Sequence-Number`
    /// and `Content-Type: application/octet-stream`. Ok on any 2xx.
    pub async fn callback(&self, data: &[u8], uri_len: usize, sequence: u32) -> Result<(), String> {
        let uri = std::str::from_utf8(&data[..uri_len])
            .map_err(|_| "callback URI is not UTF-8".to_string())?;
        let opaque = &data[uri_len..];
        let target = parse_uri(uri)?;
        let mut seq_buf = [0u8; 10];
        let seq = format_u32(&mut seq_buf, sequence);
        let headers: [(&str, &[u8]); 2] = [
            ("Content-Type", b"application/octet-stream"),
            ("X-Sequence-Number", seq),
        ];
        let response = self
            .request(
                target.host,
                target.port,
                target.authority,
                "POST",
                target.path,
                &headers,
                opaque,
                false,
            )
            .await?;
        if (200..300).contains(&response.status) {
            Ok(())
        } else {
            Err(format!("callback answered {}", response.status))
        }
    }

    /// One request with the total timeout applied. `want_body`: keep the body.
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
        self.in_flight.set(self.in_flight.get() + 1);
        let _guard = InFlight(&self.in_flight);
        let addr = future::or(self.resolve(host, port), async {
            glommio::timer::sleep(self.timeout).await;
            Err(format!(
                "cannot resolve {host} within {} ms",
                self.timeout.as_millis()
            ))
        })
        .await?;
        let pool = self.pool(addr);
        // Waiting for a connection is bounded in time (the timeout) and,
        // for a target that has just failed, in count (`QUEUED_PER_HOST_MAX`):
        // a dead target fails fast instead of taking every in-flight slot
        // from the others, while a busy live one is waited for.
        let failing = pool
            .failed_at
            .get()
            .is_some_and(|t| t.elapsed() < FAILING_FOR);
        if failing && pool.waiting.get() >= QUEUED_PER_HOST_MAX {
            return Err(format!(
                "{addr} is failing and {QUEUED_PER_HOST_MAX} requests already wait for it"
            ));
        }
        pool.waiting.set(pool.waiting.get() + 1);
        let permit = future::or(
            async {
                pool.permits
                    .acquire_permit(1)
                    .await
                    .map_err(|e| format!("connection pool closed: {e}"))
            },
            async {
                glommio::timer::sleep(self.timeout).await;
                Err(format!(
                    "no connection to {addr} free within {} ms",
                    self.timeout.as_millis()
                ))
            },
        )
        .await;
        pool.waiting.set(pool.waiting.get() - 1);
        let _permit = permit?;
        // The timeout of the request itself starts when it is sent (seed
        // 000: a callback must complete within 2 s of being sent).
        let deadline = Instant::now() + self.timeout;
        let work = async {
            let mut out = self.take_buffer();
            build_request(&mut out, method, path, authority, headers, body);
            // A pooled connection may have been closed by the peer: one retry
            // on a fresh connection when nothing at all came back.
            let mut attempt = 0;
            let result = loop {
                // Take the idle connection before awaiting anything: no
                // RefCell borrow may live across an await.
                let idle = pool.idle.borrow_mut().pop();
                let (mut stream, reused) = match idle {
                    Some(s) => (s, true),
                    None => match self.connect(addr, deadline).await {
                        Ok(s) => (s, false),
                        Err(e) => break Err(e),
                    },
                };
                match exchange(&mut stream, &out, method == "HEAD", want_body).await {
                    Ok((response, keep)) => {
                        if keep {
                            let mut idle = pool.idle.borrow_mut();
                            if idle.len() < IDLE_PER_HOST_MAX {
                                idle.push(stream);
                            }
                        }
                        break Ok(response);
                    }
                    Err(Exchange::NothingBack(_)) if reused && attempt == 0 => {
                        attempt += 1;
                        continue;
                    }
                    Err(Exchange::NothingBack(e)) | Err(Exchange::Failed(e)) => break Err(e),
                }
            };
            self.give_buffer(out);
            result
        };
        let timeout = async {
            glommio::timer::sleep(deadline.saturating_duration_since(Instant::now())).await;
            Err(format!("no answer within {} ms", self.timeout.as_millis()))
        };
        let result = future::or(work, timeout).await;
        pool.failed_at.set(result.is_err().then(Instant::now));
        result
    }

    async fn connect(&self, addr: SocketAddr, deadline: Instant) -> Result<TcpStream, String> {
        let left = deadline.saturating_duration_since(Instant::now());
        let limit = self.connect_timeout.min(left).max(Duration::from_millis(1));
        let stream = TcpStream::connect_timeout(addr, limit)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    fn pool(&self, addr: SocketAddr) -> Rc<HostPool> {
        let mut pools = self.pools.borrow_mut();
        if let Some(p) = pools.get(&addr) {
            return p.clone();
        }
        if pools.len() >= HOSTS_MAX {
            // Drop pools nobody is using (their idle connections close).
            pools.retain(|_, p| Rc::strong_count(p) > 1);
        }
        let pool = Rc::new(HostPool {
            idle: RefCell::new(Vec::new()),
            permits: Semaphore::new(self.per_host_max as u64),
            waiting: Cell::new(0),
            failed_at: Cell::new(None),
        });
        pools.insert(addr, pool.clone());
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
        let key = format!("{host}:{port}");
        if let Some((addr, at)) = self.names.borrow().get(&key) {
            if at.elapsed() < NAME_TTL {
                return Ok(*addr);
            }
        }
        let lookup = key.clone();
        let found = glommio::executor()
            .spawn_blocking(move || lookup.to_socket_addrs().map(|mut it| it.next()))
            .await
            .map_err(|e| format!("cannot resolve {host}: {e}"))?
            .ok_or_else(|| format!("{host} has no address"))?;
        let mut names = self.names.borrow_mut();
        if names.len() >= NAMES_MAX {
            names.clear();
        }
        names.insert(key, (found, Instant::now()));
        Ok(found)
    }

    fn take_buffer(&self) -> Vec<u8> {
        self.spare
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(1024))
    }

    fn give_buffer(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut spare = self.spare.borrow_mut();
        if spare.len() < SPARE_BUFFERS_MAX && buf.capacity() <= 64 * 1024 {
            spare.push(buf);
        }
    }
}

fn build_request(
    out: &mut Vec<u8>,
    method: &str,
    path: &str,
    authority: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
) {
    let _ = write!(out, "{method} {path} HTTP/1.1\r\nHost: {authority}\r\n");
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

/// Send one request and read its response. Returns the response and whether
/// the connection can be reused.
async fn exchange(
    stream: &mut TcpStream,
    request: &[u8],
    head_only: bool,
    want_body: bool,
) -> Result<(Response, bool), Exchange> {
    stream
        .write_all(request)
        .await
        .map_err(|e| Exchange::NothingBack(format!("send: {e}")))?;
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; READ_CHUNK];
    // Read the head.
    let (status, head_len, framing, mut keep) = loop {
        let n = stream.read(&mut chunk).await.map_err(|e| {
            if buf.is_empty() {
                Exchange::NothingBack(format!("receive: {e}"))
            } else {
                Exchange::Failed(format!("receive: {e}"))
            }
        })?;
        if n == 0 {
            return Err(if buf.is_empty() {
                Exchange::NothingBack("connection closed before a response".into())
            } else {
                Exchange::Failed("connection closed mid-response".into())
            });
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let status = resp.code.unwrap_or(0);
                let mut keep = resp.version == Some(1);
                let mut framing = Framing::UntilClose;
                for h in resp.headers.iter() {
                    if h.name.eq_ignore_ascii_case("content-length") {
                        let n = std::str::from_utf8(h.value)
                            .ok()
                            .and_then(|s| s.trim().parse::<usize>().ok());
                        framing = Framing::Length(n.ok_or_else(|| {
                            Exchange::Failed("bad Content-Length in response".into())
                        })?);
                    } else if h.name.eq_ignore_ascii_case("transfer-encoding")
                        && h.value
                            .windows(7)
                            .any(|w| w.eq_ignore_ascii_case(b"chunked"))
                    {
                        framing = Framing::Chunked;
                    } else if h.name.eq_ignore_ascii_case("connection") {
                        if h.value.eq_ignore_ascii_case(b"close") {
                            keep = false;
                        } else if h.value.eq_ignore_ascii_case(b"keep-alive") {
                            keep = true;
                        }
                    }
                }
                if head_only || status == 204 || status == 304 || (100..200).contains(&status) {
                    framing = Framing::Length(0);
                }
                break (status, len, framing, keep);
            }
            Ok(httparse::Status::Partial) if buf.len() <= RESPONSE_HEAD_MAX => continue,
            Ok(httparse::Status::Partial) => {
                return Err(Exchange::Failed("response head too large".into()))
            }
            Err(e) => return Err(Exchange::Failed(format!("malformed response: {e}"))),
        }
    };
    buf.drain(..head_len);
    // Read the body.
    let body = match framing {
        Framing::Length(len) => {
            if len > RESPONSE_BODY_MAX {
                return Err(Exchange::Failed("response body too large".into()));
            }
            while buf.len() < len {
                read_more(stream, &mut chunk, &mut buf).await?;
            }
            if buf.len() > len {
                keep = false; // unexpected extra bytes: do not reuse
            }
            buf.truncate(len);
            buf
        }
        Framing::Chunked => {
            let mut decoded = Vec::new();
            let mut pos = 0;
            loop {
                match decode_chunk(&buf[pos..]) {
                    ChunkStep::Data { skip, data } => {
                        let (a, b) = data;
                        if decoded.len() + (b - a) > RESPONSE_BODY_MAX {
                            return Err(Exchange::Failed("response body too large".into()));
                        }
                        decoded.extend_from_slice(&buf[pos + a..pos + b]);
                        pos += skip;
                    }
                    ChunkStep::End { skip } => {
                        if pos + skip != buf.len() {
                            keep = false;
                        }
                        break;
                    }
                    ChunkStep::More => {
                        if buf.len() - pos > RESPONSE_BODY_MAX + READ_CHUNK {
                            return Err(Exchange::Failed("response chunk too large".into()));
                        }
                        read_more(stream, &mut chunk, &mut buf).await?;
                    }
                    ChunkStep::Bad => {
                        return Err(Exchange::Failed("malformed chunked body".into()))
                    }
                }
            }
            decoded
        }
        Framing::UntilClose => {
            keep = false;
            loop {
                let n = stream
                    .read(&mut chunk)
                    .await
                    .map_err(|e| Exchange::Failed(format!("receive: {e}")))?;
                if n == 0 {
                    break;
                }
                if buf.len() + n > RESPONSE_BODY_MAX {
                    return Err(Exchange::Failed("response body too large".into()));
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            buf
        }
    };
    let body = if want_body { body } else { Vec::new() };
    Ok((Response { status, body }, keep))
}

/// Append one read to `buf`; a closed connection mid-body is an error.
async fn read_more(
    stream: &mut TcpStream,
    chunk: &mut [u8],
    buf: &mut Vec<u8>,
) -> Result<(), Exchange> {
    let n = stream
        .read(chunk)
        .await
        .map_err(|e| Exchange::Failed(format!("receive: {e}")))?;
    if n == 0 {
        return Err(Exchange::Failed("connection closed mid-body".into()));
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

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
    let Some(size) = std::str::from_utf8(size_text)
        .ok()
        .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
    else {
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

/// Decimal digits of `v` in `buf`, without allocating.
pub fn format_u32(buf: &mut [u8; 10], mut v: u32) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
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
    }

    #[test]
    fn decimal() {
        let mut b = [0u8; 10];
        assert_eq!(format_u32(&mut b, 0), b"0");
        assert_eq!(format_u32(&mut b, 4_294_967_295), b"4294967295");
    }
}
