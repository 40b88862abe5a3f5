//! What a delivery says: a pop's callback ([`Client::callback`]) and a
//! given-up pop's dead letter ([`Client::dead_letter`]), their headers,
//! and the Standard Webhooks signature (`http::sign`) both carry when
//! `[timers] callback-signing-keys` is set. Both are queued for their
//! target's lanes (`lane.rs`), behind the callback guard.
//!
//! The headers:
//! - a callback: `Content-Type: application/octet-stream`,
//!   `X-Sequence-Number`, and for an attempt of a timer with a delivery
//!   policy (`CallbackKey::attempt` ≥ 1) `X-Chronos-Attempt`;
//! - a dead letter: the same type and sequence, `X-Chronos-Timer-Id` (the
//!   32 hex digits), `X-Chronos-Attempt` (the attempts made) and
//!   `X-Chronos-Last-Outcome` (the last status code, `timeout` or
//!   `transport error`, as [`Outcome`]'s `Display` writes it);
//! - signed, both: `webhook-id` (`<timer ID>-<sequence>`, the same on
//!   every attempt of one pop), `webhook-timestamp` (Unix seconds when
//!   the request is queued) and `webhook-signature` (`v1,<sig>` per key).
//!
//! Nothing here allocates per request: the digits are written on the
//! stack, the signature into the client's kept buffer, the request into a
//! spare one.

use super::error::RequestError;
use super::job::CallbackKey;
use super::request::{build_request, Request};
use super::response::Answer;
use super::Client;
use crate::http::format_u32;
use crate::http::sign::{MessageId, SigningKeys};
use crate::http::uri;
use crate::runtime::clock;
use crate::timer::retry::Outcome;
use crate::timer::TimerId;
use std::sync::Arc;
use std::time::Duration;

/// Headers a queued request may carry before the signature's three.
const HEADERS_MAX: usize = 8;

/// The dead-letter `POST` of a given-up pop: which pop, how many attempts
/// were made, and how the last one ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    pub unique: u64,
    pub bloom: u64,
    pub sequence: u32,
    /// The attempts made (`X-Chronos-Attempt`).
    pub attempts: u8,
    /// How the last attempt ended (`X-Chronos-Last-Outcome`).
    pub last: Outcome,
}

impl Client {
    /// Deliver one pop: `POST <uri>` with the opaque data, `X-Sequence-Number`
    /// and `Content-Type: application/octet-stream` (with `key.attempt` ≥ 1
    /// also `X-Chronos-Attempt`; signed when keys are set). Ok on any
    /// 2xx; else the error's `outcome` says how the attempt ended. `wait`:
    /// how long it may wait for a connection to the target (its name
    /// resolved included) before it is sent (`None`: as long as it takes;
    /// the caller bounds the count). `key`: asked of the `wanted` check
    /// before it is sent.
    pub async fn callback(
        &self,
        uri: &str,
        opaque: &[u8],
        key: CallbackKey,
        wait: Option<Duration>,
    ) -> Result<(), RequestError> {
        let target = uri::parse(uri).map_err(RequestError::unsent)?;
        let (mut seq_buf, mut attempt_buf) = ([0u8; 10], [0u8; 10]);
        let headers: [(&str, &[u8]); 3] = [
            ("Content-Type", b"application/octet-stream"),
            ("X-Sequence-Number", format_u32(&mut seq_buf, key.sequence)),
            (
                "X-Chronos-Attempt",
                format_u32(&mut attempt_buf, key.attempt.into()),
            ),
        ];
        let count = if key.attempt == 0 { 2 } else { 3 };
        let request = post(&target, &headers[..count], opaque);
        let hex = timer_hex(key.unique, key.bloom);
        let msg = message_id(&hex, key.sequence);
        let answer = self.send_queued(&request, Some(key), wait, Some(msg));
        answered("callback", answer.await?)
    }

