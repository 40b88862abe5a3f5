//! Getting a connection: a permit for it (bounded in time by the caller's
//! wait, and in count for a target that has just failed), an idle pooled
//! one, or a new one: TCP within the connect timeout and, for `https://`
//! and a peer under `[cluster] tls`, the TLS handshake.

use super::pool::{HostPool, PoolKey};
use super::stream::Stream;
use super::Client;
use crate::http::conn::GlommioConn;
use crate::http::permits::Permit;
use crate::http::tls::TlsConn;
use crate::runtime::sleep::sleep;
use futures_lite::future;
use glommio::net::TcpStream;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

impl Client {
    /// Wait for a connection permit: bounded in time by `wait` (`None`: the
    /// caller bounds how many wait) and, for a target that has just failed,
    /// in count (`QUEUED_PER_HOST_MAX`), so a dead target fails fast instead
    /// of taking every in-flight slot from the others, while a busy live one
    /// is waited for.
    pub(super) async fn permit<'p>(
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
    pub(super) async fn take_connection(
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
