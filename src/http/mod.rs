//! HTTP/1.1 on `httparse`: request framing for the server, response writing,
//! and the client used for callbacks (`client`).
//!
//! Framing rules: `Content-Length` bodies only (a chunked request body gets
//! `411`), the header block is bounded (`431`), the body is bounded (`413`),
//! anything unparsable is `400`. After a framing error the connection is
//! closed, because the next request's start can no longer be found.

pub mod client;
pub mod config;
pub mod conn;
pub mod guard;
pub mod permits;
pub mod ring;
pub mod server;
pub mod sign;
pub mod tls;
pub mod uri;

use std::mem::MaybeUninit;

/// Headers per request (more is `431`).
pub const HEADERS_MAX: usize = 48;

/// Request methods the API knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Other,
}

impl Method {
    fn from_bytes(m: &str) -> Method {
        match m {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            _ => Method::Other,
        }
    }
}

/// One complete request, borrowing the connection's read buffer.
#[derive(Debug)]
pub struct Request<'b> {
    pub method: Method,
    /// Path without the query string.
    pub path: &'b str,
    /// Query string (after `?`), possibly empty.
    pub query: &'b str,
    pub body: &'b [u8],
    /// The client wants the connection kept open.
    pub keep_alive: bool,
    /// The `Range` header, if any (resync paging).
    pub range: Option<&'b [u8]>,
    /// The `Authorization` header, if any (the internal API's secret).
    pub authorization: Option<&'b [u8]>,
    /// An `X-Chronos-Local-Only` header was sent: a `GET /timers/<id>`
    /// from another node, answered from this node's own copy only.
    pub local_only: bool,
    /// The `Idempotency-Key` header, if any (a `POST /timers` a client
    /// may retry).
    pub idempotency_key: Option<&'b [u8]>,
    /// The connection's peer address, when the server knows it (set by
    /// the server, not by the parser).
    pub peer: Option<std::net::IpAddr>,
    /// The connection presented a TLS client certificate that the
    /// listener verified (`[cluster] tls-ca-file`); set by the server.
    pub peer_certified: bool,
}

/// A request that cannot be framed: answered, then the connection closes.
#[derive(Debug, PartialEq, Eq)]
pub struct FramingError {
    pub status: u16,
    pub reason: &'static str,
}

/// What the buffer holds.
#[derive(Debug)]
pub enum Parsed<'b> {
    /// A request and the bytes it used.
    Complete(Request<'b>, usize),
    /// More bytes needed. `head_complete`: the head is in, the body is not.
    /// `expect_continue` is set once the head is complete, the body is not,
    /// and the client sent `Expect: 100-continue`.
    Partial {
        head_complete: bool,
        expect_continue: bool,
    },
    Error(FramingError),
}

const fn err(status: u16, reason: &'static str) -> Parsed<'static> {
    Parsed::Error(FramingError { status, reason })
}

/// Frame the first request in `buf`.
pub fn parse_request(buf: &[u8], header_bytes_max: usize, body_bytes_max: usize) -> Parsed<'_> {
    // Uninitialised: httparse writes the headers it finds (no 1.5 KB
    // memset per request).
    let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; HEADERS_MAX];
    let mut req = httparse::Request::new(&mut []);
    let head_len = match req.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() > header_bytes_max {
                return err(431, "request header fields too large");
            }
            return Parsed::Partial {
                head_complete: false,
                expect_continue: false,
            };
        }
        Err(httparse::Error::TooManyHeaders) => return err(431, "too many request header fields"),
        Err(_) => return err(400, "malformed HTTP request"),
    };
    if head_len > header_bytes_max {
        return err(431, "request header fields too large");
    }
    let h = match read_headers(req.headers, req.version.unwrap_or(1)) {
        Ok(h) => h,
        Err(e) => return Parsed::Error(e),
    };
    let (keep_alive, content_length, expect_continue, range, authorization) = (
        h.keep_alive,
        h.content_length,
        h.expect_continue,
        h.range,
        h.authorization,
    );
    let (local_only, idempotency_key) = (h.local_only, h.idempotency_key);
    let body_len = content_length.unwrap_or(0);
    if body_len > body_bytes_max {
        return err(413, "request body too large");
    }
    if buf.len() - head_len < body_len {
        return Parsed::Partial {
            head_complete: true,
            expect_continue,
        };
    }
    let target = req.path.unwrap_or("/");
    // A byte search: `?` is ASCII, so both halves stay valid UTF-8.
    let (path, query) = match target.bytes().position(|b| b == b'?') {
        Some(at) => (&target[..at], &target[at + 1..]),
        None => (target, ""),
    };
    Parsed::Complete(
        Request {
            method: Method::from_bytes(req.method.unwrap_or("")),
            path,
            query,
            body: &buf[head_len..head_len + body_len],
            keep_alive,
            range,
            authorization,
            local_only,
            idempotency_key,
            peer: None,
            peer_certified: false,
        },
        head_len + body_len,
    )
}

