//! Configuration: a TOML file with the reference's key names, overridden by
//! environment variables, overridden by command-line flags. Everything is
//! validated here, before anything binds; an invalid config is an error
//! message and a non-zero exit.
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
use serde::Deserialize;
use std::net::IpAddr;

/// What the skew rule leaves for a pop's replication to reach the next
/// replica (a loopback or LAN round trip is well under it).
pub const POP_REPLICATION_ALLOWANCE_MS: u64 = 250;

/// `[http]`
#[derive(Clone, Debug, Deserialize)]
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
}

/// How the kernel picks a shard's listener for a new connection.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
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
        }
    }
}

/// `[runtime]`
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct RuntimeConfig {
    /// Number of shards (pinned cores). `None`: every available core.
    pub cores: Option<usize>,
    /// Capacity of each cross-core channel, in messages.
    pub mesh_channel_capacity: Option<usize>,
}

/// `[cluster]`
#[derive(Clone, Debug, Deserialize)]
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
    /// gets `403`. Never logged.
    pub shared_secret: Option<Secret>,
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
        }
    }
}

/// `[identity]`, with the reference's key names: the 10 identity bits of
/// every timer ID this node hands out are `deployment_id` (3 bits) over
/// `instance_id` (7 bits).
#[derive(Clone, Debug, Default, Deserialize)]
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
#[derive(Clone, Debug, Deserialize)]
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
        }
    }
}

/// `[log]`
#[derive(Clone, Debug, Deserialize)]
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
    pub sites: SitesConfig,
    /// Present: client requests are admitted by the token bucket.
    pub throttling: Option<ThrottlingConfig>,
}

/// `[throttling]`, with the reference's key names: the token bucket that
/// admits client requests (`runtime::throttle`).
#[derive(Clone, Debug, Deserialize)]
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

/// `[sites]`, with the reference's key names: geographic redundancy.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SitesConfig {
    pub local_site: String,
    /// `"name=ip:port"` (or `"name=ip"`: the local bind port) per remote
    /// site: where that site's nodes take cross-site requests.
    pub remote_site: Vec<String>,
    /// Send timers to the remote sites (off: each site keeps its own).
    pub replicate_timers_across_sites: bool,
    /// A cross-site batch must be answered within this.
    pub site_timeout_ms: u64,
    /// A cross-site message is retried while its site is unreachable, up
    /// to this long after it was queued (then given up, counted).
    pub site_deliver_within_ms: u64,
}

impl Default for SitesConfig {
    fn default() -> Self {
        SitesConfig {
            local_site: "site1".into(),
            remote_site: Vec::new(),
            replicate_timers_across_sites: false,
            site_timeout_ms: 5000,
            site_deliver_within_ms: 300_000,
        }
    }
}

/// What the command line asked for.
#[derive(Debug, Default)]
pub struct Cli {
    pub config_path: Option<String>,
    pub overrides: Vec<(String, String)>,
    pub help: bool,
    pub version: bool,
}

pub const USAGE: &str = "\
usage: chronos [--config FILE.toml] [--bind-address IP] [--bind-port PORT]
               [--cores N] [--localhost IP:PORT] [--log-level FILTER]
       chronos --help | --version

With no file, chronos runs the embedded default: a single node on
127.0.0.1:7253, in memory, on every core.
Environment: CHRONOS_CONFIG, CHRONOS_BIND_ADDRESS, CHRONOS_BIND_PORT,
CHRONOS_CORES, CHRONOS_LOCALHOST, CHRONOS_LOG_LEVEL (flags win over env).";

/// Flags that take a value, and the env variable for each.
const OVERRIDES: &[(&str, &str)] = &[
    ("--bind-address", "CHRONOS_BIND_ADDRESS"),
    ("--bind-port", "CHRONOS_BIND_PORT"),
    ("--cores", "CHRONOS_CORES"),
    ("--localhost", "CHRONOS_LOCALHOST"),
    ("--log-level", "CHRONOS_LOG_LEVEL"),
];

