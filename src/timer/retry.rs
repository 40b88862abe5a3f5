//! A timer's delivery policy (issue 41): the `callback.retry` object and
//! the `callback.dead-letter` target of the request body, the back-off
//! schedule, and what the next step is after an attempt. Pure: no I/O, no
//! clock, no random source (the caller passes the time and a random
//! sample), so every rule is a table test here. The outcome of an attempt
//! and `Retry-After` are in `retry/outcome.rs`; the 16-byte form for the
//! log and the replication body in `retry/code.rs`.
//!
//! The rules:
//! - `attempts` counts every attempt, the first included.
//! - The delay before attempt k + 1 is `min(initial-delay × multiplier^(k−1),
//!   max-delay)`, spread by ± `jitter` × that delay. It is computed in
//!   integers (millionths of a millisecond), capped at `max-delay` at each
//!   step, so it never overflows and is the same on every machine.
//! - A retried answer's `Retry-After` is honoured: the next attempt waits
//!   at least that long, but never longer than `max-delay`.
//! - `give-up-after` counts from the first attempt: no attempt is sent
//!   after it; a retry that would fall after it gives up at once instead.
//! - What is retried, what is refused and what is delivered:
//!   [`Outcome::class`].
//!
//! The JSON, its bounds and its defaults (a key left out, or `null`, takes
//! its default; the defaults are the example). Seconds may have a
//! fraction, kept to the millisecond (rounded up, never down):
//!
//! | key | bound | default |
//! |---|---|---|
//! | `attempts` | a whole number, 1 to 200 | 10 |
//! | `initial-delay` | 0.001 to 86400 s (a day) | 1 s |
//! | `max-delay` | 0.001 to 86400 s (below initial-delay, it caps every delay, the first included) | 3600 s, or initial-delay when longer |
//! | `multiplier` | 1 to 10, kept to 0.01 | 2 |
//! | `jitter` | 0 to 1, kept to 0.001 | 0.2 |
//! | `give-up-after` | 0.001 to 2592000 s (30 days) | 86400 s |
//!
//! Any other key in `retry` is refused (a misspelt key would otherwise
//! quietly take a default). `dead-letter` is `{"http": {"uri": "..."}}`;
//! the URI is checked by the caller's check, as a callback URI is.

pub mod code;
pub mod outcome;

pub use outcome::{retry_after_ms, Class, Outcome};

use serde::Deserialize;
use serde_json::Value;

/// The most attempts a policy may ask for.
pub const ATTEMPTS_MAX: u8 = 200;
/// The longest delay between two attempts: a day.
pub const DELAY_MS_MAX: u32 = 86_400_000;
/// The longest `give-up-after`: 30 days.
pub const GIVE_UP_MS_MAX: u32 = 2_592_000_000;
/// `multiplier` in hundredths: 1 to 10.
pub const MULTIPLIER_CENTI_MIN: u16 = 100;
pub const MULTIPLIER_CENTI_MAX: u16 = 1000;
/// `jitter` in thousandths of the delay: 0 to 1.
pub const JITTER_MILLI_MAX: u16 = 1000;
/// The longest dead-letter URI (as a callback URI's bound).
pub const DEAD_LETTER_URI_BYTES_MAX: usize = 8 * 1024;

/// A validated retry policy, in the units it is kept and encoded in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included: 1 to [`ATTEMPTS_MAX`].
    pub attempts: u8,
    /// The delay before the second attempt, in ms.
    pub initial_delay_ms: u32,
    /// The longest delay before an attempt (before the jitter), in ms.
    pub max_delay_ms: u32,
    /// The factor from one delay to the next, in hundredths.
    pub multiplier_centi: u16,
    /// The spread of a delay, ± this many thousandths of it.
    pub jitter_milli: u16,
    /// No attempt is sent later than this after the first, in ms.
    pub give_up_after_ms: u32,
}

impl Default for RetryPolicy {
    /// The example: 10 attempts, 1 s doubling up to an hour, ± 20 %,
    /// for at most a day.
    fn default() -> Self {
        RetryPolicy {
            attempts: 10,
            initial_delay_ms: 1000,
            max_delay_ms: 3_600_000,
            multiplier_centi: 200,
            jitter_milli: 200,
            give_up_after_ms: 86_400_000,
        }
    }
}

