//! Civil (wall-clock) time as seconds, and the search for the next civil
//! time a [`Schedule`] allows.
//!
//! One concern: the proleptic Gregorian calendar with no time zone. A civil
//! time is a count of "local seconds" since 1970-01-01T00:00:00 on the wall
//! clock, so a day is always 86,400 of them; which instant a local second
//! is, is `zone.rs`'s question. The search is bounded: it looks at most
//! through the last year it is given, day by day, and a day's time by the
//! bitsets, so it takes at most some 4,000 steps and allocates nothing.

use super::cron::Schedule;

/// Seconds in a civil day.
pub const DAY: i64 = 86_400;

/// A civil date and time of day.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// Days in `month` (1 to 12) of `year`.
pub fn days_in_month(year: i64, month: u32) -> u32 {
    debug_assert!((1..=12).contains(&month), "a month");
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the date (negative before it): the usual
/// era-of-400-years reckoning.
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = i64::from((month + 9) % 12);
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date `days` after 1970-01-01: the inverse of [`days_from_civil`].
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The day of the week of a day count, 0 Sunday (1970-01-01 was a
/// Thursday).
pub fn weekday(days: i64) -> u32 {
    (days + 4).rem_euclid(7) as u32
}

/// A local-second count as a civil date and time.
pub fn split(local: i64) -> Civil {
    let (year, month, day) = civil_from_days(local.div_euclid(DAY));
    let second_of_day = local.rem_euclid(DAY) as u32;
    Civil {
        year,
        month,
        day,
        hour: second_of_day / 3_600,
        minute: second_of_day / 60 % 60,
        second: second_of_day % 60,
    }
}

/// A civil date and time as a local-second count (the search builds its
/// answer directly; the tests use this).
#[cfg(test)]
pub fn join(c: Civil) -> i64 {
    days_from_civil(c.year, c.month, c.day) * DAY
        + i64::from(c.hour * 3_600 + c.minute * 60 + c.second)
}

/// The first civil time at or after `from` (local seconds) that
/// `schedule` allows, in year `last_year` at the latest.
pub fn next_match(schedule: &Schedule, from: i64, last_year: i64) -> Option<i64> {
    let start = split(from);
    let (mut year, mut month, mut day) = (start.year, start.month, start.day);
    let mut time = (start.hour, start.minute, start.second);
    while year <= last_year {
        if !schedule.has_month(month) || day > days_in_month(year, month) {
            (year, month) = if month == 12 {
                (year + 1, 1)
            } else {
                (year, month + 1)
            };
            (day, time) = (1, (0, 0, 0));
            continue;
        }
        let days = days_from_civil(year, month, day);
        if schedule.day_matches(day, weekday(days)) {
            if let Some((hour, minute, second)) = schedule.time_from(time.0, time.1, time.2) {
                return Some(days * DAY + i64::from(hour * 3_600 + minute * 60 + second));
            }
        }
        (day, time) = (day + 1, (0, 0, 0));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_round_trip_through_dates() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert!((1..=12).contains(&m) && d >= 1 && d <= days_in_month(y, m));
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(20_512), (2026, 2, 28));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn weekdays_and_month_lengths() {
        assert_eq!(weekday(0), 4);
        // 2026-12-01 is a Tuesday.
        assert_eq!(weekday(days_from_civil(2026, 12, 1)), 2);
        assert_eq!(days_in_month(2028, 2), 29);
        assert_eq!(days_in_month(2100, 2), 28);
        assert_eq!(days_in_month(2000, 2), 29);
        assert_eq!(days_in_month(2027, 4), 30);
    }

    #[test]
    fn split_and_join_are_inverse() {
        let c = Civil {
            year: 2026,
            month: 3,
            day: 29,
            hour: 2,
            minute: 30,
            second: 5,
        };
        assert_eq!(split(join(c)), c);
        assert_eq!(split(-1).hour, 23);
    }

    fn at(text: &str) -> i64 {
        let n = |r: std::ops::Range<usize>| text[r].parse::<u32>().unwrap();
        let c = Civil {
            year: i64::from(n(0..4)),
            month: n(5..7),
            day: n(8..10),
            hour: n(11..13),
            minute: n(14..16),
            second: n(17..19),
        };
        join(c)
    }

    #[test]
    fn next_match_walks_fields_from_the_top() {
        let s = Schedule::parse("0 9 * * MON-FRI").unwrap();
        // Saturday 2026-11-28 10:00 -> Monday 09:00.
        let from = at("2026-11-28T10:00:00");
        assert_eq!(next_match(&s, from, 2030), Some(at("2026-11-30T09:00:00")));
        // At a match itself: that match.
        assert_eq!(
            next_match(&s, at("2026-11-30T09:00:00"), 2030),
            Some(at("2026-11-30T09:00:00"))
        );
        let leap = Schedule::parse("0 0 29 2 *").unwrap();
        assert_eq!(
            next_match(&leap, at("2026-03-01T00:00:00"), 2030),
            Some(at("2028-02-29T00:00:00"))
        );
        // The last year bounds the search.
        assert_eq!(next_match(&leap, at("2026-03-01T00:00:00"), 2027), None);
        let eve = Schedule::parse("59 59 23 31 12 *").unwrap();
        assert_eq!(
            next_match(&eve, at("2026-12-31T23:59:59"), 2030),
            Some(at("2026-12-31T23:59:59"))
        );
        assert_eq!(
            next_match(&eve, at("2027-01-01T00:00:00"), 2030),
            Some(at("2027-12-31T23:59:59"))
        );
    }
}
