//! Configuration: a TOML file with the reference's key names, overridden by
//! environment variables (`CHRONOS_<SECTION>_<KEY>`, [`overrides`]),
//! overridden by command-line flags. Everything is validated before
//! anything binds; an invalid config is an error message naming the key and
//! its value, and a non-zero exit. A SIGHUP re-reads the file ([`reload`]).
//!
//! Each section's struct, defaults and own checks sit beside the module it
//! configures (`http::config`, `cluster::config`, `timer::config`,
//! `runtime::config`, `queue::config`, `storage::config`) and are
//! re-exported here; this module holds the whole [`Config`], what it
//! resolves to ([`Resolved`]), the loading (`load.rs`: the file, the
//! overrides, the resolution), the checks that need several sections
//! (`check.rs`), the TLS files' reading (`tls.rs`) and `[log]` (`log.rs`).
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
use crate::http::sign::SigningKeys;
use crate::http::tls::ListenerTls;
use serde::Deserialize;
use std::sync::Arc;

mod check;
mod load;
mod log;
pub mod overrides;
pub mod reload;
mod tls;

pub use crate::cluster::config::{ClusterConfig, Secret, SitesConfig, DEFAULT_SITE};
pub use crate::http::config::{AcceptSteering, HttpConfig};
pub use crate::queue::QueueConfig;
pub use crate::runtime::config::{RuntimeConfig, ThrottlingConfig};
pub use crate::storage::StorageConfig;
pub use crate::timer::config::{IdentityConfig, SigningSecrets, TimersConfig};
pub use log::{check_log_filter, LogConfig, LOG_LEVELS};
pub use overrides::{Applied, Cli, Override};
pub use reload::Reread;

/// What the skew rule leaves for a pop's replication to reach the next
/// replica (a loopback or LAN round trip is well under it).
pub const POP_REPLICATION_ALLOWANCE_MS: u64 = 250;

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

/// Everything resolved and checked: what the engine runs with.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub config: Config,
    pub shards: usize,
    /// The cluster at start. A reload (SIGHUP) replaces each shard's copy
    /// (`Timers::cluster` in `shard/timers.rs`), not this one.
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
    /// `[timers] callback-signing-keys` parsed; `None`: callbacks go
    /// unsigned.
    pub signing_keys: Option<Arc<SigningKeys>>,
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

#[cfg(test)]
mod tests;
