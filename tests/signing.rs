//! Issue 41, signed callbacks: the headers chronos makes
//! (`chronos::http::sign`) verified by the Standard Webhooks specification's
//! own Python library (`standardwebhooks` on PyPI), as a callback target
//! would verify them: a current key, a rotated key set checked with either
//! key, a key not in the set, a tampered body, and a timestamp older than
//! the library's 5 minutes, which it refuses.
//!
//! The library is a test need (`bash .ci/run` installs it): without it the
//! test fails and names the install step; it never skips itself.

use chronos::http::sign::{sign, MessageId, SigningKeys};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

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
    let mut child = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python3");
    let stdin = child.stdin.as_mut().expect("piped stdin");
    stdin
        .write_all(serde_json::to_string(&input).unwrap().as_bytes())
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