impl Cli {
    /// Parse arguments (without the program name) and the environment.
    pub fn parse(args: &[String], env: impl Fn(&str) -> Option<String>) -> Result<Cli, String> {
        let mut cli = Cli {
            config_path: env("CHRONOS_CONFIG"),
            ..Cli::default()
        };
        for (flag, var) in OVERRIDES {
            if let Some(value) = env(var) {
                cli.overrides.push((flag.to_string(), value));
            }
        }
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            match flag {
                "-h" | "--help" => cli.help = true,
                "-V" | "--version" => cli.version = true,
                "-c" | "--config" => {
                    cli.config_path = Some(take_value(flag, inline, &mut it)?);
                }
                _ if OVERRIDES.iter().any(|(f, _)| *f == flag) => {
                    let value = take_value(flag, inline, &mut it)?;
                    cli.overrides.push((flag.to_string(), value));
                }
                _ => return Err(format!("unknown argument {arg:?}\n{USAGE}")),
            }
        }
        Ok(cli)
    }
}

fn take_value(
    flag: &str,
    inline: Option<String>,
    it: &mut std::slice::Iter<'_, String>,
) -> Result<String, String> {
    inline
        .or_else(|| it.next().cloned())
        .ok_or_else(|| format!("{flag} needs a value"))
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
}

