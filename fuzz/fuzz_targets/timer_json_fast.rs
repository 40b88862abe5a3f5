//! The timer JSON's fast reader (`timer/spec/fast.rs`) against serde: on
//! every input, `parse` (fast reader first) and `parse_serde_only` give
//! the same timer or the same reason, and whatever the fast reader reads
//! is exactly serde's reading.
#![no_main]
use chronos::timer::spec::{fast_reader_agrees, parse, parse_serde_only};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let check = chronos::http::uri::check;
    assert_ne!(
        fast_reader_agrees(data),
        Some(false),
        "the fast reader read another value than serde"
    );
    assert_eq!(parse(data, check), parse_serde_only(data, check));
});
