//! Issue 24, "the first hour": what an operator trying Chronos from its
//! README hit, with the real binary. `chronos resync`'s help, bad
//! arguments and per-run figures (item 14), a node whose stderr is a
//! closed pipe (15), a port in use (16), and the start-up "resolved
//! configuration" line (6).

mod common;

use common::*;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `chronos` binary with no inherited configuration from the
/// environment.
fn chronos(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_chronos"));
    c.args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("CHRONOS_") || key == "RUST_LOG" {
            c.env_remove(key);
        }
    }
    c
}

fn run(args: &[&str]) -> Output {
    chronos(args).output().expect("run chronos")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn resync_help_prints_usage_and_exits_0() {
    for flag in ["--help", "-h"] {
        let out = run(&["resync", flag]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{flag}: {}", text(&out.stderr));
        // clap's usage line (issue 23), as `chronos resync --help` prints it.
        assert!(stdout.contains("Usage: chronos resync"), "{stdout}");
        for word in ["--wait", "--all-views", "--timeout-s", "--config"] {
            assert!(stdout.contains(word), "{word} missing:\n{stdout}");
        }
        // The default address is stated.
        assert!(stdout.contains("default 127.0.0.1:7253"), "{stdout}");
        assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    }
}

#[test]
fn resync_bad_arguments_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["--address", "127.0.0.3"], "127.0.0.3"),
        (&["--address", "localhost"], "localhost"),
        (&["--address"], "--address"),
        (&["--timeout-s", "soon"], "soon"),
        (&["--timeout-s"], "--timeout-s"),
        (&["--bogus"], "--bogus"),
        (&["--config"], "--config"),
        (
            &["--wait", "--config", "/nonexistent/chronos.toml"],
            "nonexistent",
        ),
    ];
    for (args, named) in cases {
        let mut all = vec!["resync"];
        all.extend_from_slice(args);
        let out = run(&all);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(named),
            "{args:?} should name {named}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
    }
}

fn cluster_json(node: &Node) -> serde_json::Value {
    let r = node.request("GET", "/cluster", "");
    assert_eq!(r.status, 200, "{}", r.text());
    serde_json::from_slice(&r.body).unwrap()
}

/// `chronos resync --wait` against `node`: its stdout.
fn resync_wait(node: &Node) -> String {
    let out = run(&["resync", "--wait", "--address", &node.addr.to_string()]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}: {stdout}{}",
        out.status,
        text(&out.stderr)
    );
    stdout
}