    /// Send a given-up pop's dead letter: `POST <uri>` with the opaque
    /// data and the headers the module's comment lists, signed as the
    /// pop's callbacks are. Behind the callback guard, queued as a
    /// callback is (`wait` as for [`Client::callback`]), but asked of no
    /// `wanted` check and told to no `sent` hook. Ok on any 2xx; else the
    /// error's `outcome` says how it ended.
    pub async fn dead_letter(
        &self,
        uri: &str,
        opaque: &[u8],
        letter: DeadLetter,
        wait: Option<Duration>,
    ) -> Result<(), RequestError> {
        let target = uri::parse(uri).map_err(RequestError::unsent)?;
        let hex = timer_hex(letter.unique, letter.bloom);
        let (mut seq_buf, mut attempt_buf, mut code_buf) = ([0u8; 10], [0u8; 10], [0u8; 10]);
        let headers: [(&str, &[u8]); 5] = [
            ("Content-Type", b"application/octet-stream"),
            (
                "X-Sequence-Number",
                format_u32(&mut seq_buf, letter.sequence),
            ),
            ("X-Chronos-Timer-Id", &hex),
            (
                "X-Chronos-Attempt",
                format_u32(&mut attempt_buf, letter.attempts.into()),
            ),
            (
                "X-Chronos-Last-Outcome",
                outcome_text(&letter.last, &mut code_buf),
            ),
        ];
        let request = post(&target, &headers, opaque);
        let msg = message_id(&hex, letter.sequence);
        let answer = self.send_queued(&request, None, wait, Some(msg));
        answered("dead-letter target", answer.await?)
    }

    /// Sign callbacks and dead letters with `keys` from now on (`None`, or
    /// none listed: unsigned); a reload calls it again.
    pub fn set_signing_keys(&self, keys: Option<Arc<SigningKeys>>) {
        *self.signing_keys.borrow_mut() = keys.filter(|k| !k.is_empty());
    }

    /// The bytes of queued request `r`, in a spare buffer: signed as `msg`
    /// when keys are set, with the clock read now.
    pub(super) fn build_queued(&self, r: &Request<'_>, msg: Option<MessageId<'_>>) -> Vec<u8> {
        let mut out = self.take_buffer();
        let keys = self.signing_keys.borrow();
        let (Some(keys), Some(msg)) = (keys.as_deref(), msg) else {
            build_request(&mut out, r.method, r.path, r.authority, r.headers, r.body);
            return out;
        };
        let n = r.headers.len();
        assert!(n <= HEADERS_MAX, "a queued request has few headers");
        let mut signed = self.signed.borrow_mut();
        signed.sign(keys, msg, clock::unix_ms() / 1000, r.body);
        let mut all: [(&str, &[u8]); HEADERS_MAX + 3] = [("", b""); HEADERS_MAX + 3];
        all[..n].copy_from_slice(r.headers);
        all[n..n + 3].copy_from_slice(&signed.pairs());
        build_request(
            &mut out,
            r.method,
            r.path,
            r.authority,
            &all[..n + 3],
            r.body,
        );
        out
    }
}

/// The timer ID's 32 hex digits, on the stack.
/// A `POST` of `body` to `target` with `headers`, its answer's body unread.
fn post<'r>(
    target: &uri::Target<'r>,
    headers: &'r [(&'r str, &'r [u8])],
    body: &'r [u8],
) -> Request<'r> {
    Request {
        host: target.host,
        port: target.port,
        tls: target.tls,
        authority: target.authority,
        method: "POST",
        path: target.path,
        headers,
        body,
        want_body: false,
    }
}

fn timer_hex(unique: u64, bloom: u64) -> [u8; 32] {
    TimerId { unique, bloom }.to_hex()
}

/// `<timer ID>-<sequence>`: the `webhook-id` of every attempt of one pop.
fn message_id(hex: &[u8; 32], sequence: u32) -> MessageId<'_> {
    MessageId {
        timer_id: std::str::from_utf8(hex).expect("hex digits are ASCII"),
        sequence,
    }
}

/// Ok on a 2xx; else the status and its `Retry-After` as the outcome.
fn answered(what: &str, answer: Answer) -> Result<(), RequestError> {
    if (200..300).contains(&answer.status) {
        return Ok(());
    }
    Err(RequestError::answered(
        what,
        answer.status,
        answer.retry_after_ms,
    ))
}

/// `X-Chronos-Last-Outcome`: what [`Outcome`]'s `Display` writes, without
/// allocating.
fn outcome_text<'b>(outcome: &Outcome, buf: &'b mut [u8; 10]) -> &'b [u8] {
    match outcome {
        Outcome::Transport => b"transport error",
        Outcome::Timeout => b"timeout",
        Outcome::Status { code, .. } => format_u32(buf, (*code).into()),
    }
}

#[cfg(test)]
mod tests;
