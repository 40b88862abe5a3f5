//! A node's admin API from the command line: one blocking HTTP/1.1
//! request per call over a `TcpStream` (not the engine: these subcommands
//! run beside a node, not in one), with the cluster's shared secret when
//! there is one. When the node's config has `[http] tls-certificate` the
//! request goes over TLS (the node's listener speaks nothing else), with
//! the certificate verified against `[cluster] tls-ca-file` or the
//! system's store: the secret never crosses in clear to a TLS node.

use chronos::config::{Config, Secret};
use chronos::http::tls;
use rustls::pki_types::ServerName;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How long a connect, and then the whole answer, may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of an answer read: `GET /cluster` is a few KiB even with
/// hundreds of members; a node that sends more is not one.
const ANSWER_BYTES_MAX: u64 = 4 << 20;

/// A node's admin API: its address, and the `Authorization` value to send
/// (`Bearer <secret>`) when the cluster has a shared secret.
pub struct Admin {
    pub address: SocketAddr,
    pub authorization: Option<String>,
    /// Set when the node's listener speaks TLS.
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Admin {
    /// The node at `address`, with the secret of `config` (or
    /// `$CHRONOS_CONFIG`; `$CHRONOS_CLUSTER_SHARED_SECRET` wins). `Err`: the
    /// config cannot be read (a usage error).
    pub fn new(address: SocketAddr, config: Option<&str>) -> Result<Admin, String> {
        let from_env = std::env::var("CHRONOS_CONFIG").ok();
        let (secret, tls) = settings_of(config.or(from_env.as_deref()))?;
        Ok(Admin {
            address,
            authorization: secret.map(|s| s.bearer()),
            tls,
        })
    }

    /// One request with `Connection: close`; `(status, body)`. `Err` says
    /// why the node could not be asked, naming its address.
    pub fn request(&self, method: &str, path: &str) -> Result<(u16, String), String> {
        let address = self.address;
        let failed = |e: std::io::Error| format!("{address}: {e}");
        let stream =
            std::net::TcpStream::connect_timeout(&address, REQUEST_TIMEOUT).map_err(failed)?;
        let _ = stream.set_read_timeout(Some(REQUEST_TIMEOUT));
        let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
        let authorization = match &self.authorization {
            Some(value) => format!("Authorization: {value}\r\n"),
            None => String::new(),
        };
        let request = format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n{authorization}\r\n");
        let answer = match &self.tls {
            None => exchange(stream, request.as_bytes()),
            Some(config) => {
                let name = ServerName::IpAddress(address.ip().into());
                let conn = rustls::ClientConnection::new(config.clone(), name)
                    .map_err(|e| format!("{address}: TLS: {e}"))?;
                exchange(rustls::StreamOwned::new(conn, stream), request.as_bytes())
            }
        }
        .map_err(failed)?;
        let text = String::from_utf8_lossy(&answer);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("{address}: a truncated answer"))?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("{address}: no status line in the answer"))?;
        Ok((status, body.to_string()))
    }

    /// `GET /cluster`'s JSON; `Err` when the node is unreachable or does
    /// not answer 200.
    pub fn cluster(&self) -> Result<serde_json::Value, String> {
        let (status, body) = self.request("GET", "/cluster")?;
        if status != 200 {
            return Err(format!(
                "{} answered {status} to GET /cluster: {}",
                self.address,
                body.trim_end()
            ));
        }
        let report = json_of(&body)?;
        // A 200 from something that is not a chronos node (a proxy, a
        // wrong port) must not pass for an empty report.
        let is_report = report
            .as_object()
            .is_some_and(|o| o.contains_key("localhost") && o.contains_key("cluster-view-id"));
        if !is_report {
            return Err(format!(
                "{} answered GET /cluster with JSON that is not a node's report (no localhost or cluster-view-id): {}",
                self.address,
                body.chars().take(200).collect::<String>()
            ));
        }
        Ok(report)
    }
}

/// Write `request` on `stream` and read the answer to its end (at most
/// [`ANSWER_BYTES_MAX`]).
fn exchange(mut stream: impl Read + Write, request: &[u8]) -> std::io::Result<Vec<u8>> {
    stream.write_all(request)?;
    stream.flush()?;
    let mut answer = Vec::new();
    match stream.take(ANSWER_BYTES_MAX).read_to_end(&mut answer) {
        Ok(_) => Ok(answer),
        // A TLS peer that closes without close_notify after a whole
        // answer: what was read is the answer (its framing is checked
        // by the caller).
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => Ok(answer),
        Err(e) => Err(e),
    }
}

/// The `[cluster] shared-secret` of the config file at `path`, if any,
/// and, when it has `[http] tls-certificate`, the TLS client to reach the
/// node with (trusting `[cluster] tls-ca-file`, else the system's store).
fn settings_of(
    path: Option<&str>,
) -> Result<(Option<Secret>, Option<Arc<rustls::ClientConfig>>), String> {
    let config = match path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read config file {path:?}: {e}"))?;
            Some(Config::from_toml(&text).map_err(|e| format!("{path}: {e}"))?)
        }
        None => None,
    };
    // The variable wins over the file, as it does for the node.
    let secret = match std::env::var("CHRONOS_CLUSTER_SHARED_SECRET") {
        Ok(text) => Some(Secret::new(&text)),
        Err(_) => config
            .as_ref()
            .and_then(|c| c.cluster.shared_secret.clone()),
    };
    let Some(config) = config.filter(|c| c.http.tls_certificate.is_some()) else {
        return Ok((secret, None));
    };
    let ca = config.cluster.tls_ca_file.as_deref();
    let (roots, _) = tls::roots(ca.map(|path| ("[cluster] tls-ca-file", path)))?;
    Ok((secret, Some(tls::client_config(roots, None)?)))
}

pub fn json_of(body: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(body).map_err(|e| format!("an answer that is not JSON ({e}): {body}"))
}
