//! A callback's and a dead letter's bytes on the wire, signed and not,
//! and how each answer (or its absence) reads as an [`Outcome`]: against a
//! one-connection target on a thread, the client on a glommio executor.

use super::*;
use crate::http::client::ClientConfig;
use crate::http::guard::Guard;
use crate::http::sign;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::thread::JoinHandle;

/// Two keys: the specification's example, and 0..=31.
const KEYS: [&str; 2] = [
    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
];
const UNIQUE: u64 = 0x0123_4567_89ab_cdef;
const BLOOM: u64 = 0x0000_0000_0000_0402;
const HEX: &str = "0123456789abcdef0000000000000402";

/// What the target does with the one request it reads.
enum Reply {
    /// Send these bytes, then close.
    Bytes(&'static str),
    /// Close without a byte.
    Close,
    /// Hold the connection open, answering nothing, for this long.
    Hang(Duration),
}

/// A target on a thread: reads one whole request (head and
/// `Content-Length` body), does `reply`, and hands back what it read.
fn target(reply: Reply) -> (String, JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
    let uri = format!("http://{}/cb", listener.local_addr().expect("bound"));
    let handle = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("one connection");
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        while !whole_request(&got) {
            let n = conn.read(&mut chunk).expect("the request arrives");
            assert!(n > 0, "the client closed mid-request: {got:?}");
            got.extend_from_slice(&chunk[..n]);
        }
        match reply {
            Reply::Bytes(b) => conn.write_all(b.as_bytes()).expect("the answer goes"),
            Reply::Close => {}
            Reply::Hang(d) => std::thread::sleep(d),
        }
        String::from_utf8(got).expect("the request is text")
    });
    (uri, handle)
}

/// Whether `got` holds a head and its `Content-Length` body.
fn whole_request(got: &[u8]) -> bool {
    let text = String::from_utf8_lossy(got);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let len = header(head, "content-length").map_or(0, |v| v.parse().expect("a length"));
    body.len() >= len
}

/// A header's value in a request head (the name in any case).
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .filter_map(|l| l.split_once(": "))
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
}

/// The header names of a request, in order (the request line left out).
fn names(request: &str) -> Vec<String> {
    let head = request.split("\r\n\r\n").next().expect("a head");
    head.lines()
        .skip(1)
        .map(|l| l.split(": ").next().expect("a field").to_ascii_lowercase())
        .collect()
}

fn client(timeout_ms: u64) -> Client {
    Client::new(ClientConfig {
        timeout: Duration::from_millis(timeout_ms),
        connect_timeout: Duration::from_millis(timeout_ms),
        per_host_max: 2,
    })
}

fn keys(secrets: &[&str]) -> Option<Arc<SigningKeys>> {
    Some(Arc::new(SigningKeys::parse(secrets).expect("valid keys")))
}

fn key(sequence: u32, attempt: u8) -> CallbackKey {
    CallbackKey {
        unique: UNIQUE,
        bloom: BLOOM,
        version: 1,
        sequence,
        due_ms: 0,
        attempt,
    }
}

/// Send one callback with `c` to a target doing `reply`: its result and
/// the request the target read.
fn call(c: Client, k: CallbackKey, reply: Reply) -> (Result<(), RequestError>, String) {
    let (uri, handle) = target(reply);
    let result = glommio::LocalExecutor::default()
        .run(async move { c.callback(&uri, b"opaque data", k, None).await });
    (result, handle.join().expect("the target thread"))
}

fn letter(last: Outcome) -> DeadLetter {
    DeadLetter {
        unique: UNIQUE,
        bloom: BLOOM,
        sequence: 4,
        attempts: 10,
        last,
    }
}

/// That `request` carries a valid signature by each of `secrets`, and
/// that it is theirs alone: the three headers as the specification has
/// them, over `<id>.<timestamp>.<body>`.
fn assert_signed(request: &str, secrets: &[&str], id: &str) {
    let (head, body) = request.split_once("\r\n\r\n").expect("a request");
    assert_eq!(header(head, "webhook-id"), Some(id), "webhook-id: {head}");
    let ts = header(head, "webhook-timestamp").expect("webhook-timestamp");
    let ts: u64 = ts.parse().expect("Unix seconds");
    let now = clock::unix_ms() / 1000;
    assert!(
        ts <= now && now - ts < 60,
        "the timestamp {ts} is now ({now})"
    );
    let want = sign::sign(
        &SigningKeys::parse(secrets).expect("keys"),
        id,
        ts,
        body.as_bytes(),
    );
    let got = header(head, "webhook-signature").expect("webhook-signature");
    assert_eq!(got, want.signature(), "the signature of {secrets:?}");
    assert_eq!(
        got.split(' ').count(),
        secrets.len(),
        "one v1 signature per key: {got}"
    );
}

