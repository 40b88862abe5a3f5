//! The wall-clock and calendar keys of `timing` (issue 42): `at`,
//! `start-at`, `cron`, `time-zone`, and, in a body between nodes,
//! `start-unix-ms` (the absolute start, `timer/timing.rs`).
//!
//! Read only when one of them is in the body: a timer without them is
//! parsed as before, with nothing more done.
//!
//! The rules (a client's body):
//! - `at`: an RFC 3339 instant; a one-shot timer, so neither `interval`
//!   nor `repeat-for` may come with it.
//! - `start-at`: an RFC 3339 instant, with `interval` (required) and
//!   `repeat-for` as without it; the first pop is at `start-at`.
//! - `cron`: 5 or 6 fields; `repeat-for` (positive) is required, for a
//!   timer must end; no `interval`; `time-zone` an IANA name, default UTC.
//! - At most one of `at`, `start-at`, `cron`; `time-zone` only with `cron`.
//!
//! In a body between nodes (`reliability.replicas` or `sites`),
//! `cron-cursor-ms` beside `cron` is the cursor (the offset of the next
//! occurrence from the start, `timer/timing.rs`), and `start-unix-ms` the
//! absolute start; in a client's body both are ignored.

use super::{seconds_to_ms, RawTiming};
use crate::timer::calendar::{parse_at, Schedule, Zone};
use crate::timer::timing::{TimingKind, TimingRef};
use std::borrow::Cow;

/// A timer's timing beyond `interval`, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing<'a> {
    pub kind: TimingKind,
    /// The instant, or the cron expression, as written.
    pub text: Cow<'a, str>,
    /// The zone's name (`cron`; empty otherwise).
    pub zone: Cow<'a, str>,
    /// The instant of `at` or `start-at`, Unix ms (0 for `cron`).
    pub at_unix_ms: i64,
    /// `start-unix-ms` of a body between nodes; `None` in a client's
    /// (the node that takes it fixes the start: [`Timing::start_unix_ms`]).
    pub start_unix_ms: Option<i64>,
}

impl Timing<'_> {
    pub fn into_owned(self) -> Timing<'static> {
        Timing {
            kind: self.kind,
            text: Cow::Owned(self.text.into_owned()),
            zone: Cow::Owned(self.zone.into_owned()),
            at_unix_ms: self.at_unix_ms,
            start_unix_ms: self.start_unix_ms,
        }
    }

    /// The wall-clock ms the pops count from: the body's, or for a
    /// client's operation made at `now_unix_ms` with `interval_ms`: the
    /// instant (`at`; never before now), one interval before `start-at`
    /// (never before now), or now (`cron`).
    pub fn start_unix_ms(&self, now_unix_ms: i64, interval_ms: u32) -> i64 {
        if let Some(start) = self.start_unix_ms {
            return start;
        }
        match self.kind {
            TimingKind::At => self.at_unix_ms.max(now_unix_ms),
            TimingKind::StartAt => self.at_unix_ms.max(now_unix_ms) - interval_ms as i64,
            TimingKind::Cron => now_unix_ms,
        }
    }

    /// As the extensions keep it, starting at `start_unix_ms`.
    pub fn to_ref(&self, start_unix_ms: i64) -> TimingRef<'_> {
        TimingRef {
            kind: self.kind,
            start_unix_ms,
            text: &self.text,
            zone: &self.zone,
        }
    }

    /// The timer's extension bytes for this timing (`timer::extras`).
    pub fn push_ext(&self, out: &mut Vec<u8>, start_unix_ms: i64) {
        crate::timer::extras::push_timing(out, &self.to_ref(start_unix_ms));
    }
}

/// Whether `timing` names any key of this file.
pub(super) fn present(t: &RawTiming) -> bool {
    t.at.is_some() || t.start_at.is_some() || t.cron.is_some() || t.time_zone.is_some()
}

