//! The retry policy's table tests: the JSON with its bounds and defaults,
//! the dead-letter target, the schedule and the step after an attempt.

use super::*;

fn policy(json: &str) -> Result<RetryPolicy, String> {
    parse_retry(json.as_bytes())
}

#[test]
fn the_issue_example_is_the_default() {
    let example = r#"{"attempts": 10, "initial-delay": 1, "max-delay": 3600,
                      "multiplier": 2, "jitter": 0.2, "give-up-after": 86400}"#;
    assert_eq!(policy(example), Ok(RetryPolicy::default()));
    assert_eq!(policy("{}"), Ok(RetryPolicy::default()));
    let nulls = r#"{"attempts": null, "jitter": null, "give-up-after": null}"#;
    assert_eq!(policy(nulls), Ok(RetryPolicy::default()));
    let p = RetryPolicy::default();
    assert_eq!((p.multiplier(), p.jitter()), (2.0, 0.2));
}

/// A policy's fields in the JSON's order: attempts, initial-delay ms,
/// max-delay ms, multiplier in hundredths, jitter in thousandths,
/// give-up-after ms.
fn fields(p: &RetryPolicy) -> (u8, u32, u32, u16, u16, u32) {
    (
        p.attempts,
        p.initial_delay_ms,
        p.max_delay_ms,
        p.multiplier_centi,
        p.jitter_milli,
        p.give_up_after_ms,
    )
}

