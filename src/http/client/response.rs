//! Response framing: one reader ([`read_response`]) for single requests
//! and pipelined batches alike, over bytes received and not yet consumed
//! ([`Recv`]), with `httparse` for the head and the chunked decoder here.
//! Bodies are framed by Content-Length, chunked coding or the close, and
//! bounded: a head by [`RESPONSE_HEAD_MAX`], a body (decoded or not) by
//! [`RESPONSE_BODY_MAX`]. [`frame_response`] runs the same parser and
//! decoder on one buffer held whole (the fuzz target's entry). A non-2xx
//! answer's `Retry-After` is read as a delay ([`retry_after_ms`]) in the
//! same pass over the head; a 2xx's is not looked at, and nothing is kept
//! but the number.

use super::stream::Stream;
use crate::http::{content_length, trim_ows};
use crate::runtime::clock;
use crate::timer::retry::retry_after_ms;

/// Largest response head and body read.
pub const RESPONSE_HEAD_MAX: usize = 16 * 1024;
pub const RESPONSE_BODY_MAX: usize = 4 * 1024 * 1024;

const READ_CHUNK: usize = 16 * 1024;
/// The first read of a response.
pub(super) const FIRST_READ: usize = 1024;

/// A response: status and (when asked for) the body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    /// A non-2xx answer's `Retry-After` as a delay in ms (a number of
    /// seconds or an HTTP date; `None` when absent, unreadable, or the
    /// answer is a 2xx).
    pub retry_after_ms: Option<u64>,
}

/// What a pipelined batch's reader keeps of each answer, in order.
pub(super) trait Answers {
    fn clear(&mut self);
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn push_answer(&mut self, status: u16, retry_after_ms: Option<u64>);
}

/// The status alone (replication).
impl Answers for Vec<u16> {
    fn clear(&mut self) {
        Vec::clear(self)
    }

    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn push_answer(&mut self, status: u16, _: Option<u64>) {
        self.push(status)
    }
}

/// One answer to a queued request: its status and `Retry-After`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) retry_after_ms: Option<u64>,
}

impl Answers for Vec<Answer> {
    fn clear(&mut self) {
        Vec::clear(self)
    }

    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn push_answer(&mut self, status: u16, retry_after_ms: Option<u64>) {
        self.push(Answer {
            status,
            retry_after_ms,
        })
    }
}

pub(super) enum Exchange {
    /// The connection failed before any response byte: safe to retry.
    NothingBack(String),
    Failed(String),
}

/// Bytes received on a connection and not yet consumed: a response may
/// arrive in pieces, and pipelined responses back to back.
/// The buffer is the caller's (a pooled one, reused per batch).
pub(super) struct Recv<'b> {
    buf: &'b mut Vec<u8>,
    pos: usize,
    /// Bytes received in all (zero: nothing came back yet).
    total: usize,
}

