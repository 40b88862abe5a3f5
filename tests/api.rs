//! The public API and the HTTP layer, against the real binary over loopback.

mod common;
use common::*;
use std::collections::HashSet;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

const CFG: &str = "[runtime]\ncores = 2\n";

#[test]
fn ping_and_unknown_routes() {
    let node = Node::start(CFG);
    let r = node.request("GET", "/ping", "");
    assert_eq!((r.status, r.text().as_str()), (200, "OK"));
    assert_eq!(node.request("GET", "/nothing", "").status, 404);
    let r = node.request("DELETE", "/ping", "");
    assert_eq!(r.status, 405);
    assert!(r.header("Allow").unwrap().contains("GET"));
    // Readiness: every shard is listening (no queue configured). The
    // start waits for one shard's /ping; the others may still be binding.
    wait_until("/ready", std::time::Duration::from_secs(10), || {
        let r = node.request("GET", "/ready", "");
        match (r.status, r.text().as_str()) {
            (200, "ready") => Ok(()),
            (status, text) => Err(format!("{status} {text}")),
        }
    });
    assert_eq!(node.request("POST", "/ready", "").status, 405);
}

#[test]
fn post_returns_unique_ids_in_location() {
    let node = Node::start(CFG);
    let sink = Sink::start(Behaviour::Ok);
    let mut ids = HashSet::new();
    for i in 0..200 {
        let id = node.create(&timer_body("300", None, &sink.uri("/x"), &format!("o{i}")));
        assert!(ids.insert(id), "IDs are unique");
    }
}

#[test]
fn schema_violations_are_400_with_a_reason() {
    let node = Node::start(CFG);
    let table: &[(&str, &str)] = &[
        ("not json at all", "JSON"),
        ("[1]", "object"),
        ("\"text\"", "object"),
        (
            r#"{"callback":{"http":{"uri":"http://127.0.0.1:1/"}}}"#,
            "timing",
        ),
        (
            r#"{"timing":{},"callback":{"http":{"uri":"http://127.0.0.1:1/"}}}"#,
            "interval",
        ),
        (r#"{"timing":{"interval":1}}"#, "callback"),
        (
            r#"{"timing":{"interval":1},"callback":{"sip":{"uri":"sip:a"}}}"#,
            "http",
        ),
        (
            r#"{"timing":{"interval":1},"callback":{"http":{"opaque":"x"}}}"#,
            "uri",
        ),
        (
            r#"{"timing":{"interval":-5},"callback":{"http":{"uri":"http://127.0.0.1:1/"}}}"#,
            "negative",
        ),
        (
            r#"{"timing":{"interval":"ten"},"callback":{"http":{"uri":"http://127.0.0.1:1/"}}}"#,
            "interval",
        ),
        (
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://127.0.0.1:1/"}},"reliability":"two"}"#,
            "reliability",
        ),
        (
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://127.0.0.1:1/"}},"statistics":{"tag-info":[{"type":"A","count":0}]}}"#,
            "count",
        ),
        (
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://127.0.0.1:1/"}},"statistics":{"tag-info":[{"type":"A","count":"3"}]}}"#,
            "count",
        ),
    ];
    for (body, needle) in table {
        for (method, path) in [
            ("POST", "/timers".to_string()),
            ("PUT", format!("/timers/{}", "ab".repeat(16))),
        ] {
            let r = node.request(method, &path, body);
            assert_eq!(r.status, 400, "{method} {body}");
            assert!(
                r.text().to_lowercase().contains(&needle.to_lowercase()),
                "{body}: reason {:?}",
                r.text()
            );
        }
    }
    // The node is unharmed.
    assert_eq!(node.request("GET", "/ping", "").status, 200);
}

#[test]
fn ids_paths_and_methods() {
    let node = Node::start(CFG);
    let sink = Sink::start(Behaviour::Ok);
    let body = timer_body("100", None, &sink.uri("/"), "x");
    for bad in ["abc", "zz".repeat(16).as_str(), "0".repeat(33).as_str(), ""] {
        assert_eq!(
            node.request("PUT", &format!("/timers/{bad}"), &body).status,
            404,
            "PUT {bad:?}"
        );
        assert_eq!(
            node.request("DELETE", &format!("/timers/{bad}"), "").status,
            404,
            "DELETE {bad:?}"
        );
    }
    let id = node.create(&body);
    // A timer is looked up with GET (issue 42); another method is 405.
    let r = node.request("GET", &format!("/timers/{id}"), "");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = node.request("PATCH", &format!("/timers/{id}"), "");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("Allow"), Some("GET, PUT, DELETE"));
    let r = node.request("PATCH", "/timers", "");
    assert_eq!(r.status, 405);
    assert!(r.header("Allow").unwrap().contains("POST"));
    // DELETE is idempotent.
    assert_eq!(
        node.request("DELETE", &format!("/timers/{id}"), "").status,
        200
    );
    assert_eq!(
        node.request("DELETE", &format!("/timers/{id}"), "").status,
        200
    );
    // PUT to an unknown ID creates it, and keeps the unique part.
    let new = "0123456789abcdef0000000000000000";
    let r = node.request("PUT", &format!("/timers/{new}"), &body);
    assert_eq!(r.status, 200);
    assert!(r.location_id().starts_with("0123456789abcdef"));
}

