//! The delivery fields of a timer body (issue 41): `callback.retry` and
//! `callback.dead-letter` (a client's policy, carried in every body), and
//! `delivery-state` (internal: a replica's report of one pop's attempts).
//!
//! A policy is `retry`, `dead-letter` or both. `dead-letter` alone means
//! one attempt and then the dead-letter target; `retry` alone means the
//! attempts, and a given-up pop is logged and counted.

use super::{CheckUri, RawTimer};
use crate::timer::retry::{RawDeadLetter, RawRetry, RetryPolicy};
use serde::Deserialize;
use std::borrow::Cow;

/// A timer's delivery policy, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery<'a> {
    pub retry: RetryPolicy,
    /// Empty: none.
    pub dead_letter: Cow<'a, str>,
}

impl Delivery<'_> {
    pub fn into_owned(self) -> Delivery<'static> {
        Delivery {
            retry: self.retry,
            dead_letter: Cow::Owned(self.dead_letter.into_owned()),
        }
    }

    /// The timer's extension bytes for this policy (`timer::extras`).
    pub fn push_ext(&self, out: &mut Vec<u8>) {
        crate::timer::extras::push_delivery(out, &self.retry, &self.dead_letter);
    }
}

/// One pop's attempts as the replica sending them reports them to the
/// others (`delivery-state`): they shift their own turn behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptState {
    /// The pop's `X-Sequence-Number`.
    pub sequence: u32,
    /// Attempts made so far (at least 1).
    pub attempts: u8,
    /// Wall-clock ms of the first attempt.
    pub first_unix_ms: u64,
    /// Wall-clock ms the next attempt is due (meaningless once done).
    pub next_unix_ms: u64,
    /// The last attempt's outcome: an HTTP status, or 0 (transport) or 1
    /// (timeout).
    pub last_outcome: u16,
    /// Delivered or given up: nothing more is sent for this pop.
    pub done: bool,
}

/// `delivery-state` as it is read.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(
    deny_unknown_fields,
    expecting = "delivery-state to be an object with sequence, attempts, first-attempt, next-attempt, last-outcome and done"
)]
pub(super) struct RawState {
    #[serde(deserialize_with = "super::integer")]
    sequence: u32,
    #[serde(deserialize_with = "super::integer")]
    attempts: u8,
    #[serde(rename = "first-attempt", deserialize_with = "super::integer")]
    first_attempt: u64,
    #[serde(rename = "next-attempt", deserialize_with = "super::integer")]
    next_attempt: u64,
    #[serde(rename = "last-outcome", deserialize_with = "super::integer")]
    last_outcome: u16,
    done: bool,
}

/// The policy of a body, if it names one.
pub(super) fn parse_policy<'a>(
    retry: Option<Box<RawRetry>>,
    dead_letter: Option<Box<RawDeadLetter>>,
    check_uri: CheckUri,
) -> Result<Option<Delivery<'a>>, String> {
    let retry = match retry {
        Some(raw) => Some(raw.policy()?),
        None => None,
    };
    let dead_letter = match dead_letter {
        Some(raw) => raw.uri(check_uri)?,
        None => String::new(),
    };
    if retry.is_none() && dead_letter.is_empty() {
        return Ok(None);
    }
    let retry = retry.unwrap_or(RetryPolicy {
        attempts: 1,
        ..RetryPolicy::default()
    });
    Ok(Some(Delivery {
        retry,
        dead_letter: Cow::Owned(dead_letter),
    }))
}

/// The `delivery-state` of a replication body.
pub(super) fn parse_state(raw: &RawTimer<'_>) -> Result<Option<AttemptState>, String> {
    let Some(s) = &raw.delivery_state else {
        return Ok(None);
    };
    if s.attempts == 0 {
        return Err("delivery-state.attempts must be at least 1".into());
    }
    if s.sequence == 0 {
        return Err(
            "delivery-state.sequence must be at least 1 (a pop's X-Sequence-Number)".into(),
        );
    }
    Ok(Some(AttemptState {
        sequence: s.sequence,
        attempts: s.attempts,
        first_unix_ms: s.first_attempt,
        next_unix_ms: s.next_attempt,
        last_outcome: s.last_outcome,
        done: s.done,
    }))
}
