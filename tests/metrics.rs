//! The operator histograms with the real binary: pop lateness per shard,
//! request duration per route, replication lag in a 2-node cluster, and
//! `chronos_build_info`.

mod common;

use common::{start_cluster, timer_body, wait_until, Behaviour, Node, Sink};
use std::time::Duration;

/// One scrape: `(series name, labels, value)` per sample line.
fn scrape(node: &Node) -> Vec<(String, String, f64)> {
    let text = node.request("GET", "/metrics", "").text();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("name value");
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            (
                name.to_string(),
                labels.to_string(),
                value.parse().expect(l),
            )
        })
        .collect()
}

/// The sum of `name`'s samples whose labels contain `label`.
fn sum(samples: &[(String, String, f64)], name: &str, label: &str) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| n == name && l.contains(label))
        .map(|(_, _, v)| v)
        .sum()
}

/// Every series of histogram `name` selected by `label`: buckets
/// cumulative (never decreasing with `le`), `+Inf` equal to `_count`.
fn check_buckets(samples: &[(String, String, f64)], name: &str, label: &str) {
    let buckets: Vec<&(String, String, f64)> = samples
        .iter()
        .filter(|(n, l, _)| *n == format!("{name}_bucket") && l.contains(label))
        .collect();
    assert!(buckets.len() > 2, "{name}{{{label}}} has buckets");
    let mut last = (-1.0f64, 0.0f64);
    for (_, labels, v) in &buckets {
        let le = labels.split("le=\"").nth(1).unwrap().trim_end_matches('"');
        let le: f64 = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap()
        };
        assert!(le > last.0, "{name}: le ascending: {labels}");
        assert!(
            *v >= last.1,
            "{name}: cumulative: {labels} {v} < {}",
            last.1
        );
        last = (le, *v);
    }
    assert!(last.0.is_infinite(), "{name}: the last bucket is +Inf");
    let count = sum(samples, &format!("{name}_count"), label);
    assert_eq!(last.1, count, "{name}{{{label}}}: +Inf == _count");
}

#[test]
fn pop_lateness_counts_every_pop_on_its_shard() {
    const N: usize = 40;
    let sink = Sink::start(Behaviour::Ok);
    let node = Node::start("[runtime]\ncores = 2\n");
    let before = scrape(&node);
    let was = sum(&before, "chronos_pop_lateness_seconds_count", "shard=");
    assert_eq!(was, 0.0);
    for i in 0..N {
        node.create(&timer_body("0.3", None, &sink.uri(&format!("/p{i}")), "x"));
    }
    assert_eq!(sink.wait_for(N, Duration::from_secs(20)).len(), N);
    let after = wait_until("every pop's lateness", Duration::from_secs(10), || {
        let s = scrape(&node);
        match sum(&s, "chronos_pop_lateness_seconds_count", "shard=") {
            n if n == N as f64 => Ok(s),
            n => Err(format!("{n} of {N}")),
        }
    });
    let per_shard: Vec<f64> = (0..2)
        .map(|i| {
            let shard = format!("shard=\"{i}\"");
            check_buckets(&after, "chronos_pop_lateness_seconds", &shard);
            sum(&after, "chronos_pop_lateness_seconds_count", &shard)
        })
        .collect();
    assert_eq!(per_shard.iter().sum::<f64>(), N as f64, "{per_shard:?}");
    // Seconds, not µs: 40 pops on an idle node are well under 1 s late.
    let late = sum(&after, "chronos_pop_lateness_seconds_sum", "shard=");
    assert!(late > 0.0 && late < N as f64, "{late}");
    assert_eq!(
        sum(&after, "chronos_timers_popped_total", ""),
        N as f64,
        "one lateness per pop"
    );
}

#[test]
fn request_duration_counts_each_route() {
    let sink = Sink::start(Behaviour::Ok);
    let node = Node::start("[runtime]\ncores = 1\n");
    let before = scrape(&node);
    let body = timer_body("60", None, &sink.uri("/r"), "x");
    let made: [(&str, &str, &str, usize); 9] = [
        ("POST", "/timers", body.as_str(), 3),
        (
            "PUT",
            "/timers/00000000000000010000000000000000",
            body.as_str(),
            2,
        ),
        ("DELETE", "/timers/00000000000000010000000000000000", "", 2),
        ("GET", "/ping", "", 4),
        ("GET", "/ready", "", 1),
        ("GET", "/cluster", "", 1),
        ("GET", "/no-such-route", "", 2),
        ("POST", "/ping", "", 1),
        ("GET", "/openapi.json", "", 1),
    ];
    for (method, path, body, times) in made {
        for _ in 0..times {
            node.request(method, path, body);
        }
    }
    let after = scrape(&node);
    check_buckets(
        &after,
        "chronos_http_request_duration_seconds",
        "route=\"ping\"",
    );
    let grew = |route: &str| {
        let label = format!("route=\"{route}\"");
        let name = "chronos_http_request_duration_seconds_count";
        sum(&after, name, &label) - sum(&before, name, &label)
    };
    for (route, n) in [
        ("timers_post", 3.0),
        ("timers_put", 2.0),
        ("timers_delete", 2.0),
        ("ping", 4.0),
        ("ready", 1.0),
        ("cluster", 1.0),
        ("openapi", 1.0),
        // A 404 and a wrong method are `other`.
        ("other", 3.0),
        // The scrape before (this one is counted once answered).
        ("metrics", 1.0),
        ("replicate", 0.0),
        ("resync_get", 0.0),
    ] {
        assert_eq!(grew(route), n, "route {route}");
    }
    let build = sum(&after, "chronos_build_info", "version=\"");
    assert_eq!(build, 1.0, "chronos_build_info is 1");
}

#[test]
fn replication_lag_grows_in_a_two_node_cluster() {
    const N: usize = 10;
    let sink = Sink::start(Behaviour::Ok);
    let nodes = start_cluster(2, 1, "");
    let lag = |node: &Node, path: &str| {
        let label = format!("path=\"{path}\"");
        sum(
            &scrape(node),
            "chronos_replication_lag_seconds_count",
            &label,
        )
    };
    let before: f64 = nodes.iter().map(|n| lag(n, "cluster")).sum();
    for i in 0..N {
        nodes[0].create(&timer_body("60", None, &sink.uri(&format!("/l{i}")), "x"));
    }
    nodes[0].wait_replication_settled(Duration::from_secs(10));
    let sent = nodes[0].metric("chronos_replication_sent_total");
    assert!(sent >= N as f64, "each create replicated: {sent}");
    let s = scrape(&nodes[0]);
    check_buckets(&s, "chronos_replication_lag_seconds", "path=\"cluster\"");
    let after = lag(&nodes[0], "cluster");
    assert_eq!(after - before, sent, "one lag per message the peer took");
    assert_eq!(lag(&nodes[0], "site"), 0.0, "no sites");
}
