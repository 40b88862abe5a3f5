//! `[http]`: the listener's settings: where it binds, its bounds on
//! connections, heads and bodies, its timeouts, the socket driver, accept
//! steering, and the names of the TLS certificate's files (the
//! configuration loader reads them, `config::tls`, not this file). The
//! loader embeds this section and calls [`HttpConfig::bind_ip`] and
//! [`HttpConfig::check`].

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// `[http]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct HttpConfig {
    pub bind_address: String,
    pub bind_port: u16,
    /// Open connections per shard; beyond it a new connection gets `503`.
    pub connections_max: usize,
    /// Open connections per peer address and shard, so that one client
    /// cannot take every slot; beyond it `503`.
    pub connections_per_source_max: usize,
    /// Largest request line plus headers; beyond it `431`.
    pub header_bytes_max: usize,
    /// Largest request body; beyond it `413`.
    pub body_bytes_max: usize,
    /// Idle keep-alive connections are closed after this long.
    pub idle_timeout_ms: u64,
    /// From a request's first byte to its complete head; beyond it `408`
    /// and the connection closes (a slow-loris client cannot hold a slot).
    pub header_timeout_ms: u64,
    /// From a complete head to the complete body; beyond it `408`.
    pub body_timeout_ms: u64,
    /// A connection whose queued output makes no progress for this long
    /// (its client stopped reading) is closed and its slot given back.
    pub write_timeout_ms: u64,
    /// Drive the sockets with the shard's own io_uring (multishot accept
    /// and receive, batched sends; `http::ring`) rather than glommio's
    /// `TcpStream`. On by default (perf/README.md, "HTTP"); falls back to
    /// glommio's sockets if the ring cannot be set up.
    pub net_ring: bool,
    /// Which shard's listener takes a new connection (`SO_REUSEPORT`).
    pub accept_steering: AcceptSteering,
    /// PEM certificate chain (leaf first): the listener speaks TLS only.
    /// With `tls-private-key`; both or neither. Re-read on SIGHUP.
    pub tls_certificate: Option<String>,
    /// PEM private key of `tls-certificate`.
    pub tls_private_key: Option<String>,
}

/// How the kernel picks a shard's listener for a new connection.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AcceptSteering {
    /// The shard pinned to the CPU that received the connection's SYN
    /// (a classic BPF program on the `SO_REUSEPORT` group): the connection's
    /// kernel work and its shard share a core. Falls back to the hash for a
    /// CPU no shard is pinned to.
    Cpu,
    /// The kernel's hash of the connection's addresses and ports.
    Hash,
}

impl AcceptSteering {
    pub fn name(self) -> &'static str {
        match self {
            AcceptSteering::Cpu => "cpu",
            AcceptSteering::Hash => "hash",
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            bind_address: "127.0.0.1".into(),
            bind_port: 7253,
            connections_max: 8192,
            connections_per_source_max: 2048,
            header_bytes_max: 16 * 1024,
            body_bytes_max: 256 * 1024,
            idle_timeout_ms: 300_000,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            write_timeout_ms: 30_000,
            net_ring: true,
            accept_steering: AcceptSteering::Cpu,
            tls_certificate: None,
            tls_private_key: None,
        }
    }
}

impl HttpConfig {
    /// The bind address as an IP, with a usable port, or why not.
    pub fn bind_ip(&self) -> Result<IpAddr, String> {
        let ip: IpAddr = self.bind_address.parse().map_err(|_| {
            format!(
                "[http] bind-address {:?} is not an IP address",
                self.bind_address
            )
        })?;
        if self.bind_port == 0 {
            return Err("[http] bind-port = 0: must be 1..65535".into());
        }
        Ok(ip)
    }

    /// Every bound and timeout in range.
    pub fn check(&self) -> Result<(), String> {
        for (key, value) in [
            ("header-timeout-ms", self.header_timeout_ms),
            ("body-timeout-ms", self.body_timeout_ms),
            ("idle-timeout-ms", self.idle_timeout_ms),
            ("write-timeout-ms", self.write_timeout_ms),
            ("connections-max", self.connections_max as u64),
            (
                "connections-per-source-max",
                self.connections_per_source_max as u64,
            ),
            ("body-bytes-max", self.body_bytes_max as u64),
        ] {
            positive("http", key, value)?;
        }
        if self.header_bytes_max < 512 {
            return Err(format!(
                "[http] header-bytes-max = {}: must be at least 512",
                self.header_bytes_max
            ));
        }
        Ok(())
    }
}

/// `[section] key = 0: must be positive`.
fn positive(section: &str, key: &str, value: u64) -> Result<(), String> {
    if value == 0 {
        return Err(format!("[{section}] {key} = 0: must be positive"));
    }
    Ok(())
}