impl Config {
    /// Parse TOML text.
    pub fn from_toml(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| format!("invalid config: {e}"))
    }

    /// Load from the CLI's file (or the embedded default), apply overrides,
    /// and validate.
    pub fn load(cli: &Cli, available_cores: usize) -> Result<Resolved, String> {
        let mut config = match &cli.config_path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read config file {path:?}: {e}"))?;
                Config::from_toml(&text).map_err(|e| format!("{path}: {e}"))?
            }
            None => Config::default(),
        };
        for (flag, value) in &cli.overrides {
            config.apply(flag, value)?;
        }
        config.resolve(available_cores)
    }

    fn apply(&mut self, flag: &str, value: &str) -> Result<(), String> {
        let bad = |what: &str| format!("{flag}: {value:?} is not {what}");
        match flag {
            "--bind-address" => self.http.bind_address = value.to_string(),
            "--bind-port" => self.http.bind_port = value.parse().map_err(|_| bad("a port"))?,
            "--cores" => self.runtime.cores = Some(value.parse().map_err(|_| bad("a number"))?),
            "--localhost" => self.cluster.localhost = Some(value.to_string()),
            "--log-level" => self.log.level = value.to_string(),
            _ => return Err(format!("unknown override {flag}")),
        }
        Ok(())
    }

    /// Check every value and derive what the engine needs.
    pub fn resolve(self, available_cores: usize) -> Result<Resolved, String> {
        let (ip, shards) = self.check_engine(available_cores)?;
        self.check_limits()?;
        let cluster = self.resolve_cluster(ip)?;
        let instance_id = self.resolve_instance(&cluster)?;
        self.check_skew_rule(&cluster)?;
        let st = &self.sites;
        let sites = Sites::new(
            &st.local_site,
            &st.remote_site,
            st.replicate_timers_across_sites,
            self.http.bind_port,
        )?;
        if st.site_timeout_ms == 0 || st.site_deliver_within_ms < st.site_timeout_ms {
            return Err("[sites] site_timeout_ms must be positive and site_deliver_within_ms at least as long".into());
        }
        assert!(shards >= 1 && shards <= available_cores);
        Ok(Resolved {
            config: self,
            shards,
            cluster,
            instance_id,
            sites,
        })
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
            return Err("[http] bind-port must be 1..65535".into());
        }
        let shards = self.runtime.cores.unwrap_or(available_cores);
        if shards == 0 || shards > available_cores {
            return Err(format!(
                "[runtime] cores = {shards}: must be between 1 and the {available_cores} available cores"
            ));
        }
        if let Some(cap) = self.runtime.mesh_channel_capacity {
            if cap == 0 {
                return Err("[runtime] mesh-channel-capacity must be positive".into());
            }
        }
        check_log_filter(&self.log.level)?;
        Ok((ip, shards))
    }

    /// Every bound and timeout positive (and the queue's own checks).
    fn check_limits(&self) -> Result<(), String> {
        let h = &self.http;
        if h.header_timeout_ms == 0 || h.body_timeout_ms == 0 || h.idle_timeout_ms == 0 {
            return Err(
                "[http] header-timeout-ms, body-timeout-ms and idle-timeout-ms must be positive"
                    .into(),
            );
        }
        if h.write_timeout_ms == 0 {
            return Err("[http] write-timeout-ms must be positive".into());
        }
        if h.connections_per_source_max == 0 {
            return Err("[http] connections-per-source-max must be positive".into());
        }
        if h.connections_max == 0 || h.header_bytes_max < 512 || h.body_bytes_max == 0 {
            return Err("[http] connections-max and body-bytes-max must be positive, header-bytes-max at least 512".into());
        }
        let t = &self.timers;
        if t.callback_timeout_ms == 0 || t.callback_connect_timeout_ms == 0 {
            return Err(
                "[timers] callback-timeout-ms and callback-connect-timeout-ms must be positive"
                    .into(),
            );
        }
        if t.callback_in_flight_max == 0 || t.callback_connections_per_host_max == 0 {
            return Err("[timers] callback-in-flight-max and callback-connections-per-host-max must be positive".into());
        }
        let share = t.callback_in_flight_per_target_max;
        if share == 0 || share > t.callback_in_flight_max {
            return Err(format!(
                "[timers] callback-in-flight-per-target-max = {share} must be between 1 and callback-in-flight-max ({})",
                t.callback_in_flight_max
            ));
        }
        if t.default_replication_factor == 0 || t.timers_per_shard_max == 0 {
            return Err(
                "[timers] default-replication-factor and timers-per-shard-max must be positive"
                    .into(),
            );
        }
        if t.timers_per_shard_max > crate::wheel::ENTRIES_MAX {
            return Err(format!(
                "[timers] timers-per-shard-max must be at most {}",
                crate::wheel::ENTRIES_MAX
            ));
        }
        self.check_cluster_and_throttling()?;
        if self.cluster.replication_deliver_within_ms < self.cluster.replication_timeout_ms {
            return Err(
                "[cluster] replication-deliver-within-ms must be at least replication-timeout-ms"
                    .into(),
            );
        }
        if self.cluster.replication_timeout_ms == 0
            || self.cluster.replication_queue_max == 0
            || self.cluster.replication_queue_bytes_max < 1024 * 1024
        {
            return Err(
                "[cluster] replication-timeout-ms and replication-queue-max must be positive, replication-queue-bytes-max at least 1 MiB"
                    .into(),
            );
        }
        match &self.queue {
            Some(q) => q.check(),
            None => Ok(()),
        }
    }

    /// `[throttling]`, and `[cluster]`'s secret and resync keys.
    fn check_cluster_and_throttling(&self) -> Result<(), String> {
        let th = self.throttling.clone().unwrap_or_default();
        let max_rate_ok = th.max_token_rate == 0 || th.max_token_rate >= th.min_token_rate;
        if th.target_latency == 0 || th.max_tokens == 0 || th.min_token_rate == 0 || !max_rate_ok {
            return Err("[throttling] target_latency, max_tokens and min_token_rate must be positive, max_token_rate 0 or at least min_token_rate".into());
        }
        let c = &self.cluster;
        if c.shared_secret.as_ref().is_some_and(|s| {
            !(16..=128).contains(&s.0.len()) || !s.0.bytes().all(|b| b.is_ascii_graphic())
        }) {
            return Err("[cluster] shared-secret must be 16 to 128 printable ASCII characters without spaces".into());
        }
        if !(1..=10_000).contains(&c.resync_page_timers) || c.resync_timeout_ms == 0 {
            return Err(
                "[cluster] resync-page-timers must be 1 to 10000 and resync-timeout-ms positive"
                    .into(),
            );
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
        let cli = Cli::parse(&args, |k| {
            (k == "CHRONOS_BIND_PORT").then(|| "8000".to_string())
        })
        .unwrap();
        let r = Config::load(&cli, 2).unwrap();
        assert_eq!(r.config.http.bind_port, 8001);
        assert_eq!(r.shards, 1);
        assert!(Cli::parse(&["--what".to_string()], |_| None).is_err());
    }
}
