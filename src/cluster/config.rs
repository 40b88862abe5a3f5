//! `[cluster]` and `[sites]`: the members, replication's and resync's
//! bounds, the shared secret ([`Secret`]) and the names of the peers' TLS
//! files (the configuration loader reads them, `config::tls`); the local
//! site and the remote ones (GR). The loader embeds both sections and calls
//! [`ClusterConfig::check`], [`ClusterConfig::resolve`] and
//! [`SitesConfig::resolve`] with the listener's address.

use super::sites::Sites;
use super::Cluster;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// `[cluster]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ClusterConfig {
    /// This node's `"ip:port"` in the lists below. Default: bind address and port.
    pub localhost: Option<String>,
    pub node: Vec<String>,
    pub joining: Vec<String>,
    pub leaving: Vec<String>,
    /// A batch of replication messages to one peer must be answered within this.
    pub replication_timeout_ms: u64,
    /// Replication messages waiting per peer and shard; beyond it they are dropped.
    pub replication_queue_max: usize,
    /// Bytes of replication requests waiting per peer and shard; beyond it
    /// they are dropped.
    pub replication_queue_bytes_max: usize,
    /// A replication message is retried until delivered, or until this
    /// long after it was queued (then given up, counted as failed).
    pub replication_deliver_within_ms: u64,
    /// Timers asked for per resync GET (`Range`); pages are also bounded
    /// in bytes by the serving node.
    pub resync_page_timers: usize,
    /// One resync request (GET page or DELETE) must be answered within this.
    pub resync_timeout_ms: u64,
    /// An unreachable node is retried (with backoff) this long before the
    /// resync reports it and moves on.
    pub resync_peer_retry_ms: u64,
    /// Resync from the other nodes at start-up (a restarted node takes
    /// back the replicas it holds).
    pub resync_at_start: bool,
    /// When set, every internal request (replication, resync, cross-site)
    /// carries it as `Authorization: Bearer <secret>`, and one without it
    /// gets `403`. Never logged (nor serialized: a reload compares it).
    #[serde(skip_serializing)]
    pub shared_secret: Option<Secret>,
    /// Speak TLS to the peers and sites (replication, resync,
    /// cross-site), verifying them against `tls-ca-file` for their
    /// configured address (IP SANs). Needs `[http] tls-certificate`.
    pub tls: bool,
    /// PEM CA certificates that sign the peers' (and sites') certificates.
    pub tls_ca_file: Option<String>,
    /// PEM certificate chain this node presents to its peers (mutual TLS);
    /// with it, internal routes need a verified client certificate.
    pub tls_client_certificate: Option<String>,
    /// PEM private key of `tls-client-certificate`.
    pub tls_client_private_key: Option<String>,
}

/// A secret that never shows in `Debug` output (logs).
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: &str) -> Secret {
        Secret(text.to_string())
    }

    /// The `Authorization` header value that carries it.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether `header` is exactly `Bearer <secret>`: compared in place
    /// (no allocation per request) and in constant time for a given secret
    /// length (every byte of `Bearer <secret>` is looked at, whatever the
    /// header holds).
    pub fn admits(&self, header: Option<&[u8]>) -> bool {
        const SCHEME: &[u8] = b"Bearer ";
        let got = header.unwrap_or(b"");
        let secret = self.0.as_bytes();
        let mut diff = (SCHEME.len() + secret.len()) ^ got.len();
        for (i, w) in SCHEME.iter().chain(secret).enumerate() {
            diff |= usize::from(w ^ got.get(i).copied().unwrap_or(0));
        }
        diff == 0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            localhost: None,
            node: Vec::new(),
            joining: Vec::new(),
            leaving: Vec::new(),
            replication_timeout_ms: 2000,
            replication_queue_max: 16_384,
            replication_queue_bytes_max: 64 * 1024 * 1024,
            replication_deliver_within_ms: 30_000,
            resync_page_timers: 1000,
            resync_timeout_ms: 10_000,
            resync_peer_retry_ms: 30_000,
            resync_at_start: true,
            shared_secret: None,
            tls: false,
            tls_ca_file: None,
            tls_client_certificate: None,
            tls_client_private_key: None,
        }
    }
}

