//! Issue 41, signed callbacks: the headers chronos makes
//! (`chronos::http::sign`) verified by the Standard Webhooks specification's
//! own Python library (`standardwebhooks` on PyPI), as a callback target
//! would verify them: a current key, a rotated key set checked with either
//! key, a key not in the set, a tampered body, and a timestamp older than
//! the library's 5 minutes, which it refuses.
//!
//! Then a running node, as a target sees it: configured with two keys it
//! signs each callback with both (`webhook-id` the timer ID and the
//! sequence, one per pop of a repeating timer); a SIGHUP that changes the
//! keys signs the next callback with the new key alone, one that drops
//! them sends it unsigned, and one with a bad key is refused (the running
//! keys stay); a bad key at start is refused by its place, never quoted.
//!
//! The library is a test need (`bash .ci/run` installs it): without it the
//! test fails and names the install step; it never skips itself.

mod common;

use chronos::http::sign::{sign, MessageId, SigningKeys};
use common::{reload_config, timer_body, wait_until, Behaviour, Node, Pop, Sink};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The version `.ci/run` installs.
const INSTALL: &str = "pip install standardwebhooks==1.1.0 (bash .ci/run installs it)";

/// The specification's example secret, and two more 32-byte keys.
const KEY_A: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const KEY_B: &str = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const KEY_C: &str = "whsec_8J+Vsg8J+Vsg8J+Vsg8J+Vsg8J+Vsg8J+Vsg8J+Vsg";

/// Reads cases (a JSON list of `[secret, body, headers]`) on stdin, prints
/// one line per case: `ok`, or `refused: <the library's reason>`.
const VERIFIER: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
for secret, body, headers in json.load(sys.stdin):
    try:
        Webhook(secret).verify(body, headers, json_parse=False)
        print("ok")
    except WebhookVerificationError as e:
        print("refused: %s" % e)
"#;

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// One case: the secret the target verifies with, the body it got, and
/// the headers chronos signed the body sent with.
struct Case {
    verify_with: &'static str,
    body: &'static str,
    signed: chronos::http::sign::Headers,
}

fn signed(
    keys: &[&str],
    sequence: u32,
    timestamp_s: u64,
    body: &str,
) -> chronos::http::sign::Headers {
    let keys = SigningKeys::parse(keys).expect("valid keys");
    let id = MessageId {
        timer_id: "0000000000000001000000000000002a",
        sequence,
    };
    sign(&keys, id, timestamp_s, body.as_bytes())
}

/// Each case's verdict from the Python library, in order.
fn verify(cases: &[Case]) -> Vec<String> {
    let input: Vec<serde_json::Value> = cases
        .iter()
        .map(|c| {
            let headers: serde_json::Map<String, serde_json::Value> = c
                .signed
                .pairs()
                .iter()
                .map(|(name, value)| {
                    let value = String::from_utf8(value.to_vec()).expect("ASCII header");
                    (name.to_string(), serde_json::Value::String(value))
                })
                .collect();
            serde_json::json!([c.verify_with, c.body, headers])
        })
        .collect();
    verdicts(&input)
}