#[test]
fn a_callback_without_policy_or_keys_is_todays_request() {
    let (result, request) = call(client(2000), key(7, 0), Reply::Bytes(OK));
    assert!(result.is_ok(), "a 200 delivers: {result:?}");
    assert_eq!(
        names(&request),
        [
            "host",
            "content-type",
            "x-sequence-number",
            "content-length"
        ],
        "no new header: {request}"
    );
    assert!(request.starts_with("POST /cb HTTP/1.1\r\n"), "{request}");
    assert!(request.contains("X-Sequence-Number: 7\r\n"), "{request}");
    assert!(request.ends_with("\r\n\r\nopaque data"), "{request}");
}

const OK: &str = "HTTP/1.1 200 OK\r\nRetry-After: 5\r\nContent-Length: 0\r\n\r\n";

#[test]
fn an_attempt_carries_its_number_and_a_signed_one_every_key() {
    let c = client(2000);
    c.set_signing_keys(keys(&KEYS));
    let (result, request) = call(c, key(3, 2), Reply::Bytes(OK));
    assert!(result.is_ok(), "a 200 delivers: {result:?}");
    assert!(request.contains("X-Chronos-Attempt: 2\r\n"), "{request}");
    assert_signed(&request, &KEYS, &format!("{HEX}-3"));
    // Keys taken away (a reload): unsigned again.
    let c = client(2000);
    c.set_signing_keys(keys(&KEYS));
    c.set_signing_keys(keys(&[]));
    let (_, request) = call(c, key(3, 1), Reply::Bytes(OK));
    assert!(
        !request.contains("webhook-"),
        "no keys, no signature: {request}"
    );
    assert!(request.contains("X-Chronos-Attempt: 1\r\n"), "{request}");
}

