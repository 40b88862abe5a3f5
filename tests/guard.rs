//! `[timers] callback-allow` (the callback guard against SSRF), with the
//! real binary: literal addresses allowed and refused with the rule named
//! in the `400`, a name resolving into a denied range, a suffix allow, a
//! bad rule at start (exit 2) and at SIGHUP (the running list kept), and
//! a callback refused at connect time after a reload narrowed the list.

mod common;

use common::{free_port, reload_config, timer_body, wait_until, Behaviour, Node, Sink};
use std::time::Duration;

fn allow(rules: &[&str]) -> String {
    let quoted: Vec<String> = rules.iter().map(|r| format!("{r:?}")).collect();
    format!(
        "[runtime]\ncores = 1\n[timers]\ncallback-allow = [{}]\n",
        quoted.join(", ")
    )
}

/// `POST /timers` for `uri`: the status and the body.
fn post(node: &Node, uri: &str) -> (u16, String) {
    let r = node.request("POST", "/timers", &timer_body("0.2", None, uri, "x"));
    (r.status, r.text())
}

#[test]
fn literal_addresses_are_judged_by_the_first_matching_rule() {
    let sink = Sink::start(Behaviour::Ok);
    let node = Node::start(&allow(&["!127.0.0.2", "127.0.0.0/8", "!10.0.0.0/8"]));
    let (status, body) = post(&node, &sink.uri("/ok"));
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(&node, "http://127.0.0.2:9/denied");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("rule \"!127.0.0.2\""), "{body}");
    let (status, body) = post(&node, "http://10.1.2.3:9/denied");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("rule \"!10.0.0.0/8\""), "{body}");
    // The scheme does not matter: an https:// callback is judged the same.
    let (status, body) = post(&node, "https://127.0.0.2:9/denied");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("rule \"!127.0.0.2\""), "{body}");
    let (status, body) = post(&node, "http://192.0.2.1/none");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("no rule matched"), "{body}");
    // A client PUT is checked the same way.
    let r = node.request(
        "PUT",
        "/timers/00000000000000010000000000000000",
        &timer_body("0.2", None, "http://[::ffff:127.0.0.2]:9/mapped", "x"),
    );
    assert_eq!(r.status, 400, "an IPv4-mapped address is its IPv4 address");
    assert!(r.text().contains("!127.0.0.2"), "{}", r.text());
    // The allowed timer popped; nothing else did.
    let pops = sink.wait_for(1, Duration::from_secs(10));
    assert_eq!(pops.len(), 1);
    assert_eq!(pops[0].path, "/ok");
    assert_eq!(node.metric("chronos_timers_created_total"), 1.0);
}

#[test]
fn a_name_resolving_into_a_denied_range_is_refused() {
    // `localhost` is not listed; what it resolves to is.
    let node = Node::start(&allow(&["!127.0.0.0/8", "!::1", "0.0.0.0/0"]));
    let (status, body) = post(&node, "http://localhost:9/cb");
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("callback host localhost") && body.contains("callback-allow rule \"!"),
        "{body}"
    );
    let (status, body) = post(&node, "http://no-such-host.invalid/cb");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("no-such-host.invalid"), "{body}");
}

#[test]
fn a_suffix_rule_allows_a_name_before_an_address_rule_denies() {
    let sink = Sink::start(Behaviour::Ok);
    let node = Node::start(&allow(&["localhost", "!127.0.0.0/8", "!::1"]));
    let by_name = format!("http://localhost:{}/named", sink.addr.port());
    let (status, body) = post(&node, &by_name);
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(&node, &sink.uri("/literal"));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("rule \"!127.0.0.0/8\""), "{body}");
    let (status, body) = post(&node, "http://notlocalhost:9/x");
    assert_eq!(status, 400, "a suffix matches whole labels: {body}");
    let pops = sink.wait_for(1, Duration::from_secs(10));
    assert_eq!(pops.len(), 1);
    assert_eq!(pops[0].path, "/named");
}

