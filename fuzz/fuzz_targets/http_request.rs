//! The server's request framing: any bytes give a request, a need for more,
//! or a 4xx, within the head and body limits.
#![no_main]
use chronos::http::{parse_request, Parsed};
use libfuzzer_sys::fuzz_target;

const HEAD_MAX: usize = 16 * 1024;
const BODY_MAX: usize = 256 * 1024;

fuzz_target!(|data: &[u8]| {
    match parse_request(data, HEAD_MAX, BODY_MAX) {
        Parsed::Complete(req, used) => {
            assert!(used <= data.len());
            assert!(req.body.len() <= BODY_MAX);
            let _ = chronos::http::uri::percent_decode(req.query);
        }
        Parsed::Partial { .. } => {}
        Parsed::Error(e) => assert!((400..500).contains(&e.status), "{}", e.status),
    }
});
