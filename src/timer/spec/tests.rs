use super::*;
use crate::timer::timing::TimingKind;

/// A stand-in for the HTTP layer's check: `http://` and a host (the
/// fast reader's tests use it too).
pub(super) fn check(uri: &str) -> Result<(), String> {
    match uri.strip_prefix("http://") {
        Some(rest) if !rest.is_empty() && !rest.contains(' ') => Ok(()),
        _ => Err(format!("{uri:?} must be an http:// URI")),
    }
}

fn parse_test(body: &[u8]) -> Result<TimerSpec<'_>, String> {
    parse(body, check)
}

const OK: &str = r#"{"timing":{"interval":10},"callback":{"http":{"uri":"http://127.0.0.1:9/cb","opaque":"x"}}}"#;

#[test]
fn minimal_timer() {
    let s = parse_test(OK.as_bytes()).unwrap();
    assert_eq!((s.interval_ms, s.repeat_for_ms), (10_000, 10_000));
    assert_eq!(s.uri, "http://127.0.0.1:9/cb");
    assert_eq!(s.opaque, "x");
    assert!(s.replication.is_none());
}

/// `reliability.only-newer` is true, false or null in any body, as the
/// OpenAPI description says; a client body (no `replicas`) with an
/// object there was accepted (schemathesis, CI at 91bc295).
#[test]
fn only_newer_is_a_boolean_or_null_in_every_body() {
    let rel = |v: &str, more: &str| {
        format!(
            r#"{{"timing":{{"interval":5}},"callback":{{"http":{{"uri":"http://a/"}}}},"reliability":{{"only-newer":{v}{more}}}}}"#
        )
    };
    for more in ["", r#","sites":[]"#, r#","replicas":["a:1"]"#] {
        for good in ["true", "false", "null"] {
            let body = rel(good, more);
            assert!(parse_test(body.as_bytes()).is_ok(), "{body}");
        }
        for bad in [r#"{"":[]}"#, "{}", "[]", "1", r#""true""#] {
            let body = rel(bad, more);
            let err = parse_test(body.as_bytes()).err();
            assert_eq!(
                err.as_deref(),
                Some("reliability.only-newer must be true or false"),
                "{body}"
            );
        }
    }
}

#[test]
fn fractional_seconds_have_ms_resolution() {
    let table = [
        ("0.1", 100),
        ("1.5", 1500),
        ("0.001", 1),
        ("0.0015", 2),
        ("2.999", 2999),
        ("0", 0),
        ("5e-324", 1),
        ("0.0000001", 1),
        ("4294967.295", u32::MAX),
    ];
    for (text, ms) in table {
        let body = format!(
            r#"{{"timing":{{"interval":{text},"repeat-for":{text}}},"callback":{{"http":{{"uri":"http://a/"}}}}}}"#
        );
        assert_eq!(
            parse_test(body.as_bytes()).unwrap().interval_ms,
            ms,
            "{text}"
        );
    }
}

#[test]
fn integers_may_be_written_with_a_zero_fraction() {
    let n = |t: &str| integral(&serde_json::from_str(t).unwrap());
    assert_eq!(n("53"), Some(53));
    assert_eq!(n("53.0"), Some(53));
    assert_eq!(n("-2.0"), Some(-2));
    assert_eq!(n("1e6"), Some(1_000_000));
    assert_eq!(n("18446744073709551615"), Some(u64::MAX.into()));
    assert_eq!(n("1.5"), None);
    assert_eq!(n("1e300"), None);
    assert_eq!(n("-9223372036854775809"), None);
    assert_eq!(n("18446744073709551616"), None);
    // 17 significant digits: read exactly (serde_json's float_roundtrip),
    // not one ULP off into a fraction (schemathesis sent this one).
    assert_eq!(n("-2194867033173387.0"), Some(-2_194_867_033_173_387));
    assert_eq!(n("4503599627370495.0"), Some(4_503_599_627_370_495));
    // ±2^53 is exact and a JSON Schema integer (schemathesis sent this
    // one as start-unix-ms); past it a float is not read.
    assert_eq!(n("-9007199254740992.0"), Some(-9_007_199_254_740_992));
    assert_eq!(n("9007199254740992.0"), Some(9_007_199_254_740_992));
    assert_eq!(n("18014398509481984.0"), None);
    let body = r#"{"timing":{"interval":1,"start-time-delta":-250.0,"sequence-number":2e0,"version":7.0},
        "callback":{"http":{"uri":"http://a/"}},"reliability":{"replicas":["a:1"]}}"#;
    let r = parse_test(body.as_bytes()).unwrap().replication.unwrap();
    assert_eq!(
        (r.start_time_delta_ms, r.sequence_number, r.version_us),
        (-250, 2, Some(7))
    );
    let big = body.replace("2e0", "4294967296");
    assert!(parse_test(big.as_bytes())
        .unwrap_err()
        .contains("not an integer in range"));
}

