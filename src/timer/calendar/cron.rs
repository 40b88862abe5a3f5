//! Cron expressions: the parser and the parsed [`Schedule`].
//!
//! One concern: text in, a fixed-size set of allowed values per field out,
//! or an error message a client can act on. Nothing here knows a clock, a
//! calendar or a time zone; the search for the next occurrence is
//! `civil.rs`'s and `next.rs`'s. The syntax accepted is the module's
//! (`calendar/mod.rs`); an expression is at most [`EXPRESSION_MAX`] bytes.

/// The longest cron expression accepted, in bytes.
pub const EXPRESSION_MAX: usize = 256;

/// A parsed cron expression: the allowed values of each field as a bitset,
/// 27 bytes and `Copy`, so evaluating it allocates nothing.
///
/// Bit `n` of a field is set when value `n` is allowed. A 5-field
/// expression allows second 0 only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    /// Seconds 0 to 59.
    seconds: u64,
    /// Minutes 0 to 59.
    minutes: u64,
    /// Hours 0 to 23.
    hours: u32,
    /// Days of the month 1 to 31 (bit 0 unused).
    days: u32,
    /// Months 1 to 12 (bit 0 unused).
    months: u16,
    /// Days of the week 0 to 6, 0 Sunday (7 is read as 0).
    weekdays: u8,
}

/// What one field accepts.
struct Field {
    /// Its name in error messages.
    name: &'static str,
    min: u32,
    max: u32,
    /// Names of its values (case-insensitive), the first naming `min`.
    names: &'static [&'static str],
}

const SECOND: Field = Field {
    name: "second",
    min: 0,
    max: 59,
    names: &[],
};
const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY: Field = Field {
    name: "day-of-month",
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ],
};
/// 7 is accepted as a second name for Sunday; `*` means 0 to 6.
const WEEKDAY: Field = Field {
    name: "day-of-week",
    min: 0,
    max: 7,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
};

