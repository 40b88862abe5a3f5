//! The timer JSON decoder of `POST`/`PUT /timers`, with the server's URI
//! check; what it accepts is within its documented bounds.
#![no_main]
use chronos::timer::spec::{parse, TAGS_MAX, URI_BYTES_MAX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(spec) = parse(data, chronos::http::uri::check) {
        assert!(spec.uri.len() <= URI_BYTES_MAX);
        assert!(spec.tags.len() <= TAGS_MAX);
    }
});
