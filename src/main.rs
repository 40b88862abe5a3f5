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
    if args.first().map(String::as_str) == Some("resync") {
        return resync_command(&args[1..]);
    }
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

/// `chronos resync [--wait] [--all-views] [--address IP:PORT] [--timeout-s N]
/// [--config FILE]`: ask a running node for a resync (`POST /resync`); with
/// `--wait`, poll `GET /cluster` until that run finished: exit 0 if it
/// completed, 1 if it failed or the wait timed out, 2 on bad flags or an
/// unreadable config. The node's config file (`--config`, else
/// `CHRONOS_CONFIG`) gives the `[cluster] shared-secret` to send.
fn resync_command(args: &[String]) -> ExitCode {
    let (mut wait, mut all_views) = (false, false);
    let mut address = "127.0.0.1:7253".to_string();
    let mut timeout_s = 600u64;
    let mut config = std::env::var("CHRONOS_CONFIG").ok();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = match flag.as_str() {
            "--wait" => {
                wait = true;
                continue;
            }
            "--all-views" => {
                all_views = true;
                continue;
            }
            "--address" | "--timeout-s" | "--config" | "-c" => it.next(),
            _ => None,
        };
        match (flag.as_str(), value) {
            ("--address", Some(v)) => address = v.clone(),
            ("--config" | "-c", Some(v)) => config = Some(v.clone()),
            ("--timeout-s", Some(v)) if v.parse::<u64>().is_ok() => {
                timeout_s = v.parse().unwrap_or(600)
            }
            _ => {
                eprintln!("chronos resync: bad argument {flag:?}; usage: chronos resync [--wait] [--all-views] [--address IP:PORT] [--timeout-s N] [--config FILE]");
                return ExitCode::from(2);
            }
        }
    }
    let authorization = match secret_of(config.as_deref()) {
        Ok(secret) => secret.map(|s| s.bearer()),
        Err(e) => {
            eprintln!("chronos resync: {e}");
            return ExitCode::from(2);
        }
    };
    let admin = Admin {
        address,
        authorization,
    };
    match resync_at(
        &admin,
        wait,
        all_views,
        std::time::Duration::from_secs(timeout_s),
    ) {
        Ok(message) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chronos resync: {e}");
            ExitCode::from(1)
        }
    }
}

/// The `[cluster] shared-secret` of the config file at `path`, if any.
fn secret_of(path: Option<&str>) -> Result<Option<chronos::config::Secret>, String> {
    let Some(path) = path else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {path:?}: {e}"))?;
    let config = Config::from_toml(&text).map_err(|e| format!("{path}: {e}"))?;
    Ok(config.cluster.shared_secret)
}

/// A node's admin API: its address, and the `Authorization` value to send
/// (`Bearer <secret>`) when the cluster has a shared secret.
struct Admin {
    address: String,
    authorization: Option<String>,
}

fn resync_at(
    admin: &Admin,
    wait: bool,
    all_views: bool,
    timeout: std::time::Duration,
) -> Result<String, String> {
    let address = &admin.address;
    let query = if all_views { "?all-views=true" } else { "" };
    let (status, body) = admin_request(admin, "POST", &format!("/resync{query}"))?;
    if status != 202 {
        return Err(format!("{address} answered {status}: {body}"));
    }
    let run = json_of(&body)?["run"]
        .as_u64()
        .ok_or("no run number in the answer")?;
    if !wait {
        return Ok(format!("resync run {run} requested"));
    }
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let (status, body) = admin_request(admin, "GET", "/cluster")?;
        let report = json_of(&body)?;
        let r = &report["resync"];
        if status == 200 && r["finished-runs"].as_u64().unwrap_or(0) >= run {
            // Runs finish in order, so the state is this run's or a later one's.
            return match r["state"].as_str() {
                Some("complete") => Ok(format!("resync run {run} complete: {r}")),
                _ => Err(format!("resync run {run} failed: {r}")),
            };
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "resync run {run} did not finish within the timeout: {r}"
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn json_of(body: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(body).map_err(|e| format!("an answer that is not JSON ({e}): {body}"))
}

/// One HTTP/1.1 request with `Connection: close`, carrying the shared
/// secret if there is one; `(status, body)`.
fn admin_request(admin: &Admin, method: &str, path: &str) -> Result<(u16, String), String> {
    use std::io::{Read, Write};
    let address = admin.address.as_str();
    let timeout = std::time::Duration::from_secs(10);
    let addr: std::net::SocketAddr = address
        .parse()
        .map_err(|_| format!("{address:?} is not IP:PORT"))?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("{address}: {e}"))?;
    let _ = stream.set_read_timeout(Some(timeout));
    let authorization = match &admin.authorization {
        Some(value) => format!("Authorization: {value}\r\n"),
        None => String::new(),
    };
    let request = format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n{authorization}\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("{address}: {e}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .map_err(|e| format!("{address}: {e}"))?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("a truncated answer")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status line")?;
    Ok((status, body.to_string()))
}