#[test]
fn a_refused_answer_reads_as_its_status_and_retry_after() {
    let table: &[(&'static str, Outcome)] = &[
        (
            "HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n",
            Outcome::Status {
                code: 503,
                retry_after_ms: Some(7000),
            },
        ),
        (
            "HTTP/1.1 429 Slow\r\nretry-after:  Thu, 01 Jan 1970 00:00:00 GMT\r\nContent-Length: 0\r\n\r\n",
            Outcome::Status {
                code: 429,
                retry_after_ms: Some(0),
            },
        ),
        (
            "HTTP/1.1 429 Slow\r\nRetry-After: soon\r\nContent-Length: 0\r\n\r\n",
            Outcome::status(429),
        ),
        (
            "HTTP/1.1 404 Gone\r\nContent-Length: 3\r\n\r\nabc",
            Outcome::status(404),
        ),
    ];
    for &(answer, want) in table {
        let (result, _) = call(client(2000), key(1, 1), Reply::Bytes(answer));
        let e = result.expect_err("a non-2xx fails");
        assert_eq!(e.outcome, Some(want), "{answer:?}");
        assert!(e.sent && !e.refused && !e.waited_out, "{answer:?}: {e:?}");
    }
}

#[test]
fn no_answer_is_transport_and_a_slow_one_timeout() {
    let (result, _) = call(client(2000), key(1, 1), Reply::Close);
    let e = result.expect_err("a close with no answer fails");
    assert_eq!(e.outcome, Some(Outcome::Transport), "{e:?}");
    let hang = Reply::Hang(Duration::from_millis(1500));
    let (result, _) = call(client(300), key(1, 1), hang);
    let e = result.expect_err("no answer within the timeout fails");
    assert_eq!(e.outcome, Some(Outcome::Timeout), "{e:?}");
    let garbage = Reply::Bytes("NOT HTTP AT ALL\r\n\r\n");
    let (result, _) = call(client(2000), key(1, 1), garbage);
    let e = result.expect_err("a malformed answer fails");
    assert_eq!(e.outcome, Some(Outcome::Transport), "{e:?}");
}

#[test]
fn a_refused_target_was_not_tried() {
    let c = client(2000);
    let guard = Guard::parse(&["!127.0.0.0/8".to_string()]).expect("a rule");
    c.set_guard(Some(Arc::new(guard)));
    let result = glommio::LocalExecutor::default().run(async move {
        c.callback("http://127.0.0.1:9/cb", b"", key(1, 1), None)
            .await
    });
    let e = result.expect_err("the guard refuses it");
    assert!(e.refused && !e.sent, "{e:?}");
    assert_eq!(e.outcome, None, "nothing was sent: {e:?}");
    // A dead letter is behind the same guard.
    let c = client(2000);
    let guard = Guard::parse(&["!127.0.0.0/8".to_string()]).expect("a rule");
    c.set_guard(Some(Arc::new(guard)));
    let sent = letter(Outcome::Transport);
    let result = glommio::LocalExecutor::default().run(async move {
        c.dead_letter("http://127.0.0.1:9/dl", b"", sent, None)
            .await
    });
    let e = result.expect_err("the guard refuses the dead letter");
    assert!(e.refused && !e.sent && e.outcome.is_none(), "{e:?}");
}

#[test]
fn a_name_that_does_not_resolve_is_transport_unsent() {
    let c = client(500);
    let uri = "http://no-such-host.invalid/cb";
    let result = glommio::LocalExecutor::default()
        .run(async move { c.callback(uri, b"", key(1, 1), None).await });
    let e = result.expect_err("no address, no callback");
    assert!(!e.sent && !e.refused && !e.waited_out, "{e:?}");
    assert_eq!(e.outcome, Some(Outcome::Transport), "{e:?}");
}

#[test]
fn a_dead_letter_names_the_pop_its_attempts_and_last_outcome() {
    let (uri, handle) = target(Reply::Bytes(OK));
    let c = client(2000);
    c.set_signing_keys(keys(&KEYS[1..]));
    let sent = letter(Outcome::status(503));
    let result = glommio::LocalExecutor::default()
        .run(async move { c.dead_letter(&uri, b"opaque data", sent, None).await });
    assert!(result.is_ok(), "a 200 takes it: {result:?}");
    let request = handle.join().expect("the target thread");
    for want in [
        "POST /cb HTTP/1.1\r\n",
        "Content-Type: application/octet-stream\r\n",
        "X-Sequence-Number: 4\r\n",
        &format!("X-Chronos-Timer-Id: {HEX}\r\n"),
        "X-Chronos-Attempt: 10\r\n",
        "X-Chronos-Last-Outcome: 503\r\n",
    ] {
        assert!(request.contains(want), "{want:?} in {request}");
    }
    assert!(request.ends_with("\r\n\r\nopaque data"), "{request}");
    assert_signed(&request, &KEYS[1..], &format!("{HEX}-4"));
}

#[test]
fn a_dead_letter_that_fails_says_how() {
    let (uri, handle) = target(Reply::Bytes("HTTP/1.1 500 No\r\nContent-Length: 0\r\n\r\n"));
    let c = client(2000);
    let result = glommio::LocalExecutor::default().run(async move {
        c.dead_letter(&uri, b"", letter(Outcome::Timeout), None)
            .await
    });
    let e = result.expect_err("a 500 fails");
    assert_eq!(e.outcome, Some(Outcome::status(500)), "{e:?}");
    let request = handle.join().expect("the target thread");
    assert!(
        request.contains("X-Chronos-Last-Outcome: timeout\r\n") && !request.contains("webhook-"),
        "unsigned, the last outcome named: {request}"
    );
}

#[test]
fn the_last_outcome_is_written_as_outcome_displays_it() {
    for outcome in [
        Outcome::Transport,
        Outcome::Timeout,
        Outcome::status(429),
        Outcome::status(0),
        Outcome::Status {
            code: 503,
            retry_after_ms: Some(1),
        },
    ] {
        let mut buf = [0u8; 10];
        let text = outcome_text(&outcome, &mut buf);
        assert_eq!(text, outcome.to_string().as_bytes(), "{outcome:?}");
    }
}
