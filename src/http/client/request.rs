//! Sending: a single request ([`Client::request`]: a permit, a pooled or
//! new connection, one retry when a reused one gives nothing back) and a
//! pipelined batch ([`Client::pipeline`]: written at once on one
//! connection, answered in order), each within its total timeout counted
//! from the send. Also the request's bytes (`build_request`) and the pool
//! a request belongs to.

use super::error::{Broken, RequestError};
use super::pool::PoolKey;
use super::response::{read_response, Answers, Exchange, Recv, Response};
use super::stream::Stream;
use super::Client;
use crate::runtime::sleep::sleep;
use futures_lite::future;
use std::cell::Cell;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// One request to send.
pub(super) struct Request<'a> {
    pub(super) host: &'a str,
    pub(super) port: u16,
    /// `https://`: over TLS, the certificate verified for `host`.
    pub(super) tls: bool,
    pub(super) authority: &'a str,
    pub(super) method: &'a str,
    pub(super) path: &'a str,
    pub(super) headers: &'a [(&'a str, &'a [u8])],
    pub(super) body: &'a [u8],
    pub(super) want_body: bool,
}

impl Client {
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
        let result = future::or(async { work.await.map_err(Broken::transport) }, async {
            self.expire(deadline).await.map_err(Broken::timeout)
        })
        .await;
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
            .map_err(|e| e.reason)
    }

    /// [`Client::pipeline`] to `key`'s pool; `on_wire` gets when the
    /// batch's first byte was handed to the connection (a callback lane's
    /// pop lateness). `statuses` takes each answer (a lane keeps its
    /// `Retry-After` too); the error says whether the timeout passed.
    pub(super) async fn pipeline_on(
        &self,
        key: &PoolKey,
        requests: &[u8],
        count: usize,
        timeout: Duration,
        statuses: &mut impl Answers,
        on_wire: &Cell<Option<Instant>>,
    ) -> Result<(), Broken> {
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
        let work = async { work.await.map_err(Broken::transport) };
        let expire = async {
            sleep(deadline.saturating_duration_since(Instant::now())).await;
            Err(Broken::timeout(format!(
                "no answer within {} ms",
                timeout.as_millis()
            )))
        };
        let result = future::or(work, expire).await;
        self.give_batch_buffer(received);
        assert!(statuses.len() <= count, "at most a status per request sent");
        result
    }

    async fn expire<T>(&self, deadline: Instant) -> Result<T, String> {
        sleep(deadline.saturating_duration_since(Instant::now())).await;
        Err(format!("no answer within {} ms", self.timeout.as_millis()))
    }
}

/// The pool for `r` at `addr`: by address, and for `https://` also by
/// the server name.
pub(super) fn pool_key(addr: SocketAddr, r: &Request<'_>) -> PoolKey {
    PoolKey {
        addr,
        tls: r.tls.then(|| r.host.into()),
        peer: false,
    }
}

pub(super) fn build_request(
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
    statuses: &mut impl Answers,
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
        statuses.push_answer(response.status, response.retry_after_ms);
        if !keep && statuses.len() < count {
            return Err(Exchange::Failed("peer closed mid-batch".into()));
        }
    }
    assert_eq!(statuses.len(), count, "a status per request sent");
    Ok(keep && recv.pending().is_empty())
}
