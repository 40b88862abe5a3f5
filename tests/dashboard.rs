//! `src/dist/grafana-dashboard.json`: every metric name in every panel
//! expression must be a series a running node exports, so a renamed
//! metric breaks this test rather than a panel in production.

mod common;

use common::Node;
use std::collections::BTreeSet;

fn dashboard() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/dist/grafana-dashboard.json"
    );
    let text = std::fs::read_to_string(path).expect("the dashboard");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every `expr` of every panel (rows' nested panels too), with its title.
fn expressions(dash: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack: Vec<&serde_json::Value> = dash["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = stack.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            stack.extend(nested);
        }
        let title = panel["title"].as_str().unwrap_or("").to_string();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a target has an expr");
            out.push((title.clone(), expr.to_string()));
        }
    }
    out
}

/// The `chronos_*` identifiers in a PromQL expression (label names and
/// values inside `{...}` and strings are skipped).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let (mut depth, mut quoted, mut word) = (0, false, String::new());
    for c in expr.chars().chain(std::iter::once(' ')) {
        if quoted {
            quoted = c != '"';
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        if depth == 0 && word.starts_with("chronos_") {
            names.insert(word.clone());
        }
        word.clear();
        match c {
            '"' => quoted = true,
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
    }
    names
}

/// The series names a scrape holds, and the histogram families declared.
fn exported(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut series = BTreeSet::new();
    let mut histograms = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(family) = rest.strip_suffix(" histogram") {
                histograms.insert(family.to_string());
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            series.insert(line[..end].to_string());
        }
    }
    (series, histograms)
}

/// Why `name` is not something the node exports: a series name, or a
/// histogram's `_bucket`/`_sum`/`_count` of a declared histogram family.
fn missing(name: &str, series: &BTreeSet<String>, histograms: &BTreeSet<String>) -> Option<String> {
    let family = ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix));
    match family {
        Some(f) if histograms.contains(f) && series.contains(name) => None,
        _ if series.contains(name) && !histograms.contains(name) => None,
        Some(f) if series.contains(name) => Some(format!("{name}: {f} is not a histogram")),
        _ if histograms.contains(name) => Some(format!(
            "{name} is a histogram family: use {name}_bucket, _sum or _count"
        )),
        _ => Some(format!("{name} is not exported")),
    }
}

#[test]
fn every_metric_a_panel_uses_is_exported() {
    let dash = dashboard();
    let exprs = expressions(&dash);
    assert!(
        exprs.len() >= 20,
        "the dashboard has its panels: {}",
        exprs.len()
    );
    let node = Node::start("[runtime]\ncores = 1\n");
    let (series, histograms) = exported(&node.request("GET", "/metrics", "").text());
    let mut used = BTreeSet::new();
    let mut problems = Vec::new();
    for (title, expr) in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "panel {title:?}: no metric in {expr}");
        for name in names {
            if let Some(why) = missing(&name, &series, &histograms) {
                problems.push(format!("panel {title:?}: {why} ({expr})"));
            }
            used.insert(name);
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // What the issue asks for is on the dashboard.
    for wanted in [
        "chronos_pop_lateness_seconds_bucket",
        "chronos_http_request_duration_seconds_bucket",
        "chronos_http_request_duration_seconds_count",
        "chronos_replication_lag_seconds_bucket",
        "chronos_timers_pending",
        "chronos_callbacks_succeeded_total",
        "chronos_queue_stage_seconds_bucket",
        "chronos_connections_open",
        "chronos_throttled_total",
    ] {
        assert!(used.contains(wanted), "no panel shows {wanted}");
    }
}

#[test]
fn the_check_can_fail() {
    let text = "# TYPE chronos_a_seconds histogram\nchronos_a_seconds_bucket{le=\"1\"} 0\nchronos_a_seconds_count 0\nchronos_b_total 1\n";
    let (series, histograms) = exported(text);
    let names = metric_names(
        "histogram_quantile(0.9, sum by (le) (rate(chronos_a_seconds_bucket{instance=~\"chronos_x\"}[5m]))) + chronos_b_total + chronos_c_total + chronos_a_seconds",
    );
    let problems: Vec<String> = names
        .iter()
        .filter_map(|n| missing(n, &series, &histograms))
        .collect();
    assert_eq!(
        problems,
        [
            "chronos_a_seconds is a histogram family: use chronos_a_seconds_bucket, _sum or _count",
            "chronos_c_total is not exported",
        ]
    );
}
