//! `chronos`: the binary. Parses flags and config, then hands over to the
//! composition root (`node::run`), which starts the engine: one pinned
//! shard per core.
//!
//! Reading order for the hot path: `node::run` → `runtime::run` →
//! `node::shard_main` → `http::server` → `api::handle` → `shard` (create/update/delete) → `wheel` → `shard::pop`
//! → `http::client` (the callback).

use chronos::config::{Cli, Config, USAGE};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cli = match Cli::parse(&args, |k| std::env::var(k).ok()) {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("chronos: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if cli.version {
        println!("chronos {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let available = core_affinity::get_core_ids()
        .map(|c| c.len())
        .unwrap_or(1)
        .max(1);
    let resolved = match Config::load(&cli, available) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("chronos: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = init_logging(&resolved.config.log.level) {
        eprintln!("chronos: {e}");
        return ExitCode::from(2);
    }
    log_resolved(&cli, &resolved);
    let reload: chronos::node::Reload = Box::new(move || Config::load(&cli, available));
    match chronos::node::run(resolved, reload) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(target: "chronos::runtime", "{e}");
            eprintln!("chronos: {e}");
            ExitCode::from(1)
        }
    }
}

/// Logs to stderr at `RUST_LOG`, else at the configured level.
fn init_logging(level: &str) -> Result<(), String> {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| level.to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .map_err(|e| format!("invalid log level {filter:?}: {e}"))?;
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    Ok(())
}

/// One line with what the node will run with.
fn log_resolved(cli: &Cli, resolved: &chronos::config::Resolved) {
    let c = &resolved.config;
    tracing::info!(
        target: "chronos::config",
        config_file = cli.config_path.as_deref().unwrap_or("(embedded default)"),
        bind = %format!("{}:{}", c.http.bind_address, c.http.bind_port),
        shards = resolved.shards,
        localhost = %resolved.cluster.local_address,
        nodes = ?resolved.cluster.nodes.iter().map(|n| n.address.as_str()).collect::<Vec<_>>(),
        leaving = ?resolved.cluster.leaving.iter().map(|n| n.address.as_str()).collect::<Vec<_>>(),
        cluster_view_id = %resolved.cluster.view_id,
        instance_id = resolved.instance_id,
        callback_timeout_ms = c.timers.callback_timeout_ms,
        replica_skew_ms = c.timers.replica_skew_ms,
        connections_max = c.http.connections_max,
        header_bytes_max = c.http.header_bytes_max,
        body_bytes_max = c.http.body_bytes_max,
        idle_timeout_ms = c.http.idle_timeout_ms,
        net_ring = c.http.net_ring,
        accept_steering = c.http.accept_steering.name(),
        "resolved configuration"
    );
}
