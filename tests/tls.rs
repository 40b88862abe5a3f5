//! TLS (issue 23): the listener over TLS on both socket drivers, the
//! handshake's deadline, start-up errors for bad files, the certificate's
//! reload on SIGHUP, `https://` callbacks, idle TLS connections closed,
//! and `chronos status` over TLS. Certificates are made by the test (rcgen,
//! `common/tls.rs`) and written to a temporary directory; the client is
//! rustls over std sockets. A cluster over TLS is in `tls_cluster.rs`.

mod common;

use common::tls::*;
use common::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConnection, StreamOwned};
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn timers_are_created_read_replaced_and_deleted_over_tls_on_both_drivers() {
    let pki = Pki::new("crud");
    let (cert, key, _) = pki.issue("node", &["127.0.0.1"]);
    let client = pki.client();
    let sink = Sink::start(Behaviour::Ok);
    for net_ring in [true, false] {
        let node = start_tls(&client, &cert, &key, &format!("net-ring = {net_ring}"));
        let path = format!("/tls-{net_ring}");
        let body = timer_body("0.1", Some("1"), &sink.uri(&path), "x");
        let created = tls_request(node.addr, &client, "POST", "/timers", &body);
        assert_eq!(created.status, 200, "{}", created.text());
        let timer = format!("/timers/{}", created.location_id());
        // Its pops go out to the (plain) sink.
        wait_until("a pop", Duration::from_secs(10), || {
            let n = sink.pops().iter().filter(|p| p.path == path).count();
            if n > 0 {
                Ok(())
            } else {
                Err("none yet".into())
            }
        });
        let long = timer_body("60", None, &sink.uri(&path), "y");
        let put = tls_request(node.addr, &client, "PUT", &timer, &long);
        assert!(
            put.status == 200 || put.status == 204,
            "{} {}",
            put.status,
            put.text()
        );
        let deleted = tls_request(node.addr, &client, "DELETE", &timer, "");
        assert!(
            deleted.status == 200 || deleted.status == 204,
            "{}",
            deleted.status
        );
        // Plain HTTP on the TLS port gets no HTTP answer.
        let raw = raw_exchange(node.addr, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            !raw.starts_with(b"HTTP/1.1"),
            "plain answer on the TLS port: {raw:?}"
        );
        assert!(tls_metric(node.addr, &client, "chronos_tls_handshakes_failed") >= 1.0);
        node.terminate();
    }
}

#[test]
fn a_handshake_that_does_not_finish_is_closed_within_the_header_timeout() {
    let pki = Pki::new("slow");
    let (cert, key, _) = pki.issue("node", &["127.0.0.1"]);
    let client = pki.client();
    let node = start_tls(&client, &cert, &key, "header-timeout-ms = 500");
    // Five bytes of a record header, then nothing.
    let mut s = TcpStream::connect(node.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    // End of stream (or a reset) is the close; bytes would be an answer.
    let n = s.read(&mut buf).unwrap_or(0);
    let took = started.elapsed();
    assert_eq!(n, 0, "the server sent {:?}", &buf[..n]);
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(5),
        "closed after {took:?}"
    );
    assert!(tls_metric(node.addr, &client, "chronos_tls_handshakes_failed") >= 1.0);
    // A client that trusts another CA is refused by its own verifier; the
    // node is not hurt and still serves the trusting client.
    let other = Pki::new("slow-other").client();
    assert!(tls_try(node.addr, &other, "GET", "/ping", "").is_err());
    assert_eq!(
        tls_request(node.addr, &client, "GET", "/ping", "").status,
        200
    );
}

#[test]
fn bad_tls_files_fail_the_start_naming_the_key_and_file() {
    let pki = Pki::new("bad");
    let (cert, key, _) = pki.issue("node", &["127.0.0.1"]);
    let (_, other_key, _) = pki.issue("other", &["127.0.0.1"]);
    let garbage = pki.dir.join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let garbage = garbage.display().to_string();
    let missing = pki.dir.join("missing.pem").display().to_string();
    let cases = [
        (
            format!("tls-certificate = {missing:?}\ntls-private-key = {key:?}"),
            "[http] tls-certificate",
            missing.clone(),
        ),
        (
            format!("tls-certificate = {garbage:?}\ntls-private-key = {key:?}"),
            "[http] tls-certificate",
            garbage.clone(),
        ),
        (
            format!("tls-certificate = {cert:?}\ntls-private-key = {garbage:?}"),
            "[http] tls-private-key",
            garbage.clone(),
        ),
        (
            format!("tls-certificate = {cert:?}\ntls-private-key = {other_key:?}"),
            "do not go together",
            other_key.clone(),
        ),
        (
            format!("tls-certificate = {cert:?}"),
            "without tls-private-key",
            String::new(),
        ),
    ];
    for (http, wanted, file) in cases {
        let mut node = Node::spawn_in(
            None,
            "127.0.0.1",
            free_port(),
            &format!("[http]\n{http}\n"),
            &[],
        );
        let status = node
            .wait_exit(Duration::from_secs(20))
            .expect("the start fails");
        let log = node.log_text();
        assert_eq!(status.code(), Some(2), "{http}: {log}");
        assert!(
            log.contains(wanted) && log.contains(&file),
            "{http}: wanted {wanted:?} and {file:?} in:\n{log}"
        );
    }
}

