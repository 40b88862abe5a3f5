//! Protection (issue 16) against the real binary: a closed internal API
//! (`[cluster] shared-secret`), overload control (`[throttling]`, the
//! reference's token bucket) and per-source connection caps.

mod common;

use common::*;
use std::time::{Duration, Instant};

const SECRET: &str = "s3cret-of-this-cluster-0123456789";

fn live(node: &Node) -> f64 {
    node.metric("chronos_timers_pending") - node.metric("chronos_tombstones")
}

/// With a shared secret, forged replication, cross-site and resync
/// requests get 403 and change nothing, while client requests work and
/// the cluster replicates and survives a kill.
#[test]
fn a_shared_secret_closes_the_internal_api_and_the_cluster_still_works() {
    let extra = format!("shared-secret = \"{SECRET}\"\n");
    let mut nodes = start_cluster(3, 1, &extra);
    let port = nodes[0].addr.port();
    let sink = Sink::start(Behaviour::Ok);
    let id = "0123456789abcdef0000000000000007";
    let replicas = format!("\"127.0.0.1:{port}\",\"127.0.0.2:{port}\"");
    let forged = [
        (
            "PUT",
            format!("/timers/{id}"),
            format!(
                r#"{{"timing":{{"interval":1}},"callback":{{"http":{{"uri":"{}","opaque":"x"}}}},"reliability":{{"replicas":[{replicas}]}}}}"#,
                sink.uri("/forged")
            ),
        ),
        (
            "PUT",
            format!("/timers/{id}"),
            format!(
                r#"{{"timing":{{"interval":1}},"callback":{{"http":{{"uri":"{}","opaque":"x"}}}},"reliability":{{"sites":["elsewhere"]}}}}"#,
                sink.uri("/forged")
            ),
        ),
        (
            "GET",
            format!("/timers?node-for-replicas=127.0.0.1:{port}&cluster-view-id=1"),
            String::new(),
        ),
        (
            "DELETE",
            "/timers/references".to_string(),
            format!(r#"{{"IDs":[{{"ID":"{id}","ReplicaIndex":0}}]}}"#),
        ),
    ];
    for (method, path, body) in &forged {
        for auth in [
            None,
            Some("Bearer wrong-secret-of-the-same-size-012"),
            Some(SECRET),
        ] {
            let headers: Vec<(&str, &str)> =
                auth.map(|a| ("Authorization", a)).into_iter().collect();
            let r = request(nodes[0].addr, method, path, &headers, body.as_bytes());
            assert_eq!(r.status, 403, "{method} {path} with {auth:?}: {}", r.text());
        }
    }
    assert_eq!(nodes[0].metric("chronos_internal_refused_total"), 12.0);
    assert_eq!(
        nodes[0].metric("chronos_timers_pending"),
        0.0,
        "nothing forged was stored"
    );
    // Client requests need no secret; replication carries it.
    let created = Instant::now();
    for i in 0..20 {
        nodes[0].create(&timer_body("3", None, &sink.uri(&format!("/t/{i}")), "x"));
    }
    for node in &nodes {
        node.wait_replication_settled(Duration::from_secs(5));
    }
    assert_eq!(
        nodes.iter().map(live).sum::<f64>(),
        40.0,
        "two replicas of each"
    );
    nodes[0].kill9();
    let pops = sink.wait_for(
        20,
        (created + Duration::from_secs(9)).saturating_duration_since(Instant::now()),
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
    let other = socket2_connect_from("127.0.0.2", node.addr);
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

/// A TCP connection to `to` from the local address `from` (port 0).
fn socket2_connect_from(from: &str, to: std::net::SocketAddr) -> std::net::TcpStream {
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert!(fd >= 0);
    let sockaddr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    };
    let local = sockaddr(from.parse().unwrap(), 0);
    let std::net::SocketAddr::V4(to) = to else {
        panic!("IPv4 only")
    };
    let remote = sockaddr(*to.ip(), to.port());
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    unsafe {
        assert_eq!(
            libc::bind(fd, &local as *const _ as *const libc::sockaddr, len),
            0
        );
        assert_eq!(
            libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len),
            0
        );
        std::os::fd::FromRawFd::from_raw_fd(fd)
    }
}