/// The number after `name ` in `chronos resync --wait`'s line.
fn figure(line: &str, name: &str) -> u64 {
    let at = line
        .find(&format!("{name} "))
        .unwrap_or_else(|| panic!("no {name:?} in {line:?}"));
    line[at + name.len() + 1..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {name:?} in {line:?}"))
}

/// A node on 127.0.0.`i`: cores 1, no resync at start.
fn member(i: usize, port: u16, nodes: &[usize], joining: &[usize]) -> String {
    let list = |l: &[usize]| {
        l.iter()
            .map(|k| format!("\"127.0.0.{k}:{port}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "[runtime]\ncores = 1\n[cluster]\nlocalhost = \"127.0.0.{i}:{port}\"\nnode = [{}]\njoining = [{}]\nresync-at-start = false\n",
        list(nodes),
        list(joining)
    )
}

/// Two runs against one node: the second prints what it did itself, not
/// the node's totals since it started.
#[test]
fn resync_wait_prints_this_runs_figures() {
    const TIMERS: u64 = 20;
    let port = cluster_port(2);
    let a = Node::start_at("127.0.0.1", port, &member(1, port, &[1], &[]));
    let uri = format!("http://127.0.0.1:{}/cb", free_port());
    for _ in 0..TIMERS {
        a.create(&timer_body("600", None, &uri, "x"));
    }
    let b = Node::start_at("127.0.0.2", port, &member(2, port, &[1], &[2]));
    reload_config(&a, &member(1, port, &[1], &[2]));
    let first = resync_wait(&b);
    assert!(first.contains("resync run 1 complete"), "{first}");
    assert_eq!(figure(&first, "received"), TIMERS, "{first}");
    let before = cluster_json(&b)["resync"].clone();
    let second = resync_wait(&b);
    let after = cluster_json(&b)["resync"].clone();
    assert!(second.contains("resync run 2 complete"), "{second}");
    for name in [
        "received",
        "added",
        "replicated",
        "tombstoned",
        "peer-errors",
    ] {
        let run = after[name].as_u64().unwrap() - before[name].as_u64().unwrap();
        assert_eq!(figure(&second, name), run, "{name}: {second}\n{after}");
    }
    let total = after["received"].as_u64().unwrap();
    assert!(figure(&second, "received") < total, "{second}\n{after}");
}

/// A node whose stderr is a pipe nobody reads any more: every log line
/// fails to write. It serves, reloads and stops as usual (SIGTERM: 0).
#[test]
fn closed_stderr_then_sigterm_exits_0() {
    let port = free_port();
    let mut child = chronos(&["--bind-port", &port.to_string(), "--cores", "1"])
        .env("CHRONOS_LOG_LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("chronos ended before it served: {status:?}");
        }
        if try_request(addr, "GET", "/ping", &[], b"").is_ok_and(|r| r.status == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "no answer on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Work that logs: a bad request body, a reload (SIGHUP).
    let r = request(addr, "POST", "/timers", &[], b"{not json");
    assert_eq!(r.status, 400);
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(300));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// A port another process listens on: one message, exit 1, whatever
/// the log level.
#[test]
fn port_in_use_is_reported_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    for level in ["info", "error", "off"] {
        let out = run(&["--bind-port", &port, "--cores", "1", "--log-level", level]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{level}: {stderr}");
        let times = stderr.matches("cannot listen on").count();
        assert_eq!(times, 1, "{level}: reported {times} times:\n{stderr}");
        assert!(stderr.contains(&port), "{stderr}");
    }
}

fn resolved_line(node: &Node) -> String {
    node.log_text()
        .lines()
        .find(|l| l.contains("resolved configuration"))
        .unwrap_or_else(|| panic!("no resolved configuration line:\n{}", node.log_text()))
        .to_string()
}

const SECRET: &str = "first-hour-secret-0123456789";

#[test]
fn resolved_line_shows_sites_throttling_and_whether_a_secret_is_set() {
    let node = Node::start(&format!(
        "[runtime]\ncores = 1\n[cluster]\nshared-secret = \"{SECRET}\"\n\
         [sites]\nlocal_site = \"east\"\nremote_site = [\"west=127.0.0.9:7300\", \"north=127.0.0.10\"]\n\
         replicate_timers_across_sites = true\n\
         [throttling]\ntarget_latency = 250000\nmax_tokens = 800\ninitial_token_rate = 300\n\
         min_token_rate = 20\nmax_token_rate = 900\n"
    ));
    let line = resolved_line(&node);
    let port = node.addr.port();
    for field in [
        "local_site=east".to_string(),
        format!("remote_site=[\"west=127.0.0.9:7300\", \"north=127.0.0.10:{port}\"]"),
        "replicate_timers_across_sites=true".into(),
        "throttling=on".into(),
        "target_latency=250000".into(),
        "max_tokens=800".into(),
        "initial_token_rate=300".into(),
        "min_token_rate=20".into(),
        "max_token_rate=900".into(),
        "shared_secret=set".into(),
    ] {
        assert!(line.contains(&field), "{field} missing:\n{line}");
    }
    assert!(!node.log_text().contains(SECRET), "{}", node.log_text());
}

#[test]
fn resolved_line_shows_defaults_without_sites_throttling_or_secret() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let line = resolved_line(&node);
    for field in [
        "local_site=site1",
        "remote_site=[]",
        "replicate_timers_across_sites=false",
        "throttling=off",
        "shared_secret=unset",
    ] {
        assert!(line.contains(field), "{field} missing:\n{line}");
    }
    assert!(!line.contains("max_tokens="), "{line}");
}
