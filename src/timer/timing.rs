//! Wall-clock and calendar timing of a timer (issue 42): what `at`,
//! `start-at` and `cron` mean for the pops of a stored timer.
//!
//! The wheel still counts a timer's pops from its head's `start_ms`
//! (engine clock). What these kinds add is an absolute start, in
//! wall-clock Unix ms, that every replica, site, resync page and log
//! record carries as it is (`extras` section 2), and converts to its own
//! engine clock where it stores the timer: so no copy drifts by the
//! transit of a relative delta.
//!
//! - `at`: one pop at the instant; the start is the instant (or the
//!   creation, for one in the past: it pops at once), the interval 0.
//! - `start-at` with `interval`: pops as for `interval` alone, shifted so
//!   that the first is at `start-at` (the start is `start-at` minus one
//!   interval; `start-at` in the past counts from the creation instead).
//! - `cron`: the start is the creation; the head's `interval_ms` is the
//!   *cursor*, the offset from the start of the occurrence that pop
//!   `sequence + 1` fires at ([`CURSOR_NONE`]: none left). Each pop moves
//!   the cursor to the next occurrence ([`next_cursor`]); the timer ends
//!   when that is past the start plus `repeat-for`. A pop taken more than
//!   [`MISFIRE_GRACE_MS`] after its occurrence (on this replica) was
//!   missed in an outage (every replica down, a restart): it fires once,
//!   and the misfire rule (`calendar::recover`) drops the other missed
//!   occurrences: the next pop is the first occurrence not yet due. One
//!   pop on recovery, not one per missed occurrence.

use super::calendar::{next_after, parse_at, recover, Schedule, Zone};

/// The cursor of a cron timer with no occurrence left.
pub const CURSOR_NONE: u32 = u32::MAX;

/// How late a cron timer's pop may be taken and still be followed by the
/// next occurrence in turn; a later one was missed in an outage, and the
/// misfire rule drops the other occurrences missed with it.
pub const MISFIRE_GRACE_MS: i64 = 1_000;

/// The kind of a timer's timing (its code in `extras` section 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TimingKind {
    At = 1,
    StartAt = 2,
    Cron = 3,
}

impl TimingKind {
    pub fn from_code(code: u8) -> Option<TimingKind> {
        match code {
            1 => Some(TimingKind::At),
            2 => Some(TimingKind::StartAt),
            3 => Some(TimingKind::Cron),
            _ => None,
        }
    }
}

/// A timer's timing as its extensions keep it, borrowed from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimingRef<'a> {
    pub kind: TimingKind,
    /// Wall-clock Unix ms the pops count from (see the module doc).
    pub start_unix_ms: i64,
    /// The RFC 3339 instant, or the cron expression, as the client wrote it.
    pub text: &'a str,
    /// The IANA zone name (`cron` only; empty otherwise).
    pub zone: &'a str,
}

impl TimingRef<'_> {
    /// Whether the texts are what the codec accepts.
    pub fn check(&self) -> Result<(), String> {
        match self.kind {
            TimingKind::At | TimingKind::StartAt => {
                parse_at(self.text)?;
                if !self.zone.is_empty() {
                    return Err("a time zone beside an instant".into());
                }
            }
            TimingKind::Cron => {
                self.calendar()?;
            }
        }
        Ok(())
    }

    /// A cron timing's schedule and zone.
    pub fn calendar(&self) -> Result<(Schedule, Zone), String> {
        Ok((Schedule::parse(self.text)?, Zone::parse(self.zone)?))
    }
}

/// The first cursor of a cron timer that starts at `start_unix_ms`: the
/// offset of its first occurrence strictly after the start.
pub fn first_cursor(
    schedule: &Schedule,
    zone: &Zone,
    start_unix_ms: i64,
    repeat_for_ms: u32,
) -> u32 {
    cursor_of(
        next_after(schedule, zone, start_unix_ms),
        start_unix_ms,
        repeat_for_ms,
    )
}

