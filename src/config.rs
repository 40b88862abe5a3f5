//! Configuration: a TOML file with the reference's key names, overridden by
//! environment variables (`CHRONOS_<SECTION>_<KEY>`, [`overrides`]),
//! overridden by command-line flags. Everything is validated here, before
//! anything binds; an invalid config is an error message naming the key and
//! its value, and a non-zero exit. A SIGHUP re-reads the file ([`reload`]).
//!
//! ```toml
//! [http]
//! bind-address = "127.0.0.1"
//! bind-port = 7253
//! [runtime]
//! cores = 2                  # default: every available core
//! [cluster]
//! localhost = "127.0.0.1:7253"
//! node = ["127.0.0.1:7253", "127.0.0.2:7253"]
//! joining = []
//! leaving = []
//! [timers]
//! callback-timeout-ms = 1500
//! ```

use crate::cluster::sites::Sites;
use crate::cluster::Cluster;
use crate::http::guard::Guard;
use crate::http::tls::{self, ListenerTls};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::sync::Arc;

pub mod overrides;
pub mod reload;

pub use overrides::{Applied, Cli, Override};
pub use reload::Reread;

/// What the skew rule leaves for a pop's replication to reach the next
/// replica (a loopback or LAN round trip is well under it).
pub const POP_REPLICATION_ALLOWANCE_MS: u64 = 250;

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

/// `[runtime]`
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct RuntimeConfig {
    /// Number of shards (pinned cores). `None`: every available core.
    pub cores: Option<usize>,
    /// Capacity of each cross-core channel, in messages.
    pub mesh_channel_capacity: Option<usize>,
}

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

/// `[identity]`, with the reference's key names: the 10 identity bits of
/// every timer ID this node hands out are `deployment_id` (3 bits) over
/// `instance_id` (7 bits).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdentityConfig {
    /// 0..=127. Default: derived from the member list, distinct for every
    /// member (`Cluster::member_instances`). Set it only to pin a value; one
    /// that another member derives is refused.
    pub instance_id: Option<u8>,
    /// 0..=7: tells deployments (sites) apart; default 0.
    pub deployment_id: u8,
}

/// `[timers]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct TimersConfig {
    /// Total time a callback may take (connect, send, response), counted
    /// from the send.
    pub callback_timeout_ms: u64,
    /// Longest a pop that has a later replica waits for a connection to its
    /// target; past it the pop is left to that replica. The last replica
    /// waits as long as it takes (late, not failed).
    pub callback_wait_ms: u64,
    /// Time to establish a callback connection (within the total).
    pub callback_connect_timeout_ms: u64,
    /// Callbacks in flight per shard; beyond it due pops wait in the wheel
    /// (late, not lost).
    pub callback_in_flight_max: usize,
    /// Callbacks in flight per shard to one target (`host:port`) once three
    /// quarters of `callback-in-flight-max` are taken: a slow or hanging
    /// target cannot take the last quarter, and its further pops wait (or,
    /// `callback-wait-ms` late, go to the next replica) while other
    /// targets' pops go out on time.
    pub callback_in_flight_per_target_max: usize,
    /// Open connections per callback target (`host:port`) per shard.
    pub callback_connections_per_host_max: usize,
    /// How much later each backup replica pops than the one before it.
    pub replica_skew_ms: u64,
    /// Replication factor when a request does not give one.
    pub default_replication_factor: u8,
    /// Pending timers per shard; beyond it creation gets `503`.
    pub timers_per_shard_max: usize,
    /// PEM CA certificates that `https://` callback targets are verified
    /// against (instead of the system's store).
    pub callback_ca_file: Option<String>,
    /// Which hosts callbacks may reach (`http::guard`): CIDRs and host
    /// suffixes, `!` to deny, the first match deciding. `None`: every
    /// host, and no resolution at create time. Reloaded by SIGHUP.
    pub callback_allow: Option<Vec<String>>,
}

impl Default for TimersConfig {
    fn default() -> Self {
        TimersConfig {
            callback_timeout_ms: 1500,
            callback_wait_ms: 250,
            callback_connect_timeout_ms: 500,
            callback_in_flight_max: 4096,
            callback_in_flight_per_target_max: 512,
            callback_connections_per_host_max: 64,
            replica_skew_ms: 2000,
            default_replication_factor: 2,
            timers_per_shard_max: 8_000_000,
            callback_ca_file: None,
            callback_allow: None,
        }
    }
}

/// `[log]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct LogConfig {
    /// A `tracing` filter, e.g. `info` or `chronos=debug`. `RUST_LOG` wins.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
        }
    }
}

pub use crate::queue::QueueConfig;
pub use crate::storage::StorageConfig;

