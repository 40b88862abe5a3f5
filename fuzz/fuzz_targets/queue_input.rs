//! A Kafka input message's headers: the chronos header check, the deadline
//! parser, and the stored header form, which relays every value byte for
//! byte.
#![no_main]
use chronos::queue::deadline::parse_unix_us;
use chronos::queue::headers::{headers_json, parse_headers_json, validate};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_unix_us(text);
        let _ = parse_headers_json(text);
    }
    // Split the input into header values at 0xfe bytes; names are fixed.
    let names = ["chronosMessageId", "chronosDeadline", "x", "y"];
    let headers: Vec<(String, Option<Vec<u8>>)> = data
        .split(|b| *b == 0xfe)
        .zip(names)
        .map(|(v, k)| (k.to_string(), (v != b"\xfd").then(|| v.to_vec())))
        .collect();
    let _ = validate(&headers);
    let stored = headers_json(&headers);
    assert!(!stored.contains("\\u0000"), "jsonb cannot hold NUL");
    assert_eq!(parse_headers_json(&stored), headers);
});
