//! What one delivery attempt's outcome means for the retries (issue 41),
//! and a `Retry-After` header read as a delay. Pure: the caller passes the
//! wall clock a `Retry-After` date is measured from.
//!
//! The rules: a transport error, a timeout, a 5xx, a 408 and a 429 are
//! retried; a 2xx is delivered; anything else is refused and not retried:
//! a 4xx other than 408 and 429 (the target refused the request), a 3xx
//! (the client follows no redirect, and the answer would be the same next
//! time), and a status outside 200 to 599. A retried answer's
//! `Retry-After` (sent with a 429 or a 503) is a number of seconds or an
//! HTTP date (any of RFC 9110's three forms); it is bounded by a day
//! ([`RETRY_AFTER_MS_MAX`]), and a date in the past is no wait.

use std::fmt;

/// The longest `Retry-After` read, in ms (a day; the policy's `max-delay`
/// bounds it again).
pub const RETRY_AFTER_MS_MAX: u64 = super::DELAY_MS_MAX as u64;

/// How one attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No answer: the connection was refused or reset, TLS failed, the
    /// response was malformed.
    Transport,
    /// No answer within the client's timeout.
    Timeout,
    /// The target answered: its status, and its `Retry-After` as a delay
    /// in ms ([`retry_after_ms`]) when it sent one.
    Status {
        code: u16,
        retry_after_ms: Option<u64>,
    },
}

/// What an outcome means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// The target took the pop.
    Delivered,
    /// Try again, if the policy allows.
    Retry,
    /// The target refused it: trying again would not help.
    Refused,
}

impl Outcome {
    /// An answer with no `Retry-After`.
    pub fn status(code: u16) -> Outcome {
        Outcome::Status {
            code,
            retry_after_ms: None,
        }
    }

    pub fn class(&self) -> Class {
        match *self {
            Outcome::Transport | Outcome::Timeout => Class::Retry,
            Outcome::Status { code, .. } => match code {
                200..=299 => Class::Delivered,
                408 | 429 | 500..=599 => Class::Retry,
                _ => Class::Refused,
            },
        }
    }

    /// The wait the target asked for, when the outcome is retried.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match *self {
            Outcome::Status { retry_after_ms, .. } if self.class() == Class::Retry => {
                retry_after_ms.map(|ms| ms.min(RETRY_AFTER_MS_MAX))
            }
            _ => None,
        }
    }
}

impl fmt::Display for Outcome {
    /// As `X-Chronos-Last-Outcome` names it: the status code, `timeout`,
    /// or `transport error`.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Outcome::Transport => f.write_str("transport error"),
            Outcome::Timeout => f.write_str("timeout"),
            Outcome::Status { code, .. } => write!(f, "{code}"),
        }
    }
}

