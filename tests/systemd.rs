//! Issue 23, item 6: bare metal. The node speaks systemd's readiness
//! protocol (`Type=notify`) on a socket the test binds, as systemd would:
//! `READY=1` once it serves (after its log is replayed), `RELOADING=1`
//! and `READY=1` around a SIGHUP, `STOPPING=1` at SIGTERM. And what can be
//! checked of the Debian package without building it: the assets exist,
//! the default config passes `check-config`, the unit is `Type=notify`
//! with a reload and a memlock limit, and its `ExecStart` flags are ones
//! `chronos run` accepts.

mod common;

use common::*;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A socket standing in for systemd's notification socket.
struct Systemd {
    socket: UnixDatagram,
    /// `$NOTIFY_SOCKET` for it.
    name: String,
}

impl Systemd {
    /// On a path, or (`abstract_name`) in the abstract namespace (`@...`).
    fn bind(tag: &str, abstract_name: bool) -> Systemd {
        let unique = format!("chronos-notify-{}-{tag}", std::process::id());
        let (socket, name) = if abstract_name {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(&unique).unwrap();
            (
                UnixDatagram::bind_addr(&addr).unwrap(),
                format!("@{unique}"),
            )
        } else {
            let path = std::env::temp_dir().join(format!("{unique}.sock"));
            let _ = std::fs::remove_file(&path);
            let socket = UnixDatagram::bind(&path).unwrap();
            (socket, path.to_str().unwrap().to_string())
        };
        Systemd { socket, name }
    }

    /// The next message, within `timeout` (fails the test without one).
    fn next(&self, timeout: Duration) -> String {
        self.socket.set_read_timeout(Some(timeout)).unwrap();
        let mut buf = [0u8; 4096];
        match self.socket.recv(&mut buf) {
            Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
            Err(e) => panic!("no notification within {timeout:?}: {e}"),
        }
    }
}

/// A durable node's config: `[storage]` in `dir`.
fn durable(dir: &Path) -> String {
    format!(
        "[runtime]\ncores = 2\n[storage]\npath = \"{}\"\n",
        dir.display()
    )
}