/// The Python library's verdict on each `[secret, body, headers]`, in
/// order: `ok`, or `refused: <why>`.
fn verdicts(input: &[serde_json::Value]) -> Vec<String> {
    let found = Command::new("python3")
        .args(["-c", "import standardwebhooks"])
        .output()
        .unwrap_or_else(|e| panic!("python3 is needed to run {INSTALL}: {e}"));
    assert!(
        found.status.success(),
        "the Python package standardwebhooks is missing: {INSTALL}\n{}",
        String::from_utf8_lossy(&found.stderr)
    );
    // One file per call: the tests run on parallel threads.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let name = format!("chronos-signing-{}-{call}.py", std::process::id());
    let script = std::env::temp_dir().join(name);
    std::fs::write(&script, VERIFIER).expect("write the verifier script");
    let mut child = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python3");
    let stdin = child.stdin.as_mut().expect("piped stdin");
    stdin
        .write_all(serde_json::to_string(input).unwrap().as_bytes())
        .expect("write the cases");
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("python3 runs");
    let _ = std::fs::remove_file(&script);
    assert!(
        out.status.success(),
        "the verifier failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("UTF-8 verdicts")
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn standardwebhooks_verifies_what_chronos_signs() {
    let now = now_s();
    let body = r#"{"opaque": "tick \u00e9 ✓", "n": 1}"#;
    let cases = [
        // A target with the one key.
        Case {
            verify_with: KEY_A,
            body,
            signed: signed(&[KEY_A], 1, now, body),
        },
        // A target that knows only the new key, mid-rotation.
        Case {
            verify_with: KEY_B,
            body,
            signed: signed(&[KEY_A, KEY_B], 2, now, body),
        },
        // A target that still has the old key, mid-rotation.
        Case {
            verify_with: KEY_A,
            body,
            signed: signed(&[KEY_A, KEY_B], 2, now, body),
        },
        // The secret without its prefix is the same key.
        Case {
            verify_with: "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            body: "",
            signed: signed(&[KEY_A], 3, now, ""),
        },
    ];
    let verdicts = verify(&cases);
    assert_eq!(verdicts, ["ok"; 4], "every case verifies");
}

#[test]
fn standardwebhooks_refuses_what_it_must() {
    let now = now_s();
    let body = "opaque data";
    let cases = [
        // Signed 10 minutes ago: the library allows 5.
        Case {
            verify_with: KEY_A,
            body,
            signed: signed(&[KEY_A], 1, now - 600, body),
        },
        // A key not in the set (the old one dropped after a rotation).
        Case {
            verify_with: KEY_A,
            body,
            signed: signed(&[KEY_B, KEY_C], 1, now, body),
        },
        // The body changed on the way.
        Case {
            verify_with: KEY_A,
            body: "opaque datA",
            signed: signed(&[KEY_A], 1, now, body),
        },
    ];
    let verdicts = verify(&cases);
    assert_eq!(verdicts.len(), 3, "{verdicts:?}");
    assert_eq!(verdicts[0], "refused: Message timestamp too old");
    assert_eq!(verdicts[1], "refused: No matching signature found");
    assert_eq!(verdicts[2], "refused: No matching signature found");
}

#[test]
fn every_attempt_of_one_pop_has_one_id_and_its_own_timestamp() {
    let now = now_s();
    let first = signed(&[KEY_A], 7, now - 2, "x");
    let retry = signed(&[KEY_A], 7, now, "x");
    let next_pop = signed(&[KEY_A], 8, now, "x");
    assert_eq!(first.id(), retry.id(), "a target deduplicates by the ID");
    assert_ne!(first.timestamp(), retry.timestamp());
    assert_ne!(first.signature(), retry.signature());
    assert_ne!(
        retry.id(),
        next_pop.id(),
        "each sequence is its own message"
    );
    let cases = [first, retry, next_pop].map(|signed| Case {
        verify_with: KEY_A,
        body: "x",
        signed,
    });
    assert_eq!(verify(&cases), ["ok"; 3]);
}

/// A node's config: one shard, and these signing keys (none: the key left
/// out).
fn keyed(keys: &[&str]) -> String {
    let list: Vec<String> = keys.iter().map(|k| format!("{k:?}")).collect();
    match keys {
        [] => "[runtime]\ncores = 1\n".to_string(),
        _ => format!(
            "[runtime]\ncores = 1\n[timers]\ncallback-signing-keys = [{}]\n",
            list.join(", ")
        ),
    }
}

/// The pops that came to `path`, once there are `n` (within 10 s).
fn pops_to(sink: &Sink, path: &str, n: usize) -> Vec<Pop> {
    wait_until(
        &format!("{n} callbacks to {path}"),
        Duration::from_secs(10),
        || {
            let pops: Vec<Pop> = sink.pops().into_iter().filter(|p| p.path == path).collect();
            match pops.len() >= n {
                true => Ok(pops),
                false => Err(format!("{} so far: {pops:?}", pops.len())),
            }
        },
    )
}

/// The library's verdict on `pop` for each of `secrets`, as a target
/// holding that one key would verify it.
fn verify_pop(pop: &Pop, secrets: &[&str]) -> Vec<String> {
    let headers: serde_json::Map<String, serde_json::Value> = pop
        .headers
        .iter()
        .filter(|(name, _)| name.starts_with("webhook-"))
        .map(|(n, v)| (n.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let input: Vec<serde_json::Value> = secrets
        .iter()
        .map(|secret| serde_json::json!([secret, pop.body, headers]))
        .collect();
    verdicts(&input)
}

/// One timer to `sink`'s `path`, due at once; its ID and its one pop.
fn one_pop(node: &Node, sink: &Sink, path: &str) -> (String, Pop) {
    let id = node.create(&timer_body("0.05", None, &sink.uri(path), "opaque data"));
    let pop = pops_to(sink, path, 1).remove(0);
    assert_eq!(pop.body, "opaque data", "the body is the opaque data");
    (id, pop)
}

const REFUSED: &str = "refused: No matching signature found";

#[test]
fn a_node_signs_with_every_key_and_a_reload_rotates_them() {
    let sink = Sink::start(Behaviour::Ok);
    let node = Node::start(&keyed(&[KEY_A, KEY_B]));
    let (id, pop) = one_pop(&node, &sink, "/two-keys");
    let want_id = format!("{id}-{}", pop.sequence);
    assert_eq!(pop.header("webhook-id"), Some(want_id.as_str()), "{pop:?}");
    let signatures = pop.header("webhook-signature").expect("signed");
    assert_eq!(signatures.split(' ').count(), 2, "one per key: {pop:?}");
    assert_eq!(
        verify_pop(&pop, &[KEY_A, KEY_B, KEY_C]),
        ["ok", "ok", REFUSED],
        "a target with either key takes it, one with another refuses it"
    );
    assert_eq!(
        pop.header("x-chronos-attempt"),
        None,
        "no policy, no attempt"
    );
    // A rotation: the old keys dropped, the new one alone.
    reload_config(&node, &keyed(&[KEY_C]));
    let (id, pop) = one_pop(&node, &sink, "/rotated");
    let want_id = format!("{id}-{}", pop.sequence);
    assert_eq!(pop.header("webhook-id"), Some(want_id.as_str()), "{pop:?}");
    assert_eq!(
        verify_pop(&pop, &[KEY_A, KEY_B, KEY_C]),
        [REFUSED, REFUSED, "ok"],
        "after the reload, the new key alone signs"
    );
    // The keys taken out: unsigned, as before the feature.
    reload_config(&node, &keyed(&[]));
    let (_, pop) = one_pop(&node, &sink, "/unsigned");
    let webhook: Vec<_> = pop
        .headers
        .iter()
        .filter(|(n, _)| n.starts_with("webhook-"))
        .collect();
    assert!(webhook.is_empty(), "no keys, no signature: {pop:?}");
}

#[test]
fn a_repeating_timers_pops_are_each_their_own_message() {
    let sink = Sink::start(Behaviour::Ok);
    let node = Node::start(&keyed(&[KEY_B]));
    let uri = sink.uri("/repeating");
    let id = node.create(&timer_body("0.2", Some("0.6"), &uri, "tick"));
    let pops = pops_to(&sink, "/repeating", 3);
    let ids: Vec<&str> = pops.iter().filter_map(|p| p.header("webhook-id")).collect();
    let want: Vec<String> = pops
        .iter()
        .map(|p| format!("{id}-{}", p.sequence))
        .collect();
    assert_eq!(
        ids, want,
        "each pop's webhook-id is the timer and its sequence"
    );
    let distinct: std::collections::BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), pops.len(), "distinct ids: {ids:?}");
    for pop in &pops {
        assert_eq!(verify_pop(pop, &[KEY_B]), ["ok"], "{pop:?}");
    }
}

#[test]
fn a_bad_key_is_refused_by_its_place_and_never_quoted() {
    const BAD: &str = "whsec_c2hvcnQ=";
    // At start: the node does not run.
    let port = common::free_port();
    let mut node = Node::spawn_in(None, "127.0.0.1", port, &keyed(&[KEY_A, BAD]), &[]);
    let status = node.wait_exit(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| !s.success()),
        "a bad key stops the start"
    );
    let log = node.log_text();
    assert!(
        log.contains("[timers] callback-signing-keys: signing key 1: 5 bytes once decoded"),
        "the key is named by its place: {log}"
    );
    assert!(!log.contains("c2hvcnQ"), "never the key's text: {log}");
    // At a reload: refused, and the running key still signs.
    let sink = Sink::start(Behaviour::Ok);
    let node = Node::start(&keyed(&[KEY_A]));
    std::fs::write(node.config_path(), keyed(&[BAD])).expect("rewrite the config");
    node.signal(libc::SIGHUP);
    let log = wait_until("the refused reload", Duration::from_secs(10), || {
        let log = node.log_text();
        match log.contains("keeping the current one") {
            true => Ok(log),
            false => Err(log),
        }
    });
    assert!(log.contains("signing key 0"), "named by its place: {log}");
    assert!(!log.contains("c2hvcnQ"), "never the key's text: {log}");
    let (_, pop) = one_pop(&node, &sink, "/kept");
    assert_eq!(verify_pop(&pop, &[KEY_A]), ["ok"], "the running key stays");
}

/// A pop with a delivery policy: each attempt is signed afresh (its own
/// `webhook-timestamp`, the time it is sent, so a target that refuses an
/// old timestamp takes the retry), with the pop's one `webhook-id`.
#[test]
fn each_retry_is_signed_with_its_own_timestamp_and_the_pops_id() {
    let sink = Sink::start(Behaviour::FailFirst);
    let node = Node::start(&keyed(&[KEY_A]));
    let body = format!(
        r#"{{"timing":{{"interval":0.05}},"callback":{{"http":{{"uri":"{}","opaque":"retried"}},"retry":{{"attempts":3,"initial-delay":1.2,"jitter":0}}}}}}"#,
        sink.uri("/retried")
    );
    let id = node.create(&body);
    let pops = pops_to(&sink, "/retried", 2);
    let want_id = format!("{id}-1");
    let stamp = |p: &Pop| -> u64 { p.header("webhook-timestamp").unwrap().parse().unwrap() };
    for (n, pop) in pops.iter().enumerate() {
        assert_eq!(pop.header("webhook-id"), Some(want_id.as_str()), "{pop:?}");
        assert_eq!(
            pop.header("x-chronos-attempt"),
            Some((n + 1).to_string().as_str())
        );
        assert_eq!(verify_pop(pop, &[KEY_A]), ["ok"], "attempt {}", n + 1);
        assert!(
            stamp(pop).abs_diff(now_s()) <= 5,
            "signed when sent: {pop:?}"
        );
    }
    assert!(
        stamp(&pops[1]) > stamp(&pops[0]),
        "a fresh timestamp: {pops:?}"
    );
}