#[test]
fn a_bad_rule_refuses_the_start() {
    let mut node = Node::spawn_in(
        None,
        "127.0.0.1",
        free_port(),
        &allow(&["10.0.0.0/8", "10.0.0.1/33"]),
        &[],
    );
    let status = node.wait_exit(Duration::from_secs(10)).expect("exits");
    assert_eq!(status.code(), Some(2));
    let log = node.log_text();
    assert!(
        log.contains("[timers] callback-allow rule \"10.0.0.1/33\"") && log.contains("prefix"),
        "{log}"
    );
    // The variable names itself too.
    let mut node = Node::spawn_in(
        None,
        "127.0.0.1",
        free_port(),
        "",
        &[("CHRONOS_TIMERS_CALLBACK_ALLOW", "[\"exa mple\"]")],
    );
    let status = node.wait_exit(Duration::from_secs(10)).expect("exits");
    assert_eq!(status.code(), Some(2));
    let log = node.log_text();
    assert!(
        log.contains("\"exa mple\"") && log.contains("CHRONOS_TIMERS_CALLBACK_ALLOW"),
        "{log}"
    );
}

#[test]
fn a_narrowed_list_refuses_at_connect_time_and_a_bad_one_is_not_taken() {
    let sink = Sink::start(Behaviour::Ok);
    let mut node = Node::start(&allow(&["127.0.0.0/8"]));
    // Accepted while allowed; due in 8 s (room for two reloads and the
    // probes on a loaded machine before they pop).
    let (status, body) = post_in(&node, &sink.uri("/later"), "8");
    assert_eq!(status, 200, "{body}");
    // A reload with a bad rule is refused: the running list stays.
    std::fs::write(node.config_path(), allow(&["!127.0.0.1/8"])).unwrap();
    node.signal(libc::SIGHUP);
    wait_until("the refused reload", Duration::from_secs(10), || {
        let log = node.log_text();
        match log.contains("configuration is invalid") {
            true => Ok(()),
            false => Err(log),
        }
    });
    assert!(node.log_text().contains("\"!127.0.0.1/8\""));
    let (status, body) = post_in(&node, &sink.uri("/still"), "8");
    assert_eq!(status, 200, "the running list still allows it: {body}");
    // Narrowed: the timers already accepted are refused when they pop.
    reload_config(&node, &allow(&["!127.0.0.1", "127.0.0.0/8"]));
    wait_until(
        "the narrowed list on the shard",
        Duration::from_secs(10),
        // A probe accepted before the list changed is due in a minute:
        // it never counts among the refused callbacks below.
        || match post_in(&node, "http://127.0.0.1:9/probe", "60") {
            (400, _) => Ok(()),
            (status, body) => Err(format!("{status} {body}")),
        },
    );
    wait_until(
        "two refused callbacks",
        Duration::from_secs(20),
        || match node.metric("chronos_callbacks_refused_total") {
            n if n >= 2.0 => Ok(()),
            n => Err(format!("{n}")),
        },
    );
    assert!(sink.pops().is_empty(), "{:?}", sink.pops());
    assert_eq!(node.metric("chronos_callbacks_succeeded_total"), 0.0);
    let log = node.log_text();
    assert!(
        log.contains("not sent: callback host 127.0.0.1 (127.0.0.1) is refused by [timers] callback-allow rule \"!127.0.0.1\""),
        "{log}"
    );
    // Rate-limited: one line for both.
    assert_eq!(log.matches("not sent: callback host").count(), 1, "{log}");
    // Removing the key allows everything again.
    reload_config(&node, "[runtime]\ncores = 1\n");
    wait_until(
        "the list removed on the shard",
        Duration::from_secs(10),
        || match post(&node, &sink.uri("/open")) {
            (200, _) => Ok(()),
            (status, body) => Err(format!("{status} {body}")),
        },
    );
    sink.wait_for(1, Duration::from_secs(10));
    // Counted once the node has read the sink's answer.
    wait_until("the callback counted", Duration::from_secs(10), || {
        let n = node.metric("chronos_callbacks_succeeded_total");
        match n == 1.0 {
            true => Ok(()),
            false => Err(format!("{n}")),
        }
    });
    node.kill9();
}

/// `POST /timers` for `uri`, due in `interval` seconds.
fn post_in(node: &Node, uri: &str, interval: &str) -> (u16, String) {
    let r = node.request("POST", "/timers", &timer_body(interval, None, uri, "x"));
    (r.status, r.text())
}

