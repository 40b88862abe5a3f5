//! The binary's command line (clap): `run` (the default), `resync`,
//! `check-config` and `status`. This module owns the syntax and the help
//! texts; what a flag means (the key it sets, the environment rule) stays
//! with the library's `config` (`config::Cli`), which the node's start and
//! `check-config` both go through.
//!
//! Exit codes, for every subcommand: 0 done, 1 a runtime failure (the node
//! failed, or a node asked is unreachable or answered an error), 2 a usage
//! or configuration error.

pub mod admin;
pub mod check;
pub mod resync;
pub mod status;

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;

/// The default node the admin subcommands talk to: the embedded default's
/// listener.
pub const DEFAULT_NODE: &str = "127.0.0.1:7253";

const EXIT_CODES: &str = "\
Exit status: 0 ok; 1 a runtime failure (the node failed, or the node asked
is unreachable or answered an error); 2 a usage or configuration error.";

const RUN_AFTER: &str = "\
Configuration: the file (--config, else $CHRONOS_CONFIG, else the embedded
default: a single node on 127.0.0.1:7253, in memory, on every core), then
the environment, then these flags. Every key of the file has a variable,
CHRONOS_<SECTION>_<KEY> in upper case with dashes as underscores, e.g.
CHRONOS_TIMERS_CALLBACK_TIMEOUT_MS=1000 or CHRONOS_SITES_LOCAL_SITE=east; a
value is read as TOML (1000, true, [\"a:1\"]), else as a string. The flags
also have short variables: CHRONOS_BIND_ADDRESS, CHRONOS_BIND_PORT,
CHRONOS_CORES, CHRONOS_LOCALHOST, CHRONOS_LOG_LEVEL. An unknown CHRONOS_*
variable is a warning. Signals: SIGTERM/SIGINT drain and exit 0, SIGHUP
re-reads the file (the members and [identity]), SIGUSR1 starts a resync.
Under systemd (NOTIFY_SOCKET set) the node reports READY=1 once it serves.

Exit status: 0 stopped by a signal; 1 a runtime failure (e.g. the port is
in use); 2 a bad argument or configuration.";

/// `chronos`: a distributed, redundant timer service and Kafka delay
/// queue.
#[derive(Parser, Debug)]
#[command(
    name = "chronos",
    version,
    propagate_version = true,
    about = "A distributed, redundant timer service and Kafka delay queue.",
    long_about = "A distributed, redundant timer service and Kafka delay queue.\n\nWithout a subcommand, chronos runs a node (as `chronos run`), with the same flags.",
    args_conflicts_with_subcommands = true,
    after_help = EXIT_CODES
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `chronos --flag ...` without a subcommand: `run`'s flags.
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a node (the default: `chronos` alone runs the embedded default)
    #[command(after_help = RUN_AFTER)]
    Run(RunArgs),
    /// Ask a running node for a resync (POST /resync), as SIGUSR1 does
    #[command(after_help = resync::AFTER)]
    Resync(ResyncArgs),
    /// Check a config file as the node's start would, without starting it
    #[command(after_help = check::AFTER)]
    CheckConfig(CheckArgs),
    /// Show a running node's cluster (GET /cluster) as a table
    #[command(after_help = status::AFTER)]
    Status(StatusArgs),
}

/// The node's flags. Each sets one key of the file (the config layer's
/// `overrides::FLAGS` says which) and wins over the environment.
#[derive(Args, Debug, Default)]
pub struct RunArgs {
    /// The config file (TOML; see chronos.sample.toml) [default:
    /// $CHRONOS_CONFIG, else the embedded default]
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<String>,
    /// [http] bind-address: the IP to listen on
    #[arg(long, value_name = "IP")]
    pub bind_address: Option<String>,
    /// [http] bind-port: the port to listen on
    #[arg(long, value_name = "PORT")]
    pub bind_port: Option<String>,
    /// [runtime] cores: shards, one pinned core each [default: every core]
    #[arg(long, value_name = "N")]
    pub cores: Option<String>,
    /// [cluster] localhost: this node's address in the member list
    /// [default: bind-address:bind-port]
    #[arg(long, value_name = "IP:PORT")]
    pub localhost: Option<String>,
    /// [log] level: a level (off, error, warn, info, debug, trace) or
    /// target=level directives; RUST_LOG wins
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,
}

impl RunArgs {
    /// The flags as `--flag=value` words for `config::Cli::parse`, which
    /// owns what each means and how it ranks against the environment.
    pub fn words(&self) -> Vec<String> {
        let flags = [
            ("--config", &self.config),
            ("--bind-address", &self.bind_address),
            ("--bind-port", &self.bind_port),
            ("--cores", &self.cores),
            ("--localhost", &self.localhost),
            ("--log-level", &self.log_level),
        ];
        flags
            .iter()
            .filter_map(|(flag, value)| value.as_ref().map(|v| format!("{flag}={v}")))
            .collect()
    }
}

#[derive(Args, Debug)]
pub struct ResyncArgs {
    /// Wait until that run finished (polling GET /cluster) and print what
    /// this run did: received, added, replicated, tombstoned, peer-errors
    #[arg(long)]
    pub wait: bool,
    /// A restore: the peers list every timer this node is a replica of,
    /// whatever its cluster view (what a node runs at start after a crash)
    #[arg(long)]
    pub all_views: bool,
    /// The node's HTTP address (default 127.0.0.1:7253, the embedded
    /// default's)
    #[arg(long, value_name = "IP:PORT", default_value = DEFAULT_NODE, hide_default_value = true, value_parser = ip_port)]
    pub address: SocketAddr,
    /// Stop waiting after N seconds
    #[arg(long, value_name = "N", default_value_t = 600)]
    pub timeout_s: u64,
    /// The node's config file, whose [cluster] shared-secret is sent
    /// [default: $CHRONOS_CONFIG]
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<String>,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The config file to check
    #[arg(value_name = "FILE")]
    pub file: String,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The node to ask, HOST:PORT (a host name is resolved)
    #[arg(long, visible_alias = "address", value_name = "HOST:PORT", default_value = DEFAULT_NODE, value_parser = host_port)]
    pub node: SocketAddr,
    /// The node's config file, whose [cluster] shared-secret is sent
    /// [default: $CHRONOS_CONFIG; $CHRONOS_CLUSTER_SHARED_SECRET wins]
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<String>,
    /// Print GET /cluster's JSON as the node sent it, not the table
    #[arg(long)]
    pub json: bool,
}

/// The cores this machine offers (what `[runtime] cores` is checked
/// against).
pub fn available_cores() -> usize {
    core_affinity::get_core_ids()
        .map(|c| c.len())
        .unwrap_or(1)
        .max(1)
}

/// The log filter: `RUST_LOG` if set, else the configured level. `Err`
/// names which was refused.
pub fn log_filter(level: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| level.to_string());
    tracing_subscriber::EnvFilter::try_new(&filter)
        .map_err(|e| format!("invalid log level {filter:?}: {e}"))
}

/// An `IP:PORT` (no name resolution).
fn ip_port(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not IP:PORT (e.g. 127.0.0.1:7253)"))
}

/// A `HOST:PORT`, resolved; the first address it resolves to.
fn host_port(text: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(address) = text.parse() {
        return Ok(address);
    }
    let mut all = text
        .to_socket_addrs()
        .map_err(|e| format!("{text:?} is not HOST:PORT or does not resolve: {e}"))?;
    all.next()
        .ok_or_else(|| format!("{text:?} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_without_a_subcommand_are_runs() {
        let cli = Cli::try_parse_from(["chronos", "--bind-port", "7000", "-c", "f.toml"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run.words(), ["--config=f.toml", "--bind-port=7000"]);
        let cli = Cli::try_parse_from(["chronos", "run", "--cores=1"]).unwrap();
        match cli.command {
            Some(Command::Run(run)) => assert_eq!(run.words(), ["--cores=1"]),
            other => panic!("{other:?}"),
        }
        // A node's flag before a subcommand is ambiguous: refused.
        assert!(Cli::try_parse_from(["chronos", "--cores=1", "status"]).is_err());
    }
}
