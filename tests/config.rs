//! Configuration as an operator meets it, with the real binary (issue 24,
//! "the first hour", items 3 to 7). Every `CHRONOS_<SECTION>_<KEY>`
//! variable sets its key and a bad one is refused by its own name; an
//! unknown `CHRONOS_*` variable is a warning; refused values name the key
//! and the value; `[sites]` needs `local_site`; the throttle gauge says it
//! is the node's; a SIGHUP names the restart-only settings it did not
//! apply, and does not fail on a `[timers]` change it would not apply.

mod common;

use common::{chronos, free_port, reload_config, wait_until, Node};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `chronos` with a config file, `--bind-port`, the given variables and
/// none inherited ([`chronos`]).
fn command(config: &str, port: u16, vars: &[(&str, &str)]) -> (Command, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("chronos-cfg-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("chronos.toml");
    std::fs::write(&path, config).unwrap();
    let mut c = chronos(&["--config", path.to_str().unwrap()]);
    c.args(["--bind-port", &port.to_string()]);
    c.envs(vars.iter().copied());
    (c, dir)
}

/// A start that must be refused: its exit status and stderr (`-1` and
/// the log so far if it is still running after 10 s: it was not refused).
fn refused(config: &str, vars: &[(&str, &str)]) -> (i32, String) {
    let (mut c, dir) = command(config, free_port(), vars);
    let err = dir.join("refused.err");
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code().unwrap_or(-1);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break -1;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, std::fs::read_to_string(&err).unwrap_or_default())
}