/// What the request head's headers say about framing.
struct HeadFacts<'b> {
    keep_alive: bool,
    content_length: Option<usize>,
    expect_continue: bool,
    range: Option<&'b [u8]>,
    authorization: Option<&'b [u8]>,
    local_only: bool,
    idempotency_key: Option<&'b [u8]>,
}

fn read_headers<'b>(
    headers: &[httparse::Header<'b>],
    version: u8,
) -> Result<HeadFacts<'b>, FramingError> {
    let fail = |status, reason| Err(FramingError { status, reason });
    let mut h = HeadFacts {
        keep_alive: version >= 1,
        content_length: None,
        expect_continue: false,
        range: None,
        authorization: None,
        local_only: false,
        idempotency_key: None,
    };
    for header in headers {
        let (name, value) = (header.name, header.value);
        if name_is(name.as_bytes(), b"content-length") {
            let Some(n) = content_length(value) else {
                return fail(400, "invalid Content-Length");
            };
            if h.content_length.is_some_and(|c| c != n) {
                return fail(400, "conflicting Content-Length headers");
            }
            h.content_length = Some(n);
        } else if name_is(name.as_bytes(), b"transfer-encoding") {
            return fail(
                411,
                "chunked request bodies are not supported: send Content-Length",
            );
        } else if name_is(name.as_bytes(), b"connection") {
            for token in value.split(|b| *b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    h.keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    h.keep_alive = true;
                }
            }
        } else if name_is(name.as_bytes(), b"expect") {
            if !value.eq_ignore_ascii_case(b"100-continue") {
                return fail(417, "unsupported Expect header");
            }
            h.expect_continue = true;
        } else if name_is(name.as_bytes(), b"range") {
            h.range = Some(value);
        } else if name_is(name.as_bytes(), b"authorization") {
            h.authorization = Some(value);
        } else if name_is(name.as_bytes(), b"x-chronos-local-only") {
            h.local_only = true;
        } else if name_is(name.as_bytes(), b"idempotency-key") {
            h.idempotency_key = Some(value);
        }
    }
    Ok(h)
}

/// `name` is `lower` (lowercase ASCII, no letter-like symbols) in any
/// case: what `eq_ignore_ascii_case` says, with the literal's case
/// folding known at compile time (it lowercased both sides a byte at a
/// time, ~100 instructions per `Content-Length`).
#[inline(always)]
pub(crate) fn name_is(name: &[u8], lower: &[u8]) -> bool {
    name.len() == lower.len()
        && name
            .iter()
            .zip(lower)
            .all(|(&b, &l)| b | (u8::from(l.is_ascii_lowercase()) << 5) == l)
}

/// A `Content-Length` value: `1*DIGIT` (RFC 9110 8.6), with the optional
/// whitespace around a field value (SP, HTAB) ignored. Nothing else is a
/// length: not `+5`, not a Unicode space, not `1, 1`, not a value past
/// `usize`. A node that read more forms than a proxy in front of it does
/// could be handed a request the proxy framed differently (smuggling).
fn content_length(value: &[u8]) -> Option<usize> {
    let digits = trim_ows(value);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0usize, |n, d| {
        n.checked_mul(10)?.checked_add(usize::from(d - b'0'))
    })
}

/// `value` without leading and trailing SP and HTAB (RFC 9110 5.6.3 OWS).
fn trim_ows(value: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !ows(b)).unwrap_or(value.len());
    let end = value.iter().rposition(|b| !ows(b)).map_or(start, |e| e + 1);
    &value[start..end]
}