#[test]
fn sighup_serves_a_new_certificate_and_keeps_the_old_one_when_the_new_is_bad() {
    let pki = Pki::new("reload");
    let (cert, key, first) = pki.issue("node", &["127.0.0.1"]);
    let client = pki.client();
    let node = start_tls(&client, &cert, &key, "");
    let (_, leaf) = tls_try(node.addr, &client, "GET", "/ping", "").unwrap();
    assert_eq!(leaf, first);
    // A new certificate in the same files: the next connection gets it.
    let (_, _, second) = pki.issue("node", &["127.0.0.1"]);
    assert_ne!(first, second);
    node.signal(libc::SIGHUP);
    // A fresh client each time: a resumed session shows no certificate.
    wait_until(
        "the new certificate served",
        Duration::from_secs(10),
        || {
            let (_, leaf) =
                tls_try(node.addr, &pki.client(), "GET", "/ping", "").map_err(|e| e.to_string())?;
            if leaf == second {
                Ok(())
            } else {
                Err("the old certificate".into())
            }
        },
    );
    // A bad one is refused, logged, and the current one stays.
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    node.signal(libc::SIGHUP);
    wait_until("the refusal logged", Duration::from_secs(10), || {
        if node
            .log_text()
            .contains("TLS certificate refused, keeping the current one")
        {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    let (r, leaf) = tls_try(node.addr, &pki.client(), "GET", "/ping", "").unwrap();
    assert_eq!((r.status, leaf == second), (200, true));
}

/// What an HTTPS callback target saw: each request's path, sequence
/// number, and whether its connection resumed an earlier TLS session.
#[derive(Clone, Debug)]
struct TlsPop {
    path: String,
    sequence: u32,
    resumed: bool,
}

/// A small HTTPS callback target: rustls on std threads, one per connection.
struct TlsSink {
    addr: SocketAddr,
    pops: Arc<std::sync::Mutex<Vec<TlsPop>>>,
    handshakes: Arc<std::sync::atomic::AtomicUsize>,
}

impl TlsSink {
    /// Serve with `cert`/`key`; `close`: answer `Connection: close` and
    /// close after each request (so every callback needs a new connection).
    fn start(cert: &str, key: &str, close: bool) -> TlsSink {
        let chain = CertificateDer::pem_file_iter(cert)
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let pops: Arc<std::sync::Mutex<Vec<TlsPop>>> = Default::default();
        let handshakes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (p, h) = (pops.clone(), handshakes.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (config, p, h) = (config.clone(), p.clone(), h.clone());
                std::thread::spawn(move || serve_tls_sink(stream, config, p, h, close));
            }
        });
        TlsSink {
            addr,
            pops,
            handshakes,
        }
    }

    fn uri(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    /// Wait for `n` pops from `node` (its log shown on failure).
    fn wait_for(&self, node: &Node, n: usize, timeout: Duration) -> Vec<TlsPop> {
        wait_until(&format!("{n} HTTPS pops"), timeout, || {
            let pops = self.pops.lock().unwrap().clone();
            if pops.len() >= n {
                Ok(pops)
            } else {
                Err(format!("{} so far; log:\n{}", pops.len(), node.log_text()))
            }
        })
    }
}

fn serve_tls_sink(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
    pops: Arc<std::sync::Mutex<Vec<TlsPop>>>,
    handshakes: Arc<std::sync::atomic::AtomicUsize>,
    close: bool,
) {
    let conn = rustls::ServerConnection::new(config).unwrap();
    let mut reader = BufReader::new(StreamOwned::new(conn, stream));
    let mut counted = false;
    while let Some((path, headers, _body)) = read_request(&mut reader) {
        let tls = reader.get_mut();
        if !counted {
            handshakes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            counted = true;
        }
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        pops.lock().unwrap().push(TlsPop {
            path,
            sequence: header("x-sequence-number")
                .and_then(|v| v.parse().ok())
                .unwrap_or(u32::MAX),
            resumed: tls.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
        });
        let answer: &[u8] = if close {
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        } else {
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        };
        if tls.write_all(answer).and_then(|_| tls.flush()).is_err() {
            return;
        }
        if close {
            tls.conn.send_close_notify();
            let _ = tls.flush();
            return;
        }
    }
}

/// A plain node whose callbacks trust `pki`'s CA, logging every failed
/// callback (debug) with its reason.
fn start_trusting(pki: &Pki) -> Node {
    let ca = pki.ca_path();
    let config = format!("[timers]\ncallback-ca-file = {ca:?}\n");
    let env = [("RUST_LOG", "info,chronos::callback=debug")];
    Node::start_env("127.0.0.1", free_port(), &config, &env)
}

#[test]
fn https_callbacks_arrive_in_order_with_their_sequence_numbers() {
    let pki = Pki::new("cb");
    let (cert, key, _) = pki.issue("target", &["127.0.0.1"]);
    let sink = TlsSink::start(&cert, &key, false);
    let node = start_trusting(&pki);
    node.create(&timer_body("0.05", Some("0.49"), &sink.uri("/cb"), "x"));
    let pops = sink.wait_for(&node, 9, Duration::from_secs(10));
    let seqs: Vec<u32> = pops.iter().map(|p| p.sequence).collect();
    assert_eq!(&seqs[..9], &(1..=9).collect::<Vec<u32>>()[..], "{pops:?}");
    assert!(pops.iter().all(|p| p.path == "/cb"));
    // Kept alive: far fewer handshakes than pops.
    let handshakes = sink.handshakes.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        handshakes <= 2,
        "{handshakes} handshakes for {} pops",
        pops.len()
    );
    wait_until("callbacks counted", Duration::from_secs(5), || {
        let ok = node.metric("chronos_callbacks_succeeded_total");
        if ok >= 9.0 {
            Ok(())
        } else {
            Err(format!("{ok}"))
        }
    });
}

#[test]
fn a_second_https_connection_resumes_the_first_ones_session() {
    let pki = Pki::new("resume");
    let (cert, key, _) = pki.issue("target", &["127.0.0.1"]);
    let sink = TlsSink::start(&cert, &key, true);
    // One core: one client, one session store.
    let ca = pki.ca_path();
    let node = Node::start(&format!(
        "[runtime]\ncores = 1\n[timers]\ncallback-ca-file = {ca:?}\n"
    ));
    node.create(&timer_body("0.1", Some("0.35"), &sink.uri("/r"), "x"));
    let pops = sink.wait_for(&node, 3, Duration::from_secs(10));
    assert!(
        !pops[0].resumed,
        "the first connection is a full handshake: {pops:?}"
    );
    assert!(
        pops[1..].iter().any(|p| p.resumed),
        "no later connection resumed: {pops:?}"
    );
}

#[test]
fn an_https_target_with_a_certificate_from_another_ca_fails_its_callbacks_with_the_reason() {
    let trusted = Pki::new("trusted");
    let other = Pki::new("untrusted");
    let (cert, key, _) = other.issue("target", &["127.0.0.1"]);
    let sink = TlsSink::start(&cert, &key, false);
    let node = start_trusting(&trusted);
    node.create(&timer_body("0.05", Some("1"), &sink.uri("/x"), "x"));
    wait_until("a failed callback", Duration::from_secs(10), || {
        let failed = node.metric("chronos_callbacks_failed_total");
        if failed >= 1.0 {
            Ok(())
        } else {
            Err(format!("{failed}"))
        }
    });
    wait_until("the reason logged", Duration::from_secs(10), || {
        let log = node.log_text();
        if log.contains("TLS handshake with 127.0.0.1") && log.contains("UnknownIssuer") {
            Ok(())
        } else {
            Err(log)
        }
    });
    assert!(
        sink.pops.lock().unwrap().is_empty(),
        "nothing reached the untrusted target"
    );
    // A name the certificate does not carry fails too (IP SAN 127.0.0.1 only).
    let (cert2, key2, _) = trusted.issue("elsewhere", &["127.0.0.9"]);
    let wrong = TlsSink::start(&cert2, &key2, false);
    node.create(&timer_body("0.05", Some("1"), &wrong.uri("/y"), "y"));
    wait_until("the name mismatch logged", Duration::from_secs(15), || {
        let log = node.log_text();
        if log.contains("not valid for name") {
            Ok(())
        } else {
            Err(log)
        }
    });
    assert!(wrong.pops.lock().unwrap().is_empty());
}

/// The second review: a TLS client that sends records carrying no plaintext (TLS
/// 1.3 KeyUpdates) between requests is, to the server, a connection in
/// the idle phase forever: each record is a read that returns, so the
/// per-read idle timeout restarts, and no request head ever starts the
/// header deadline. A plain connection cannot do this (its first byte
/// starts the header timeout). Expected: closed within about
/// idle-timeout-ms of the last request, as a silent connection is.
fn idle_close(key_updates: bool) -> (Option<Duration>, usize) {
    let pki = Pki::new(if key_updates {
        "keyupdate"
    } else {
        "keyupdate-control"
    });
    let (cert, key, _) = pki.issue("node", &["127.0.0.1"]);
    let client = pki.client();
    let node = start_tls(&client, &cert, &key, "idle-timeout-ms = 1000");
    let sock = TcpStream::connect(node.addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let name = ServerName::IpAddress(node.addr.ip().into());
    let conn = ClientConnection::new(client.clone(), name).unwrap();
    let mut tls = StreamOwned::new(conn, sock);
    let req = format!("GET /ping HTTP/1.1\r\nHost: {}\r\n\r\n", node.addr);
    tls.write_all(req.as_bytes()).unwrap();
    let started = Instant::now();
    let mut updates = 0;
    let mut buf = [0u8; 4096];
    while started.elapsed() < Duration::from_secs(6) {
        // A KeyUpdate: a record, but no plaintext for the server.
        if key_updates && tls.conn.refresh_traffic_keys().is_ok() {
            updates += 1;
            let _ = tls.conn.write_tls(&mut tls.sock);
        }
        match tls.sock.read(&mut buf) {
            Ok(0) => return (Some(started.elapsed()), updates),
            Ok(n) => {
                let mut slice = &buf[..n];
                let _ = tls.conn.read_tls(&mut slice);
                if tls.conn.process_new_packets().is_err() {
                    return (Some(started.elapsed()), updates);
                }
                let _ = tls.conn.reader().read(&mut [0u8; 4096]);
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return (Some(started.elapsed()), updates),
        }
        std::thread::sleep(Duration::from_millis(400));
    }
    (None, updates)
}

/// The second review: the control: a silent TLS connection is closed at about
/// idle-timeout-ms (so the next test's loop can see a close).
#[test]
fn a_silent_tls_connection_is_closed_at_the_idle_timeout() {
    let (closed, _) = idle_close(false);
    let closed = closed.expect("still open after 6 s with idle-timeout-ms = 1000");
    assert!(closed < Duration::from_secs(3), "closed after {closed:?}");
}

/// The second review: a TLS client that sends records carrying no plaintext (TLS
/// 1.3 KeyUpdates, every 400 ms) between requests is, to the server, a
/// connection in the idle phase forever: each record is a read that
/// returns, so the per-read idle timeout restarts, and no request head
/// ever starts the header deadline. A plain connection cannot do this
/// (its first byte starts the header timeout). Expected: closed within
/// about idle-timeout-ms of the last request, as a silent one is.
#[test]
fn key_updates_do_not_keep_an_idle_tls_connection_open() {
    let (closed, updates) = idle_close(true);
    let closed = closed.unwrap_or_else(|| {
        panic!("still open after 6 s with idle-timeout-ms = 1000 ({updates} KeyUpdates sent)")
    });
    assert!(closed < Duration::from_secs(3), "closed after {closed:?}");
}

/// The second review: `chronos status` and `chronos resync` spoke plain
/// HTTP only, so against a node whose listener speaks TLS they sent the
/// shared secret in clear (and then failed). With the node's config they
/// now go over TLS, verified against `[cluster] tls-ca-file`.
#[test]
fn status_reaches_a_tls_node_over_tls_with_its_secret() {
    let pki = Pki::new("cli");
    let port = cluster_port(1);
    let secret = "cli-over-tls-secret-0123456789";
    let config = tls_node_config(&pki, &pki, 1, 1, port, false).replace(
        "[cluster]\n",
        &format!("[cluster]\nshared-secret = {secret:?}\n"),
    );
    let node = start_tls_at(&pki.client(), "127.0.0.1", port, &config, &[]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_chronos"))
        .args(["status", "--node", &node.addr.to_string(), "--config"])
        .arg(node.config_path())
        .env_remove("CHRONOS_CLUSTER_SHARED_SECRET")
        .env_remove("CHRONOS_CONFIG")
        .output()
        .expect("chronos status");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains(&node.addr.to_string()), "{stdout}");
}