impl<'b> Recv<'b> {
    pub(super) fn new(buf: &'b mut Vec<u8>) -> Recv<'b> {
        buf.clear();
        Recv {
            buf,
            pos: 0,
            total: 0,
        }
    }

    pub(super) fn pending(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    fn consume(&mut self, n: usize) {
        assert!(n <= self.buf.len() - self.pos, "consume what was received");
        self.pos += n;
    }

    /// Read once more; end of stream is an error. The failure is
    /// `NothingBack` only when nothing at all was received.
    async fn fill(&mut self, stream: &mut Stream) -> Result<(), Exchange> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        // Read straight into the buffer: a small first read (most answers
        // are a few hundred bytes), full chunks once more is coming. (A
        // zeroed 16 KiB stack chunk per callback was 6% of a shard's time
        // in the 100 k pop burst.)
        let want = if self.total == 0 {
            FIRST_READ
        } else {
            READ_CHUNK
        };
        let start = self.buf.len();
        self.buf.resize(start + want, 0);
        let fail = |total: usize, e: String| {
            if total == 0 {
                Exchange::NothingBack(e)
            } else {
                Exchange::Failed(e)
            }
        };
        let read = stream.read(&mut self.buf[start..]).await;
        let n = *read.as_ref().unwrap_or(&0);
        self.buf.truncate(start + n);
        let n = read.map_err(|e| fail(self.total, format!("receive: {e}")))?;
        if n == 0 {
            return Err(fail(
                self.total,
                "connection closed before a full response".into(),
            ));
        }
        self.total += n;
        Ok(())
    }
}

/// A response head: status, length, body framing, keep-alive, and a
/// non-2xx answer's `Retry-After`.
struct Head {
    status: u16,
    len: usize,
    framing: Framing,
    keep: bool,
    retry_after_ms: Option<u64>,
}

/// Read one response from `recv` (reading more as needed), leaving any
/// bytes after it in `recv`. Returns it and whether the connection may be
/// kept.
pub(super) async fn read_response(
    stream: &mut Stream,
    recv: &mut Recv<'_>,
    head_only: bool,
    want_body: bool,
) -> Result<(Response, bool), Exchange> {
    let head = loop {
        if let Some(head) = parse_head(recv.pending(), head_only)? {
            break head;
        }
        recv.fill(stream).await?;
    };
    recv.consume(head.len);
    let mut keep = head.keep;
    // A body not wanted is read past, never copied.
    let body = match head.framing {
        Framing::Length(len) => read_length(stream, recv, len, want_body).await?,
        Framing::Chunked => read_chunked(stream, recv, want_body).await?,
        Framing::UntilClose => {
            keep = false;
            read_until_close(stream, recv, want_body).await?
        }
    };
    Ok((
        Response {
            status: head.status,
            body,
            retry_after_ms: head.retry_after_ms,
        },
        keep,
    ))
}

/// Frame one response held whole in `buf` with the same head parser and
/// chunk decoder the client reads with: `Ok(Some((status, body, used)))`,
/// `Ok(None)` when more bytes are needed. For fuzzing and tests; the
/// client itself reads from a socket ([`read_response`]).
pub fn frame_response(buf: &[u8]) -> Result<Option<(u16, Vec<u8>, usize)>, String> {
    let fail = |e: Exchange| match e {
        Exchange::NothingBack(e) | Exchange::Failed(e) => e,
    };
    let Some(head) = parse_head(buf, false).map_err(fail)? else {
        return Ok(None);
    };
    let mut pos = head.len;
    assert!(pos <= buf.len(), "a head lies within its buffer");
    let body = match head.framing {
        Framing::Length(len) if len > RESPONSE_BODY_MAX => {
            return Err("response body too large".into())
        }
        Framing::Length(len) if buf.len() - pos < len => return Ok(None),
        Framing::Length(len) => {
            pos += len;
            buf[head.len..pos].to_vec()
        }
        Framing::UntilClose => {
            pos = buf.len();
            buf[head.len..].to_vec()
        }
        Framing::Chunked => {
            let mut decoded = Vec::new();
            loop {
                match decode_chunk(&buf[pos..]) {
                    ChunkStep::Data { skip, data: (a, b) } => {
                        if decoded.len() + (b - a) > RESPONSE_BODY_MAX {
                            return Err("response body too large".into());
                        }
                        decoded.extend_from_slice(&buf[pos + a..pos + b]);
                        pos += skip;
                    }
                    ChunkStep::End { skip } => break pos += skip,
                    ChunkStep::More => return Ok(None),
                    ChunkStep::Bad => return Err("malformed chunked body".into()),
                }
            }
            decoded
        }
    };
    assert!(pos <= buf.len(), "the parse position stays in the buffer");
    Ok(Some((head.status, body, pos)))
}

/// The head at the start of `buf`, `None` if incomplete.
fn parse_head(buf: &[u8], head_only: bool) -> Result<Option<Head>, Exchange> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() <= RESPONSE_HEAD_MAX => return Ok(None),
        Ok(httparse::Status::Partial) => {
            return Err(Exchange::Failed("response head too large".into()))
        }
        Err(e) => return Err(Exchange::Failed(format!("malformed response: {e}"))),
    };
    let status = resp.code.unwrap_or(0);
    let mut keep = resp.version == Some(1);
    let (mut length, mut coding): (Option<usize>, Option<&[u8]>) = (None, None);
    let mut retry_after = None;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            // As strict as the server's reading of a request's: one length,
            // `1*DIGIT`; two that differ are an error (RFC 9112 6.3).
            let n = content_length(h.value)
                .filter(|n| length.is_none_or(|l| l == *n))
                .ok_or_else(|| Exchange::Failed("bad Content-Length in response".into()))?;
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // Several fields are one list: a field's last coding, if it
            // has one, follows the earlier fields'.
            coding = last_coding(h.value).or(coding).or(Some(b""));
        } else if h.name.eq_ignore_ascii_case("connection") {
            if h.value.eq_ignore_ascii_case(b"close") {
                keep = false;
            } else if h.value.eq_ignore_ascii_case(b"keep-alive") {
                keep = true;
            }
        } else if h.name.eq_ignore_ascii_case("retry-after") {
            // The last one counts; a 2xx's is never read.
            retry_after = Some(h.value);
        }
    }
    let retry_after_ms = retry_after
        .filter(|_| !(200..300).contains(&status))
        .and_then(|value| retry_after_ms(value, clock::unix_ms()));
    // Transfer-Encoding overrides Content-Length: its last coding decides
    // (chunked, or else the body runs until the close); with no coding
    // in it, the length frames the body.
    let final_coding = coding.filter(|c| !c.is_empty());
    let mut framing = match (final_coding, length) {
        (Some(c), _) if c.eq_ignore_ascii_case(b"chunked") => Framing::Chunked,
        (Some(_), _) | (None, None) => Framing::UntilClose,
        (None, Some(n)) => Framing::Length(n),
    };
    if head_only || status == 204 || status == 304 || (100..200).contains(&status) {
        framing = Framing::Length(0);
    }
    if matches!(framing, Framing::UntilClose) || (coding.is_some() && length.is_some()) {
        // Either the close ends the body, or the framing was ambiguous
        // (a smuggling pattern): no second exchange on this connection.
        keep = false;
    }
    Ok(Some(Head {
        status,
        len,
        framing,
        keep,
        retry_after_ms,
    }))
}

