//! `chronos`: the binary. Parses flags and config, then hands over to the
//! composition root (`node::run`), which starts the engine: one pinned
//! shard per core.
//!
//! Reading order for the hot path: `node::run` → `runtime::run` →
//! `node::shard_main` → `http::server` → `api::handle` → `shard` (create/update/delete) → `wheel` → `shard::pop`
//! → `http::client` (the callback).

use chronos::config::{Cli, Config, USAGE};
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("resync") {
        return resync_command(&args[1..]);
    }
    if let Some(name) = non_utf8_setting() {
        // Read as absent, it would start the node without it (a shared
        // secret, say): refused, naming the variable, never its value.
        let why = format!("environment variable {name} is not valid UTF-8");
        return fail("chronos", &why, 2);
    }
    let cli = match Cli::parse(&args, |k| std::env::var(k).ok()) {
        Ok(cli) => cli,
        Err(e) => return fail("chronos", &e, 2),
    };
    if cli.help {
        return print(USAGE);
    }
    if cli.version {
        return print(&format!("chronos {}", env!("CARGO_PKG_VERSION")));
    }
    let available = core_affinity::get_core_ids()
        .map(|c| c.len())
        .unwrap_or(1)
        .max(1);
    let resolved = match Config::load(&cli, available) {
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
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| level.to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .map_err(|e| format!("invalid log level {filter:?}: {e}"))?;
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
fn log_resolved(cli: &Cli, resolved: &chronos::config::Resolved) {
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

const RESYNC_USAGE: &str = "\
usage: chronos resync [--wait] [--all-views] [--address IP:PORT] [--timeout-s N]
                      [--config FILE]
       chronos resync --help

Ask a running node for a resync (POST /resync), as SIGUSR1 does.
  --address IP:PORT  the node's HTTP address (default 127.0.0.1:7253, the
                     embedded default's)
  --wait             wait until that run finished (polling GET /cluster) and
                     print what this run did: received, added, replicated,
                     tombstoned, peer-errors
  --all-views        a restore: the peers list every timer this node is a
                     replica of, whatever its cluster view (what a node runs
                     at start after a crash)
  --timeout-s N      stop waiting after N seconds (default 600)
  --config FILE      the node's config file (default $CHRONOS_CONFIG), whose
                     [cluster] shared-secret is sent
Exit status: 0 requested (with --wait: complete); 1 refused by the node,
unreachable, failed or not finished in time; 2 a bad argument or an
unreadable config.";

/// `chronos resync`'s arguments.
struct ResyncArgs {
    help: bool,
    wait: bool,
    all_views: bool,
    address: std::net::SocketAddr,
    timeout: std::time::Duration,
    config: Option<String>,
}

/// Parse `chronos resync`'s arguments (`--flag value` or `--flag=value`);
/// `config` is `CHRONOS_CONFIG`. `Err` names the bad argument.
fn parse_resync(args: &[String], config: Option<String>) -> Result<ResyncArgs, String> {
    let mut parsed = ResyncArgs {
        help: false,
        wait: false,
        all_views: false,
        address: ([127, 0, 0, 1], 7253).into(),
        timeout: std::time::Duration::from_secs(600),
        config,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag {
            "-h" | "--help" => parsed.help = true,
            "--wait" => parsed.wait = true,
            "--all-views" => parsed.all_views = true,
            "--address" => {
                let v = value()?;
                parsed.address = v
                    .parse()
                    .map_err(|_| format!("--address {v:?} is not IP:PORT (e.g. 127.0.0.1:7253)"))?;
            }
            "--timeout-s" => {
                let v = value()?;
                let s = v
                    .parse()
                    .map_err(|_| format!("--timeout-s {v:?} is not a number of seconds"))?;
                parsed.timeout = std::time::Duration::from_secs(s);
            }
            "-c" | "--config" => parsed.config = Some(value()?),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    Ok(parsed)
}

/// `chronos resync` (see `RESYNC_USAGE`): ask a running node for a resync;
/// with `--wait`, wait for that run and print its own figures. The node's
/// config file gives the `[cluster] shared-secret` to send.
fn resync_command(args: &[String]) -> ExitCode {
    const WHO: &str = "chronos resync";
    let parsed = match parse_resync(args, std::env::var("CHRONOS_CONFIG").ok()) {
        Ok(p) => p,
        Err(e) => {
            let usage = RESYNC_USAGE.lines().take(2).collect::<Vec<_>>().join("\n");
            return fail(WHO, &format!("{e}\n{usage}"), 2);
        }
    };
    if parsed.help {
        return print(RESYNC_USAGE);
    }
    let authorization = match secret_of(parsed.config.as_deref()) {
        Ok(secret) => secret.map(|s| s.bearer()),
        Err(e) => return fail(WHO, &e, 2),
    };
    let admin = Admin {
        address: parsed.address,
        authorization,
    };
    match resync_at(&admin, &parsed) {
        Ok(message) => print(&message),
        Err(e) => fail(WHO, &e, 1),
    }
}

/// The `[cluster] shared-secret` of the config file at `path`, if any.
fn secret_of(path: Option<&str>) -> Result<Option<chronos::config::Secret>, String> {
    // The variable wins over the file, as it does for the node.
    if let Ok(text) = std::env::var("CHRONOS_CLUSTER_SHARED_SECRET") {
        return Ok(Some(chronos::config::Secret::new(&text)));
    }
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
    address: std::net::SocketAddr,
    authorization: Option<String>,
}

/// `POST /resync`; with `--wait`, `GET /cluster`'s `resync` object is read
/// first, so that the run's own figures can be told from the node's
/// totals.
fn resync_at(admin: &Admin, args: &ResyncArgs) -> Result<String, String> {
    let address = admin.address;
    let before = match args.wait {
        true => Some(resync_report(admin)?),
        false => None,
    };
    let query = if args.all_views {
        "?all-views=true"
    } else {
        ""
    };
    let (status, body) = admin_request(admin, "POST", &format!("/resync{query}"))?;
    if status != 202 {
        return Err(format!("{address} answered {status}: {body}"));
    }
    let run = json_of(&body)?["run"]
        .as_u64()
        .ok_or("no run number in the answer")?;
    match before {
        Some(before) => wait_for_run(admin, run, before, args.timeout),
        None => Ok(format!("resync run {run} requested")),
    }
}

/// `GET /cluster`'s `resync` object.
fn resync_report(admin: &Admin) -> Result<serde_json::Value, String> {
    let (status, body) = admin_request(admin, "GET", "/cluster")?;
    if status != 200 {
        return Err(format!(
            "{} answered {status} to GET /cluster: {body}",
            admin.address
        ));
    }
    Ok(json_of(&body)?["resync"].take())
}

/// A count in a `resync` object.
fn count(report: &serde_json::Value, name: &str) -> u64 {
    report[name].as_u64().unwrap_or(0)
}

/// Poll `GET /cluster` until run `run` finished. `before` is the `resync`
/// object read before the request; it is replaced by later readings while
/// the run has not started, so that it ends as close to the run's start
/// as can be seen from outside.
fn wait_for_run(
    admin: &Admin,
    run: u64,
    mut before: serde_json::Value,
    timeout: std::time::Duration,
) -> Result<String, String> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let r = resync_report(admin)?;
        if count(&r, "finished-runs") >= run {
            let figures = run_figures(run, &before, &r);
            // Runs finish in order, so the state is this run's or a later one's.
            return match r["state"].as_str() {
                Some("complete") => Ok(format!("resync run {run} complete: {figures}")),
                _ => Err(format!(
                    "resync run {run} failed: {}; {figures}",
                    r["last-error"].as_str().unwrap_or("")
                )),
            };
        }
        let started = count(&r, "started-runs");
        if std::time::Instant::now() > deadline {
            // Checked on every pass: a run that never starts (an earlier
            // one still going, or the node restarted) ends the wait too.
            if started < run {
                return Err(format!(
                    "resync run {run} did not start within the timeout (started-runs {started})"
                ));
            }
            let figures = run_figures(run, &before, &r);
            return Err(format!(
                "resync run {run} did not finish within the timeout; so far: {figures}"
            ));
        }
        if started < run {
            before = r;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// What run `run` did: the node's counters now less those of `before`,
/// with a note when they may include another run's work.
fn run_figures(run: u64, before: &serde_json::Value, now: &serde_json::Value) -> String {
    let names = [
        "received",
        "added",
        "replicated",
        "tombstoned",
        "peer-errors",
    ];
    let mut text = names
        .iter()
        .map(|n| format!("{n} {}", count(now, n).saturating_sub(count(before, n))))
        .collect::<Vec<_>>()
        .join(", ");
    let previous = run - 1;
    if count(before, "started-runs") != previous || count(before, "finished-runs") != previous {
        text.push_str(&format!(
            " (run {previous} was still running when asked: these include its end)"
        ));
    }
    let finished = count(now, "finished-runs");
    if finished > run {
        text.push_str(&format!(" (they include the later runs up to {finished})"));
    }
    text
}

fn json_of(body: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(body).map_err(|e| format!("an answer that is not JSON ({e}): {body}"))
}

/// One HTTP/1.1 request with `Connection: close`, carrying the shared
/// secret if there is one; `(status, body)`.
fn admin_request(admin: &Admin, method: &str, path: &str) -> Result<(u16, String), String> {
    use std::io::Read;
    let address = admin.address;
    let timeout = std::time::Duration::from_secs(10);
    let mut stream = std::net::TcpStream::connect_timeout(&address, timeout)
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

/// The name of a `CHRONOS_*` variable whose value is not valid UTF-8.
fn non_utf8_setting() -> Option<String> {
    std::env::vars_os().find_map(|(k, v)| {
        let k = k.to_str()?;
        (k.starts_with("CHRONOS_") && v.to_str().is_none()).then(|| k.to_string())
    })
}
