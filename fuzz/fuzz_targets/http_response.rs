//! The client's response framing (callbacks, replication, resync): any
//! bytes give a response, a need for more, or an error; never a panic.
#![no_main]
use chronos::http::client::{frame_response, RESPONSE_BODY_MAX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((_, body, used))) = frame_response(data) {
        assert!(used <= data.len());
        assert!(body.len() <= RESPONSE_BODY_MAX.max(data.len()));
    }
});