/// A `Retry-After` value as a delay in ms from `now_unix_ms` (the wall
/// clock, Unix ms), at most [`RETRY_AFTER_MS_MAX`]; `None` when it is
/// neither a number of seconds nor an HTTP date (the schedule's delay
/// stands).
pub fn retry_after_ms(value: &[u8], now_unix_ms: u64) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // Digits past what u64 holds are a wait past the bound too.
        let secs = text.parse::<u64>().unwrap_or(u64::MAX);
        return Some(secs.saturating_mul(1000).min(RETRY_AFTER_MS_MAX));
    }
    let at_s = http_date_s(text, now_unix_ms / 1000)?;
    let wait = at_s.saturating_mul(1000).saturating_sub(now_unix_ms);
    Some(wait.min(RETRY_AFTER_MS_MAX))
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// An HTTP date as Unix seconds, in any of RFC 9110's forms:
/// `Sun, 06 Nov 1994 08:49:37 GMT` (IMF-fixdate), `Sunday, 06-Nov-94
/// 08:49:37 GMT` (RFC 850) and `Sun Nov  6 08:49:37 1994` (asctime).
/// Dates before 1970 are `None`.
fn http_date_s(text: &str, now_s: u64) -> Option<u64> {
    let (day, month, year, time) = match text.split_once(", ") {
        Some((weekday, rest)) if is_alpha(weekday) => {
            let rest = rest.strip_suffix(" GMT")?;
            let (date, time) = rest.rsplit_once(' ')?;
            match date.split_once('-') {
                Some((day, rest)) => {
                    let (month, yy) = rest.split_once('-')?;
                    (day, month, two_digit_year(yy, now_s)?, time)
                }
                None => {
                    let mut parts = date.split(' ');
                    let day = parts.next()?;
                    let month = parts.next()?;
                    let year = number(parts.next()?, 4)?;
                    (parts.next().is_none().then_some(day)?, month, year, time)
                }
            }
        }
        _ => {
            // asctime: the day is padded to two places with a space.
            let (weekday, rest) = text.split_once(' ')?;
            let (month, rest) = rest.split_once(' ')?;
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            let (day, rest) = rest.split_once(' ')?;
            let (time, year) = rest.split_once(' ')?;
            is_alpha(weekday).then_some(())?;
            (day, month, number(year, 4)?, time)
        }
    };
    let month = MONTHS.iter().position(|m| *m == month)? as u64 + 1;
    let day = number(day, 2).filter(|d| (1..=days_in(month, year)).contains(d))?;
    let mut hms = time.split(':');
    let h = number(hms.next()?, 2).filter(|&h| h < 24)?;
    let m = number(hms.next()?, 2).filter(|&m| m < 60)?;
    let s = number(hms.next()?, 2).filter(|&s| s <= 60)?;
    if hms.next().is_some() || year < 1970 {
        return None;
    }
    Some(days_since_epoch(year, month, day) * 86_400 + h * 3600 + m * 60 + s)
}

fn is_alpha(word: &str) -> bool {
    !word.is_empty() && word.bytes().all(|b| b.is_ascii_alphabetic())
}

/// Exactly `digits` digits (a one-digit day is allowed where two are
/// written: asctime pads it with a space).
fn number(text: &str, digits: usize) -> Option<u64> {
    let ok = (1..=digits).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| text.parse().ok()).flatten()
}

/// RFC 850's two-digit year: the year ending so that is at most 50 years
/// after now (RFC 9110, 5.6.7).
fn two_digit_year(yy: &str, now_s: u64) -> Option<u64> {
    let yy = number(yy, 2).filter(|_| yy.len() == 2)?;
    let this_year = 1970 + now_s / 31_556_952;
    let year = this_year / 100 * 100 + yy;
    Some(if year > this_year + 50 {
        year - 100
    } else {
        year
    })
}