/// The level names a log filter directive may use.
pub const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Check `[log] level` (`--log-level`, `CHRONOS_LOG_LEVEL`): comma-separated
/// directives, each a level name or `target=level`. A bare word that is not
/// a level would be taken by the filter as a target enabled at every level,
/// so `verbose` or `warning` silenced the whole log; such a word is refused
/// unless it names a target path (`chronos::http`).
pub fn check_log_filter(filter: &str) -> Result<(), String> {
    let levels = LOG_LEVELS.join(", ");
    for directive in filter.split(',').map(str::trim) {
        let (target, level) = match directive.split_once('=') {
            Some((t, l)) => (t, Some(l)),
            None if LOG_LEVELS.contains(&directive.to_ascii_lowercase().as_str()) => continue,
            None => (directive, None),
        };
        let level_ok = level.is_none_or(|l| LOG_LEVELS.contains(&l.to_ascii_lowercase().as_str()));
        let target_ok = !target.is_empty() && (level.is_some() || target.contains("::"));
        if !level_ok || !target_ok {
            return Err(format!(
                "[log] level {filter:?}: {directive:?} is not a level ({levels}) or a target=level directive"
            ));
        }
    }
    Ok(())
}

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Config {
    pub http: HttpConfig,
    pub runtime: RuntimeConfig,
    pub cluster: ClusterConfig,
    pub identity: IdentityConfig,
    pub timers: TimersConfig,
    pub log: LogConfig,
    pub queue: Option<QueueConfig>,
    /// `[storage]`: the durable timer log (`path` turns it on).
    pub storage: StorageConfig,
    pub sites: SitesConfig,
    /// Present: client requests are admitted by the token bucket.
    pub throttling: Option<ThrottlingConfig>,
}

/// `[throttling]`, with the reference's key names: the token bucket that
/// admits client requests (`runtime::throttle`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThrottlingConfig {
    /// The latency the bucket steers to, in µs (request latency and pop
    /// lateness, smoothed).
    pub target_latency: u64,
    pub max_tokens: u64,
    pub initial_token_rate: u64,
    pub min_token_rate: u64,
    /// 0: no maximum.
    pub max_token_rate: u64,
}

impl Default for ThrottlingConfig {
    fn default() -> Self {
        ThrottlingConfig {
            target_latency: 500_000,
            max_tokens: 1000,
            initial_token_rate: 500,
            min_token_rate: 10,
            max_token_rate: 0,
        }
    }
}

