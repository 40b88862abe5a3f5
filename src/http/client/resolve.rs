//! Host names to addresses: IP literals as they are, names through the
//! system resolver on a blocking thread, and a cache of what was found
//! ([`NAMES_MAX`] names, each for `NAME_TTL`). Every lookup is bounded in
//! time by its caller's wait.

use super::Client;
use crate::runtime::sleep::sleep;
use futures_lite::future;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Resolved host names kept, and for how long.
pub const NAMES_MAX: usize = 1024;
const NAME_TTL: Duration = Duration::from_secs(30);

impl Client {
    /// Resolve `host`, within the timeout.
    pub(super) async fn resolve_within(&self, host: &str, port: u16) -> Result<SocketAddr, String> {
        self.resolve_for(host, port, self.timeout).await
    }

    /// Resolve `host`, within `limit`.
    pub(super) async fn resolve_for(
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
}