/// The timing, `interval_ms` and `repeat_for_ms` of a body that names a
/// key of this file; `between_nodes`: a replication or cross-site body.
pub(super) fn parse(
    t: &RawTiming,
    between_nodes: bool,
) -> Result<(Timing<'static>, u32, u32), String> {
    let at = text(t.at.as_deref(), "timing.at", "an RFC 3339 instant")?;
    let start_at = text(
        t.start_at.as_deref(),
        "timing.start-at",
        "an RFC 3339 instant",
    )?;
    let cron = text(t.cron.as_deref(), "timing.cron", "a cron expression")?;
    let zone = text(
        t.time_zone.as_deref(),
        "timing.time-zone",
        "an IANA time zone name",
    )?;
    let named = [at.is_some(), start_at.is_some(), cron.is_some()];
    if named.iter().filter(|n| **n).count() > 1 {
        return Err(
            "timing.at, timing.start-at and timing.cron exclude each other: give one".into(),
        );
    }
    if zone.is_some() && cron.is_none() {
        return Err("timing.time-zone applies to timing.cron only".into());
    }
    let start_unix_ms = if between_nodes { t.start_unix_ms } else { None };
    let (kind, text, zone) = match (at, start_at, cron) {
        (Some(a), _, _) => (TimingKind::At, a, None),
        (_, Some(s), _) => (TimingKind::StartAt, s, None),
        (_, _, Some(c)) => (TimingKind::Cron, c, zone),
        // `time-zone` alone was refused above.
        _ => return Err("timing.time-zone applies to timing.cron only".into()),
    };
    let mut timing = Timing {
        kind,
        text: Cow::Owned(text),
        zone: Cow::Borrowed(""),
        at_unix_ms: 0,
        start_unix_ms,
    };
    let (interval_ms, repeat_for_ms) = match kind {
        TimingKind::At => {
            timing.at_unix_ms = parse_at(&timing.text).map_err(|e| format!("timing.at: {e}"))?;
            at_timing(t)?
        }
        TimingKind::StartAt => {
            timing.at_unix_ms =
                parse_at(&timing.text).map_err(|e| format!("timing.start-at: {e}"))?;
            start_at_timing(t)?
        }
        TimingKind::Cron => {
            let zone = zone.unwrap_or_else(|| "UTC".to_string());
            Schedule::parse(&timing.text).map_err(|e| format!("timing.cron: {e}"))?;
            Zone::parse(&zone).map_err(|e| format!("timing.{e}"))?;
            timing.zone = Cow::Owned(zone);
            cron_timing(t, between_nodes)?
        }
    };
    Ok((timing, interval_ms, repeat_for_ms))
}

/// A string key's text (`None`: absent or `null`).
fn text(v: Option<&serde_json::Value>, field: &str, what: &str) -> Result<Option<String>, String> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{field} must be a string: {what}")),
    }
}

/// A seconds key, in ms (`None`: absent or `null`).
fn ms(v: &Option<serde_json::Value>, field: &str) -> Result<Option<u32>, String> {
    match v {
        Some(v) if !v.is_null() => seconds_to_ms(field, v).map(Some),
        _ => Ok(None),
    }
}

/// `at`: no interval, no repeat-for.
fn at_timing(t: &RawTiming) -> Result<(u32, u32), String> {
    let interval = ms(&t.interval, "timing.interval")?;
    let repeat_for = ms(&t.repeat_for, "timing.repeat-for")?;
    if interval.is_some() || repeat_for.is_some() {
        return Err("timing.at is a one-shot timer: no timing.interval or timing.repeat-for with it (timing.start-at with timing.interval makes a repeating one)".into());
    }
    Ok((0, 0))
}

/// `start-at`: `interval` required, `repeat-for` as without `start-at`.
fn start_at_timing(t: &RawTiming) -> Result<(u32, u32), String> {
    if t.interval.as_ref().is_none_or(|v| v.is_null()) {
        return Err("timing.start-at needs timing.interval (the seconds between pops; timing.at makes a one-shot timer)".into());
    }
    super::parse_timing(t)
}

/// `cron`: `repeat-for` required and positive, no `interval`; between
/// nodes, the cursor from `cron-cursor-ms` (0 without: the first pop at
/// the start, then the schedule's).
fn cron_timing(t: &RawTiming, between_nodes: bool) -> Result<(u32, u32), String> {
    let interval = ms(&t.interval, "timing.interval")?;
    let repeat_for = ms(&t.repeat_for, "timing.repeat-for")?;
    if interval.is_some() {
        return Err("timing.cron with timing.interval: a calendar timer pops on its schedule's occurrences; leave timing.interval out".into());
    }
    // A client's cursor is fixed where the timer is created.
    let cursor = match between_nodes {
        true => t.cron_cursor_ms.unwrap_or(0),
        false => 0,
    };
    match repeat_for {
        None => Err("timing.cron needs timing.repeat-for (seconds after which the timer ends: a timer never runs for ever)".into()),
        Some(0) => Err("timing.repeat-for must be positive with timing.cron".into()),
        Some(r) => Ok((cursor, r)),
    }
}