const ALL_HOURS: u32 = (1 << 24) - 1;
/// Days 1 to 31.
const ALL_DAYS: u32 = !1;
/// Sunday to Saturday.
const ALL_WEEKDAYS: u8 = 0x7F;
/// The most days each month can have (February 29 in a leap year).
const MONTH_DAYS_MAX: [u32; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

/// The smallest set bit of `mask` at or above `from`.
fn next_bit(mask: u64, from: u32) -> Option<u32> {
    if from >= 64 {
        return None;
    }
    let rest = mask >> from;
    (rest != 0).then(|| from + rest.trailing_zeros())
}

impl Schedule {
    /// Parses a cron expression of 5 fields (minute hour day-of-month
    /// month day-of-week) or 6 (second first), or says what is wrong.
    pub fn parse(text: &str) -> Result<Schedule, String> {
        if text.len() > EXPRESSION_MAX {
            return Err(format!(
                "a cron expression is at most {EXPRESSION_MAX} bytes; this one has {}",
                text.len()
            ));
        }
        let mut fields = [""; 6];
        let mut count = 0;
        for part in text.split_ascii_whitespace() {
            if count < fields.len() {
                fields[count] = part;
            }
            count += 1;
        }
        let (seconds, rest) = match count {
            5 => (1, &fields[..5]),
            6 => (parse_field(fields[0], &SECOND)?, &fields[1..]),
            _ => {
                return Err(format!(
                    "a cron expression has 5 fields (minute hour day-of-month month \
                     day-of-week) or 6 (second first); this one has {count}"
                ))
            }
        };
        let weekdays = parse_field(rest[4], &WEEKDAY)?;
        let schedule = Schedule {
            seconds,
            minutes: parse_field(rest[0], &MINUTE)?,
            hours: parse_field(rest[1], &HOUR)? as u32,
            days: parse_field(rest[2], &DAY)? as u32,
            months: parse_field(rest[3], &MONTH)? as u16,
            // Bit 7 (Sunday written as 7) folds onto bit 0.
            weekdays: ((weekdays | weekdays >> 7) & u64::from(ALL_WEEKDAYS)) as u8,
        };
        schedule.check_some_day()?;
        Ok(schedule)
    }

    /// Refuses a day-of-month that no chosen month has (`0 0 30 2 *`),
    /// which would never fire. With a day of the week also restricted the
    /// day of the week alone can match, so that always fires.
    fn check_some_day(&self) -> Result<(), String> {
        if self.weekdays_restricted() {
            return Ok(());
        }
        let meets = (1..=12u32).any(|month| {
            let allowed = (1u64 << (MONTH_DAYS_MAX[month as usize - 1] + 1)) - 2;
            self.has_month(month) && u64::from(self.days) & allowed != 0
        });
        if meets {
            Ok(())
        } else {
            Err(
                "the day-of-month and month fields never meet: no chosen month has \
                 any of the chosen days, so this would never fire"
                    .to_string(),
            )
        }
    }

    /// Whether `month` (1 to 12) is allowed.
    pub(super) fn has_month(&self, month: u32) -> bool {
        month < 16 && self.months >> month & 1 == 1
    }

    /// Whether every hour is allowed: then a local time that a DST change
    /// skips is skipped, not moved (`calendar/mod.rs`).
    pub(super) fn every_hour(&self) -> bool {
        self.hours == ALL_HOURS
    }

    fn days_restricted(&self) -> bool {
        self.days != ALL_DAYS
    }

    fn weekdays_restricted(&self) -> bool {
        self.weekdays != ALL_WEEKDAYS
    }

    /// Whether a date with this day of the month (1 to 31) and day of the
    /// week (0 Sunday to 6) matches. When both fields are restricted either
    /// one matching is enough, as in Vixie cron and croniter; otherwise
    /// both must (the unrestricted one always does).
    pub(super) fn day_matches(&self, day: u32, weekday: u32) -> bool {
        debug_assert!(
            (1..=31).contains(&day) && weekday < 7,
            "a calendar day and weekday"
        );
        let by_day = self.days >> day & 1 == 1;
        let by_weekday = self.weekdays >> weekday & 1 == 1;
        if self.days_restricted() && self.weekdays_restricted() {
            by_day || by_weekday
        } else {
            by_day && by_weekday
        }
    }

    /// The first allowed time of day at or after `hour:minute:second`, or
    /// `None` when the rest of the day has none.
    pub(super) fn time_from(&self, hour: u32, minute: u32, second: u32) -> Option<(u32, u32, u32)> {
        debug_assert!(hour < 24 && minute < 60 && second < 60, "a time of day");
        let first_second = self.seconds.trailing_zeros();
        if self.hours >> hour & 1 == 1 {
            if self.minutes >> minute & 1 == 1 {
                if let Some(s) = next_bit(self.seconds, second) {
                    return Some((hour, minute, s));
                }
            }
            if let Some(m) = next_bit(self.minutes, minute + 1) {
                return Some((hour, m, first_second));
            }
        }
        let h = next_bit(u64::from(self.hours), hour + 1)?;
        Some((h, self.minutes.trailing_zeros(), first_second))
    }
}

/// Parses one field: a comma-separated list of items, into its bitset.
fn parse_field(text: &str, field: &Field) -> Result<u64, String> {
    let mut bits = 0u64;
    for item in text.split(',') {
        if item.is_empty() {
            return Err(format!(
                "the {} field `{text}` has an empty list item",
                field.name
            ));
        }
        bits |= parse_item(item, field)?;
    }
    Ok(bits)
}

/// Parses one list item: `*`, `a`, `a-b`, each optionally with `/step`
/// (`a/step` runs from `a` to the field's end).
fn parse_item(item: &str, field: &Field) -> Result<u64, String> {
    let (range, step) = match item.split_once('/') {
        Some((range, step)) => (range, Some(parse_step(step, item, field)?)),
        None => (item, None),
    };
    // `*` for the day of the week is Sunday to Saturday (7 would be Sunday
    // again).
    let top = if field.names.len() == 7 { 6 } else { field.max };
    let (low, high) = if range == "*" {
        (field.min, top)
    } else if let Some((a, b)) = range.split_once('-') {
        (parse_value(a, item, field)?, parse_value(b, item, field)?)
    } else {
        let value = parse_value(range, item, field)?;
        (
            value,
            if step.is_some() {
                top.max(value)
            } else {
                value
            },
        )
    };
    if low > high {
        return Err(format!(
            "the {} field's range `{item}` runs backward ({low} is after {high})",
            field.name
        ));
    }
    let step = step.unwrap_or(1);
    let mut bits = 0u64;
    let mut value = low;
    while value <= high {
        bits |= 1 << value;
        value += step;
    }
    Ok(bits)
}

/// Parses a step: a number from 1 to the field's span.
fn parse_step(text: &str, item: &str, field: &Field) -> Result<u32, String> {
    let span = field.max - field.min + 1;
    match number(text) {
        Some(step) if (1..=span).contains(&step) => Ok(step),
        _ => Err(format!(
            "the {} field's step in `{item}` must be a number from 1 to {span}",
            field.name
        )),
    }
}

/// Parses a value: a number in the field's range, or one of its names.
fn parse_value(text: &str, item: &str, field: &Field) -> Result<u32, String> {
    if let Some(value) = number(text) {
        if (field.min..=field.max).contains(&value) {
            return Ok(value);
        }
        return Err(format!(
            "the {} field's value {value} in `{item}` is outside {} to {}",
            field.name, field.min, field.max
        ));
    }
    if let Some(at) = field
        .names
        .iter()
        .position(|name| name.eq_ignore_ascii_case(text))
    {
        return Ok(field.min + at as u32);
    }
    let names = match field.names.first().zip(field.names.last()) {
        Some((first, last)) => format!(" or a name {first} to {last}"),
        None => String::new(),
    };
    Err(format!(
        "the {} field's `{text}` in `{item}` is not a number {} to {}{names}",
        field.name, field.min, field.max
    ))
}

/// A decimal number of at most 3 digits (no sign, no spaces).
fn number(text: &str) -> Option<u32> {
    if text.is_empty() || text.len() > 3 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(values: &[u32]) -> u64 {
        values.iter().fold(0, |acc, v| acc | 1 << v)
    }

    #[test]
    fn five_fields_fire_at_second_zero() {
        let s = Schedule::parse("*/15 9-17 * * MON-FRI").unwrap();
        assert_eq!(s.seconds, 1);
        assert_eq!(s.minutes, bits(&[0, 15, 30, 45]));
        assert_eq!(
            u64::from(s.hours),
            bits(&[9, 10, 11, 12, 13, 14, 15, 16, 17])
        );
        assert_eq!(s.days, ALL_DAYS);
        assert_eq!(s.months, 0x1FFE);
        assert_eq!(u64::from(s.weekdays), bits(&[1, 2, 3, 4, 5]));
    }

    #[test]
    fn six_fields_put_seconds_first() {
        let s = Schedule::parse("10-50/20 0 12 1 jan,Jul sun").unwrap();
        assert_eq!(s.seconds, bits(&[10, 30, 50]));
        assert_eq!(s.minutes, 1);
        assert_eq!(s.hours, 1 << 12);
        assert_eq!(s.days, 1 << 1);
        assert_eq!(u64::from(s.months), bits(&[1, 7]));
        assert_eq!(s.weekdays, 1);
    }

    #[test]
    fn sunday_is_zero_and_seven() {
        let zero = Schedule::parse("0 0 * * 0").unwrap();
        let seven = Schedule::parse("0 0 * * 7").unwrap();
        assert_eq!(zero, seven);
        let weekend = Schedule::parse("0 0 * * 6-7").unwrap();
        assert_eq!(u64::from(weekend.weekdays), bits(&[0, 6]));
        assert_eq!(Schedule::parse("0 0 * * */2").unwrap().weekdays, 0b101_0101);
        // Every day of the week, however written, is unrestricted.
        assert_eq!(
            Schedule::parse("0 0 * * 1-7").unwrap().weekdays,
            ALL_WEEKDAYS
        );
    }

    #[test]
    fn start_with_step_runs_to_the_end() {
        let s = Schedule::parse("10/20 * * * *").unwrap();
        assert_eq!(s.minutes, bits(&[10, 30, 50]));
    }

    #[test]
    fn either_day_field_matches_when_both_are_restricted() {
        // The 13th, or any Friday.
        let s = Schedule::parse("0 0 13 * FRI").unwrap();
        assert!(s.day_matches(13, 2));
        assert!(s.day_matches(6, 5));
        assert!(!s.day_matches(6, 4));
        // Only the day of the month restricted: the weekday does not matter.
        let s = Schedule::parse("0 0 13 * *").unwrap();
        assert!(s.day_matches(13, 3));
        assert!(!s.day_matches(12, 3));
        // Only the weekday restricted.
        let s = Schedule::parse("0 0 * * MON").unwrap();
        assert!(s.day_matches(9, 1));
        assert!(!s.day_matches(9, 2));
    }

    #[test]
    fn time_from_carries_into_the_next_minute_and_hour() {
        let s = Schedule::parse("30 */20 9,10 * * *").unwrap();
        assert_eq!(s.time_from(0, 0, 0), Some((9, 0, 30)));
        assert_eq!(s.time_from(9, 0, 30), Some((9, 0, 30)));
        assert_eq!(s.time_from(9, 0, 31), Some((9, 20, 30)));
        assert_eq!(s.time_from(9, 41, 0), Some((10, 0, 30)));
        assert_eq!(s.time_from(10, 40, 31), None);
        assert_eq!(s.time_from(23, 59, 59), None);
    }

    #[test]
    fn malformed_expressions_say_why() {
        let cases = [
            ("", "5 fields"),
            ("* * * *", "this one has 4"),
            ("* * * * * * *", "this one has 7"),
            ("60 * * * *", "minute field's value 60"),
            ("* 24 * * *", "hour field's value 24"),
            ("* * 0 * *", "day-of-month field's value 0"),
            ("* * * 13 *", "month field's value 13"),
            ("* * * * 8", "day-of-week field's value 8"),
            ("*/0 * * * *", "step"),
            ("*/61 * * * *", "step"),
            ("5-2 * * * *", "runs backward"),
            ("1,,2 * * * *", "empty list item"),
            ("* * * FOO *", "not a number 1 to 12 or a name JAN to DEC"),
            ("* * * * MONDAY", "not a number 0 to 7"),
            ("-1 * * * *", "not a number"),
            ("1-2-3 * * * *", "not a number"),
            ("*/5/2 * * * *", "step"),
            ("L * * * *", "not a number"),
            ("@daily", "5 fields"),
            ("0 0 30 2 *", "never meet"),
            ("0 0 31 4,6,9,11 *", "never meet"),
        ];
        for (text, want) in cases {
            let error = Schedule::parse(text).expect_err(text);
            assert!(error.contains(want), "{text}: {error}");
        }
        // February 29 exists in leap years; the 30th with a weekday is fine.
        assert!(Schedule::parse("0 0 29 2 *").is_ok());
        assert!(Schedule::parse("0 0 30 2 MON").is_ok());
    }

    #[test]
    fn long_expressions_are_refused_before_parsing() {
        let long = format!("0 0 * * {}", "1,".repeat(130));
        let error = Schedule::parse(&long).unwrap_err();
        assert!(error.contains("at most 256 bytes"), "{error}");
    }

    #[test]
    fn the_schedule_is_small() {
        assert!(std::mem::size_of::<Schedule>() <= 32);
    }
}
