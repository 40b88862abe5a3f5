//! Smoke runs of `chronos-perf`, a few seconds each: results are produced
//! and nothing is lost. (The harness's arithmetic has unit tests in
//! `perf/harness/report.rs`.)

mod common;

use std::process::Command;

/// Run `chronos-perf` with `args`; its JSON results (its SVG checked too).
fn run_perf(args: &[&str]) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("chronos-perf-smoke-{}", std::process::id()));
    let name = args[0].to_string() + "-smoke";
    let out = Command::new(env!("CARGO_BIN_EXE_chronos-perf"))
        .args(args)
        .args(["--name", &name, "--out-dir", dir.to_str().unwrap()])
        .env("CHRONOS_TANSU", common::queue::tansu_path())
        .output()
        .expect("run chronos-perf");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "chronos-perf failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(dir.join(format!("{name}.svg"))).expect("svg written");
    assert!(svg.starts_with("<svg"));
    let json = std::fs::read_to_string(dir.join(format!("{name}.json"))).expect("json written");
    serde_json::from_str(&json).expect("valid JSON")
}

#[test]
fn http_mode_smoke() {
    let r = run_perf(&[
        "http",
        "--count",
        "1000",
        "--connections",
        "4",
        "--interval-ms",
        "200-600",
        "--pops",
        "2",
    ]);
    let pops = &r["pops"];
    assert_eq!(pops["expected"], 2000);
    assert_eq!(pops["lost"], 0);
    assert_eq!(pops["early"], 0);
    assert_eq!(pops["duplicates"], 0);
    assert!(r["post_throughput_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["noise_1ms_sleep"]["count"].as_u64().unwrap() > 0);
}

#[test]
fn queue_mode_smoke() {
    let r = run_perf(&[
        "queue",
        "--rate",
        "300",
        "--duration-s",
        "2",
        "--delay-ms",
        "1500",
    ]);
    let m = &r["messages"];
    assert_eq!(m["expected"], 600);
    assert_eq!(m["lost"], 0);
    assert_eq!(m["early"], 0);
}