impl RetryPolicy {
    /// `multiplier` as written in the JSON.
    pub fn multiplier(&self) -> f64 {
        f64::from(self.multiplier_centi) / 100.0
    }

    /// `jitter` as written in the JSON.
    pub fn jitter(&self) -> f64 {
        f64::from(self.jitter_milli) / 1000.0
    }

    /// Whether every field is within its bound (a parsed policy always is;
    /// a decoded one is checked with this).
    pub fn check(&self) -> Result<(), String> {
        let p = self;
        let within = |field: &str, ms: u32, min: u32, max: u32| {
            if (min..=max).contains(&ms) {
                Ok(())
            } else {
                Err(format!(
                    "callback.retry.{field} must be {} to {} seconds",
                    seconds(min),
                    seconds(max)
                ))
            }
        };
        if !(1..=ATTEMPTS_MAX).contains(&p.attempts) {
            return Err(format!(
                "callback.retry.attempts must be 1 to {ATTEMPTS_MAX}"
            ));
        }
        within("initial-delay", p.initial_delay_ms, 1, DELAY_MS_MAX)?;
        within("max-delay", p.max_delay_ms, 1, DELAY_MS_MAX)?;
        within("give-up-after", p.give_up_after_ms, 1, GIVE_UP_MS_MAX)?;
        if !(MULTIPLIER_CENTI_MIN..=MULTIPLIER_CENTI_MAX).contains(&p.multiplier_centi) {
            return Err("callback.retry.multiplier must be 1 to 10".into());
        }
        if p.jitter_milli > JITTER_MILLI_MAX {
            return Err("callback.retry.jitter must be 0 to 1".into());
        }
        Ok(())
    }
}

impl RetryPolicy {
    /// The policy as `callback.retry`'s JSON object, every key written
    /// (the replication, cross-site and resync bodies, and a look-up): it
    /// reads back as this policy.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        let _ = write!(
            out,
            "{{\"attempts\":{},\"initial-delay\":{},\"max-delay\":{},\"multiplier\":{},\"jitter\":{},\"give-up-after\":{}}}",
            self.attempts,
            seconds(self.initial_delay_ms),
            seconds(self.max_delay_ms),
            decimal(u32::from(self.multiplier_centi), 100),
            decimal(u32::from(self.jitter_milli), 1000),
            seconds(self.give_up_after_ms),
        );
    }
}

/// `n / scale` as the shortest decimal that reads back as it.
fn decimal(n: u32, scale: u32) -> String {
    let width = scale.ilog10() as usize;
    match n % scale {
        0 => (n / scale).to_string(),
        frac => {
            let text = format!("{}.{frac:0width$}", n / scale);
            text.trim_end_matches('0').to_string()
        }
    }
}

/// `callback.retry` as it is read: every key a JSON value, so a wrong type
/// gets a reason naming the key. The caller's codec embeds this and asks
/// [`RawRetry::policy`].
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, expecting = "callback.retry to be an object")]
pub struct RawRetry {
    attempts: Option<Value>,
    #[serde(rename = "initial-delay")]
    initial_delay: Option<Value>,
    #[serde(rename = "max-delay")]
    max_delay: Option<Value>,
    multiplier: Option<Value>,
    jitter: Option<Value>,
    #[serde(rename = "give-up-after")]
    give_up_after: Option<Value>,
}