async fn read_length(
    stream: &mut Stream,
    recv: &mut Recv<'_>,
    len: usize,
    want_body: bool,
) -> Result<Vec<u8>, Exchange> {
    if len > RESPONSE_BODY_MAX {
        return Err(Exchange::Failed("response body too large".into()));
    }
    while recv.pending().len() < len {
        recv.fill(stream).await.map_err(mid_body)?;
    }
    let body = if want_body {
        recv.pending()[..len].to_vec()
    } else {
        Vec::new()
    };
    recv.consume(len);
    Ok(body)
}

async fn read_chunked(
    stream: &mut Stream,
    recv: &mut Recv<'_>,
    want_body: bool,
) -> Result<Vec<u8>, Exchange> {
    let mut decoded = Vec::new();
    let mut decoded_len = 0usize;
    loop {
        match decode_chunk(recv.pending()) {
            ChunkStep::Data { skip, data: (a, b) } => {
                if decoded_len + (b - a) > RESPONSE_BODY_MAX {
                    return Err(Exchange::Failed("response body too large".into()));
                }
                decoded_len += b - a;
                if want_body {
                    decoded.extend_from_slice(&recv.pending()[a..b]);
                }
                recv.consume(skip);
            }
            ChunkStep::End { skip } => {
                recv.consume(skip);
                return Ok(decoded);
            }
            ChunkStep::More => {
                if recv.pending().len() > RESPONSE_BODY_MAX + READ_CHUNK {
                    return Err(Exchange::Failed("response chunk too large".into()));
                }
                recv.fill(stream).await.map_err(mid_body)?;
            }
            ChunkStep::Bad => return Err(Exchange::Failed("malformed chunked body".into())),
        }
    }
}