/// A node started with `vars`: killed when dropped; its log file.
struct Started {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Started {
    fn new(config: &str, vars: &[(&str, &str)]) -> Started {
        let port = free_port();
        let (mut c, dir) = command(config, port, vars);
        let log = dir.join("chronos.log");
        let child = c
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let started = Started { child, log };
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        wait_until(
            "the node answers /ping",
            Duration::from_secs(20),
            || match common::try_request(addr, "GET", "/ping", &[], b"") {
                Ok(r) if r.status == 200 => Ok(()),
                _ => Err(started.log_text()),
            },
        );
        started
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_variable_sets_any_key_by_the_rule() {
    let node = Started::new(
        "",
        &[
            ("CHRONOS_TIMERS_CALLBACK_TIMEOUT_MS", "1000"),
            ("CHRONOS_HTTP_CONNECTIONS_MAX", "100"),
        ],
    );
    let log = node.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("resolved configuration"))
        .unwrap_or_else(|| panic!("no resolved configuration line:\n{log}"));
    assert!(
        line.contains("callback_timeout_ms=1000") && line.contains("connections_max=100"),
        "{line}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("CHRONOS_")),
        "{log}"
    );
}

#[test]
fn a_bad_variable_is_refused_by_its_own_name() {
    let (code, err) = refused("", &[("CHRONOS_BIND_PORT", "abc")]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("CHRONOS_BIND_PORT") && err.contains("abc") && !err.contains("--bind-port"),
        "{err}"
    );
    let (code, err) = refused("", &[("CHRONOS_TIMERS_CALLBACK_TIMEOUT_MS", "0")]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("[timers] callback-timeout-ms = 0")
            && err.contains("CHRONOS_TIMERS_CALLBACK_TIMEOUT_MS"),
        "{err}"
    );
}

#[test]
fn an_unknown_variable_is_warned_about_at_start() {
    let node = Started::new(
        "",
        &[
            ("CHRONOS_TIMERS_CALLBACK_TIMEOUT", "5"),
            ("CHRONOS_BOGUS", "1"),
        ],
    );
    let log = node.log_text();
    for name in ["CHRONOS_TIMERS_CALLBACK_TIMEOUT", "CHRONOS_BOGUS"] {
        assert!(
            log.lines().any(|l| l.contains("WARN") && l.contains(name)),
            "no warning naming {name}:\n{log}"
        );
    }
}

#[test]
fn more_shards_than_cores_is_refused_naming_the_value() {
    let (code, err) = refused("[runtime]\ncores = 4096\n", &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("[runtime] cores = 4096"), "{err}");
}

#[test]
fn throttling_and_timers_values_are_refused_by_key_and_value() {
    for (text, wanted, unwanted) in [
        (
            "[throttling]\ninitial_token_rate = 0\n",
            "[throttling] initial_token_rate = 0",
            "max_tokens",
        ),
        (
            "[throttling]\nmax_tokens = 0\n",
            "[throttling] max_tokens = 0",
            "min_token_rate",
        ),
        (
            "[throttling]\nmin_token_rate = 20\nmax_token_rate = 10\n",
            "max_token_rate = 10",
            "target_latency",
        ),
        (
            "[timers]\ndefault-replication-factor = 0\n",
            "[timers] default-replication-factor = 0",
            "timers-per-shard-max",
        ),
    ] {
        let (code, err) = refused(text, &[]);
        assert_eq!(code, 2, "{text}: {err}");
        assert!(
            err.contains(wanted) && !err.contains(unwanted),
            "{text}: {err}"
        );
    }
}

#[test]
fn the_throttle_gauge_says_it_is_the_nodes() {
    let node = Node::start("[throttling]\ninitial_token_rate = 50\n");
    let text = node.request("GET", "/metrics", "").text();
    let help = text
        .lines()
        .find(|l| l.starts_with("# HELP chronos_throttle_rate "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        help.contains("this node") && help.contains("per shard"),
        "{help}"
    );
}

#[test]
fn a_sites_section_without_local_site_is_refused() {
    let (code, err) = refused("[sites]\nremote_site = [\"west=127.0.0.1:7999\"]\n", &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("[sites] local_site"), "{err}");
}

#[test]
fn sighup_names_the_restart_only_settings_it_did_not_apply() {
    let node = Node::start("");
    reload_config(
        &node,
        "[timers]\ncallback-timeout-ms = 1600\n[http]\nconnections-max = 100\n",
    );
    let log = node.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("not applied"))
        .unwrap_or_else(|| panic!("no 'not applied' line:\n{log}"));
    assert!(
        line.contains("WARN")
            && line.contains("[timers] callback-timeout-ms 1500 -> 1600")
            && line.contains("[http] connections-max 8192 -> 100"),
        "{line}"
    );
}

#[test]
fn sighup_applies_the_cluster_beside_a_timers_change_it_does_not_apply() {
    let port = free_port();
    let (me, other) = (format!("127.0.0.1:{port}"), "127.0.0.1:1".to_string());
    let config = |nodes: &str, timers: &str| {
        format!("[cluster]\nlocalhost = \"{me}\"\nnode = [{nodes}]\nresync-at-start = false\n[timers]\n{timers}")
    };
    let node = Node::start_at("127.0.0.1", port, &config(&format!("\"{me}\""), ""));
    // 2000 ms of callback breaks the skew rule in a cluster: the next start
    // would refuse it, but this reload does not apply [timers] at all.
    let two = format!("\"{me}\", \"{other}\"");
    reload_config(&node, &config(&two, "callback-timeout-ms = 2000\n"));
    let log = node.log_text();
    assert!(!log.contains("the configuration is invalid"), "{log}");
    let reloaded = log
        .lines()
        .find(|l| l.contains("cluster reloaded"))
        .unwrap();
    assert!(reloaded.contains(&other), "{reloaded}");
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("refused at the next start")
            && l.contains("replica-skew-ms")),
        "{log}"
    );
    // Each shard takes the reload from its own channel: the shard that
    // answers may take it a moment after the logged line.
    wait_until(
        "every shard's /cluster names the new node",
        Duration::from_secs(5),
        || {
            let cluster = node.request("GET", "/cluster", "").text();
            cluster.contains(&other).then_some(()).ok_or(cluster)
        },
    );
}

/// A `CHRONOS_*` value that is not UTF-8 was read as absent: a secret
/// given that way left every route open. Refused, naming the variable and
/// never the value.
#[test]
fn a_non_utf8_setting_is_refused_naming_the_variable() {
    use std::os::unix::ffi::OsStrExt;
    let value = std::ffi::OsStr::from_bytes(b"secret-\xff-0123456789abcdef");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_chronos"))
        .args(["--bind-port", &free_port().to_string()])
        .env("CHRONOS_CLUSTER_SHARED_SECRET", value)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("CHRONOS_CLUSTER_SHARED_SECRET"), "{err}");
    assert!(
        !err.contains("0123456789abcdef"),
        "the value is never shown: {err}"
    );
}
