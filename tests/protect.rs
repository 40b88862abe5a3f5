//! Protection (issues 16 and 20) against the real binary: a closed
//! internal API and admin routes (`[cluster] shared-secret`), overload
//! control (`[throttling]`, the reference's token bucket) and per-source
//! connection caps.

mod common;

use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// The system allocator, counting each thread's allocations: the secret
/// check must make none per request.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const SECRET: &str = "s3cret-of-this-cluster-0123456789";

/// `Authorization` values that must open nothing: none, a wrong secret of
/// the same length, the bare secret (no scheme), the secret with more
/// after it.
fn forged_auths() -> [Option<String>; 4] {
    [
        None,
        Some("Bearer wrong-secret-of-the-same-size-012".into()),
        Some(SECRET.into()),
        Some(format!("Bearer {SECRET}0")),
    ]
}

fn headers(auth: &Option<String>) -> Vec<(&str, &str)> {
    auth.as_deref()
        .map(|a| ("Authorization", a))
        .into_iter()
        .collect()
}

/// A request carrying the shared secret, as the project's own tools send it.
fn authed(node: &Node, method: &str, path: &str, body: &str) -> Response {
    let bearer = format!("Bearer {SECRET}");
    request(
        node.addr,
        method,
        path,
        &[("Authorization", &bearer)],
        body.as_bytes(),
    )
}

/// How many of `ids` (by their unique half) `text` shows.
fn shown(text: &str, ids: &[String]) -> usize {
    ids.iter().filter(|id| text.contains(&id[..16])).count()
}