#[test]
fn seconds_beyond_u32_ms_are_refused_naming_the_bound() {
    for interval in ["4294967.296", "4294967.295000001", "4294968"] {
        let body = format!(
            r#"{{"timing":{{"interval":{interval}}},"callback":{{"http":{{"uri":"http://a/"}}}}}}"#
        );
        let err = parse_test(body.as_bytes()).expect_err(interval);
        assert!(
            err.contains("timing.interval is too large (at most 4294967.295 s)"),
            "{interval}: {err}"
        );
    }
}

#[test]
fn rejections_carry_reasons() {
    let table: &[(&str, &str)] = &[
        ("not json", "invalid JSON"),
        ("[1,2]", "JSON object"),
        ("{}", "missing timing"),
        (r#"{"timing":{}}"#, "missing timing.interval"),
        (
            r#"{"timing":{"interval":-1},"callback":{"http":{"uri":"http://a/"}}}"#,
            "negative",
        ),
        (
            r#"{"timing":{"interval":"10"},"callback":{"http":{"uri":"http://a/"}}}"#,
            "timing.interval must be a number",
        ),
        (r#"{"timing":{"interval":1}}"#, "missing callback"),
        (
            r#"{"timing":{"interval":1},"callback":{"sip":{}}}"#,
            "only \"http\"",
        ),
        (
            r#"{"timing":{"interval":1},"callback":{"http":{"opaque":"x"}}}"#,
            "missing callback.http.uri",
        ),
        (
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"ftp://x/"}}}"#,
            "http://",
        ),
        (
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"reliability":5}"#,
            "object",
        ),
        (
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"reliability":{"replication-factor":0}}"#,
            "replication-factor",
        ),
        (
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"statistics":{"tag-info":[{"type":"A","count":0}]}}"#,
            "positive integer",
        ),
        (
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"statistics":{"tag-info":[{"type":"A","count":1.5}]}}"#,
            "positive integer",
        ),
        (
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"statistics":{"tag-info":[{"type":"A","count":-2}]}}"#,
            "positive integer",
        ),
        (
            r#"{"timing":{"interval":0,"repeat-for":5},"callback":{"http":{"uri":"http://a/"}}}"#,
            "timing.interval 0 with timing.repeat-for 5:",
        ),
        (
            r#"{"timing":{"interval":0.0,"repeat-for":0.25},"callback":{"http":{"uri":"http://a/"}}}"#,
            "timing.interval 0 with timing.repeat-for 0.25:",
        ),
    ];
    for (body, needle) in table {
        let err = parse_test(body.as_bytes()).expect_err(body);
        assert!(err.contains(needle), "{body}: {err}");
    }
}

#[test]
fn tags_and_replication() {
    let body = r#"{"timing":{"interval":1,"repeat-for":3,"start-time-delta":-250,"sequence-number":2},
        "callback":{"http":{"uri":"http://h:81/p?q=1","opaque":"o"}},
        "reliability":{"cluster-view-id":"12","replicas":["10.0.0.1:7253","10.0.0.2:7253"]},
        "statistics":{"tag-info":[{"type":"CALL"},{"type":"SUB","count":3}]}}"#;
    let s = parse_test(body.as_bytes()).unwrap();
    assert_eq!(
        s.tags,
        vec![(Cow::Borrowed("CALL"), 1), (Cow::Borrowed("SUB"), 3)]
    );
    let r = s.replication.unwrap();
    assert_eq!((r.start_time_delta_ms, r.sequence_number), (-250, 2));
    assert_eq!(r.replicas.len(), 2);
    let tomb = r#"{"timing":{"interval":1},"callback":{},"reliability":{"replicas":["a:1"]}}"#;
    assert!(parse_test(tomb.as_bytes()).unwrap().is_tombstone());
}

/// `callback.retry` and `callback.dead-letter` as `null` are as if absent
/// (every optional key is), and a policy reads back with its defaults.
#[test]
fn a_null_policy_is_no_policy() {
    let none = r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"},"retry":null,"dead-letter":null}}"#;
    assert_eq!(parse_test(none.as_bytes()).unwrap().delivery, None);
    let some = r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"},"retry":{}}}"#;
    let d = parse_test(some.as_bytes()).unwrap().delivery.unwrap();
    assert_eq!(d.retry, crate::timer::retry::RetryPolicy::default());
    assert_eq!(d.dead_letter, "");
}