/// The review: an IPv4-mapped range rule (`!::ffff:0:0/96`) made the shard
/// panic on the first POST with an IPv4 callback (debug build): the
/// connection closed with no answer. Now it refuses the callback.
#[test]
fn an_ipv4_mapped_range_rule_refuses_the_ipv4_callbacks_it_covers() {
    let node = Node::start(&allow(&["!::ffff:0:0/96", "0.0.0.0/0"]));
    let (status, body) = post(&node, "http://127.0.0.1:9/cb");
    assert_eq!(status, 400, "{body}\n{}", node.log_text());
    assert!(body.contains("::ffff:0:0/96"), "{body}");
    assert_eq!(node.request("GET", "/ping", "").status, 200);
}

/// The review: the create-time check resolved every callback name on the
/// shard's one blocking thread with no bound, so one client posting names
/// whose DNS never answers (60 of them, 5 s each: `common/slowdns.c`,
/// preloaded) queued minutes of look-ups ahead of everyone else's, and
/// another client's POST to an allowed name was refused as "does not
/// resolve" long after. Now look-ups run on threads of their own, at most
/// 8 per shard (past it `503`), so another client's name is judged as soon
/// as the hanging ones time out (5 s here), not minutes later.
#[test]
fn names_that_never_resolve_hold_up_other_clients_only_briefly() {
    let so = slow_dns();
    let sink = Sink::start(Behaviour::Ok);
    let config = allow(&["localhost", "!0.0.0.0/0"]);
    let node = Node::start_env("127.0.0.1", free_port(), &config, &[("LD_PRELOAD", &so)]);
    let mut refused = Vec::new();
    for round in 0..3 {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..20)
                .map(|i| {
                    let node = &node;
                    s.spawn(move || post(node, &format!("http://slow{round}-{i}.example/cb")))
                })
                .collect();
            for h in handles {
                refused.push(h.join().unwrap());
            }
        });
    }
    for (status, body) in &refused {
        assert!(
            (*status == 400 && body.contains("does not resolve"))
                || (*status == 503 && body.contains("being resolved")),
            "{status} {body}"
        );
    }
    assert!(
        refused.iter().any(|(s, _)| *s == 503),
        "no bound: {refused:?}"
    );
    // Another client's allowed name, never looked up before: accepted as
    // soon as the hanging look-ups end (5 s), well before the 60 queued
    // ones would have (300 s).
    let good = format!("http://localhost:{}/cb", sink.addr.port());
    let started = std::time::Instant::now();
    loop {
        let (status, body) = post(&node, &good);
        if status == 200 {
            break;
        }
        assert!(
            status == 503 && started.elapsed() < Duration::from_secs(20),
            "another client's allowed name after the flood: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `common/slowdns.c` built for LD_PRELOAD (names starting "slow" take 5 s
/// to fail to resolve); its path.
fn slow_dns() -> String {
    let so = std::env::temp_dir().join(format!("chronos-slowdns-{}.so", std::process::id()));
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/common/slowdns.c"
        ))
        .arg("-ldl")
        .status()
        .expect("cc (gcc) builds the resolver stub");
    assert!(built.success(), "cc failed");
    so.to_str().unwrap().to_string()
}

/// The second review: a name that did not resolve took a new look-up
/// (and a look-up slot) every time a client repeated it. It is refused
/// again at once for 5 s now, with the same reason.
#[test]
fn a_name_that_did_not_resolve_is_refused_again_without_a_new_look_up() {
    let so = slow_dns();
    let config = allow(&["localhost", "!0.0.0.0/0"]);
    let node = Node::start_env("127.0.0.1", free_port(), &config, &[("LD_PRELOAD", &so)]);
    let uri = "http://slow-again.example/cb";
    let (status, first) = post(&node, uri);
    assert_eq!(status, 400, "{first}");
    assert!(first.contains("does not resolve"), "{first}");
    let started = std::time::Instant::now();
    let (status, again) = post(&node, uri);
    let took = started.elapsed();
    assert_eq!((status, again.as_str()), (400, first.as_str()));
    // A new look-up would take the callback timeout (1.5 s) again.
    assert!(
        took < Duration::from_millis(1_000),
        "took {took:?}: looked up again"
    );
}