/// The reason phrase of a status code.
pub fn status_text(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// Append a response to `out`. `headers` are extra `(name, value)` pairs.
/// Plain byte appends (no `core::fmt`): a response is on every request's
/// path.
pub fn write_response(
    out: &mut Vec<u8>,
    status: u16,
    headers: &[(&str, &[u8])],
    body: &[u8],
    close: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    let mut digits = [0u8; 10];
    out.extend_from_slice(format_u32(&mut digits, u32::from(status)));
    out.push(b' ');
    out.extend_from_slice(status_text(status).as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !body.is_empty()
        && !headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("content-type"))
    {
        out.extend_from_slice(b"Content-Type: text/plain; charset=utf-8\r\n");
    }
    out.extend_from_slice(b"Content-Length: ");
    let mut digits = [0u8; 20];
    out.extend_from_slice(format_u64(&mut digits, body.len() as u64));
    out.extend_from_slice(b"\r\n");
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

/// `GET /ping`'s whole response on a kept-alive connection: the bytes
/// [`write_response`] makes for `200`, no extra header, body `OK` (a unit
/// test holds them equal), appended as they are.
pub const PING_OK: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 2\r\n\r\nOK";

/// A `200` with a `Location` and no body on a kept-alive connection (a
/// created timer): the bytes `write_response(out, 200, &[("Location",
/// location)], b"", false)` makes (a unit test holds them equal), in three
/// appends.
pub fn write_ok_location(out: &mut Vec<u8>, location: &[u8]) {
    out.extend_from_slice(b"HTTP/1.1 200 OK\r\nLocation: ");
    out.extend_from_slice(location);
    out.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
}

/// Decimal digits of `v` in `buf`, without allocating.
pub fn format_u64(buf: &mut [u8; 20], mut v: u64) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Decimal digits of `v` in `buf`, without allocating.
pub fn format_u32(buf: &mut [u8; 10], v: u32) -> &[u8] {
    let mut wide = [0u8; 20];
    let digits = format_u64(&mut wide, u64::from(v)).len();
    assert!(digits <= buf.len(), "a u32 has at most 10 digits");
    buf[10 - digits..].copy_from_slice(&wide[20 - digits..]);
    &buf[10 - digits..]
}

#[cfg(test)]
mod tests {
    /// `Content-Length` is `1*DIGIT` around optional SP/HTAB, and nothing
    /// else: what a stricter proxy in front would read the same way.
    #[test]
    fn content_length_is_digits_and_nothing_else() {
        let max = usize::MAX.to_string();
        let past = format!("{}0", usize::MAX);
        let table: [(&[u8], Option<usize>); 21] = [
            (b"0", Some(0)),
            (b"7", Some(7)),
            (b"0012", Some(12)),
            (b"123", Some(123)),
            (b" 5 ", Some(5)),
            (b"\t5\t", Some(5)),
            (b"9999999999999999999", Some(9_999_999_999_999_999_999)),
            (max.as_bytes(), Some(usize::MAX)),
            (past.as_bytes(), None),
            (b"18446744073709551616", None),
            (b"", None),
            (b"  ", None),
            (b"+5", None),
            (b"-5", None),
            (b"5a", None),
            (b"1_0", None),
            (b"1, 1", None),
            (b"5 5", None),
            ("5\u{a0}".as_bytes(), None),
            ("\u{3000}5".as_bytes(), None),
            (b"\xff5", None),
        ];
        for (value, want) in table {
            assert_eq!(content_length(value), want, "{value:?}");
        }
    }

    #[test]
    fn a_content_length_with_a_sign_or_a_unicode_space_is_refused() {
        for value in ["+5", "5\u{a0}", "\u{a0}5"] {
            let req = format!("POST /timers HTTP/1.1\r\nContent-Length: {value}\r\n\r\nhello");
            match parse_request(req.as_bytes(), 8192, 8192) {
                Parsed::Error(e) => {
                    assert_eq!(e.status, 400, "{value:?}");
                    assert_eq!(e.reason, "invalid Content-Length", "{value:?}");
                }
                _ => panic!("{value:?} was taken as a length"),
            }
        }
    }

    #[test]
    fn header_names_compare_as_eq_ignore_ascii_case() {
        // With a digit and punctuation too, so that a fold that touched
        // anything but letters would fail here.
        let lower: [&[u8]; 5] = [b"content-length", b"range", b"x", b"https://", b"x-9_a.b"];
        for l in lower {
            for name in 0..=255u8 {
                let mut candidates = vec![l.to_vec(), l.to_ascii_uppercase()];
                for at in 0..l.len() {
                    let mut n = l.to_vec();
                    n[at] = name;
                    candidates.push(n);
                }
                for n in candidates {
                    let Ok(n) = std::str::from_utf8(&n) else {
                        continue;
                    };
                    let want = n.as_bytes().eq_ignore_ascii_case(l);
                    assert_eq!(name_is(n.as_bytes(), l), want, "{n:?} {l:?}");
                }
            }
        }
    }

    #[test]
    fn every_status_the_node_sends_has_its_reason_phrase() {
        // Every status written by the server, the API and the queue's
        // /ready (kept in step with `write_response` callers).
        let sent = [
            100, 200, 202, 206, 400, 403, 404, 405, 408, 409, 411, 413, 417, 429, 431, 500, 503,
        ];
        for status in sent {
            assert_ne!(status_text(status), "Unknown", "{status}");
        }
        assert_eq!(status_text(403), "Forbidden");
    }

    use super::*;

    fn parse(buf: &[u8]) -> Parsed<'_> {
        parse_request(buf, 1024, 64)
    }

    #[test]
    fn complete_and_pipelined() {
        let buf =
            b"POST /timers?x=1 HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}GET /ping HTTP/1.1\r\n\r\n";
        let Parsed::Complete(r, n) = parse(buf) else {
            panic!()
        };
        assert_eq!(
            (r.method, r.path, r.query, r.body),
            (Method::Post, "/timers", "x=1", &b"{}"[..])
        );
        assert!(r.keep_alive);
        let Parsed::Complete(r, m) = parse(&buf[n..]) else {
            panic!()
        };
        assert_eq!((r.method, r.path), (Method::Get, "/ping"));
        assert_eq!(n + m, buf.len());
    }

    #[test]
    fn framing_table() {
        let table: &[(&[u8], Option<u16>)] = &[
            (b"GET /ping HTTP/1.1\r\n", None),
            (b"POST /t HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", None),
            (b"GARBAGE\r\n\r\n", Some(400)),
            (b"\x00\x01\x02 / HTTP/1.1\r\n\r\n", Some(400)),
            (b"POST /t HTTP/1.1\r\nContent-Length: x\r\n\r\n", Some(400)),
            (
                b"POST /t HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                Some(400),
            ),
            (
                b"POST /t HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                Some(411),
            ),
            (b"POST /t HTTP/1.1\r\nContent-Length: 65\r\n\r\n", Some(413)),
            (b"POST /t HTTP/1.1\r\nExpect: bogus\r\n\r\n", Some(417)),
        ];
        for (buf, want) in table {
            let got = match parse(buf) {
                Parsed::Error(e) => Some(e.status),
                Parsed::Partial { .. } => None,
                Parsed::Complete(..) => Some(200),
            };
            assert_eq!(got, *want, "{:?}", String::from_utf8_lossy(buf));
        }
    }

    #[test]
    fn header_limits() {
        let mut big = b"GET / HTTP/1.1\r\nX-A: ".to_vec();
        big.resize(2000, b'a');
        assert!(matches!(
            parse(&big),
            Parsed::Error(FramingError { status: 431, .. })
        ));
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..(HEADERS_MAX + 1) {
            many.extend_from_slice(format!("X-{i}: 1\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        let r = parse_request(&many, 1 << 20, 64);
        assert!(matches!(r, Parsed::Error(FramingError { status: 431, .. })));
    }

    #[test]
    fn keep_alive_and_continue() {
        let Parsed::Complete(r, _) = parse(b"GET / HTTP/1.0\r\n\r\n") else {
            panic!()
        };
        assert!(!r.keep_alive);
        let Parsed::Complete(r, _) = parse(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n") else {
            panic!()
        };
        assert!(!r.keep_alive);
        let p = parse(b"PUT /t HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n");
        assert!(matches!(
            p,
            Parsed::Partial {
                head_complete: true,
                expect_continue: true
            }
        ));
        let p = parse(b"PUT /t HTTP/1.1\r\nContent-Le");
        assert!(matches!(
            p,
            Parsed::Partial {
                head_complete: false,
                ..
            }
        ));
    }

    #[test]
    fn decimal() {
        let mut b = [0u8; 10];
        assert_eq!(format_u32(&mut b, 0), b"0");
        assert_eq!(format_u32(&mut b, 4_294_967_295), b"4294967295");
        let mut b = [0u8; 20];
        assert_eq!(format_u64(&mut b, 0), b"0");
        assert_eq!(format_u64(&mut b, u64::MAX), b"18446744073709551615");
    }

    #[test]
    fn the_static_ping_answer_is_what_write_response_makes() {
        let mut out = Vec::new();
        write_response(&mut out, 200, &[], b"OK", false);
        assert_eq!(out, PING_OK);
    }

    #[test]
    fn the_created_answer_is_what_write_response_makes() {
        let (mut fast, mut slow) = (Vec::new(), Vec::new());
        let location = b"/timers/0123456789abcdef0123456789abcdef";
        write_ok_location(&mut fast, location);
        write_response(&mut slow, 200, &[("Location", location)], b"", false);
        assert_eq!(fast, slow);
    }

    #[test]
    fn a_query_splits_at_the_first_question_mark() {
        let Parsed::Complete(r, _) = parse(b"GET /t?a=1?b HTTP/1.1\r\n\r\n") else {
            panic!()
        };
        assert_eq!((r.path, r.query), ("/t", "a=1?b"));
        let Parsed::Complete(r, _) = parse(b"GET /t? HTTP/1.1\r\n\r\n") else {
            panic!()
        };
        assert_eq!((r.path, r.query), ("/t", ""));
    }

    #[test]
    fn response_bytes() {
        let mut out = Vec::new();
        write_response(
            &mut out,
            405,
            &[("Allow", b"POST")],
            b"method not allowed",
            true,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 405 Method Not Allowed\r\nAllow: POST\r\n"));
        assert!(text.contains("Content-Length: 18\r\nConnection: close\r\n\r\nmethod not allowed"));
    }
}