/// The cursor after the pop at `cursor` of a cron timer `t`, taken at
/// `now_unix_ms` on a replica `lag_ms` behind the occurrences: the next
/// occurrence; or, when this pop was more than [`MISFIRE_GRACE_MS`] late
/// (it was missed in an outage, and fired now, once), the first
/// occurrence not yet due here (the misfire rule, `calendar::recover`).
pub fn next_cursor(
    t: &TimingRef<'_>,
    cursor: u32,
    repeat_for_ms: u32,
    now_unix_ms: i64,
    lag_ms: i64,
) -> u32 {
    if cursor == CURSOR_NONE {
        return CURSOR_NONE;
    }
    let Ok((schedule, zone)) = t.calendar() else {
        // Checked where it came in; a bad one ends the timer, never panics.
        return CURSOR_NONE;
    };
    let popped = t.start_unix_ms.saturating_add(cursor as i64);
    let schedule_now = now_unix_ms.saturating_sub(lag_ms);
    let next = if schedule_now.saturating_sub(popped) > MISFIRE_GRACE_MS {
        // Due here from `schedule_now` on: the first strictly after the
        // ms before it.
        recover(&schedule, &zone, popped, schedule_now - 1).next
    } else {
        next_after(&schedule, &zone, popped)
    };
    cursor_of(next, t.start_unix_ms, repeat_for_ms)
}

/// An occurrence as a cursor from `start_unix_ms`: [`CURSOR_NONE`] past
/// `repeat_for_ms`, or for none.
fn cursor_of(occurrence: Option<i64>, start_unix_ms: i64, repeat_for_ms: u32) -> u32 {
    let Some(at) = occurrence else {
        return CURSOR_NONE;
    };
    match at.checked_sub(start_unix_ms) {
        Some(offset)
            if (0..=repeat_for_ms as i64).contains(&offset) && offset < CURSOR_NONE as i64 =>
        {
            offset as u32
        }
        _ => CURSOR_NONE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-03-29 00:59:58 UTC: Paris changes to summer time an hour later.
    const START_MS: i64 = 1_774_745_998_000;

    fn every_2_s() -> TimingRef<'static> {
        TimingRef {
            kind: TimingKind::Cron,
            start_unix_ms: START_MS,
            text: "*/2 * * * * *",
            zone: "Europe/Paris",
        }
    }

    #[test]
    fn the_cursor_walks_the_occurrences_and_ends_after_repeat_for() {
        let t = every_2_s();
        let (s, z) = t.calendar().unwrap();
        let mut cursor = first_cursor(&s, &z, START_MS, 6_000);
        let mut seen = Vec::new();
        while cursor != CURSOR_NONE {
            seen.push(cursor);
            let now = START_MS + cursor as i64;
            cursor = next_cursor(&t, cursor, 6_000, now, 0);
        }
        assert_eq!(seen, [2_000, 4_000, 6_000]);
    }

    #[test]
    fn a_missed_run_fires_once_then_waits_for_the_next_occurrence() {
        let t = every_2_s();
        // The pop at 2 s taken 60 s late (a restart): the next is the
        // first from now on, not the 29 missed since.
        let now = START_MS + 62_000;
        assert_eq!(next_cursor(&t, 2_000, 600_000, now, 0), 62_000);
        assert_eq!(next_cursor(&t, 2_000, 600_000, now + 1, 0), 64_000);
        // A skewed replica (2 s behind) keeps its occurrences.
        assert_eq!(
            next_cursor(&t, 2_000, 600_000, START_MS + 4_500, 2_000),
            4_000
        );
        // A pop late by less than the grace: the next in turn.
        assert_eq!(next_cursor(&t, 2_000, 600_000, START_MS + 2_900, 0), 4_000);
    }

    #[test]
    fn a_bad_text_ends_the_timer_instead_of_panicking() {
        let t = TimingRef {
            text: "nonsense",
            ..every_2_s()
        };
        assert_eq!(next_cursor(&t, 0, 10_000, START_MS, 0), CURSOR_NONE);
        assert!(t.check().is_err());
        assert_eq!(cursor_of(Some(START_MS - 1), START_MS, 10), CURSOR_NONE);
    }
}