impl ThrottlingConfig {
    /// Each key named with its value: every one positive but
    /// `max_token_rate` (0: no maximum, else at least `min_token_rate`).
    /// An `initial_token_rate` outside `[min_token_rate, max_token_rate]`
    /// starts at the nearer bound.
    fn check(&self) -> Result<(), String> {
        for (key, value) in [
            ("target_latency", self.target_latency),
            ("max_tokens", self.max_tokens),
            ("initial_token_rate", self.initial_token_rate),
            ("min_token_rate", self.min_token_rate),
        ] {
            positive("throttling", key, value)?;
        }
        if self.max_token_rate != 0 && self.max_token_rate < self.min_token_rate {
            return Err(format!(
                "[throttling] max_token_rate = {} is below min_token_rate = {}: set it to 0 (no maximum) or at least min_token_rate",
                self.max_token_rate, self.min_token_rate
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

/// Everything resolved and checked: what the engine runs with.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub config: Config,
    pub shards: usize,
    /// The cluster at start. A reload (SIGHUP) replaces each shard's copy
    /// (`Shard::cluster`), not this one.
    pub cluster: Cluster,
    pub instance_id: u16,
    /// `[sites]` resolved (restart to change).
    pub sites: Sites,
    /// What it was read from, for a reload.
    pub source: Source,
    /// What start-up should log at warn (unknown `CHRONOS_*` variables).
    pub warnings: Vec<String>,
    /// `[http] tls-certificate`: the listener's TLS, its files read and
    /// checked (a reload keeps this one and re-reads its files).
    pub tls: Option<Arc<ListenerTls>>,
    /// `https://` callbacks: the roots of `[timers] callback-ca-file`, else
    /// the system's (each shard takes its own copy, `tls::for_shard`).
    pub callback_tls: Option<Arc<rustls::ClientConfig>>,
    /// `[cluster] tls`: how peers and sites are reached (each shard takes
    /// its own copy, `tls::for_shard`).
    pub peer_tls: Option<Arc<rustls::ClientConfig>>,
    /// `[timers] callback-allow` parsed; `None`: callbacks go anywhere.
    pub guard: Option<Arc<Guard>>,
}

/// Where a configuration was read from: the file, and the overrides as
/// they were applied at start (a reload re-reads the file, not the
/// environment or the flags). Its `Debug` shows no value (the table holds
/// the shared secret).
#[derive(Clone, Default)]
pub struct Source {
    pub config_path: Option<String>,
    pub applied: Vec<Applied>,
    /// The file's table with the overrides applied, as at start.
    pub table: toml::Table,
    /// The cores there were at start.
    pub available_cores: usize,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("config_path", &self.config_path)
            .field("applied", &self.applied)
            .field("available_cores", &self.available_cores)
            .finish_non_exhaustive()
    }
}

impl Source {
    /// The file's text (`""`: the embedded default).
    fn text(&self) -> Result<String, String> {
        match &self.config_path {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read config file {path:?}: {e}")),
            None => Ok(String::new()),
        }
    }

    /// Where errors in the file are: its path.
    fn name(&self) -> &str {
        self.config_path.as_deref().unwrap_or("(embedded default)")
    }
}

impl Config {
    /// Parse TOML text.
    pub fn from_toml(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| format!("invalid config: {e}"))
    }

    /// Load from the CLI's file (or the embedded default), apply the
    /// environment's and the flags' overrides, and validate. An error
    /// names the key and the value, and the variable or flag that set it.
    pub fn load(cli: &Cli, available_cores: usize) -> Result<Resolved, String> {
        let mut source = Source {
            config_path: cli.config_path.clone(),
            available_cores,
            ..Source::default()
        };
        let text = source.text()?;
        let name = source.name().to_string();
        // The file alone first: its errors point at its lines.
        let mut config = Config::from_toml(&text).map_err(|e| format!("{name}: {e}"))?;
        let mut warnings = cli.warnings.clone();
        if !cli.overrides.is_empty() {
            let mut table: toml::Table =
                toml::from_str(&text).map_err(|e| format!("{name}: {e}"))?;
            let (applied, unknown) = overrides::apply(&mut table, &cli.overrides)?;
            config = Config::deserialize(toml::Value::Table(table.clone()))
                .map_err(|e| format!("invalid config: {}", e.to_string().trim_end()))?;
            (source.applied, source.table) = (applied, table);
            warnings.extend(unknown);
        } else {
            source.table = toml::from_str(&text).map_err(|e| format!("{name}: {e}"))?;
        }
        let mut resolved = config
            .resolve(available_cores)
            .map_err(|e| overrides::annotate(e, &source.applied))?;
        warnings.append(&mut resolved.warnings);
        (resolved.source, resolved.warnings) = (source, warnings);
        Ok(resolved)
    }

    /// `[cluster] tls`: the peers' client configuration, and with mutual
    /// TLS the roots the listener verifies peers' certificates against.
    /// Refused: TLS to peers while the listener is plain (the peers would
    /// send the secret and the timers in clear), or half a setting.
    #[allow(clippy::type_complexity)]
    fn load_cluster_tls(
        &self,
    ) -> Result<
        (
            Option<Arc<rustls::ClientConfig>>,
            Option<rustls::RootCertStore>,
        ),
        String,
    > {
        let c = &self.cluster;
        let identity = match (&c.tls_client_certificate, &c.tls_client_private_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            _ => return Err("[cluster] tls-client-certificate and tls-client-private-key: set both (mutual TLS) or neither".into()),
        };
        if !c.tls {
            if c.tls_ca_file.is_some() || identity.is_some() {
                return Err("[cluster] tls-ca-file and tls-client-certificate take effect only with [cluster] tls = true; set it, or remove them".into());
            }
            return Ok((None, None));
        }
        if self.http.tls_certificate.is_none() {
            return Err("[cluster] tls = true needs [http] tls-certificate and tls-private-key: the peers reach this node's listener, which must speak TLS too (the shared secret and the timers must never cross in clear)".into());
        }
        let ca = c.tls_ca_file.as_deref().ok_or(
            "[cluster] tls = true needs tls-ca-file (PEM: the CA that signs the peers' certificates)",
        )?;
        let (roots, _) = tls::roots(Some(("[cluster] tls-ca-file", ca)))?;
        let identity = match identity {
            Some((cert, key)) => Some(tls::client_identity(
                ("[cluster] tls-client-certificate", cert),
                ("[cluster] tls-client-private-key", key),
            )?),
            None => None,
        };
        let mutual = identity.is_some();
        let client = tls::client_config(roots.clone(), identity)?;
        Ok((Some(client), mutual.then_some(roots)))
    }

    /// Check every value and derive what the engine needs, reading the
    /// TLS files (a bad path or PEM is an error naming the key and file).
    pub fn resolve(self, available_cores: usize) -> Result<Resolved, String> {
        let (peer_tls, client_roots) = self.load_cluster_tls()?;
        let tls = self.load_tls(client_roots)?;
        let ca = self.timers.callback_ca_file.as_deref();
        let (roots, warning) = tls::roots(ca.map(|p| ("[timers] callback-ca-file", p)))?;
        let callback_tls = tls::client_config(roots, None)?;
        let mut resolved = self.resolve_with(available_cores, None)?;
        resolved.tls = tls;
        resolved.callback_tls = Some(callback_tls);
        resolved.peer_tls = peer_tls;
        resolved.warnings.extend(warning);
        Ok(resolved)
    }

    /// `[http] tls-certificate` and `tls-private-key`: both or neither.
    /// `client_roots`: verify the client certificates peers present.
    fn load_tls(
        &self,
        client_roots: Option<rustls::RootCertStore>,
    ) -> Result<Option<Arc<ListenerTls>>, String> {
        let h = &self.http;
        match (&h.tls_certificate, &h.tls_private_key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => ListenerTls::load(
                ("[http] tls-certificate", cert),
                ("[http] tls-private-key", key),
                client_roots,
            )
            .map(|t| Some(Arc::new(t))),
            (Some(_), None) => Err("[http] tls-certificate is set without tls-private-key: set both (TLS) or neither (plain HTTP)".into()),
            (None, Some(_)) => Err("[http] tls-private-key is set without tls-certificate: set both (TLS) or neither (plain HTTP)".into()),
        }
    }

    /// `resolve`, with `sites` already resolved (a reload keeps the ones
    /// the node started with, host names and all).
    fn resolve_with(
        self,
        available_cores: usize,
        sites: Option<Sites>,
    ) -> Result<Resolved, String> {
        let (ip, shards) = self.check_engine(available_cores)?;
        self.check_limits()?;
        let guard = self.resolve_guard()?;
        let cluster = self.resolve_cluster(ip)?;
        let instance_id = self.resolve_instance(&cluster)?;
        self.check_skew_rule(&cluster)?;
        let sites = match sites {
            Some(sites) => sites,
            None => self.resolve_sites()?,
        };
        assert!(shards >= 1 && shards <= available_cores);
        Ok(Resolved {
            config: self,
            shards,
            cluster,
            instance_id,
            sites,
            source: Source::default(),
            warnings: Vec::new(),
            tls: None,
            callback_tls: None,
            peer_tls: None,
            guard,
        })
    }

    /// `[timers] callback-allow`, parsed (a bad rule is named).
    fn resolve_guard(&self) -> Result<Option<Arc<Guard>>, String> {
        match &self.timers.callback_allow {
            None => Ok(None),
            Some(rules) => Guard::parse(rules).map(|g| Some(Arc::new(g))),
        }
    }

    /// `[sites]`: a section must name this site.
    fn resolve_sites(&self) -> Result<Sites, String> {
        let st = &self.sites;
        let local = match (&st.local_site, st.given) {
            (Some(name), _) => name.as_str(),
            (None, false) => DEFAULT_SITE,
            (None, true) => return Err("[sites] local_site is missing: a [sites] section must name this site (local_site = \"east\"), the name the other sites know it by in their remote_site".into()),
        };
        positive("sites", "site_timeout_ms", st.site_timeout_ms)?;
        if st.site_deliver_within_ms < st.site_timeout_ms {
            return Err(format!(
                "[sites] site_deliver_within_ms = {} must be at least site_timeout_ms = {}",
                st.site_deliver_within_ms, st.site_timeout_ms
            ));
        }
        Sites::new(
            local,
            &st.remote_site,
            st.replicate_timers_across_sites,
            self.http.bind_port,
        )
    }

    /// The bind IP and the shard count, or why not.
    fn check_engine(&self, available_cores: usize) -> Result<(IpAddr, usize), String> {
        let ip: IpAddr = self.http.bind_address.parse().map_err(|_| {
            format!(
                "[http] bind-address {:?} is not an IP address",
                self.http.bind_address
            )
        })?;
        if self.http.bind_port == 0 {
            return Err("[http] bind-port = 0: must be 1..65535".into());
        }
        let shards = self.runtime.cores.unwrap_or(available_cores);
        if shards == 0 || shards > available_cores {
            return Err(format!(
                "[runtime] cores = {shards}: must be between 1 and the {available_cores} available cores"
            ));
        }
        if let Some(cap) = self.runtime.mesh_channel_capacity {
            positive("runtime", "mesh-channel-capacity", cap as u64)?;
        }
        check_log_filter(&self.log.level)?;
        Ok((ip, shards))
    }

    /// Every bound and timeout in range (and the queue's own checks).
    fn check_limits(&self) -> Result<(), String> {
        self.check_http()?;
        self.check_timers()?;
        self.check_cluster()?;
        if let Some(th) = &self.throttling {
            th.check()?;
        }
        self.storage.check()?;
        match &self.queue {
            Some(q) => q.check(),
            None => Ok(()),
        }
    }

    fn check_http(&self) -> Result<(), String> {
        let h = &self.http;
        for (key, value) in [
            ("header-timeout-ms", h.header_timeout_ms),
            ("body-timeout-ms", h.body_timeout_ms),
            ("idle-timeout-ms", h.idle_timeout_ms),
            ("write-timeout-ms", h.write_timeout_ms),
            ("connections-max", h.connections_max as u64),
            (
                "connections-per-source-max",
                h.connections_per_source_max as u64,
            ),
            ("body-bytes-max", h.body_bytes_max as u64),
        ] {
            positive("http", key, value)?;
        }
        if h.header_bytes_max < 512 {
            return Err(format!(
                "[http] header-bytes-max = {}: must be at least 512",
                h.header_bytes_max
            ));
        }
        Ok(())
    }

    fn check_timers(&self) -> Result<(), String> {
        let t = &self.timers;
        for (key, value) in [
            ("callback-timeout-ms", t.callback_timeout_ms),
            ("callback-connect-timeout-ms", t.callback_connect_timeout_ms),
            ("callback-in-flight-max", t.callback_in_flight_max as u64),
            (
                "callback-connections-per-host-max",
                t.callback_connections_per_host_max as u64,
            ),
            (
                "default-replication-factor",
                u64::from(t.default_replication_factor),
            ),
            ("timers-per-shard-max", t.timers_per_shard_max as u64),
        ] {
            positive("timers", key, value)?;
        }
        let share = t.callback_in_flight_per_target_max;
        if share == 0 || share > t.callback_in_flight_max {
            return Err(format!(
                "[timers] callback-in-flight-per-target-max = {share}: must be between 1 and callback-in-flight-max = {}",
                t.callback_in_flight_max
            ));
        }
        if t.timers_per_shard_max > crate::wheel::ENTRIES_MAX {
            return Err(format!(
                "[timers] timers-per-shard-max = {}: must be at most {}",
                t.timers_per_shard_max,
                crate::wheel::ENTRIES_MAX
            ));
        }
        Ok(())
    }

    /// `[cluster]`: replication and resync bounds, the secret.
    fn check_cluster(&self) -> Result<(), String> {
        let c = &self.cluster;
        for (key, value) in [
            ("replication-timeout-ms", c.replication_timeout_ms),
            ("replication-queue-max", c.replication_queue_max as u64),
            ("resync-timeout-ms", c.resync_timeout_ms),
        ] {
            positive("cluster", key, value)?;
        }
        if c.replication_deliver_within_ms < c.replication_timeout_ms {
            return Err(format!(
                "[cluster] replication-deliver-within-ms = {}: must be at least replication-timeout-ms = {}",
                c.replication_deliver_within_ms, c.replication_timeout_ms
            ));
        }
        if c.replication_queue_bytes_max < 1024 * 1024 {
            return Err(format!(
                "[cluster] replication-queue-bytes-max = {}: must be at least 1 MiB (1048576)",
                c.replication_queue_bytes_max
            ));
        }
        if !(1..=10_000).contains(&c.resync_page_timers) {
            return Err(format!(
                "[cluster] resync-page-timers = {}: must be 1 to 10000",
                c.resync_page_timers
            ));
        }
        if c.shared_secret.as_ref().is_some_and(|s| {
            !(16..=128).contains(&s.0.len()) || !s.0.bytes().all(|b| b.is_ascii_graphic())
        }) {
            return Err("[cluster] shared-secret must be 16 to 128 printable ASCII characters without spaces".into());
        }
        Ok(())
    }

    /// The skew rule (tuning.md): in a cluster, a backup must not pop while
    /// the replica before it may still call back successfully. The slowest
    /// success is the wait for a connection plus the callback timeout; the
    /// pop's replication to the backup then needs its round trip.
    fn check_skew_rule(&self, cluster: &Cluster) -> Result<(), String> {
        let t = &self.timers;
        if cluster.nodes.len() + cluster.leaving.len() < 2 {
            return Ok(());
        }
        let slowest_ms = t.callback_wait_ms + t.callback_timeout_ms + POP_REPLICATION_ALLOWANCE_MS;
        if slowest_ms > t.replica_skew_ms {
            return Err(format!(
                "[timers] replica-skew-ms {} must cover callback-wait-ms {} + callback-timeout-ms {} + {POP_REPLICATION_ALLOWANCE_MS} ms for the pop's replication = {slowest_ms} ms; otherwise a backup pops while the callback before it can still succeed (a duplicate with no failure)",
                t.replica_skew_ms, t.callback_wait_ms, t.callback_timeout_ms
            ));
        }
        Ok(())
    }

    /// The cluster this node is a member of.
    fn resolve_cluster(&self, ip: IpAddr) -> Result<Cluster, String> {
        let localhost = match &self.cluster.localhost {
            Some(l) => l.clone(),
            None if ip.is_unspecified() => return Err(
                "[cluster] localhost must be set when bind-address is unspecified (0.0.0.0 or ::)"
                    .into(),
            ),
            None => std::net::SocketAddr::new(ip, self.http.bind_port).to_string(),
        };
        let mut nodes: Vec<String> = if self.cluster.node.is_empty() {
            vec![localhost.clone()]
        } else {
            self.cluster.node.clone()
        };
        nodes.extend(self.cluster.joining.iter().cloned());
        Cluster::new(&localhost, &nodes, &self.cluster.leaving)
            .map(|c| c.with_joining(self.cluster.joining.len().min(nodes.len() - 1)))
            .map_err(|e| format!("[cluster] {e}"))
    }

    /// The 10-bit instance field of this node's timer IDs. An explicit
    /// `instance_id` that another member derives from the member list
    /// would hand out that member's IDs: refused, naming both.
    pub fn resolve_instance(&self, cluster: &Cluster) -> Result<u16, String> {
        use crate::timer::{instance_field, DEPLOYMENT_ID_MAX, NODE_INSTANCE_MAX};
        let identity = &self.identity;
        if identity.deployment_id > DEPLOYMENT_ID_MAX {
            return Err(format!(
                "[identity] deployment_id must be at most {DEPLOYMENT_ID_MAX}"
            ));
        }
        let instance = match identity.instance_id {
            None => cluster.local_instance(),
            Some(id) if id > NODE_INSTANCE_MAX => {
                return Err(format!(
                    "[identity] instance_id must be at most {NODE_INSTANCE_MAX}"
                ))
            }
            Some(id) => {
                let local = cluster.local_address.as_str();
                let clash = cluster
                    .member_instances()
                    .into_iter()
                    .find(|&(address, derived)| derived == id && address != local);
                if let Some((other, _)) = clash {
                    return Err(format!(
                        "[identity] instance_id {id} of {local} is the instance ID {other} derives from the member list: both would hand out the same timer IDs; choose another, or leave it unset on every node"
                    ));
                }
                id
            }
        };
        Ok(instance_field(identity.deployment_id, instance))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_node(identity: &str) -> Result<Resolved, String> {
        let text = format!(
            "[cluster]\nlocalhost = \"10.0.0.1:7253\"\nnode = [\"10.0.0.1:7253\", \"10.0.0.2:7253\"]\n[http]\nbind-address = \"10.0.0.1\"\n{identity}"
        );
        Config::from_toml(&text)?.resolve(1)
    }

    #[test]
    fn identity_takes_the_reference_keys_and_refuses_a_collision() {
        let derived = two_node("").unwrap();
        let peer = derived
            .cluster
            .member_instances()
            .into_iter()
            .find(|m| m.0 == "10.0.0.2:7253")
            .unwrap()
            .1;
        assert_eq!(derived.instance_id, derived.cluster.local_instance() as u16);
        let pinned = two_node(&format!(
            "[identity]\ninstance_id = {}\ndeployment_id = 5",
            (peer + 1) % 128
        ))
        .unwrap();
        assert_eq!(pinned.instance_id, 5 * 128 + ((peer as u16 + 1) % 128));
        let clash = two_node(&format!("[identity]\ninstance_id = {peer}")).unwrap_err();
        assert!(
            clash.contains("10.0.0.1:7253") && clash.contains("10.0.0.2:7253"),
            "{clash}"
        );
        for (bad, why) in [
            ("instance_id = 128", "instance_id"),
            ("deployment_id = 8", "deployment_id"),
        ] {
            let e = two_node(&format!("[identity]\n{bad}")).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn the_skew_rule_holds_by_default_and_a_config_that_breaks_it_is_refused() {
        assert!(two_node("").is_ok(), "the defaults keep the rule");
        let e = two_node("[timers]\ncallback-timeout-ms = 2000").unwrap_err();
        assert!(
            e.contains("replica-skew-ms 2000") && e.contains("2500 ms"),
            "{e}"
        );
        let wider = "[timers]\ncallback-timeout-ms = 2000\nreplica-skew-ms = 2500";
        assert!(two_node(wider).is_ok());
        // A single node has no backup to race.
        let single = Config::from_toml("[timers]\ncallback-timeout-ms = 5000").unwrap();
        assert!(single.resolve(1).is_ok());
    }

    #[test]
    fn embedded_default_is_single_node_on_7253() {
        let r = Config::default().resolve(2).unwrap();
        assert_eq!(r.shards, 2);
        assert_eq!(r.cluster.local_address, "127.0.0.1:7253");
        assert_eq!(r.cluster.nodes.len(), 1);
        assert_eq!(r.config.timers.callback_timeout_ms, 1500);
    }

    #[test]
    fn reference_key_names() {
        let c = Config::from_toml(
            r#"
            [http]
            bind-address = "127.0.0.2"
            bind-port = 9000
            [runtime]
            cores = 1
            [cluster]
            localhost = "127.0.0.2:9000"
            node = ["127.0.0.1:9000", "127.0.0.2:9000"]
            joining = ["127.0.0.3:9000"]
            leaving = []
            [timers]
            callback-timeout-ms = 500
            "#,
        )
        .unwrap();
        let r = c.resolve(2).unwrap();
        assert_eq!(r.shards, 1);
        assert_eq!(r.cluster.nodes.len(), 3);
        assert_eq!(r.cluster.local, Some(1));
        assert_eq!(r.config.timers.callback_timeout_ms, 500);
    }

    #[test]
    fn sample_config_is_valid_and_matches_defaults() {
        let text = include_str!("../chronos.sample.toml");
        let c = Config::from_toml(text).unwrap();
        let d = Config::default();
        assert_eq!(c.http.body_bytes_max, d.http.body_bytes_max);
        assert_eq!(
            c.timers.callback_connections_per_host_max,
            d.timers.callback_connections_per_host_max
        );
        assert_eq!(c.timers.timers_per_shard_max, d.timers.timers_per_shard_max);
        assert_eq!(c.http.accept_steering, d.http.accept_steering);
        assert_eq!(c.http.net_ring, d.http.net_ring);
        assert_eq!(c.http.write_timeout_ms, d.http.write_timeout_ms);
        c.resolve(2).unwrap();
    }

    #[test]
    fn a_queue_section_with_defaults_is_valid() {
        let text = "[queue]\nkafka-brokers = \"127.0.0.1:9092\"\ninput-topic = \"in\"\noutput-topic = \"out\"\npostgres-url = \"postgres://postgres@127.0.0.1:5432/test\"\n[queue.consumer]\n\"session.timeout.ms\" = 6000\n";
        let r = Config::from_toml(text).unwrap().resolve(2).unwrap();
        let q = r.config.queue.unwrap();
        assert_eq!(q.table, "chronos_messages");
        assert_eq!(
            (
                q.timing_advance_ms,
                q.hold_time_ms,
                q.poll_interval_ms,
                q.failure_detection_interval_ms
            ),
            (50, 5000, 100, 500)
        );
        assert_eq!(
            QueueConfig::property(&q.consumer["session.timeout.ms"]),
            "6000"
        );
    }

    #[test]
    fn log_filters_are_levels_or_target_directives() {
        for good in [
            "info",
            "WARN",
            "off",
            "chronos=debug",
            "warn,chronos::http=trace",
        ] {
            assert!(check_log_filter(good).is_ok(), "{good}");
        }
        for bad in ["verbose", "warning", "", "info,", "=debug", "chronos=loud"] {
            assert!(check_log_filter(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn invalid_configs_fail_clearly() {
        let table = [
            ("[http]\nbind-port = \"x\"", "bind-port"),
            ("[http]\nbogus = 1", "bogus"),
            ("[http]\naccept-steering = \"round-robin\"", "cpu"),
            ("[runtime]\ncores = 0", "cores"),
            ("[runtime]\ncores = 99", "cores"),
            ("[http]\nbind-address = \"nope\"", "bind-address"),
            ("[cluster]\nnode = [\"10.0.0.9:1\"]", "not in the cluster"),
            ("[timers]\ncallback-timeout-ms = 0", "callback-timeout-ms"),
            ("[http]\nwrite-timeout-ms = 0", "write-timeout-ms"),
            ("[log]\nlevel = \"verbose\"", "\"verbose\" is not a level"),
            ("[log]\nlevel = \"info,warning\"", "\"warning\" is not a level"),
            ("[log]\nlevel = \"chronos=loud\"", "[log] level"),
            (
                "[timers]\ncallback-in-flight-per-target-max = 5000",
                "callback-in-flight-per-target-max = 5000",
            ),
            ("[cluster]\nreplication-queue-max = 0", "replication-queue-max"),
            (
                "[queue]\nkafka-brokers = \"k:1\"\ninput-topic = \"a\"\noutput-topic = \"b\"\npostgres-url = \"postgres://u@h:5432/d\"\ntable = \"x; drop\"",
                "plain SQL identifier",
            ),
            (
                "[queue]\nkafka-brokers = \"k:1\"\ninput-topic = \"a\"\noutput-topic = \"b\"\npostgres-url = \"postgres://u@h:5432/d\"\nlook-ahead-ms = 5000",
                "look-ahead-ms",
            ),
            (
                "[queue]\nkafka-brokers = \"k:1\"\ninput-topic = \"a\"\noutput-topic = \"a\"\npostgres-url = \"postgres://u@h:5432/d\"",
                "must differ",
            ),
            (
                "[queue]\nkafka-brokers = \"k:1\"\ninput-topic = \"a\"\noutput-topic = \"b\"\npostgres-url = \"host=/var/run/postgresql\"",
                "TCP host",
            ),
            ("[queue]\nkafka-brokers = \"k:1\"", "missing field"),
        ];
        for (text, needle) in table {
            let err = Config::from_toml(text)
                .and_then(|c| c.resolve(2))
                .expect_err(text);
            assert!(err.contains(needle), "{text:?} gave {err:?}");
        }
    }

    #[test]
    fn flags_override_env_override_file() {
        let args: Vec<String> = ["--bind-port", "8001", "--cores=1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let cli = Cli::parse_from(&args, vars(&[("CHRONOS_BIND_PORT", "8000")])).unwrap();
        let r = Config::load(&cli, 2).unwrap();
        assert_eq!(r.config.http.bind_port, 8001);
        assert_eq!(r.shards, 1);
        assert!(Cli::parse_from(&["--what".to_string()], vars(&[])).is_err());
    }

    fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn load_with(list: &[(&str, &str)]) -> Result<Resolved, String> {
        Config::load(&Cli::parse_from(&[], vars(list))?, 2)
    }

    #[test]
    fn every_key_has_a_variable_by_the_rule() {
        let r = load_with(&[
            ("CHRONOS_TIMERS_CALLBACK_TIMEOUT_MS", "1000"),
            ("CHRONOS_HTTP_BIND_ADDRESS", "127.0.0.2"),
            ("CHRONOS_HTTP_NET_RING", "false"),
            (
                "CHRONOS_CLUSTER_NODE",
                "[\"127.0.0.2:7253\", \"127.0.0.3:7253\"]",
            ),
            ("CHRONOS_SITES_LOCAL_SITE", "east"),
            ("CHRONOS_THROTTLING_MAX_TOKENS", "7"),
            ("CHRONOS_IDENTITY_DEPLOYMENT_ID", "3"),
            ("CHRONOS_LOG_LEVEL", "warn"),
            ("CHRONOS_RUNTIME_CORES", "1"),
        ])
        .unwrap();
        let c = &r.config;
        assert_eq!(c.timers.callback_timeout_ms, 1000);
        assert_eq!(c.http.bind_address, "127.0.0.2");
        assert!(!c.http.net_ring);
        assert_eq!(r.cluster.nodes.len(), 2);
        assert_eq!(r.sites.local, "east");
        assert_eq!(c.throttling.as_ref().map(|t| t.max_tokens), Some(7));
        assert_eq!(c.identity.deployment_id, 3);
        assert_eq!((c.log.level.as_str(), r.shards), ("warn", 1));
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        // The queue's keys together make the section.
        let q = load_with(&[
            ("CHRONOS_QUEUE_KAFKA_BROKERS", "127.0.0.1:9092"),
            ("CHRONOS_QUEUE_INPUT_TOPIC", "123"),
            ("CHRONOS_QUEUE_OUTPUT_TOPIC", "out"),
            ("CHRONOS_QUEUE_POSTGRES_URL", "postgres://u@h:5432/d"),
        ])
        .unwrap();
        assert_eq!(q.config.queue.unwrap().input_topic, "123");
    }

    #[test]
    fn a_bad_variable_is_refused_by_its_name_and_value() {
        for (name, value, wanted) in [
            ("CHRONOS_BIND_PORT", "abc", "CHRONOS_BIND_PORT = \"abc\": [http] bind-port"),
            ("CHRONOS_HTTP_BIND_PORT", "70000", "CHRONOS_HTTP_BIND_PORT = \"70000\""),
            ("CHRONOS_HTTP_NET_RING", "maybe", "CHRONOS_HTTP_NET_RING"),
            (
                "CHRONOS_TIMERS_CALLBACK_TIMEOUT_MS",
                "0",
                "[timers] callback-timeout-ms = 0: must be positive (set by CHRONOS_TIMERS_CALLBACK_TIMEOUT_MS = 0)",
            ),
            ("CHRONOS_LOG_LEVEL", "verbose", "(set by CHRONOS_LOG_LEVEL = \"verbose\")"),
        ] {
            let e = load_with(&[(name, value)]).unwrap_err();
            assert!(e.contains(wanted) && !e.contains("--"), "{name}={value}: {e}");
        }
        let e =
            load_with(&[("CHRONOS_BIND_PORT", "1"), ("CHRONOS_HTTP_BIND_PORT", "2")]).unwrap_err();
        assert!(e.contains("both set [http] bind-port"), "{e}");
        let args = ["--bind-port".to_string(), "x".to_string()];
        let e = Config::load(&Cli::parse_from(&args, vars(&[])).unwrap(), 2).unwrap_err();
        assert!(
            e.starts_with("--bind-port = \"x\": [http] bind-port"),
            "{e}"
        );
    }

    #[test]
    fn a_secret_set_by_a_variable_never_shows() {
        let e = load_with(&[("CHRONOS_CLUSTER_SHARED_SECRET", "short-one")]).unwrap_err();
        assert!(
            e.contains("[cluster] shared-secret") && e.contains("<redacted>"),
            "{e}"
        );
        assert!(!e.contains("short-one"), "{e}");
        let secret = "a-long-enough-secret-value";
        let r = load_with(&[("CHRONOS_CLUSTER_SHARED_SECRET", secret)]).unwrap();
        assert_eq!(r.config.cluster.shared_secret, Some(Secret::new(secret)));
        let cli = Cli::parse_from(&[], vars(&[("CHRONOS_CLUSTER_SHARED_SECRET", secret)]));
        for shown in [format!("{r:?}"), format!("{cli:?}")] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }

    #[test]
    fn an_unknown_variable_is_a_warning() {
        let r = load_with(&[
            ("CHRONOS_TIMERS_CALLBACK_TIMEOUT", "5"),
            ("CHRONOS_BOGUS", "1"),
            ("CHRONOS_CONFIG_FILE", "x"),
            ("OTHER_VARIABLE", "1"),
        ])
        .unwrap();
        let w = r.warnings.join("\n");
        assert_eq!(r.warnings.len(), 3, "{w}");
        assert!(w.contains("CHRONOS_TIMERS_CALLBACK_TIMEOUT is not a setting: [timers] has no key \"callback-timeout\""), "{w}");
        assert!(
            w.contains("CHRONOS_BOGUS is not a setting: no section \"bogus\""),
            "{w}"
        );
        assert_eq!(r.config.timers.callback_timeout_ms, 1500);
    }

    #[test]
    fn validation_names_the_key_and_the_value() {
        for (text, wanted) in [
            ("[throttling]\ninitial_token_rate = 0", "[throttling] initial_token_rate = 0: must be positive"),
            ("[throttling]\nmax_tokens = 0", "[throttling] max_tokens = 0: must be positive"),
            ("[throttling]\nmin_token_rate = 20\nmax_token_rate = 10", "[throttling] max_token_rate = 10 is below min_token_rate = 20"),
            ("[timers]\ndefault-replication-factor = 0", "[timers] default-replication-factor = 0: must be positive"),
            ("[timers]\ntimers-per-shard-max = 0", "[timers] timers-per-shard-max = 0: must be positive"),
            ("[http]\nheader-bytes-max = 100", "[http] header-bytes-max = 100: must be at least 512"),
            ("[http]\nidle-timeout-ms = 0", "[http] idle-timeout-ms = 0"),
            ("[cluster]\nreplication-queue-bytes-max = 5", "[cluster] replication-queue-bytes-max = 5"),
            ("[cluster]\nresync-page-timers = 0", "[cluster] resync-page-timers = 0"),
            ("[cluster]\nreplication-deliver-within-ms = 10", "[cluster] replication-deliver-within-ms = 10: must be at least replication-timeout-ms = 2000"),
            ("[sites]\nlocal_site = \"a\"\nsite_timeout_ms = 0", "[sites] site_timeout_ms = 0"),
        ] {
            let e = Config::from_toml(text).and_then(|c| c.resolve(2)).unwrap_err();
            assert!(e.contains(wanted), "{text:?} gave {e:?}");
            // One key per message: no other key of the section is named.
            assert!(!e.contains(" and "), "{text:?} gave {e:?}");
        }
        let e = Config::from_toml("[runtime]\ncores = 9").and_then(|c| c.resolve(2));
        let e = e.unwrap_err();
        assert!(
            e.contains("[runtime] cores = 9: must be between 1 and the 2 available cores"),
            "{e}"
        );
        let ok = "[throttling]\ninitial_token_rate = 1\nmin_token_rate = 1";
        assert!(Config::from_toml(ok).unwrap().resolve(2).is_ok());
    }

    #[test]
    fn a_sites_section_must_name_the_local_site() {
        let e = Config::from_toml("[sites]\nremote_site = [\"b=10.0.0.2\"]")
            .and_then(|c| c.resolve(2))
            .unwrap_err();
        assert!(e.contains("[sites] local_site is missing"), "{e}");
        let r = Config::default().resolve(2).unwrap();
        assert_eq!(r.sites.local, DEFAULT_SITE);
        let r = Config::from_toml("[sites]\nlocal_site = \"east\"")
            .unwrap()
            .resolve(2)
            .unwrap();
        assert_eq!(r.sites.local, "east");
    }
}