/// With a shared secret, forged replication, cross-site and resync
/// requests to a node that holds timers get 403 and neither add a timer
/// nor reveal one (the same listing with the secret does), while client
/// requests work and the cluster replicates and survives a kill.
#[test]
fn a_shared_secret_closes_the_internal_api_and_the_cluster_still_works() {
    let extra = format!("shared-secret = \"{SECRET}\"\n");
    let mut nodes: Vec<Node> = start_cluster(3, 1, &extra)
        .into_iter()
        .map(|n| n.with_secret(SECRET))
        .collect();
    let port = nodes[0].addr.port();
    let sink = Sink::start(Behaviour::Ok);
    // Seed: client requests need no secret; replication carries it.
    let created = Instant::now();
    let ids: Vec<String> = (0..20)
        .map(|i| nodes[0].create(&timer_body("5", None, &sink.uri(&format!("/t/{i}")), "x")))
        .collect();
    wait_settled(&nodes);
    let live_all = || nodes.iter().map(Node::live_timers).sum::<f64>();
    assert_eq!(live_all(), 40.0, "two replicas of each");
    // What node 1 holds with node 2 as a replica (every view), in one page.
    let listing = format!(
        "/timers?node-for-replicas=127.0.0.2:{port}&cluster-view-id={}&all-views=true",
        view_id(&nodes[0])
    );
    let control = authed(&nodes[0], "GET", &listing, "");
    assert_eq!(control.status, 200, "{}", control.text());
    assert!(shown(&control.text(), &ids) > 0, "{}", control.text());
    let id = "0123456789abcdef0000000000000007";
    let replicas = format!("\"127.0.0.1:{port}\",\"127.0.0.2:{port}\"");
    let new_timer = |reliability: &str| {
        format!(
            r#"{{"timing":{{"interval":1}},"callback":{{"http":{{"uri":"{}","opaque":"x"}}}},"reliability":{reliability}}}"#,
            sink.uri("/forged")
        )
    };
    let forged = [
        (
            "PUT",
            format!("/timers/{id}"),
            new_timer(&format!("{{\"replicas\":[{replicas}]}}")),
        ),
        (
            "PUT",
            format!("/timers/{id}"),
            new_timer(r#"{"sites":["elsewhere"]}"#),
        ),
        ("GET", listing, String::new()),
    ];
    for (method, path, body) in &forged {
        for auth in &forged_auths() {
            let r = request(nodes[0].addr, method, path, &headers(auth), body.as_bytes());
            assert_eq!(r.status, 403, "{method} {path} with {auth:?}: {}", r.text());
            assert!(r.text().contains("shared secret"), "{}", r.text());
            assert_eq!(shown(&r.text(), &ids), 0, "{}", r.text());
        }
    }
    assert_eq!(nodes[0].metric("chronos_internal_refused_total"), 12.0);
    wait_settled(&nodes);
    assert_eq!(live_all(), 40.0, "nothing forged was stored");
    nodes[0].kill9();
    let pops = sink.wait_for(
        20,
        (created + Duration::from_secs(12)).saturating_duration_since(Instant::now()),
    );
    let mut paths: Vec<&str> = pops.iter().map(|p| p.path.as_str()).collect();
    paths.sort_unstable();
    paths.dedup();
    assert_eq!(
        paths.len(),
        20,
        "{} of 20 popped after the kill",
        paths.len()
    );
    assert!(pops.iter().all(|p| !p.path.starts_with("/forged")));
    assert!(!nodes[1].log_text().contains(SECRET) && !nodes[2].log_text().contains(SECRET));
}

/// `Secret::admits` takes exactly `Bearer <secret>` and allocates nothing
/// while it compares.
#[test]
fn the_secret_check_is_exact_and_allocates_nothing() {
    let secret = chronos::config::Secret::new(SECRET);
    let right = format!("Bearer {SECRET}");
    let longer = format!("{right}0");
    let last_differs = format!("{}8", &right[..right.len() - 1]);
    let lower = format!("bearer {SECRET}");
    let cases: [(Option<&[u8]>, bool); 8] = [
        (Some(right.as_bytes()), true),
        (None, false),
        (Some(b""), false),
        (Some(SECRET.as_bytes()), false),
        (Some(&right.as_bytes()[..right.len() - 1]), false),
        (Some(longer.as_bytes()), false),
        (Some(last_differs.as_bytes()), false),
        (Some(lower.as_bytes()), false),
    ];
    let mut admitted = [false; 8];
    let before = ALLOCATIONS.with(Cell::get);
    for (slot, (header, _)) in admitted.iter_mut().zip(cases) {
        *slot = secret.admits(header);
    }
    let allocations = ALLOCATIONS.with(Cell::get) - before;
    assert_eq!(allocations, 0, "allocations for 8 checks");
    assert_eq!(admitted, cases.map(|(_, want)| want));
}

/// `DELETE /timers/references` can only mark timers held under an older
/// view: seed a node, let a second node join (the seeded timers are now
/// old-view, and the joiner is a new replica of each), then forge it for
/// every seeded timer. Nothing is marked (the joiner's listing still shows
/// all of them); the same request with the secret marks what it names.
#[test]
fn a_forged_references_delete_marks_nothing_on_a_node_holding_timers() {
    let port = cluster_port(2);
    let (a, b) = (format!("127.0.0.1:{port}"), format!("127.0.0.2:{port}"));
    let config = |joining: &str| {
        format!("[runtime]\ncores = 1\n[cluster]\nlocalhost = \"{a}\"\nnode = [\"{a}\"]\njoining = [{joining}]\nresync-at-start = false\nshared-secret = \"{SECRET}\"\n")
    };
    let node = Node::start_at("127.0.0.1", port, &config("")).with_secret(SECRET);
    let sink = Sink::start(Behaviour::Ok);
    let body = replicated_body("120", None, &sink.uri("/t"), "x", 2);
    let ids: Vec<String> = (0..10).map(|_| node.create(&body)).collect();
    reload_view(&node, &config(&format!("\"{b}\"")));
    let listing = format!(
        "/timers?node-for-replicas={b}&cluster-view-id={}",
        view_id(&node)
    );
    let listed = || {
        let r = authed(&node, "GET", &listing, "");
        assert_eq!(r.status, 200, "{}", r.text());
        shown(&r.text(), &ids)
    };
    assert_eq!(listed(), 10, "the joiner is told of every seeded timer");
    let references = |ids: &[String]| {
        let entries: Vec<String> = ids
            .iter()
            .map(|id| format!(r#"{{"ID":"{id}","ReplicaIndex":0}}"#))
            .collect();
        format!(r#"{{"IDs":[{}]}}"#, entries.join(","))
    };
    for auth in &forged_auths() {
        let r = request(
            node.addr,
            "DELETE",
            "/timers/references",
            &headers(auth),
            references(&ids).as_bytes(),
        );
        assert_eq!(r.status, 403, "with {auth:?}: {}", r.text());
        assert!(r.text().contains("shared secret"), "{}", r.text());
    }
    assert_eq!(node.metric("chronos_internal_refused_total"), 4.0);
    assert_eq!(node.metric("chronos_resync_references_total"), 0.0);
    assert_eq!(listed(), 10, "a forged DELETE marked nothing");
    assert_eq!(node.live_timers(), 10.0);
    // Control: with the secret it marks the timers it names.
    let r = authed(
        &node,
        "DELETE",
        "/timers/references",
        &references(&ids[..4]),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(node.metric("chronos_resync_references_total"), 4.0);
    assert_eq!(listed(), 6, "the four marked are no longer listed");
}

/// With a shared secret, the admin routes (`/resync`, `/cluster`,
/// `/metrics`) answer 403 with the reason, counted, to a request without
/// it or with another, and do nothing (no resync run starts); with it they
/// work. `/ping` and `/ready` stay open for health checks.
#[test]
fn with_a_shared_secret_the_admin_routes_need_it_and_health_checks_stay_open() {
    let node = Node::start(&format!(
        "[runtime]\ncores = 1\n[cluster]\nresync-at-start = false\nshared-secret = \"{SECRET}\"\n"
    ))
    .with_secret(SECRET);
    let runs = |n: &Node| cluster_json(n)["resync"]["started-runs"].as_u64().unwrap();
    let before = runs(&node);
    let admin = [
        ("POST", "/resync"),
        ("POST", "/resync?all-views=true"),
        ("GET", "/cluster"),
        ("GET", "/metrics"),
    ];
    for (method, path) in admin {
        for auth in &forged_auths() {
            let r = request(node.addr, method, path, &headers(auth), b"");
            let text = r.text();
            assert_eq!(r.status, 403, "{method} {path} with {auth:?}: {text}");
            assert!(text.contains("shared secret"), "{text}");
            assert!(
                !text.contains("instance-id") && !text.contains("chronos_"),
                "{text}"
            );
        }
    }
    assert_eq!(node.metric("chronos_internal_refused_total"), 16.0);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(runs(&node), before, "a forged POST /resync started no run");
    // With the secret: the next run is the first one since.
    let r = authed(&node, "POST", "/resync", "");
    assert_eq!(r.status, 202, "{}", r.text());
    let answer: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(answer["run"].as_u64(), Some(before + 1), "{answer}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster_json(&node)["resync"]["finished-runs"].as_u64() < Some(before + 1) {
        assert!(Instant::now() < deadline, "the run did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = authed(&node, "GET", "/metrics", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("chronos_timers_pending"), "{}", r.text());
    for (method, path) in [("GET", "/ping"), ("HEAD", "/ping"), ("GET", "/ready")] {
        let r = node.request(method, path, "");
        assert_eq!(r.status, 200, "{method} {path}: {}", r.text());
    }
    assert_eq!(node.metric("chronos_internal_refused_total"), 16.0);
}

/// Without a shared secret nothing changes: the admin routes answer
/// without `Authorization` (and ignore one), nothing is refused.
#[test]
fn without_a_shared_secret_the_admin_routes_stay_open() {
    let node = Node::start("[runtime]\ncores = 1\n");
    for auth in [None, Some("Bearer anything-at-all".to_string())] {
        let get = |path: &str| request(node.addr, "GET", path, &headers(&auth), b"");
        let r = get("/cluster");
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().contains("instance-id"), "{}", r.text());
        let r = get("/metrics");
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().contains("chronos_timers_pending"), "{}", r.text());
        assert_eq!(get("/ping").status, 200);
        assert_eq!(get("/ready").status, 200);
        let r = request(node.addr, "POST", "/resync", &headers(&auth), b"");
        assert_eq!(r.status, 202, "{}", r.text());
    }
    assert_eq!(node.metric("chronos_internal_refused_total"), 0.0);
}

/// `chronos resync` takes the secret from the node's config file
/// (`--config`, as the service itself): without it the node refuses it.
#[test]
fn chronos_resync_sends_the_secret_from_the_config() {
    let node = Node::start(&format!(
        "[runtime]\ncores = 1\n[cluster]\nresync-at-start = false\nshared-secret = \"{SECRET}\"\n"
    ));
    let cli = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_chronos"))
            .args(["resync", "--wait", "--address", &node.addr.to_string()])
            .args(extra)
            .env_remove("CHRONOS_CONFIG")
            .output()
            .unwrap()
    };
    let out = cli(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("403"), "{stderr}");
    let config = node.config_path();
    let out = cli(&["--config", config.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("complete"));
}

/// With a low token rate, a flood of `POST`s gets both 200s and 503s with
/// `Retry-After`, no more are admitted than the bucket allows, and the
/// node keeps serving.
#[test]
fn a_flood_beyond_the_token_rate_is_refused_with_503_and_retry_after() {
    let node = Node::start(
        "[runtime]\ncores = 1\n[throttling]\nmax_tokens = 20\ninitial_token_rate = 20\nmin_token_rate = 20\nmax_token_rate = 20\n",
    );
    let sink = Sink::start(Behaviour::Ok);
    let body = timer_body("60", None, &sink.uri("/f"), "x");
    let mut s = std::net::TcpStream::connect(node.addr).unwrap();
    let mut reader = std::io::BufReader::new(s.try_clone().unwrap());
    let started = Instant::now();
    let (mut ok, mut refused) = (0usize, 0usize);
    for _ in 0..300 {
        use std::io::Write;
        let req = format!(
            "POST /timers HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let r = read_response(&mut reader).unwrap();
        match r.status {
            200 => ok += 1,
            503 => {
                assert_eq!(r.header("Retry-After"), Some("1"), "{r:?}");
                assert!(r.text().contains("overloaded"), "{}", r.text());
                refused += 1;
            }
            other => panic!("status {other}: {}", r.text()),
        }
    }
    let bound = 20.0 + 20.0 * started.elapsed().as_secs_f64() + 1.0;
    assert!(ok > 0 && refused > 0, "{ok} admitted, {refused} refused");
    assert!(
        (ok as f64) <= bound,
        "{ok} admitted, the bucket allows {bound:.0}"
    );
    assert_eq!(node.metric("chronos_throttled_total"), refused as f64);
    assert_eq!(node.request("GET", "/ping", "").status, 200);
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        node.request("POST", "/timers", &body).status,
        200,
        "tokens refill"
    );
}

/// One source cannot take every connection slot: beyond
/// `connections-per-source-max` it gets 503; another source still gets in,
/// and a slot freed is taken again.
#[test]
fn connections_per_source_are_capped() {
    use std::io::Write;
    let node = Node::start("[runtime]\ncores = 1\n[http]\nconnections-per-source-max = 4\n");
    let ping = |s: &mut std::net::TcpStream| -> Response {
        s.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        read_response(&mut std::io::BufReader::new(s.try_clone().unwrap())).unwrap()
    };
    let mut held: Vec<std::net::TcpStream> = (0..4)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(node.addr).unwrap();
            assert_eq!(ping(&mut s).status, 200);
            s
        })
        .collect();
    let mut fifth = std::net::TcpStream::connect(node.addr).unwrap();
    let r = ping(&mut fifth);
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.text().contains("connections-per-source-max"),
        "{}",
        r.text()
    );
    // Another source address is not affected.
    let other = connect_from("127.0.0.2", node.addr);
    let mut other = other;
    assert_eq!(ping(&mut other).status, 200);
    // A slot freed by this source is taken again.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = std::net::TcpStream::connect(node.addr).unwrap();
        if ping(&mut s).status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the freed slot was not given back"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