impl ClusterConfig {
    /// Replication and resync bounds, the secret.
    pub fn check(&self) -> Result<(), String> {
        for (key, value) in [
            ("replication-timeout-ms", self.replication_timeout_ms),
            ("replication-queue-max", self.replication_queue_max as u64),
            ("resync-timeout-ms", self.resync_timeout_ms),
        ] {
            positive("cluster", key, value)?;
        }
        if self.replication_deliver_within_ms < self.replication_timeout_ms {
            return Err(format!(
                "[cluster] replication-deliver-within-ms = {}: must be at least replication-timeout-ms = {}",
                self.replication_deliver_within_ms, self.replication_timeout_ms
            ));
        }
        if self.replication_queue_bytes_max < 1024 * 1024 {
            return Err(format!(
                "[cluster] replication-queue-bytes-max = {}: must be at least 1 MiB (1048576)",
                self.replication_queue_bytes_max
            ));
        }
        if !(1..=10_000).contains(&self.resync_page_timers) {
            return Err(format!(
                "[cluster] resync-page-timers = {}: must be 1 to 10000",
                self.resync_page_timers
            ));
        }
        if self.shared_secret.as_ref().is_some_and(|s| {
            !(16..=128).contains(&s.0.len()) || !s.0.bytes().all(|b| b.is_ascii_graphic())
        }) {
            return Err("[cluster] shared-secret must be 16 to 128 printable ASCII characters without spaces".into());
        }
        Ok(())
    }

    /// The cluster this node is a member of, `ip` and `bind_port` the
    /// listener's (this node's address when `localhost` is not set).
    pub fn resolve(&self, ip: IpAddr, bind_port: u16) -> Result<Cluster, String> {
        let localhost = match &self.localhost {
            Some(l) => l.clone(),
            None if ip.is_unspecified() => return Err(
                "[cluster] localhost must be set when bind-address is unspecified (0.0.0.0 or ::)"
                    .into(),
            ),
            None => std::net::SocketAddr::new(ip, bind_port).to_string(),
        };
        let mut nodes: Vec<String> = if self.node.is_empty() {
            vec![localhost.clone()]
        } else {
            self.node.clone()
        };
        nodes.extend(self.joining.iter().cloned());
        Cluster::new(&localhost, &nodes, &self.leaving)
            .map(|c| c.with_joining(self.joining.len().min(nodes.len() - 1)))
            .map_err(|e| format!("[cluster] {e}"))
    }
}

/// `[sites]`, with the reference's key names: geographic redundancy.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SitesConfig {
    /// This site's name, as the other sites know it. Required in a
    /// `[sites]` section; without the section the node's site is `site1`.
    pub local_site: Option<String>,
    /// `"name=host:port"` (or `"name=host"`: the local bind port) per
    /// remote site, the host an IP address or a DNS name: where that
    /// site's nodes take cross-site requests.
    pub remote_site: Vec<String>,
    /// Send timers to the remote sites (off: each site keeps its own).
    pub replicate_timers_across_sites: bool,
    /// A cross-site batch must be answered within this.
    pub site_timeout_ms: u64,
    /// A cross-site message is retried while its site is unreachable, up
    /// to this long after it was queued (then given up, counted).
    pub site_deliver_within_ms: u64,
    /// Whether the file (or a `CHRONOS_SITES_*` variable) has a `[sites]`
    /// section: `true` when deserialized, `false` in the default.
    #[serde(skip, default = "section_given")]
    pub given: bool,
}

/// The name of the node's site without a `[sites]` section.
pub const DEFAULT_SITE: &str = "site1";

fn section_given() -> bool {
    true
}

impl Default for SitesConfig {
    fn default() -> Self {
        SitesConfig {
            local_site: None,
            given: false,
            remote_site: Vec::new(),
            replicate_timers_across_sites: false,
            site_timeout_ms: 5000,
            site_deliver_within_ms: 300_000,
        }
    }
}

impl SitesConfig {
    /// This site and the remote ones: a section must name this site.
    /// `bind_port`: a remote site's port where its entry gives none.
    pub fn resolve(&self, bind_port: u16) -> Result<Sites, String> {
        let local = match (&self.local_site, self.given) {
            (Some(name), _) => name.as_str(),
            (None, false) => DEFAULT_SITE,
            (None, true) => return Err("[sites] local_site is missing: a [sites] section must name this site (local_site = \"east\"), the name the other sites know it by in their remote_site".into()),
        };
        positive("sites", "site_timeout_ms", self.site_timeout_ms)?;
        if self.site_deliver_within_ms < self.site_timeout_ms {
            return Err(format!(
                "[sites] site_deliver_within_ms = {} must be at least site_timeout_ms = {}",
                self.site_deliver_within_ms, self.site_timeout_ms
            ));
        }
        Sites::new(
            local,
            &self.remote_site,
            self.replicate_timers_across_sites,
            bind_port,
        )
    }
}

/// `[section] key = 0: must be positive`.
fn positive(section: &str, key: &str, value: u64) -> Result<(), String> {
    if value == 0 {
        return Err(format!("[{section}] {key} = 0: must be positive"));
    }
    Ok(())
}