#[test]
fn keys_table() {
    const H: u32 = 3_600_000;
    const DAY: u32 = 86_400_000;
    type Row = (&'static str, (u8, u32, u32, u16, u16, u32));
    let table: &[Row] = &[
        (r#"{"attempts": 1}"#, (1, 1000, H, 200, 200, DAY)),
        (r#"{"attempts": 200.0}"#, (200, 1000, H, 200, 200, DAY)),
        (r#"{"initial-delay": 0.1}"#, (10, 100, H, 200, 200, DAY)),
        (r#"{"initial-delay": 0.0001}"#, (10, 1, H, 200, 200, DAY)),
        (r#"{"initial-delay": 1.0005}"#, (10, 1001, H, 200, 200, DAY)),
        // max-delay's default follows a longer initial-delay.
        (
            r#"{"initial-delay": 7200}"#,
            (10, 2 * H, 2 * H, 200, 200, DAY),
        ),
        (
            r#"{"initial-delay": 2, "max-delay": 2}"#,
            (10, 2000, 2000, 200, 200, DAY),
        ),
        (r#"{"max-delay": 86400}"#, (10, 1000, DAY, 200, 200, DAY)),
        (r#"{"multiplier": 1}"#, (10, 1000, H, 100, 200, DAY)),
        (r#"{"multiplier": 1.5}"#, (10, 1000, H, 150, 200, DAY)),
        (r#"{"multiplier": 10}"#, (10, 1000, H, 1000, 200, DAY)),
        (r#"{"jitter": 0}"#, (10, 1000, H, 200, 0, DAY)),
        (r#"{"jitter": 1}"#, (10, 1000, H, 200, 1000, DAY)),
        (r#"{"jitter": 0.0004}"#, (10, 1000, H, 200, 0, DAY)),
        (
            r#"{"give-up-after": 2592000}"#,
            (10, 1000, H, 200, 200, 30 * DAY),
        ),
        (r#"{"give-up-after": 0.5}"#, (10, 1000, H, 200, 200, 500)),
        // A max-delay below initial-delay caps every delay (JSON Schema
        // cannot say one bound is below the other, so it is not refused).
        (
            r#"{"initial-delay": 10, "max-delay": 5}"#,
            (10, 10_000, 5_000, 200, 200, DAY),
        ),
    ];
    for &(json, want) in table {
        let p = policy(json).expect(json);
        assert_eq!(fields(&p), want, "{json}");
    }
}

#[test]
fn refusals_name_the_key_and_its_bound() {
    let table: &[(&str, &str)] = &[
        (
            r#"{"attempts": 0}"#,
            "attempts must be a whole number, 1 to 200",
        ),
        (
            r#"{"attempts": 201}"#,
            "attempts must be a whole number, 1 to 200",
        ),
        (r#"{"attempts": 2.5}"#, "attempts must be a whole number"),
        (r#"{"attempts": -1}"#, "attempts must be a whole number"),
        (r#"{"attempts": "3"}"#, "attempts must be a whole number"),
        (r#"{"attempts": 1e300}"#, "attempts must be a whole number"),
        (
            r#"{"initial-delay": 0}"#,
            "initial-delay must be a number of seconds, 0.001 to 86400",
        ),
        (r#"{"initial-delay": -1}"#, "initial-delay must be a number"),
        (r#"{"initial-delay": 86400.001}"#, "initial-delay must be"),
        (
            r#"{"initial-delay": "1"}"#,
            "initial-delay must be a number",
        ),
        (
            r#"{"max-delay": 86401}"#,
            "max-delay must be a number of seconds",
        ),
        (
            r#"{"multiplier": 0.5}"#,
            "multiplier must be a number, 1 to 10",
        ),
        (
            r#"{"multiplier": 11}"#,
            "multiplier must be a number, 1 to 10",
        ),
        (r#"{"multiplier": true}"#, "multiplier must be a number"),
        (r#"{"jitter": -0.1}"#, "jitter must be a number, 0 to 1"),
        (r#"{"jitter": 1.5}"#, "jitter must be a number, 0 to 1"),
        (
            r#"{"give-up-after": 0}"#,
            "give-up-after must be a number of seconds, 0.001 to 2592000",
        ),
        (r#"{"give-up-after": 2592001}"#, "give-up-after must be"),
        (r#"{"give-up-after": 1e308}"#, "give-up-after must be"),
        (r#"{"attempt": 3}"#, "unknown field `attempt`"),
        ("[]", "expected callback.retry to be an object"),
        ("5", "expected callback.retry to be an object"),
    ];
    for (json, want) in table {
        let err = policy(json).expect_err(json);
        assert!(err.contains(want), "{json}: {err:?} lacks {want:?}");
    }
}

fn check(uri: &str) -> Result<(), String> {
    if uri.starts_with("http://") {
        Ok(())
    } else {
        Err("must be an http:// URI".into())
    }
}

#[test]
fn the_dead_letter_target() {
    let ok = parse_dead_letter(br#"{"http": {"uri": "http://dlq.test/in"}}"#, check);
    assert_eq!(ok, Ok("http://dlq.test/in".to_string()));
    let long = format!(
        r#"{{"http": {{"uri": "http://a/{}"}}}}"#,
        "x".repeat(8 * 1024)
    );
    let table: &[(&str, &str)] = &[
        (
            r#"{"http": {"uri": "ftp://x/"}}"#,
            "callback.dead-letter.http.uri: must be an http:// URI",
        ),
        (
            r#"{"http": {"uri": ""}}"#,
            "callback.dead-letter.http.uri is missing",
        ),
        (
            r#"{"http": {}}"#,
            "callback.dead-letter.http.uri is missing",
        ),
        (r#"{}"#, "callback.dead-letter needs http"),
        (
            r#"{"http": 5}"#,
            "expected callback.dead-letter.http to be an object",
        ),
        (r#"{"http": {"uri": 5}}"#, "invalid type"),
        ("[]", "expected callback.dead-letter to be an object"),
        (&long, "longer than 8192 bytes"),
    ];
    for (json, want) in table {
        let err = parse_dead_letter(json.as_bytes(), check).expect_err(json);
        assert!(err.contains(want), "{json}: {err:?} lacks {want:?}");
    }
}

/// The issue's example without jitter.
fn steady() -> RetryPolicy {
    RetryPolicy {
        jitter_milli: 0,
        ..RetryPolicy::default()
    }
}

const MIDDLE: u32 = 1 << 31;

#[test]
fn delays_double_up_to_the_cap() {
    let p = steady();
    let table: &[(u32, u64)] = &[
        (1, 1000),
        (2, 2000),
        (3, 4000),
        (12, 2_048_000),
        (13, 3_600_000),
        (14, 3_600_000),
        (200, 3_600_000),
        (u32::MAX, 3_600_000),
    ];
    for &(done, want) in table {
        for sample in [0, MIDDLE, u32::MAX] {
            assert_eq!(delay_before_attempt_ms(&p, done, sample), want, "{done}");
        }
    }
}

#[test]
fn delays_in_other_shapes() {
    let d = steady();
    let table: &[(RetryPolicy, &[u64])] = &[
        // 1.5 from 1 ms: 1, 1.5, 2.25, 3.375, 5.0625 (rounded to the ms).
        (
            RetryPolicy {
                initial_delay_ms: 1,
                multiplier_centi: 150,
                ..d
            },
            &[1, 2, 2, 3, 5],
        ),
        (
            RetryPolicy {
                multiplier_centi: 100,
                ..d
            },
            &[1000, 1000, 1000, 1000],
        ),
        (
            RetryPolicy {
                initial_delay_ms: 1,
                max_delay_ms: DELAY_MS_MAX,
                multiplier_centi: 1000,
                ..d
            },
            &[
                1, 10, 100, 1000, 10_000, 100_000, 1_000_000, 10_000_000, 86_400_000,
            ],
        ),
        (
            RetryPolicy {
                initial_delay_ms: 500,
                max_delay_ms: 500,
                ..d
            },
            &[500, 500, 500],
        ),
    ];
    for (p, want) in table {
        let got: Vec<u64> = (1..=want.len() as u32)
            .map(|done| delay_before_attempt_ms(p, done, MIDDLE))
            .collect();
        assert_eq!(&got, want, "{p:?}");
    }
    // The largest policy, at its last attempt: capped, no overflow.
    let most = RetryPolicy {
        attempts: ATTEMPTS_MAX,
        initial_delay_ms: DELAY_MS_MAX,
        max_delay_ms: DELAY_MS_MAX,
        multiplier_centi: MULTIPLIER_CENTI_MAX,
        jitter_milli: JITTER_MILLI_MAX,
        give_up_after_ms: GIVE_UP_MS_MAX,
    };
    assert_eq!(delay_before_attempt_ms(&most, 200, u32::MAX), 172_799_999);
}

#[test]
fn jitter_spreads_by_the_sample() {
    let p = RetryPolicy::default(); // 1 s, ± 20 %
    let table: &[(u32, u32, u64)] = &[
        (1, 0, 800),
        (1, 1 << 30, 900),
        (1, MIDDLE, 1000),
        (1, 3 << 30, 1100),
        (1, u32::MAX, 1199),
        (2, 0, 1600),
        (2, u32::MAX, 2399),
    ];
    for &(done, sample, want) in table {
        assert_eq!(delay_before_attempt_ms(&p, done, sample), want);
    }
    let full = RetryPolicy {
        jitter_milli: 1000,
        ..p
    };
    assert_eq!(delay_before_attempt_ms(&full, 1, 0), 0);
    assert_eq!(delay_before_attempt_ms(&full, 1, u32::MAX), 1999);
}

/// 3 attempts, 1 s doubling to 10 s, no jitter, give up after 5 s.
fn short() -> RetryPolicy {
    RetryPolicy {
        attempts: 3,
        initial_delay_ms: 1000,
        max_delay_ms: 10_000,
        multiplier_centi: 200,
        jitter_milli: 0,
        give_up_after_ms: 5000,
    }
}

const T: u64 = 1_000_000;

/// `(policy, attempts done, now, outcome) -> next`, the first attempt at T.
type Step = (RetryPolicy, u32, u64, Outcome, Next);

fn steps(table: &[Step]) {
    for (i, &(p, done, now, outcome, want)) in table.iter().enumerate() {
        assert_eq!(
            next_attempt(&p, done, T, now, outcome, MIDDLE),
            want,
            "row {i}"
        );
    }
}

#[test]
fn next_step_table() {
    use GiveUp::{AttemptsSpent, Refused};
    use Next::{Done, GiveUp as Stop, RetryAt};
    use Outcome::{Timeout, Transport};
    let (s, st) = (short(), Outcome::status);
    steps(&[
        (s, 1, T, st(200), Done),
        (s, 3, T + 9000, st(204), Done),
        (s, 1, T + 50, st(503), RetryAt(T + 1050)),
        (s, 1, T, st(408), RetryAt(T + 1000)),
        (s, 2, T + 1100, Timeout, RetryAt(T + 3100)),
        (s, 2, T + 1100, Transport, RetryAt(T + 3100)),
        (s, 3, T + 3100, st(500), Stop(AttemptsSpent)),
        (s, 1, T, st(404), Stop(Refused)),
        (s, 1, T, st(301), Stop(Refused)),
        (s, 3, T, st(400), Stop(Refused)),
    ]);
}

#[test]
fn retry_after_and_give_up_after_table() {
    use GiveUp::{PastGiveUpAfter as Past, Refused};
    use Next::{GiveUp as Stop, RetryAt};
    use Outcome::Timeout;
    let after = |code, ms| Outcome::Status {
        code,
        retry_after_ms: Some(ms),
    };
    let s = short();
    let long = RetryPolicy {
        give_up_after_ms: 60_000,
        ..s
    };
    steps(&[
        // Retry-After: waited when longer than the schedule, not shorter,
        (s, 1, T, after(429, 3000), RetryAt(T + 3000)),
        (s, 1, T, after(429, 100), RetryAt(T + 1000)),
        (s, 1, T, after(503, 2500), RetryAt(T + 2500)),
        (s, 1, T, after(404, 2500), Stop(Refused)),
        // and bounded by max-delay.
        (long, 1, T, after(429, 3_600_000), RetryAt(T + 10_000)),
        (s, 1, T, after(429, 3_600_000), Stop(Past)),
        // give-up-after counts from the first attempt; an attempt due
        // exactly at it is still sent.
        (s, 1, T + 4000, Timeout, RetryAt(T + 5000)),
        (s, 1, T + 4001, Timeout, Stop(Past)),
        (s, 2, T + 3500, Timeout, Stop(Past)),
        (s, 1, T + 9000, Timeout, Stop(Past)),
        (s, 1, u64::MAX - 5, Timeout, Stop(Past)),
    ]);
}

/// The issue's check, as the rules see it: a target that fails N times,
/// then answers 200, gets exactly N + 1 attempts at the documented times.
#[test]
fn a_target_failing_n_times_gets_n_plus_one_attempts() {
    let p = steady();
    let answer_ms = 30;
    for n in 0..9u32 {
        let first = 5_000;
        let mut sent = vec![first];
        loop {
            let done = sent.len() as u32;
            let now = sent[sent.len() - 1] + answer_ms;
            let outcome = if done <= n {
                Outcome::status(503)
            } else {
                Outcome::status(200)
            };
            match next_attempt(&p, done, first, now, outcome, MIDDLE) {
                Next::RetryAt(at) => sent.push(at),
                Next::Done => break,
                Next::GiveUp(why) => panic!("gave up: {why:?}"),
            }
        }
        assert_eq!(sent.len() as u32, n + 1);
        for k in 1..sent.len() {
            let want = answer_ms + 1000 * (1 << (k - 1));
            assert_eq!(sent[k] - sent[k - 1], want, "n {n}, attempt {}", k + 1);
        }
    }
    // One more failure than attempts allow: 10 sent, then given up.
    let mut done = 1;
    let mut now = 0;
    loop {
        match next_attempt(&p, done, 0, now, Outcome::Timeout, MIDDLE) {
            Next::RetryAt(at) => (done, now) = (done + 1, at),
            other => {
                assert_eq!(other, Next::GiveUp(GiveUp::AttemptsSpent));
                break;
            }
        }
    }
    assert_eq!(done, 10);
}