async fn read_until_close(
    stream: &mut Stream,
    recv: &mut Recv<'_>,
    want_body: bool,
) -> Result<Vec<u8>, Exchange> {
    let mut chunk = [0u8; READ_CHUNK];
    let mut len = recv.pending().len();
    let mut body = if want_body {
        recv.pending().to_vec()
    } else {
        Vec::new()
    };
    recv.consume(len);
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| Exchange::Failed(format!("receive: {e}")))?;
        if n == 0 {
            return Ok(body);
        }
        if len + n > RESPONSE_BODY_MAX {
            return Err(Exchange::Failed("response body too large".into()));
        }
        len += n;
        if want_body {
            body.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Any failure once the head arrived is not retryable.
fn mid_body(e: Exchange) -> Exchange {
    match e {
        Exchange::NothingBack(e) | Exchange::Failed(e) => Exchange::Failed(e),
    }
}

#[derive(Debug, PartialEq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

#[derive(Debug, PartialEq)]
enum ChunkStep {
    /// A data chunk: bytes to skip in total, and the data's range.
    Data {
        skip: usize,
        data: (usize, usize),
    },
    /// The last chunk and trailers: bytes to skip.
    End {
        skip: usize,
    },
    More,
    Bad,
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// The last coding of a `Transfer-Encoding` field value: empty list items
/// and `identity` are not codings (RFC 9110 5.6.1).
fn last_coding(value: &[u8]) -> Option<&[u8]> {
    value
        .rsplit(|&b| b == b',')
        .map(trim_ows)
        .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity"))
}

/// A chunk's size: `1*HEXDIG` (RFC 9112 7.1), SP and HTAB around it
/// ignored; no sign, no other space, nothing past `usize`.
fn chunk_size(text: &[u8]) -> Option<usize> {
    let digits = trim_ows(text);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0usize, |n, &d| {
        let v = char::from(d).to_digit(16)?;
        n.checked_mul(16)?.checked_add(v as usize)
    })
}

fn decode_chunk(buf: &[u8]) -> ChunkStep {
    let Some(line_end) = find_crlf(buf) else {
        return if buf.len() > 1024 {
            ChunkStep::Bad
        } else {
            ChunkStep::More
        };
    };
    let line = &buf[..line_end];
    let size_text = line.split(|b| *b == b';').next().unwrap_or_default();
    let Some(size) = chunk_size(size_text) else {
        return ChunkStep::Bad;
    };
    let data_start = line_end + 2;
    if size == 0 {
        // Trailers end with an empty line.
        let mut pos = data_start;
        loop {
            match find_crlf(&buf[pos..]) {
                Some(0) => return ChunkStep::End { skip: pos + 2 },
                Some(n) => pos += n + 2,
                None => return ChunkStep::More,
            }
        }
    }
    if size > RESPONSE_BODY_MAX {
        return ChunkStep::Bad;
    }
    if buf.len() < data_start + size + 2 {
        return ChunkStep::More;
    }
    if &buf[data_start + size..data_start + size + 2] != b"\r\n" {
        return ChunkStep::Bad;
    }
    ChunkStep::Data {
        skip: data_start + size + 2,
        data: (data_start, data_start + size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_decoding() {
        assert_eq!(
            decode_chunk(b"5\r\nhello\r\n"),
            ChunkStep::Data {
                skip: 10,
                data: (3, 8)
            }
        );
        assert_eq!(decode_chunk(b"5\r\nhel"), ChunkStep::More);
        assert_eq!(decode_chunk(b"0\r\n\r\n"), ChunkStep::End { skip: 5 });
        assert_eq!(
            decode_chunk(b"0\r\nX-T: 1\r\n\r\n"),
            ChunkStep::End { skip: 13 }
        );
        assert_eq!(decode_chunk(b"zz\r\n"), ChunkStep::Bad);
        assert_eq!(decode_chunk(b"2\r\nabXX"), ChunkStep::Bad);
        // A chunk size is 1*HEXDIG: no sign, no Unicode space around it.
        assert_eq!(decode_chunk(b"+5\r\nhello\r\n"), ChunkStep::Bad);
        assert_eq!(
            decode_chunk("\u{a0}5\r\nhello\r\n".as_bytes()),
            ChunkStep::Bad
        );
        assert_eq!(decode_chunk(b"\r\n\r\n"), ChunkStep::Bad);
        assert_eq!(
            decode_chunk(b"5 ;x=1\r\nhello\r\n"),
            ChunkStep::Data {
                skip: 15,
                data: (8, 13)
            }
        );
    }

    /// How a callback target's response head is framed: `(head fields,
    /// framing, keep-alive)`, `None` for a response refused as malformed.
    use Framing::{Chunked, Length, UntilClose};
    const FRAMING_CASES: &[(&str, Option<(Framing, bool)>)] = &[
        ("Content-Length: 5", Some((Length(5), true))),
        ("Content-Length:  5\t", Some((Length(5), true))),
        ("Content-Length: +5", None),
        ("Content-Length: \u{a0}5", None),
        ("Content-Length: 5, 5", None),
        ("Content-Length: -1", None),
        (
            "Content-Length: 5\r\nContent-Length: 5",
            Some((Length(5), true)),
        ),
        ("Content-Length: 5\r\nContent-Length: 6", None),
        ("Transfer-Encoding: chunked", Some((Chunked, true))),
        ("Transfer-Encoding: gzip, chunked", Some((Chunked, true))),
        // Transfer-Encoding overrides Content-Length (RFC 9112 6.3),
        // and such a response ends its connection.
        (
            "Content-Length: 5\r\nTransfer-Encoding: chunked",
            Some((Chunked, false)),
        ),
        (
            "Transfer-Encoding: chunked\r\nContent-Length: 5",
            Some((Chunked, false)),
        ),
        // Not chunked last: the body runs until the connection closes.
        ("Transfer-Encoding: notchunked", Some((UntilClose, false))),
        (
            "Transfer-Encoding: chunked, gzip",
            Some((UntilClose, false)),
        ),
        (
            "Connection: close\r\nContent-Length: 0",
            Some((Length(0), false)),
        ),
        ("", Some((UntilClose, false))),
        // Empty list items and `identity` are not codings (RFC 9110
        // 5.6.1): what is left decides; nothing left, the length does.
        ("Transfer-Encoding: chunked,", Some((Chunked, true))),
        ("Transfer-Encoding: chunked , ,", Some((Chunked, true))),
        (
            "Transfer-Encoding: identity\r\nContent-Length: 2",
            Some((Length(2), false)),
        ),
        (
            "Transfer-Encoding: chunked, identity",
            Some((Chunked, true)),
        ),
        (
            "Transfer-Encoding: ,\r\nContent-Length: 2",
            Some((Length(2), false)),
        ),
        ("Transfer-Encoding: identity", Some((UntilClose, false))),
        (
            "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked",
            Some((Chunked, true)),
        ),
        (
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip",
            Some((UntilClose, false)),
        ),
        (
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: ,",
            Some((Chunked, true)),
        ),
    ];

    #[test]
    fn response_framing_table() {
        let cases = FRAMING_CASES;
        for (fields, want) in cases {
            let head = format!("HTTP/1.1 200 OK\r\n{fields}\r\n\r\n");
            let got = match parse_head(head.as_bytes(), false) {
                Ok(Some(h)) => Some((h.framing, h.keep)),
                Ok(None) => panic!("{fields:?}: a whole head read as partial"),
                Err(_) => None,
            };
            assert_eq!(&got, want, "{fields:?}");
        }
        // No body by its status: the connection stays usable.
        let head = parse_head(b"HTTP/1.1 204 No Content\r\n\r\n", false);
        let head = head.ok().flatten().expect("a whole head");
        assert_eq!((head.framing, head.keep), (Framing::Length(0), true));
    }
}
