//! The next occurrence of a schedule in a zone, and the one to fire after
//! an outage.
//!
//! One concern: the rules of `calendar/mod.rs` for local times that a DST
//! change skips or repeats, applied to `civil.rs`'s search. Bounded: the
//! search looks through the year of the instant and the next
//! [`HORIZON_YEARS`], and each turn of its loop either returns or moves
//! past a candidate, at most [`TURNS_MAX`] turns. Nothing allocates.

use super::civil;
use super::cron::Schedule;
use super::zone::{Local, Zone};

/// Years searched after the year of the instant: 8, the longest wait
/// between two February 29ths (2096 to 2104), so that every schedule
/// [`Schedule::parse`] accepts has an occurrence within the horizon.
pub const HORIZON_YEARS: i64 = 8;

/// The most candidates one search looks at: one, plus one per DST change
/// it steps over (a few a year in any zone). Never reached in practice; a
/// bound all the same.
pub const TURNS_MAX: usize = 1_024;

/// The first occurrence of `schedule` in `zone` strictly after the instant
/// `after_ms` (Unix ms), in Unix ms (always a whole second), or `None` when
/// there is none within the horizon or the years -9999 to 9999.
pub fn next_after(schedule: &Schedule, zone: &Zone, after_ms: i64) -> Option<i64> {
    // Occurrences are whole seconds: the first candidate second is the one
    // after the second `after_ms` falls in.
    let from = after_ms.div_euclid(1_000).checked_add(1)?;
    let mut local = start_local(zone, from)?;
    let last_year = civil::split(local).year + HORIZON_YEARS;
    for _ in 0..TURNS_MAX {
        let candidate = civil::next_match(schedule, local, last_year)?;
        match zone.resolve(candidate)? {
            // A local time shown twice fires at its first instant only.
            Local::One(at) | Local::Fold { first: at, .. } if at >= from => {
                return at.checked_mul(1_000)
            }
            Local::One(_) | Local::Fold { .. } => local = candidate + 1,
            Local::Gap { after, .. } => {
                let end = gap_end(zone, candidate, after)?;
                if !schedule.every_hour() {
                    // Moved forward by whole minutes to the first local
                    // time that exists, as croniter does.
                    let moved = candidate + (end - candidate + 59) / 60 * 60;
                    let at = moved - after;
                    if at >= from {
                        return at.checked_mul(1_000);
                    }
                }
                local = end;
            }
        }
    }
    None
}

/// The local time to search from for occurrences at or after the instant
/// `from`: the local time after that of the second before it (so that
/// when `from` is a change of offset, the local times of a gap just
/// before, moved to `from`, are still found), except in the second pass of
/// a local time shown twice, where every local time up to the end of the
/// repeated stretch had its first instant before `from`, so the search
/// starts at that end.
fn start_local(zone: &Zone, from: i64) -> Option<i64> {
    let before = from - 1;
    let local = before + zone.offset_at(before)? + 1;
    match zone.resolve(local)? {
        Local::Fold { first, .. } if first < from => {
            // Local times repeat from the change until the change plus
            // the offset before it.
            let change = zone.change_at_or_before(from)?;
            Some(change + (local - first))
        }
        _ => Some(local),
    }
}

/// The first local time after the gap that `local` falls in, given the
/// offset after the change: the change's instant in the new offset.
fn gap_end(zone: &Zone, local: i64, after: i64) -> Option<i64> {
    // `local` read with the new offset is an instant before the change.
    let change = zone.change_after(local - after)?;
    let end = change + after;
    debug_assert!(
        end > local,
        "a local time in a gap comes before the gap's end"
    );
    Some(end)
}

/// What to do about a calendar timer when it is looked at again after an
/// outage (every replica down, or a restart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// The occurrence to fire at once (Unix ms): the first one after the
    /// last pop, when it is already due. However many occurrences were
    /// missed, this one alone fires, once; the others are dropped.
    pub missed: Option<i64>,
    /// The occurrence to wait for next (Unix ms): the first strictly after
    /// now, or `None` when the schedule has none within the horizon.
    pub next: Option<i64>,
}

