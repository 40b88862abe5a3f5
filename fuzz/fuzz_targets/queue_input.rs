//! A Kafka input message's headers: the chronos header check, the deadline
//! parser, and the stored header form, which relays every value byte for
//! byte.
#![no_main]
use chronos::queue::deadline::parse_unix_us;
use chronos::queue::headers::{headers_json, parse_headers_json, validate};
use libfuzzer_sys::fuzz_target;

/// Whether any string (key or value) in `v` holds a NUL, which `jsonb`
/// refuses.
fn holds_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(a) => a.iter().any(holds_nul),
        serde_json::Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}

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
    let value: serde_json::Value = serde_json::from_str(&stored).expect("valid JSON");
    assert!(!holds_nul(&value), "jsonb cannot hold NUL: {stored}");
    assert_eq!(parse_headers_json(&stored), headers);
});