#[test]
fn pipelined_requests_answer_in_order() {
    let node = Node::start(CFG);
    let sink = Sink::start(Behaviour::Ok);
    let body = timer_body("600", None, &sink.uri("/"), "p");
    let mut batch = Vec::new();
    for i in 0..60 {
        match i % 3 {
            0 => batch.extend_from_slice(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"),
            1 => batch.extend_from_slice(
                format!(
                    "POST /timers HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            ),
            _ => batch.extend_from_slice(
                b"DELETE /timers/short HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            ),
        }
    }
    let mut s = TcpStream::connect(node.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&batch).unwrap();
    let mut reader = BufReader::new(s);
    for i in 0..60 {
        let r = read_response(&mut reader).unwrap();
        let want = [200, 200, 404][i % 3];
        assert_eq!(r.status, want, "response {i}");
        if i % 3 == 1 {
            r.location_id();
        }
    }
}

#[test]
fn hostile_input_only_hurts_its_own_connection() {
    let node = Node::start(
        "[runtime]\ncores = 2\n[http]\nbody-bytes-max = 4096\nheader-bytes-max = 2048\n",
    );
    let sink = Sink::start(Behaviour::Ok);
    // A timer set before the abuse must still pop after it.
    let id = node.create(&timer_body("1", None, &sink.uri("/survivor"), "s"));

    let status = |bytes: &[u8]| -> u16 {
        let out = raw_exchange(node.addr, bytes);
        let text = String::from_utf8_lossy(&out).to_string();
        text.split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(status(b"\x16\x03\x01\x02\x00garbage\r\n\r\n"), 400);
    assert_eq!(status(b"GET /ping HTTP/1.1\r\nHost\r\n\r\n"), 400);
    let mut big_header = b"GET /ping HTTP/1.1\r\nX-Big: ".to_vec();
    big_header.extend(std::iter::repeat_n(b'a', 4000));
    big_header.extend_from_slice(b"\r\n\r\n");
    assert_eq!(status(&big_header), 431);
    let mut many = b"GET /ping HTTP/1.1\r\n".to_vec();
    for i in 0..100 {
        many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(status(&many), 431);
    assert_eq!(
        status(b"POST /timers HTTP/1.1\r\nContent-Length: 999999\r\n\r\n{"),
        413
    );
    assert_eq!(
        status(b"POST /timers HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"),
        411
    );
    assert_eq!(
        status(b"POST /timers HTTP/1.1\r\nContent-Length: nope\r\n\r\n"),
        400
    );
    // Error bodies carry a reason.
    let out = String::from_utf8_lossy(&raw_exchange(
        node.addr,
        b"POST /timers HTTP/1.1\r\nContent-Length: 999999\r\n\r\n",
    ))
    .to_string();
    assert!(out.contains("too large"), "{out}");
    // A client that sends half a request and vanishes.
    {
        let mut s = TcpStream::connect(node.addr).unwrap();
        s.write_all(b"POST /timers HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"tim")
            .unwrap();
    }
    assert_eq!(node.request("GET", "/ping", "").status, 200);
    let pops = sink.wait_for(1, Duration::from_secs(5));
    assert_eq!(pops.len(), 1, "timer {id} popped despite the abuse");
    assert_eq!(pops[0].path, "/survivor");
}

#[test]
fn expect_continue_is_honoured() {
    let node = Node::start(CFG);
    let sink = Sink::start(Behaviour::Ok);
    let body = timer_body("100", None, &sink.uri("/"), &"x".repeat(2000));
    let mut s = TcpStream::connect(node.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("POST /timers HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes()).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let interim = read_response(&mut reader).unwrap();
    assert_eq!(interim.status, 100);
    s.write_all(body.as_bytes()).unwrap();
    let r = read_response(&mut reader).unwrap();
    assert_eq!(r.status, 200);
}

#[test]
fn metrics_count_timers_and_tags() {
    let node = Node::start(CFG);
    let sink = Sink::start(Behaviour::Ok);
    let tagged = |count: &str| {
        format!(
            r#"{{"timing":{{"interval":300}},"callback":{{"http":{{"uri":"{}","opaque":"t"}}}},"statistics":{{"tag-info":[{{"type":"CALL","count":{count}}},{{"type":"SUB"}}]}}}}"#,
            sink.uri("/")
        )
    };
    let a = node.create(&tagged("3"));
    node.create(&tagged("2"));
    let r = node.request("GET", "/metrics", "");
    assert_eq!(r.status, 200);
    let text = r.text();
    assert!(text.contains("chronos_tag_count{tag=\"CALL\"} 5"), "{text}");
    assert!(text.contains("chronos_tag_count{tag=\"SUB\"} 2"), "{text}");
    assert!(text.contains("chronos_timers_pending 2"), "{text}");
    node.request("DELETE", &format!("/timers/{a}"), "");
    let text = node.request("GET", "/metrics", "").text();
    assert!(text.contains("chronos_tag_count{tag=\"CALL\"} 2"), "{text}");
    assert!(text.contains("chronos_timers_created_total 2"), "{text}");
}

#[test]
fn sigterm_exits_zero() {
    let node = Node::start(CFG);
    assert_eq!(node.request("GET", "/ping", "").status, 200);
    let status = node.terminate();
    assert!(status.success(), "exit status {status:?}");
}

#[test]
fn reload_and_resync_signals_do_not_stop_the_node() {
    // SIGHUP and SIGUSR1 terminate a process by default; the node must
    // survive them, keep its timers and keep serving.
    let node = Node::start(CFG);
    let sink = Sink::start(Behaviour::Ok);
    node.create(&timer_body("0.5", None, &sink.uri("/s"), "after-signals"));
    node.signal(libc::SIGHUP);
    node.signal(libc::SIGUSR1);
    // A broken file on reload is reported and changes nothing.
    std::fs::write(node.config_path(), "[cluster\n").unwrap();
    node.signal(libc::SIGHUP);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !node.log_text().contains("the configuration is invalid") {
        assert!(std::time::Instant::now() < deadline, "{}", node.log_text());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(node.request("GET", "/ping", "").status, 200);
    let pops = sink.wait_for(1, Duration::from_secs(5));
    assert_eq!(pops.len(), 1);
    assert_eq!(pops[0].body, "after-signals");
    let log = node.log_text();
    assert!(log.contains("SIGHUP") && log.contains("SIGUSR1"), "{log}");
    assert!(node.terminate().success());
}

#[test]
fn invalid_config_fails_before_binding() {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("chronos-badcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = [
        ("[http]\nbind-port = \"x\"\n", "bind-port"),
        ("[runtime]\ncores = 999\n", "cores"),
        ("[cluster]\nnode = [\"not-an-address\"]\n", "cluster"),
        ("[nonsense]\nx = 1\n", "nonsense"),
        // A filter word that is not a level used to silence the whole log.
        ("[log]\nlevel = \"warning\"\n", "not a level"),
    ];
    for (text, needle) in table {
        let path = dir.join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_chronos"))
            .arg("--config")
            .arg(&path)
            .args(["--bind-port", &port.to_string()])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{text}: {err}");
        // Nothing bound.
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
    }
}

#[test]
fn a_port_another_process_listens_on_fails_the_start() {
    // SO_REUSEPORT would otherwise let the second node join the first's
    // listeners and take a share of its connections.
    let first = Node::start(CFG);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_chronos"))
        .args([
            "--bind-port",
            &first.addr.port().to_string(),
            "--cores",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot listen") && err.contains("in use"),
        "{err}"
    );
    // The first node is undisturbed.
    assert_eq!(first.request("GET", "/ping", "").status, 200);
    assert!(first.terminate().success());
}

#[test]
fn resync_get_and_references_follow_the_internal_api() {
    let node = Node::start(CFG);
    let sink = Sink::start(Behaviour::Ok);
    let me = node.addr.to_string();
    let metrics = node.request("GET", "/metrics", "").text();
    assert!(metrics.contains("chronos_timers_pending"));
    // The single-node cluster's view ID (DESIGN: the OR of the bloom filters).
    let view = {
        let c = chronos::cluster::Cluster::single(&me).unwrap();
        c.view_id_string()
    };
    // Two timers held under an old view (as a replication PUT would leave them).
    let old_view_body = |opaque: &str| {
        format!(
            r#"{{"timing":{{"interval":300,"repeat-for":300,"start-time-delta":-5,"sequence-number":0}},"callback":{{"http":{{"uri":"{}","opaque":"{opaque}"}}}},"reliability":{{"cluster-view-id":"1","replicas":["{me}"]}}}}"#,
            sink.uri("/old")
        )
    };
    for (i, id) in [
        "00000000000000aa0000000000000000",
        "00000000000000bb0000000000000000",
    ]
    .iter()
    .enumerate()
    {
        let r = node.request(
            "PUT",
            &format!("/timers/{id}"),
            &old_view_body(&format!("o{i}")),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // A timer under the current view is passed over.
    node.create(&timer_body("300", None, &sink.uri("/new"), "n"));

    let get = |q: &str, range: Option<&str>| {
        let headers: Vec<(&str, &str)> = range.map(|r| vec![("Range", r)]).unwrap_or_default();
        request(node.addr, "GET", &format!("/timers{q}"), &headers, b"")
    };
    assert_eq!(get("", None).status, 400, "missing parameters");
    assert_eq!(get(&format!("?node-for-replicas={me}"), None).status, 400);
    let r = get(
        &format!("?node-for-replicas=10.9.9.9:1&cluster-view-id={view}"),
        None,
    );
    assert_eq!(r.status, 404, "{}", r.text());
    let r = get(
        &format!("?node-for-replicas={me}&cluster-view-id=12345"),
        None,
    );
    assert_eq!(r.status, 400, "{}", r.text());

    let encoded = me.replace(':', "%3A");
    let r = get(
        &format!("?node-for-replicas={encoded}&cluster-view-id={view}"),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let timers = v["timers"].as_array().unwrap();
    assert_eq!(timers.len(), 2, "{v}");
    let t = &timers[0];
    assert_eq!(t["TimerID"].as_str().unwrap().len(), 32);
    assert_eq!(t["OldReplicas"], serde_json::json!([me]));
    assert_eq!(t["Timer"]["timing"]["interval"], 300.0);
    assert_eq!(t["Timer"]["timing"]["sequence-number"], 0);
    assert!(t["Timer"]["timing"]["start-time"].as_u64().is_some());
    assert_eq!(t["Timer"]["callback"]["http"]["uri"], sink.uri("/old"));
    assert_eq!(t["Timer"]["reliability"]["cluster-view-id"], view);
    assert_eq!(
        t["Timer"]["reliability"]["replicas"],
        serde_json::json!([me])
    );

    // Paged: Range 1 gives one timer and 206 with Content-Range.
    let r = get(
        &format!("?node-for-replicas={me}&cluster-view-id={view}"),
        Some("1"),
    );
    assert_eq!(r.status, 206);
    assert_eq!(r.header("Content-Range"), Some("1"));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["timers"].as_array().unwrap().len(), 1);
    // time-from after both timers' pops: nothing left.
    let later_us = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        + 400_000_000)
        .to_string();
    let r = get(
        &format!("?node-for-replicas={me}&cluster-view-id={view}&time-from={later_us}"),
        None,
    );
    assert_eq!((r.status, r.text().as_str()), (200, r#"{"timers":[]}"#));

    // DELETE /timers/references.
    let r = node.request("DELETE", "/timers/references", "{\"nope\":1}");
    assert_eq!(r.status, 400);
    assert!(!r.text().is_empty());
    let r = node.request(
        "DELETE",
        "/timers/references",
        r#"{"IDs":[{"ID":"00000000000000aa0000000000000000","ReplicaIndex":0}]}"#,
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(node.request("PUT", "/timers/references", "{}").status, 405);
}

/// Issue 13: replication bodies carry start times, sequence numbers and
/// versions straight from the network. Extreme ones are refused or stored
/// with saturating arithmetic: no panic (a debug build checks overflow),
/// and the node keeps serving.
#[test]
fn extreme_replication_numbers_never_panic_the_node() {
    let node = Node::start(CFG);
    let me = node.addr.to_string();
    let extremes = [
        ("9223372036854775807", "4294967295", "4294967", "4294967"),
        ("-9223372036854775808", "4294967295", "4294967", "4294967"),
        ("9223372036854775807", "0", "0.001", "4294967"),
        ("-9223372036854775808", "4294967294", "0.001", "4294967"),
        ("0", "4294967295", "1", "4294967"),
    ];
    for (k, (delta, seq, interval, repeat)) in extremes.iter().enumerate() {
        for version in ["0", "18446744073709551615"] {
            let body = format!(
                r#"{{"timing":{{"interval":{interval},"repeat-for":{repeat},"start-time-delta":{delta},"sequence-number":{seq},"version":{version}}},"callback":{{"http":{{"uri":"http://127.0.0.1:9/x","opaque":"o"}}}},"reliability":{{"cluster-view-id":"1","replicas":["{me}"]}}}}"#
            );
            let id = format!(
                "{:016x}{:016x}",
                0x1234_5678_0000_0000u64 + k as u64,
                u64::MAX
            );
            let r = node.request("PUT", &format!("/timers/{id}"), &body);
            assert!(
                r.status == 200 || r.status == 400,
                "{delta} {seq} {interval}: {} {}",
                r.status,
                r.text()
            );
        }
    }
    assert_eq!(node.request("GET", "/ping", "").status, 200);
    let sink = Sink::start(Behaviour::Ok);
    node.create(&timer_body("0.1", None, &sink.uri("/after"), "a"));
    assert_eq!(
        sink.wait_for(1, Duration::from_secs(5)).len(),
        1,
        "still pops"
    );
}

/// Trickle `head` one byte every 100 ms; returns what the server sent and
/// how long after the first byte the connection was closed.
fn trickle(node: &Node, head: &[u8]) -> (String, Duration) {
    trickle_on(TcpStream::connect(node.addr).unwrap(), head)
}

fn trickle_on(mut s: TcpStream, head: &[u8]) -> (String, Duration) {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    for &b in head.iter().cycle().take(200) {
        if s.write_all(&[b]).is_err() {
            break;
        }
        let mut buf = [0u8; 1024];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

/// Issue 13: a slow-loris connection trickling its head (or its body) is
/// closed at `header-timeout-ms` (or `body-timeout-ms`), long before the
/// keep-alive idle timeout, and other clients are served meanwhile.
#[test]
fn a_trickled_head_or_body_is_cut_off_at_its_deadline() {
    let node = Node::start(
        "[runtime]\ncores = 1\n[http]\nheader-timeout-ms = 1000\nbody-timeout-ms = 1500\n",
    );
    let (got, took) = trickle(&node, b"GET /ping HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("header-timeout-ms"), "{got}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    let mut head = b"POST /timers HTTP/1.1\r\nContent-Length: 100000\r\n\r\n".to_vec();
    // The head arrives at once; the body trickles.
    let mut s = TcpStream::connect(node.addr).unwrap();
    s.write_all(&head).unwrap();
    head.clear();
    let (got, took) = trickle_on(s, b"{");
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("body-timeout-ms"), "{got}");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(node.request("GET", "/ping", "").status, 200);
}