/// The misfire rule: given the instant of the last pop (`last_ms`; its
/// start when none popped yet) and `now_ms`, the one missed occurrence to
/// fire now, if any, and the next one to wait for.
pub fn recover(schedule: &Schedule, zone: &Zone, last_ms: i64, now_ms: i64) -> Recovery {
    let due = next_after(schedule, zone, last_ms);
    match due {
        Some(at) if at <= now_ms => Recovery {
            missed: Some(at),
            next: next_after(schedule, zone, now_ms),
        },
        _ => Recovery {
            missed: None,
            next: due,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix ms of an RFC 3339 instant.
    fn ms(text: &str) -> i64 {
        super::super::at::parse_at(text).unwrap()
    }

    /// `count` successive occurrences after `start`.
    fn chain(expr: &str, zone: &str, start: &str, count: usize) -> Vec<i64> {
        let schedule = Schedule::parse(expr).unwrap();
        let zone = Zone::parse(zone).unwrap();
        let mut at = ms(start);
        let mut out = Vec::new();
        for _ in 0..count {
            at = next_after(&schedule, &zone, at).unwrap();
            out.push(at);
        }
        out
    }

    fn all(texts: &[&str]) -> Vec<i64> {
        texts.iter().map(|t| ms(t)).collect()
    }

    #[test]
    fn strictly_after_and_on_whole_seconds() {
        let every = chain("* * * * * *", "UTC", "2026-01-01T00:00:00.500Z", 2);
        assert_eq!(
            every,
            all(&["2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z"])
        );
        let minute = chain("* * * * *", "UTC", "2026-01-01T00:00:00Z", 1);
        assert_eq!(minute, all(&["2026-01-01T00:01:00Z"]));
        let weekdays = chain(
            "0 9 * * MON-FRI",
            "Europe/Paris",
            "2026-11-27T09:00:00+01:00",
            2,
        );
        assert_eq!(
            weekdays,
            all(&["2026-11-30T09:00:00+01:00", "2026-12-01T09:00:00+01:00"])
        );
        let kolkata = chain("30 8 * * *", "Asia/Kolkata", "2026-06-01T00:00:00Z", 1);
        assert_eq!(kolkata, all(&["2026-06-01T08:30:00+05:30"]));
    }

    #[test]
    fn a_skipped_local_time_moves_to_the_end_of_the_gap() {
        // Paris, 2025-03-30: 02:00 to 03:00 does not exist.
        let fixed = chain("30 2 * * *", "Europe/Paris", "2025-03-29T12:00:00+01:00", 2);
        assert_eq!(
            fixed,
            all(&["2025-03-30T03:00:00+02:00", "2025-03-31T02:30:00+02:00"])
        );
        // Several matches in the gap fire once, at its end.
        let many = chain(
            "*/20 2 * * *",
            "Europe/Paris",
            "2025-03-29T12:00:00+01:00",
            2,
        );
        assert_eq!(
            many,
            all(&["2025-03-30T03:00:00+02:00", "2025-03-31T02:00:00+02:00"])
        );
        let both = chain(
            "0 2-3 * * *",
            "Europe/Paris",
            "2025-03-29T12:00:00+01:00",
            2,
        );
        assert_eq!(
            both,
            all(&["2025-03-30T03:00:00+02:00", "2025-03-31T02:00:00+02:00"])
        );
        // Lord Howe moves 30 minutes: 02:00 to 02:30 does not exist.
        let howe = chain(
            "15 2 * * *",
            "Australia/Lord_Howe",
            "2025-10-04T12:00:00+10:30",
            2,
        );
        assert_eq!(
            howe,
            all(&["2025-10-05T02:30:00+11:00", "2025-10-06T02:15:00+11:00"])
        );
        // With seconds: moved by whole minutes, as croniter does.
        let seconds = chain(
            "30 15 2 * * *",
            "Australia/Lord_Howe",
            "2025-10-04T12:00:00+10:30",
            1,
        );
        assert_eq!(seconds, all(&["2025-10-05T02:30:30+11:00"]));
    }

    #[test]
    fn a_skipped_local_time_of_an_every_hour_schedule_is_skipped() {
        let every = chain(
            "*/20 * * * *",
            "Europe/Paris",
            "2025-03-30T01:30:00+01:00",
            3,
        );
        let want = [
            "2025-03-30T01:40:00+01:00",
            "2025-03-30T03:00:00+02:00",
            "2025-03-30T03:20:00+02:00",
        ];
        assert_eq!(every, all(&want));
        let half = chain(
            "30 * * * *",
            "America/New_York",
            "2025-03-09T01:00:00-05:00",
            2,
        );
        assert_eq!(
            half,
            all(&["2025-03-09T01:30:00-05:00", "2025-03-09T03:30:00-04:00"])
        );
    }

    #[test]
    fn a_repeated_local_time_fires_once() {
        // Paris, 2025-10-26: 02:00 to 03:00 happens twice.
        let fixed = chain("30 2 * * *", "Europe/Paris", "2025-10-25T12:00:00+02:00", 2);
        assert_eq!(
            fixed,
            all(&["2025-10-26T02:30:00+02:00", "2025-10-27T02:30:00+01:00"])
        );
        let every = chain(
            "*/20 * * * *",
            "Europe/Paris",
            "2025-10-26T01:50:00+02:00",
            5,
        );
        let want = [
            "2025-10-26T02:00:00+02:00",
            "2025-10-26T02:20:00+02:00",
            "2025-10-26T02:40:00+02:00",
            "2025-10-26T03:00:00+01:00",
            "2025-10-26T03:20:00+01:00",
        ];
        assert_eq!(every, all(&want));
        // From inside the second pass: the next local time not yet shown.
        let inside = chain(
            "*/20 * * * *",
            "Europe/Paris",
            "2025-10-26T02:10:00+01:00",
            1,
        );
        assert_eq!(inside, all(&["2025-10-26T03:00:00+01:00"]));
        let howe = chain(
            "45 1 * * *",
            "Australia/Lord_Howe",
            "2026-04-04T12:00:00+11:00",
            2,
        );
        assert_eq!(
            howe,
            all(&["2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"])
        );
    }

    #[test]
    fn changes_at_midnight_cross_the_date() {
        // Santiago, 2025-09-07: 00:00 to 01:00 does not exist.
        let gap = chain(
            "30 0 * * *",
            "America/Santiago",
            "2025-09-06T12:00:00-04:00",
            2,
        );
        assert_eq!(
            gap,
            all(&["2025-09-07T01:00:00-03:00", "2025-09-08T00:30:00-03:00"])
        );
        // 2025-04-06 00:00 went back to 23:00 of the 5th, which then repeated.
        let fold = chain(
            "30 23 * * *",
            "America/Santiago",
            "2025-04-05T12:00:00-03:00",
            2,
        );
        assert_eq!(
            fold,
            all(&["2025-04-05T23:30:00-03:00", "2025-04-06T23:30:00-04:00"])
        );
    }

    #[test]
    fn the_horizon_bounds_the_search() {
        let leap = Schedule::parse("0 0 29 2 *").unwrap();
        let utc = Zone::utc();
        let from = ms("2096-03-01T00:00:00Z");
        assert_eq!(
            next_after(&leap, &utc, from),
            Some(ms("2104-02-29T00:00:00Z"))
        );
        assert_eq!(next_after(&leap, &utc, ms("9998-03-01T00:00:00Z")), None);
        assert_eq!(next_after(&leap, &utc, i64::MAX), None);
        assert_eq!(next_after(&leap, &utc, i64::MIN), None);
    }

    #[test]
    fn an_outage_fires_one_missed_occurrence() {
        let s = Schedule::parse("0 * * * *").unwrap();
        let utc = Zone::utc();
        let last = ms("2026-01-01T00:00:00Z");
        // Down for 5 hours: the first missed fires once, then 06:00.
        let late = recover(&s, &utc, last, ms("2026-01-01T05:30:00Z"));
        let want = Recovery {
            missed: Some(ms("2026-01-01T01:00:00Z")),
            next: Some(ms("2026-01-01T06:00:00Z")),
        };
        assert_eq!(late, want);
        // Nothing missed: wait for the next.
        let early = recover(&s, &utc, last, ms("2026-01-01T00:59:59Z"));
        assert_eq!(
            early,
            Recovery {
                missed: None,
                next: Some(ms("2026-01-01T01:00:00Z"))
            }
        );
        // Exactly due counts as missed.
        let due = recover(&s, &utc, last, ms("2026-01-01T01:00:00Z"));
        assert_eq!(due.missed, Some(ms("2026-01-01T01:00:00Z")));
        assert_eq!(due.next, Some(ms("2026-01-01T02:00:00Z")));
    }
}