fn days_in(month: u64, year: u64) -> u64 {
    let leap = year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400));
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a date on or after it (the civil calendar's
/// count from 1 March of year 0).
fn days_since_epoch(year: u64, month: u64, day: u64) -> u64 {
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y / 400;
    let year_of_era = y % 400;
    let day_of_year = (153 * m + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_table() {
        let table: &[(Outcome, Class)] = &[
            (Outcome::Transport, Class::Retry),
            (Outcome::Timeout, Class::Retry),
            (Outcome::status(200), Class::Delivered),
            (Outcome::status(204), Class::Delivered),
            (Outcome::status(299), Class::Delivered),
            (Outcome::status(301), Class::Refused),
            (Outcome::status(304), Class::Refused),
            (Outcome::status(400), Class::Refused),
            (Outcome::status(404), Class::Refused),
            (Outcome::status(408), Class::Retry),
            (Outcome::status(410), Class::Refused),
            (Outcome::status(429), Class::Retry),
            (Outcome::status(499), Class::Refused),
            (Outcome::status(500), Class::Retry),
            (Outcome::status(503), Class::Retry),
            (Outcome::status(599), Class::Retry),
            (Outcome::status(600), Class::Refused),
            (Outcome::status(100), Class::Refused),
        ];
        for &(outcome, class) in table {
            assert_eq!(outcome.class(), class, "{outcome}");
        }
    }

    #[test]
    fn retry_after_counts_only_on_a_retried_answer_and_is_bounded() {
        let with = |code, ms| Outcome::Status {
            code,
            retry_after_ms: Some(ms),
        };
        assert_eq!(with(429, 5000).retry_after_ms(), Some(5000));
        assert_eq!(with(503, 7).retry_after_ms(), Some(7));
        assert_eq!(with(429, u64::MAX).retry_after_ms(), Some(86_400_000));
        assert_eq!(with(404, 5000).retry_after_ms(), None);
        assert_eq!(with(200, 5000).retry_after_ms(), None);
        assert_eq!(Outcome::status(429).retry_after_ms(), None);
    }

    #[test]
    fn names_for_the_dead_letter_header() {
        assert_eq!(Outcome::status(503).to_string(), "503");
        assert_eq!(Outcome::Timeout.to_string(), "timeout");
        assert_eq!(Outcome::Transport.to_string(), "transport error");
    }

    #[test]
    fn retry_after_table() {
        // 1994-11-06T08:49:37Z
        const T: u64 = 784_111_777;
        let now = T * 1000 - 30_000; // 30 s before it
        let table: &[(&str, Option<u64>)] = &[
            ("120", Some(120_000)),
            ("0", Some(0)),
            (" 5\t", Some(5000)),
            ("86401", Some(86_400_000)),
            ("99999999999999999999999", Some(86_400_000)),
            ("", None),
            ("-1", None),
            ("1.5", None),
            ("soon", None),
            ("Sun, 06 Nov 1994 08:49:37 GMT", Some(30_000)),
            ("Sunday, 06-Nov-94 08:49:37 GMT", Some(30_000)),
            ("Sun Nov  6 08:49:37 1994", Some(30_000)),
            ("Sun Nov 6 08:49:37 1994", Some(30_000)),
            ("Sun, 06 Nov 1994 08:49:07 GMT", Some(0)),
            ("Sun, 06 Nov 1994 08:48:37 GMT", Some(0)),
            ("Mon, 07 Nov 1994 08:49:37 GMT", Some(86_400_000)),
            ("Sun, 06 Nov 1995 08:49:37 GMT", Some(86_400_000)),
            ("Sun, 06 Nov 1994 08:49:37 UTC", None),
            ("Sun, 31 Nov 1994 08:49:37 GMT", None),
            ("Sun, 06 Nov 1994 24:00:00 GMT", None),
            ("Sun, 06 Nov 1994 08:49 GMT", None),
            ("Sun, 06 Nox 1994 08:49:37 GMT", None),
            ("Sun, 06 Nov 94 08:49:37 GMT", None),
            ("Sun, 06 Nov 1994 08:49:37 GMT x", None),
            ("Sun Nov  6 08:49:37", None),
        ];
        for &(value, want) in table {
            assert_eq!(retry_after_ms(value.as_bytes(), now), want, "{value:?}");
        }
        assert_eq!(retry_after_ms(b"\xff", now), None);
    }

    #[test]
    fn dates_are_counted_from_the_epoch() {
        let table: &[(&str, u64)] = &[
            ("Thu, 01 Jan 1970 00:00:00 GMT", 0),
            ("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_777),
            ("Tue, 29 Feb 2000 00:00:00 GMT", 951_782_400),
            ("Sat, 28 Nov 2026 15:00:00 GMT", 1_795_878_000),
            ("Wed, 01 Jan 2076 00:00:00 GMT", 3_345_062_400),
        ];
        for &(date, secs) in table {
            assert_eq!(http_date_s(date, 0), Some(secs), "{date}");
        }
        assert_eq!(http_date_s("Mon, 29 Feb 2100 00:00:00 GMT", 0), None);
        assert_eq!(http_date_s("Wed, 31 Dec 1969 23:59:59 GMT", 0), None);
    }

    #[test]
    fn two_digit_years_are_at_most_50_years_ahead() {
        let now_2026 = 1_795_878_000;
        let table: &[(&str, Option<u64>)] = &[
            ("26", Some(2026)),
            ("76", Some(2076)),
            ("77", Some(1977)),
            ("99", Some(1999)),
            ("00", Some(2000)),
            ("7", None),
        ];
        for &(yy, want) in table {
            assert_eq!(two_digit_year(yy, now_2026), want, "{yy}");
        }
    }
}
