//! The command line, with the real binary, as an operator meets it.
//!
//! - Issue 23, item 4, the command line on clap: `run` is the default
//!   (the old flags still start a node), every subcommand has its help,
//!   `check-config` checks what a start checks (exit 0 or 2 naming the
//!   key), `status` renders `GET /cluster` as a table (exit 1 when the
//!   node cannot be asked).
//! - Issue 24, "the first hour": `chronos resync`'s help, bad arguments
//!   and per-run figures (item 14), a node whose stderr is a closed pipe
//!   (15), a port in use (16), and the start-up "resolved configuration"
//!   line (6).

mod common;

use common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A file in this test process's own temporary directory.
fn file(name: &str, body: &str) -> String {
    let dir = std::env::temp_dir().join(format!("chronos-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn help_lists_the_subcommands_and_each_has_its_own() {
    let out = run(&["--help"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for word in ["run", "resync", "check-config", "status", "Exit status"] {
        assert!(stdout.contains(word), "{word} missing:\n{stdout}");
    }
    for sub in ["run", "resync", "check-config", "status"] {
        for flag in ["--help", "-h"] {
            let out = run(&[sub, flag]);
            let stdout = text(&out.stdout);
            assert_eq!(out.status.code(), Some(0), "{sub} {flag}");
            assert!(
                stdout.contains(&format!("Usage: chronos {sub}")),
                "{sub} {flag}:\n{stdout}"
            );
            assert!(stdout.contains("Exit status"), "{sub} {flag}:\n{stdout}");
        }
    }
    // What run's help says of the flags: each names its key.
    let stdout = text(&run(&["run", "--help"]).stdout);
    for flag in ["--config", "--bind-address", "--bind-port", "--cores"] {
        assert!(stdout.contains(flag), "{flag} missing:\n{stdout}");
    }
    assert!(stdout.contains("[http] bind-port"), "{stdout}");
    // check-config says what it does not check.
    let stdout = text(&run(&["check-config", "--help"]).stdout);
    assert!(stdout.contains("Not checked"), "{stdout}");
    let out = run(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout).trim(),
        format!("chronos {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn usage_errors_exit_2_naming_the_argument() {
    let cases: &[(&[&str], &str)] = &[
        (&["--bogus"], "--bogus"),
        (&["frobnicate"], "frobnicate"),
        (&["check-config"], "FILE"),
        (&["status", "--node", "no-port"], "no-port"),
        (&["--cores", "1", "status"], "status"),
    ];
    for (args, named) in cases {
        let out = run(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(named),
            "{args:?} should name {named}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
    }
}

#[test]
fn check_config_accepts_a_good_file_and_summarises_it() {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("chronos-cli-storage-{}", std::process::id()));
    let path = file(
        "good.toml",
        &format!(
            "[http]\nbind-port = {port}\n[runtime]\ncores = 1\n[storage]\npath = \"{}\"\n",
            dir.join("not-yet").display()
        ),
    );
    let out = run(&["check-config", &path]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains(&format!("{path}: ok")), "{stdout}");
    assert!(
        stdout.contains(&format!("listens on 127.0.0.1:{port}")),
        "{stdout}"
    );
    assert!(stdout.contains("created at start"), "{stdout}");
    assert_eq!(stdout.trim().lines().count(), 1, "one line: {stdout}");
    // Nothing was created, nothing bound.
    assert!(!dir.join("not-yet").exists());
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
}

#[test]
fn check_config_refuses_what_the_start_refuses_with_exit_2() {
    let blocker = file("a-file", "not a directory");
    let cases = [
        ("[http]\nbind-port = \"x\"\n", "bind-port"),
        ("[timers]\ncallback-timeout-ms = 0\n", "callback-timeout-ms"),
        ("[timers]\nno-such-key = 1\n", "no-such-key"),
        ("[runtime]\ncores = 9999\n", "cores"),
        ("[log]\nlevel = \"warning\"\n", "not a level"),
        ("[sites]\nremote_site = []\n", "local_site"),
    ];
    for (body, needle) in cases {
        let path = file("bad.toml", body);
        let out = run(&["check-config", &path]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{body}: {stderr}");
        assert!(stderr.contains(needle), "{body}: {stderr}");
        assert!(stderr.starts_with("chronos check-config: "), "{stderr}");
        assert!(out.stdout.is_empty(), "{body}");
    }
    // A storage path the node could not use: checked as the start would.
    let path = file(
        "storage.toml",
        &format!("[storage]\npath = \"{blocker}/sub\"\n"),
    );
    let out = run(&["check-config", &path]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("[storage] path"),
        "{}",
        text(&out.stderr)
    );
    // The Kafka clients' properties, as librdkafka judges them at start
    // (nothing is contacted: no broker listens on port 1).
    let queue = "[queue]\nkafka-brokers = \"127.0.0.1:1\"\ninput-topic = \"in\"\noutput-topic = \"out\"\npostgres-url = \"postgres://postgres@127.0.0.1:1/test\"\n";
    let path = file("queue-good.toml", queue);
    let out = run(&["check-config", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("queue on"));
    for (section, key) in [
        ("producer", "no.such.property"),
        ("consumer", "fetch.wait.max.ms"),
    ] {
        let value = if key == "no.such.property" {
            "1"
        } else {
            "\"soon\""
        };
        let body = format!("{queue}[queue.{section}]\n\"{key}\" = {value}\n");
        let out = run(&["check-config", &file("queue-bad.toml", &body)]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{body}: {stderr}");
        assert!(stderr.contains(&format!("[queue.{section}]")), "{stderr}");
        assert!(stderr.contains(key), "{stderr}");
    }
    // A missing file.
    let out = run(&["check-config", "/nonexistent/chronos.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/nonexistent/chronos.toml"));
    // The environment is applied, as at start: a bad variable is named.
    let good = file("good-env.toml", "");
    let out = chronos(&["check-config", &good])
        .env("CHRONOS_HTTP_BIND_PORT", "abc")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("CHRONOS_HTTP_BIND_PORT"));
}

/// The lines of `chronos status` against `node` (asserting exit 0).
fn status(node: &Node, extra: &[&str]) -> String {
    let address = node.addr.to_string();
    let mut args = vec!["status", "--node", &address];
    args.extend_from_slice(extra);
    let out = run(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn status_shows_a_live_node_as_a_table() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let cluster: serde_json::Value =
        serde_json::from_slice(&node.request("GET", "/cluster", "").body).unwrap();
    let view = cluster["cluster-view-id"].as_str().unwrap().to_string();
    let table = status(&node, &[]);
    let me = node.addr.to_string();
    for needle in [
        format!("node        {me}"),
        format!("view        {view}"),
        format!("{me}  member  (this node)"),
        "site        site1".to_string(),
        "resync      idle".to_string(),
    ] {
        assert!(table.contains(&needle), "{needle:?} missing in:\n{table}");
    }
    // --json: the node's own answer.
    let json: serde_json::Value = serde_json::from_str(&status(&node, &["--json"])).unwrap();
    assert_eq!(json["cluster-view-id"], view.as_str());
}

#[test]
fn status_sends_the_shared_secret_from_the_config() {
    let secret = "a-secret-of-at-least-16";
    let node = Node::start(&format!(
        "[runtime]\ncores = 1\n[cluster]\nshared-secret = \"{secret}\"\n"
    ));
    let config = node.config_path();
    let table = status(&node, &["--config", config.to_str().unwrap()]);
    assert!(table.contains(&node.addr.to_string()), "{table}");
    // Without it: the node's 403, exit 1.
    let out = run(&["status", "--node", &node.addr.to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("403"), "{}", text(&out.stderr));
}

#[test]
fn status_of_a_closed_port_exits_1_with_the_reason() {
    let address = format!("127.0.0.1:{}", free_port());
    let out = run(&["status", "--node", &address]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&address) && stderr.contains("refused"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

/// Environment variables to start with.
type Env<'a> = &'a [(&'a str, &'a str)];

/// Start `chronos` with `args` on `port`; wait for `/ping`.
fn started(args: &[&str], port: u16, env: &[(&str, &str)]) -> std::process::Child {
    let mut child = chronos(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until("the node answers /ping", Duration::from_secs(20), || {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("chronos {args:?} exited: {status}");
        }
        match try_request(addr, "GET", "/ping", &[], b"") {
            Ok(r) if r.status == 200 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    child
}

#[test]
fn the_old_flags_and_run_both_start_a_node() {
    let port = free_port();
    let p = port.to_string();
    let path = file("run.toml", "[runtime]\ncores = 1\n");
    let forms: [(&[&str], Env); 3] = [
        (&["--config", &path, "--bind-port", &p], &[]),
        (&["run", "-c", &path, "--bind-port", &p], &[]),
        // The environment, as before: the file and the flag's variable.
        (
            &["run"],
            &[("CHRONOS_CONFIG", &path), ("CHRONOS_BIND_PORT", &p)],
        ),
    ];
    for (args, env) in forms {
        let mut child = started(args, port, env);
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{args:?}");
    }
}

/// The review: a `200` with JSON that is not a node's report (a proxy, a
/// wrong port) made `resync --wait` panic (exit 101) and `status` print a
/// table of `?` with exit 0. Both now exit 1 naming what was wrong.
#[test]
fn status_and_resync_refuse_an_answer_that_is_not_a_node_s_report() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    // Answers every connection with `200 []`, until the test ends.
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = if seen.starts_with(b"POST") {
                    "HTTP/1.1 202 Accepted\r\nContent-Length: 9\r\nConnection: close\r\n\r\n{\"run\":1}"
                } else {
                    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n[]"
                };
                let _ = s.write_all(answer.as_bytes());
            });
        }
    });
    let out = run(&["status", "--node", &address]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "status: {stderr}");
    assert!(stderr.contains("not a node's report"), "status: {stderr}");
    let out = run(&[
        "resync",
        "--wait",
        "--address",
        &address,
        "--timeout-s",
        "2",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "resync --wait: {stderr}");
    assert!(!stderr.contains("panicked"), "resync --wait: {stderr}");
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
    format!(
        "[runtime]\ncores = 1\n[cluster]\nlocalhost = \"127.0.0.{i}:{port}\"\nnode = [{}]\njoining = [{}]\nresync-at-start = false\n",
        member_list(nodes, port),
        member_list(joining, port)
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