impl RawRetry {
    /// Validate into a policy, taking defaults for keys left out.
    pub fn policy(&self) -> Result<RetryPolicy, String> {
        let d = RetryPolicy::default();
        let given = |v: &Option<Value>| v.as_ref().filter(|v| !v.is_null()).cloned();
        let attempts = match given(&self.attempts) {
            Some(v) => whole("attempts", &v, 1, u64::from(ATTEMPTS_MAX))? as u8,
            None => d.attempts,
        };
        let initial_delay_ms = match given(&self.initial_delay) {
            Some(v) => seconds_ms("initial-delay", &v, DELAY_MS_MAX)?,
            None => d.initial_delay_ms,
        };
        let max_delay_ms = match given(&self.max_delay) {
            Some(v) => seconds_ms("max-delay", &v, DELAY_MS_MAX)?,
            None => d.max_delay_ms.max(initial_delay_ms),
        };
        let multiplier_centi = match given(&self.multiplier) {
            Some(v) => fraction("multiplier", &v, 1.0, 10.0, 100.0)?,
            None => d.multiplier_centi,
        };
        let jitter_milli = match given(&self.jitter) {
            Some(v) => fraction("jitter", &v, 0.0, 1.0, 1000.0)?,
            None => d.jitter_milli,
        };
        let give_up_after_ms = match given(&self.give_up_after) {
            Some(v) => seconds_ms("give-up-after", &v, GIVE_UP_MS_MAX)?,
            None => d.give_up_after_ms,
        };
        let policy = RetryPolicy {
            attempts,
            initial_delay_ms,
            max_delay_ms,
            multiplier_centi,
            jitter_milli,
            give_up_after_ms,
        };
        policy.check()?;
        Ok(policy)
    }
}

/// Parse and validate a `callback.retry` object on its own.
pub fn parse_retry(json: &[u8]) -> Result<RetryPolicy, String> {
    serde_json::from_slice::<RawRetry>(json)
        .map_err(|e| format!("invalid callback.retry: {e}"))?
        .policy()
}

/// `callback.dead-letter` as it is read.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(expecting = "callback.dead-letter to be an object such as {\"http\": {\"uri\": ...}}")]
pub struct RawDeadLetter {
    http: Option<RawDeadLetterHttp>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(expecting = "callback.dead-letter.http to be an object with a uri")]
struct RawDeadLetterHttp {
    uri: Option<String>,
}

impl RawDeadLetter {
    /// The dead-letter URI, checked by `check_uri` (the caller's check of
    /// a callback URI: scheme, form, the callback guard).
    pub fn uri(self, check_uri: impl FnOnce(&str) -> Result<(), String>) -> Result<String, String> {
        let uri = self
            .http
            .ok_or("callback.dead-letter needs http: {\"http\": {\"uri\": ...}}")?
            .uri
            .filter(|u| !u.is_empty())
            .ok_or("callback.dead-letter.http.uri is missing")?;
        if uri.len() > DEAD_LETTER_URI_BYTES_MAX {
            return Err(format!(
                "callback.dead-letter.http.uri is longer than {DEAD_LETTER_URI_BYTES_MAX} bytes"
            ));
        }
        check_uri(&uri).map_err(|e| format!("callback.dead-letter.http.uri: {e}"))?;
        Ok(uri)
    }
}

/// Parse and validate a `callback.dead-letter` object on its own.
pub fn parse_dead_letter(
    json: &[u8],
    check_uri: impl FnOnce(&str) -> Result<(), String>,
) -> Result<String, String> {
    serde_json::from_slice::<RawDeadLetter>(json)
        .map_err(|e| format!("invalid callback.dead-letter: {e}"))?
        .uri(check_uri)
}

/// A whole number in `min..=max` (`10` and `10.0` alike).
fn whole(field: &str, v: &Value, min: u64, max: u64) -> Result<u64, String> {
    let bad = || format!("callback.retry.{field} must be a whole number, {min} to {max}");
    let n = match v {
        Value::Number(n) => n,
        _ => return Err(bad()),
    };
    let n = match (n.as_u64(), n.as_f64()) {
        (Some(u), _) => u,
        (None, Some(f)) if f.fract() == 0.0 && (0.0..=max as f64).contains(&f) => f as u64,
        _ => return Err(bad()),
    };
    if (min..=max).contains(&n) {
        Ok(n)
    } else {
        Err(bad())
    }
}