/// Issue 42's timing keys: what each kind reads to, and the 400s.
#[test]
fn wall_clock_and_calendar_timing() {
    let cb = r#""callback":{"http":{"uri":"http://a/"}}"#;
    let at = format!(r#"{{"timing":{{"at":"2026-12-01T09:00:00+01:00"}},{cb}}}"#);
    let s = parse_test(at.as_bytes()).unwrap();
    let t = s.timing.as_deref().unwrap();
    assert_eq!((t.kind, t.at_unix_ms), (TimingKind::At, 1_796_112_000_000));
    assert_eq!(
        (s.interval_ms, s.repeat_for_ms, t.start_unix_ms),
        (0, 0, None)
    );
    let start = format!(
        r#"{{"timing":{{"start-at":"2026-12-01T08:00:00Z","interval":60,"repeat-for":180}},{cb}}}"#
    );
    let s = parse_test(start.as_bytes()).unwrap();
    assert_eq!((s.interval_ms, s.repeat_for_ms), (60_000, 180_000));
    let t = s.timing.as_deref().unwrap();
    assert_eq!(
        t.start_unix_ms(0, s.interval_ms),
        1_796_112_000_000 - 60_000
    );
    let cron = format!(
        r#"{{"timing":{{"cron":"0 9 * * MON-FRI","time-zone":"Europe/Paris","repeat-for":2592000}},{cb}}}"#
    );
    let s = parse_test(cron.as_bytes()).unwrap();
    let t = s.timing.as_deref().unwrap();
    assert_eq!(
        (t.kind, &*t.text, &*t.zone),
        (TimingKind::Cron, "0 9 * * MON-FRI", "Europe/Paris")
    );
    assert_eq!((s.interval_ms, s.repeat_for_ms), (0, 2_592_000_000));
    assert_eq!(t.start_unix_ms(1234, 0), 1234, "a client's cron starts now");
    let utc = format!(r#"{{"timing":{{"cron":"*/2 * * * * *","repeat-for":10}},{cb}}}"#);
    assert_eq!(
        parse_test(utc.as_bytes()).unwrap().timing.unwrap().zone,
        "UTC"
    );
    // Between nodes: `interval` is the cursor and the start is absolute.
    let replica = r#"{"timing":{"cron-cursor-ms":4000,"repeat-for":10,"cron":"*/2 * * * * *","time-zone":"UTC","start-unix-ms":77},"callback":{"http":{"uri":"http://a/"}},"reliability":{"replicas":["a:1"]}}"#;
    let s = parse_test(replica.as_bytes()).unwrap();
    assert_eq!(
        (s.interval_ms, s.timing.unwrap().start_unix_ms),
        (4_000, Some(77))
    );
    // A client's `start-unix-ms` is ignored.
    let client = format!(r#"{{"timing":{{"at":"2026-12-01T08:00:00Z","start-unix-ms":5}},{cb}}}"#);
    assert_eq!(
        parse_test(client.as_bytes())
            .unwrap()
            .timing
            .unwrap()
            .start_unix_ms,
        None
    );
}

#[test]
fn timing_rejections_say_what_is_wrong() {
    let table: &[(&str, &str)] = &[
        (
            r#""at":"2026-12-01 09:00""#,
            "timing.at: expected an RFC 3339 instant",
        ),
        (r#""at":5"#, "timing.at must be a string"),
        (
            r#""at":"2026-12-01T09:00:00Z","interval":5"#,
            "timing.at is a one-shot",
        ),
        (
            r#""at":"2026-12-01T09:00:00Z","repeat-for":5"#,
            "timing.at is a one-shot",
        ),
        (
            r#""start-at":"2026-12-01T09:00:00Z""#,
            "timing.start-at needs timing.interval",
        ),
        (
            r#""start-at":"x","interval":5"#,
            "timing.start-at: expected",
        ),
        (
            r#""cron":"0 9 * * *""#,
            "timing.cron needs timing.repeat-for",
        ),
        (r#""cron":"0 9 * * *","repeat-for":0"#, "must be positive"),
        (
            r#""cron":"0 9 * * *","repeat-for":60,"interval":5"#,
            "timing.cron with timing.interval",
        ),
        (r#""cron":"61 9 * * *","repeat-for":60"#, "timing.cron:"),
        (
            r#""cron":"0 9 * * *","repeat-for":60,"time-zone":"Mars/Olympus""#,
            "timing.`time-zone` Mars/Olympus is not in the IANA",
        ),
        (
            r#""cron":["0"],"repeat-for":60"#,
            "timing.cron must be a string",
        ),
        (
            r#""time-zone":"UTC","interval":5"#,
            "timing.time-zone applies to timing.cron only",
        ),
        (
            r#""at":"2026-12-01T09:00:00Z","cron":"* * * * *""#,
            "exclude each other",
        ),
    ];
    for (timing, needle) in table {
        let body =
            format!(r#"{{"timing":{{{timing}}},"callback":{{"http":{{"uri":"http://a/"}}}}}}"#);
        let err = parse_test(body.as_bytes()).expect_err(&body);
        assert!(err.contains(needle), "{body}: {err}");
        assert_eq!(
            fast_reader_agrees(body.as_bytes()),
            None,
            "the fast reader declines {body}"
        );
    }
}
