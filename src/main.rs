//! `chronos`: the binary. Parses the command line (`cli`: `run`, the
//! default, `resync`, `check-config`, `status`), the config, then hands
//! over to the composition root (`node::run`), which starts the engine:
//! one pinned shard per core.
//!
//! Reading order for the hot path: `node::run` → `runtime::run` →
//! `node::shard_main` → `http::server` → `api::handle` → `shard` (create/update/delete) → `wheel` → `shard::pop`
//! → `http::client` (the callback).

mod cli;

use chronos::config::Config;
use clap::Parser;
use cli::{Command, RunArgs};
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let parsed = match cli::Cli::try_parse() {
        Ok(parsed) => parsed,
        Err(e) => {
            // Help and version on stdout with 0, usage errors on stderr
            // with 2 (clap's codes); a closed pipe is no reason to panic.
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    match parsed.command {
        None => run(&parsed.run),
        Some(Command::Run(args)) => run(&args),
        Some(Command::Resync(args)) => finish("chronos resync", cli::resync::command(&args)),
        Some(Command::Status(args)) => finish("chronos status", cli::status::command(&args)),
        Some(Command::CheckConfig(args)) => {
            const WHO: &str = "chronos check-config";
            if let Some(why) = non_utf8_setting() {
                return fail(WHO, &why, 2);
            }
            let warn = |w: &str| {
                let _ = writeln!(std::io::stderr(), "{WHO}: warning: {w}");
            };
            let checked = cli::check::command(&args, warn);
            finish(WHO, checked.map_err(|e| (2, e)))
        }
    }
}

/// A subcommand's end: its text on stdout and 0, or its reason on stderr
/// and its status.
fn finish(who: &str, result: Result<String, (u8, String)>) -> ExitCode {
    match result {
        Ok(text) => print(&text),
        Err((status, why)) => fail(who, &why, status),
    }
}

/// `chronos [run] [flags]`: start a node and run it until shutdown.
fn run(args: &RunArgs) -> ExitCode {
    if let Some(why) = non_utf8_setting() {
        return fail("chronos", &why, 2);
    }
    let cli = match chronos::config::Cli::parse(&args.words(), |k| std::env::var(k).ok()) {
        Ok(cli) => cli,
        Err(e) => return fail("chronos", &e, 2),
    };
    let resolved = match Config::load(&cli, cli::available_cores()) {
        Ok(r) => r,
        Err(e) => return fail("chronos", &e, 2),
    };
    if let Err(e) = init_logging(&resolved.config.log.level) {
        return fail("chronos", &e, 2);
    }
    log_resolved(&cli, &resolved);
    match chronos::node::run(resolved) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Once: in the log if it shows errors, else on stderr.
            if tracing::enabled!(target: "chronos::runtime", tracing::Level::ERROR) {
                tracing::error!(target: "chronos::runtime", "{e}");
                ExitCode::from(1)
            } else {
                fail("chronos", &e, 1)
            }
        }
    }
}

/// `text` on stdout; exit 0. A closed stdout is no reason to panic.
fn print(text: &str) -> ExitCode {
    let _ = writeln!(std::io::stdout(), "{text}");
    ExitCode::SUCCESS
}

/// `who: message` on stderr (never panicking, even on a closed pipe);
/// exit with `status`.
fn fail(who: &str, message: &str, status: u8) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "{who}: {message}");
    ExitCode::from(status)
}

/// Stderr for the log, ignoring write errors: a log line that cannot be
/// written (stderr a closed pipe, a full disk) is lost, and the node goes
/// on. `std::io::stderr` alone made the log layer report the failure with
/// `eprintln!`, which panics, and a release build aborts on a panic.
struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Logs to stderr at `RUST_LOG`, else at the configured level.
fn init_logging(level: &str) -> Result<(), String> {
    let filter = cli::log_filter(level)?;
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(|| LogWriter)
        .log_internal_errors(false)
        .init();
    Ok(())
}

/// One line with what the node will run with: never the shared secret,
/// only whether one is set.
fn log_resolved(cli: &chronos::config::Cli, resolved: &chronos::config::Resolved) {
    let c = &resolved.config;
    let sites = &resolved.sites;
    let throttling = c.throttling.as_ref();
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
        local_site = %sites.local,
        remote_site = ?remote_sites(sites),
        replicate_timers_across_sites = sites.across,
        throttling = %if throttling.is_some() { "on" } else { "off" },
        target_latency = throttling.map(|t| t.target_latency),
        max_tokens = throttling.map(|t| t.max_tokens),
        initial_token_rate = throttling.map(|t| t.initial_token_rate),
        min_token_rate = throttling.map(|t| t.min_token_rate),
        max_token_rate = throttling.map(|t| t.max_token_rate),
        shared_secret = %if c.cluster.shared_secret.is_some() { "set" } else { "unset" },
        callback_timeout_ms = c.timers.callback_timeout_ms,
        callback_allow = ?c.timers.callback_allow,
        callback_signing_keys = c.timers.callback_signing_keys.keys.len(),
        replica_skew_ms = c.timers.replica_skew_ms,
        connections_max = c.http.connections_max,
        header_bytes_max = c.http.header_bytes_max,
        body_bytes_max = c.http.body_bytes_max,
        idle_timeout_ms = c.http.idle_timeout_ms,
        net_ring = c.http.net_ring,
        tls = %if resolved.tls.is_some() { "on" } else { "off" },
        accept_steering = c.http.accept_steering.name(),
        "resolved configuration"
    );
}

/// `name=host:port` per remote site, with the address a host name
/// resolved to when it differs.
fn remote_sites(sites: &chronos::cluster::sites::Sites) -> Vec<String> {
    let one = |r: &chronos::cluster::sites::RemoteSite| {
        if r.address == r.socket.to_string() {
            format!("{}={}", r.name, r.address)
        } else {
            format!("{}={} ({})", r.name, r.address, r.socket)
        }
    };
    sites.remote.iter().map(one).collect()
}

/// Why the environment is refused: a `CHRONOS_*` variable whose value is
/// not valid UTF-8. Read as absent, it would start the node without it (a
/// shared secret, say): refused, naming the variable, never its value.
fn non_utf8_setting() -> Option<String> {
    std::env::vars_os().find_map(|(k, v)| {
        let k = k.to_str()?;
        (k.starts_with("CHRONOS_") && v.to_str().is_none())
            .then(|| format!("environment variable {k} is not valid UTF-8"))
    })
}