/// Seconds to whole ms, in `1..=max_ms`: rounded to the nearest ms when
/// within a millionth of it (binary floating point), else up.
fn seconds_ms(field: &str, v: &Value, max_ms: u32) -> Result<u32, String> {
    let bad = || {
        format!(
            "callback.retry.{field} must be a number of seconds, 0.001 to {}",
            seconds(max_ms)
        )
    };
    let secs = match v {
        Value::Number(n) => n.as_f64().ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    // Compared in seconds first: nothing past the bound is multiplied.
    if !(secs > 0.0 && secs <= f64::from(max_ms) / 1000.0) {
        return Err(bad());
    }
    let ms = (super::ms_of_seconds(secs) as u32).clamp(1, max_ms);
    Ok(ms)
}

/// A number in `min..=max`, kept in `1 / scale` steps (rounded).
fn fraction(field: &str, v: &Value, min: f64, max: f64, scale: f64) -> Result<u16, String> {
    let x = match v {
        Value::Number(n) => n.as_f64(),
        _ => None,
    };
    match x {
        Some(x) if (min..=max).contains(&x) => Ok((x * scale).round() as u16),
        _ => Err(format!(
            "callback.retry.{field} must be a number, {min} to {max}"
        )),
    }
}

/// Milliseconds as the seconds a client writes (`1500` → `1.5`).
fn seconds(ms: u32) -> String {
    match ms % 1000 {
        0 => (ms / 1000).to_string(),
        frac => {
            let text = format!("{}.{frac:03}", ms / 1000);
            text.trim_end_matches('0').to_string()
        }
    }
}

/// Millionths of a millisecond: the schedule's fixed point.
const NANO_MS: u64 = 1_000_000;

/// The delay before attempt `done + 1`, after `done` (at least 1) failed
/// attempts: `min(initial × multiplier^(done−1), max)` ms, spread by
/// ± jitter × that. `sample` is a uniform random `u32`: 0 is the shortest
/// delay, `2^31` the delay itself, `u32::MAX` just under the longest.
pub fn delay_before_attempt_ms(policy: &RetryPolicy, done: u32, sample: u32) -> u64 {
    assert!(done >= 1, "a delay follows an attempt");
    let cap = u64::from(policy.max_delay_ms) * NANO_MS;
    let mut delay = (u64::from(policy.initial_delay_ms) * NANO_MS).min(cap);
    // Capped at each step, so the product never passes a day (in nano-ms,
    // 8.64e13, times 10 is far inside u64); at most ATTEMPTS_MAX steps.
    for _ in 1..done.min(u32::from(ATTEMPTS_MAX)) {
        if delay == cap {
            break;
        }
        delay = (delay * u64::from(policy.multiplier_centi) / 100).min(cap);
    }
    let base = (delay + NANO_MS / 2) / NANO_MS;
    let spread = base * u64::from(policy.jitter_milli) / 1000;
    // base ≤ 8.64e7, so 2 × spread × sample < 2^64.
    base - spread + ((2 * spread * u64::from(sample)) >> 32)
}

/// What follows an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Delivered: nothing more to send.
    Done,
    /// Send the next attempt at this time (the caller's clock, as `now_ms`).
    RetryAt(u64),
    /// Send no more attempts: the pop goes to the dead-letter target.
    GiveUp(GiveUp),
}

/// Why the attempts end without a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// The target refused the request (a 4xx other than 408 and 429, or
    /// an answer that is neither a success nor retried).
    Refused,
    /// `attempts` are spent.
    AttemptsSpent,
    /// The next attempt would fall after `give-up-after`.
    PastGiveUpAfter,
}

/// After attempt number `done` (from 1) ended with `outcome` at `now_ms`,
/// the first having been sent at `first_attempt_ms` (both on the caller's
/// one clock): whether and when to send the next. `sample`: as for
/// [`delay_before_attempt_ms`].
pub fn next_attempt(
    policy: &RetryPolicy,
    done: u32,
    first_attempt_ms: u64,
    now_ms: u64,
    outcome: Outcome,
    sample: u32,
) -> Next {
    match outcome.class() {
        Class::Delivered => return Next::Done,
        Class::Refused => return Next::GiveUp(GiveUp::Refused),
        Class::Retry => {}
    }
    if done >= u32::from(policy.attempts) {
        return Next::GiveUp(GiveUp::AttemptsSpent);
    }
    let mut delay = delay_before_attempt_ms(policy, done, sample);
    if let Some(after) = outcome.retry_after_ms() {
        delay = delay.max(after.min(u64::from(policy.max_delay_ms)));
    }
    let at = now_ms.saturating_add(delay);
    if at > first_attempt_ms.saturating_add(u64::from(policy.give_up_after_ms)) {
        return Next::GiveUp(GiveUp::PastGiveUpAfter);
    }
    Next::RetryAt(at)
}

#[cfg(test)]
mod tests;