#[test]
fn ready_is_sent_once_the_log_is_replayed_and_stopping_at_sigterm() {
    let dir = std::env::temp_dir().join(format!("chronos-notify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = free_port();
    // Timers for the restart to replay: READY=1 must wait for them.
    let node = Node::start_at("127.0.0.1", port, &durable(&dir));
    // `start_at` waits for /ping; a change waits for the (empty) log's
    // replay too (a loaded CI machine got 503 recovering here).
    node.wait_ready_200(Duration::from_secs(20));
    let sink = Sink::start(Behaviour::Ok);
    let body = timer_body("3600", None, &sink.uri("/cb"), "x");
    let ids: Vec<String> = (0..2000).map(|_| node.create(&body)).collect();
    assert!(node.terminate().success());

    let systemd = Systemd::bind("durable", false);
    let started = Instant::now();
    let mut node = Node::spawn_in(
        None,
        "127.0.0.1",
        port,
        &durable(&dir),
        &[("NOTIFY_SOCKET", &systemd.name)],
    );
    let first = systemd.next(Duration::from_secs(30));
    // At this moment the node serves: /ready 200, the timers are back.
    let ready = node.request("GET", "/ready", "");
    assert_eq!(first, "READY=1", "after {:?}", started.elapsed());
    assert_eq!(ready.status, 200, "READY=1 before /ready: {}", ready.text());
    let r = node.request("DELETE", &format!("/timers/{}", ids[0]), "");
    assert_eq!(r.status, 200, "{}", r.text());
    let id = node.create(&timer_body("0.05", None, &sink.uri("/cb"), "y"));
    assert_eq!(sink.wait_for(1, Duration::from_secs(10)).len(), 1, "{id}");
    // SIGTERM: STOPPING=1 as the drain starts.
    node.signal(libc::SIGTERM);
    assert_eq!(systemd.next(Duration::from_secs(10)), "STOPPING=1");
    assert_eq!(
        node.wait_exit(Duration::from_secs(15)).map(|s| s.code()),
        Some(Some(0))
    );
}

#[test]
fn a_reload_is_reported_around_sighup_on_an_abstract_socket() {
    let systemd = Systemd::bind("reload", true);
    let port = free_port();
    let config = "[runtime]\ncores = 1\n";
    let node = Node::start_env(
        "127.0.0.1",
        port,
        config,
        &[("NOTIFY_SOCKET", &systemd.name)],
    );
    assert_eq!(systemd.next(Duration::from_secs(10)), "READY=1");
    reload_config(&node, config);
    let reloading = systemd.next(Duration::from_secs(10));
    let mut lines = reloading.lines();
    assert_eq!(lines.next(), Some("RELOADING=1"), "{reloading}");
    let usec: u64 = lines
        .next()
        .and_then(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC in {reloading:?}"));
    assert!(usec > 0);
    assert_eq!(systemd.next(Duration::from_secs(10)), "READY=1");
    assert_eq!(node.request("GET", "/ready", "").status, 200);
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `[package.metadata.deb]` of Cargo.toml.
fn deb_metadata() -> toml::Table {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let cargo: toml::Table = toml::from_str(&text).unwrap();
    cargo["package"]["metadata"]["deb"]
        .as_table()
        .expect("[package.metadata.deb]")
        .clone()
}

/// The unit file's `Key=value` lines (the last of a key wins, as in
/// systemd for these).
fn unit() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("src/dist/chronos.service")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn unit_value(key: &str) -> String {
    unit()
        .into_iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("the unit has no {key}="))
}

#[test]
fn the_package_metadata_names_files_that_exist() {
    let deb = deb_metadata();
    let assets = deb["assets"].as_array().expect("assets");
    let mut targets = Vec::new();
    for asset in assets {
        let source = asset[0].as_str().unwrap();
        targets.push(asset[1].as_str().unwrap().to_string());
        if source.starts_with("target/") {
            assert_eq!(source, "target/release/chronos", "the one built asset");
            continue;
        }
        assert!(root().join(source).is_file(), "asset {source} is missing");
    }
    assert!(targets.contains(&"usr/bin/".to_string()), "{targets:?}");
    assert!(targets.contains(&"etc/chronos/chronos.toml".to_string()));
    let conf: Vec<&str> = deb["conf-files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(conf, ["/etc/chronos/chronos.toml"]);
    let units = deb["systemd-units"].as_table().expect("systemd-units");
    let dir = units["unit-scripts"].as_str().unwrap();
    let name = units["unit-name"].as_str().unwrap();
    assert!(root().join(dir).join(format!("{name}.service")).is_file());
}

#[test]
fn the_default_config_passes_check_config() {
    let path = root().join("src/dist/chronos.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_chronos"))
        .arg("check-config")
        .arg(&path)
        .env_remove("CHRONOS_CONFIG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Safe as installed: loopback only, in memory.
    assert!(stdout.contains("listens on 127.0.0.1:7253"), "{stdout}");
    assert!(stdout.contains("storage in memory"), "{stdout}");
}

#[test]
fn the_unit_is_type_notify_and_starts_with_flags_chronos_accepts() {
    assert_eq!(unit_value("Type"), "notify");
    assert_eq!(unit_value("ExecReload"), "/bin/kill -HUP $MAINPID");
    assert!(!unit_value("LimitMEMLOCK").is_empty());
    assert!(!unit_value("LimitNOFILE").is_empty());
    assert!(
        unit().iter().all(|(k, _)| k != "SystemCallFilter"),
        "a system call allow-list may lack io_uring's calls"
    );
    let exec = unit_value("ExecStart");
    let words: Vec<&str> = exec.split_whitespace().collect();
    assert_eq!(words[..2], ["/usr/bin/chronos", "run"], "{exec}");
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_chronos"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in words.iter().filter(|w| w.starts_with('-')) {
        assert!(
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag},")),
            "ExecStart's {flag} is not a flag of chronos run:\n{help}"
        );
    }
    // The file it names is the package's conffile.
    let config = words.iter().skip_while(|w| **w != "--config").nth(1);
    assert_eq!(config, Some(&"/etc/chronos/chronos.toml"));
}
