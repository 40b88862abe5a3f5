//! The timer JSON's fast reader (`timer/spec/fast.rs`) against serde: on
//! every input, `parse` (fast reader first) and `parse_serde_only` give
//! the same timer or the same reason, and whatever the fast reader reads
//! is exactly serde's reading. Each input is also tried spliced into a
//! valid body at one of a few places (a number, a string, an unknown
//! value, an object's members), so that the mutations land where the
//! fast reader does its work rather than mostly in serde's error paths.
#![no_main]
use chronos::timer::spec::{fast_reader_agrees, parse, parse_serde_only};
use libfuzzer_sys::fuzz_target;

/// `(before, after)`: the input goes between them.
const PLACES: [(&str, &str); 21] = [
    (
        r#"{"timing":{"interval":"#,
        r#"},"callback":{"http":{"uri":"http://a/"}}}"#,
    ),
    (
        r#"{"timing":{"interval":1,"repeat-for":"#,
        r#"},"callback":{"http":{"uri":"http://a/"}}}"#,
    ),
    (
        r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/","opaque":""#,
        r#""}}}"#,
    ),
    (
        r#"{"timing":{"interval":1},"callback":{"http":{"uri":""#,
        r#""}}}"#,
    ),
    (
        r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"x":"#,
        "}",
    ),
    (
        r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"reliability":{"replication-factor":"#,
        "}}",
    ),
    (
        r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"statistics":{"tag-info":["#,
        "]}}",
    ),
    (
        r#"{"timing":{"#,
        r#"},"callback":{"http":{"uri":"http://a/"}}}"#,
    ),
    (
        r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"reliability":{"#,
        "}}",
    ),
    // The integer fields, negative ones read too (a resync entry's or a
    // late replication body's `start-time-delta`).
    (
        r#"{"timing":{"interval":1,"start-time-delta":"#,
        r#"},"callback":{},"reliability":{"replicas":["a:1"]}}"#,
    ),
    (
        r#"{"timing":{"interval":1,"sequence-number":"#,
        r#"},"callback":{},"reliability":{"replicas":["a:1"]}}"#,
    ),
    (
        r#"{"timing":{"interval":1,"version":"#,
        r#"},"callback":{},"reliability":{"replicas":["a:1"]}}"#,
    ),
    // The members of the top-level object, of `callback`, of `http`, of
    // a tag and of `statistics`, and the items of `replicas` (review).
    (
        "{",
        r#","timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}}}"#,
    ),
    (r#"{"timing":{"interval":1},"callback":{"#, "}}"),
    (r#"{"timing":{"interval":1},"callback":{"http":{"#, "}}}"),
    (
        r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"statistics":{"tag-info":[{"#,
        "}]}}",
    ),
    (
        r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"statistics":{"#,
        "}}",
    ),
    (
        r#"{"timing":{"interval":1},"callback":{},"reliability":{"replicas":["#,
        "]}}",
    ),
    // A key's own bytes (known keys are compared in place: prefixes,
    // near misses, escapes), what follows a known key (whitespace, the
    // colon, the value), and what follows a value (whitespace, a comma).
    (
        r#"{"timing":{""#,
        r#"":1},"callback":{"http":{"uri":"http://a/"}}}"#,
    ),
    (
        r#"{"timing":{"interval""#,
        r#"},"callback":{"http":{"uri":"http://a/"}}}"#,
    ),
    (
        r#"{"timing":{"interval":1"#,
        r#""callback":{"http":{"uri":"http://a/"}}}"#,
    ),
];

fn check(body: &[u8]) {
    let uri = chronos::http::uri::check;
    assert_ne!(
        fast_reader_agrees(body),
        Some(false),
        "the fast reader read another value than serde"
    );
    assert_eq!(parse(body, uri), parse_serde_only(body, uri));
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Some((&which, rest)) = data.split_first() {
        let (before, after) = PLACES[usize::from(which) % PLACES.len()];
        let mut body = Vec::with_capacity(before.len() + rest.len() + after.len());
        body.extend_from_slice(before.as_bytes());
        body.extend_from_slice(rest);
        body.extend_from_slice(after.as_bytes());
        check(&body);
    }
});
