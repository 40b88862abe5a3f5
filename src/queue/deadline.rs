//! `chronosDeadline`: ISO 8601 date-times, to Unix microseconds.
//!
//! Accepted: `YYYY-MM-DDTHH:MM:SS` with an optional fraction (any number of
//! digits, kept to the µs) and an optional zone: none (UTC, as seed 004's own
//! example), `Z`, or `±HH:MM` / `±HHMM` / `±HH`. A space may stand for `T`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Days from 1970-01-01 to a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

fn digits(s: &[u8], n: usize) -> Option<u32> {
    if s.len() < n || !s[..n].iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s[..n].iter().fold(0, |a, c| a * 10 + (c - b'0') as u32))
}

/// A civil date from days since 1970-01-01 (the inverse of `days_from_civil`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

/// Unix ms as seed 004 writes a deadline: `YYYY-MM-DDTHH:MM:SS.mmm`, UTC,
/// without a zone.
pub fn format_utc_ms(unix_ms: i64) -> String {
    let secs = unix_ms.div_euclid(1000);
    let ms = unix_ms.rem_euclid(1000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Parse a deadline; `Err` says what is wrong.
pub fn parse_unix_us(text: &str) -> Result<i64, String> {
    let bad = |why: &str| format!("chronosDeadline {text:?} is not an ISO 8601 date-time: {why}");
    let s = text.trim().as_bytes();
    if s.len() < 19 {
        return Err(bad("too short"));
    }
    let y = digits(s, 4).ok_or_else(|| bad("year"))? as i64;
    let m = digits(&s[5..], 2).ok_or_else(|| bad("month"))?;
    let d = digits(&s[8..], 2).ok_or_else(|| bad("day"))?;
    if s[4] != b'-' || s[7] != b'-' || !(s[10] == b'T' || s[10] == b't' || s[10] == b' ') {
        return Err(bad("expected YYYY-MM-DDTHH:MM:SS"));
    }
    let hh = digits(&s[11..], 2).ok_or_else(|| bad("hour"))?;
    let mm = digits(&s[14..], 2).ok_or_else(|| bad("minute"))?;
    let ss = digits(&s[17..], 2).ok_or_else(|| bad("second"))?;
    if s[13] != b':' || s[16] != b':' {
        return Err(bad("expected HH:MM:SS"));
    }
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return Err(bad("no such date"));
    }
    if hh > 23 || mm > 59 || ss > 60 {
        return Err(bad("no such time"));
    }
    let mut rest = &s[19..];
    let mut micros = 0i64;
    if let Some(frac) = rest.strip_prefix(b".").or_else(|| rest.strip_prefix(b",")) {
        let n = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return Err(bad("empty fraction"));
        }
        for (i, c) in frac[..n].iter().take(6).enumerate() {
            micros += (c - b'0') as i64 * 10i64.pow(5 - i as u32);
        }
        rest = &frac[n..];
    }
    let offset_s: i64 = match rest {
        [] | [b'Z'] | [b'z'] => 0,
        [sign @ (b'+' | b'-'), tz @ ..] => {
            let h = digits(tz, 2).ok_or_else(|| bad("zone hours"))? as i64;
            let min = match &tz[2..] {
                [] => 0,
                [b':', r @ ..] if r.len() == 2 => {
                    digits(r, 2).ok_or_else(|| bad("zone minutes"))?
                }
                r if r.len() == 2 => digits(r, 2).ok_or_else(|| bad("zone minutes"))?,
                _ => return Err(bad("zone")),
            } as i64;
            if h > 23 || min > 59 {
                return Err(bad("zone out of range"));
            }
            let off = h * 3600 + min * 60;
            if *sign == b'+' {
                off
            } else {
                -off
            }
        }
        _ => return Err(bad("trailing characters")),
    };
    let days = days_from_civil(y, m, d);
    let secs = days * 86_400 + (hh * 3600 + mm * 60 + ss) as i64 - offset_s;
    Ok(secs * 1_000_000 + micros)
}

/// A `SystemTime` of Unix µs (before the epoch too).
pub fn system_time_of(unix_us: i64) -> SystemTime {
    if unix_us >= 0 {
        UNIX_EPOCH + Duration::from_micros(unix_us as u64)
    } else {
        UNIX_EPOCH - Duration::from_micros(unix_us.unsigned_abs())
    }
}

/// Unix µs of a `SystemTime` (negative before the epoch).
pub fn unix_us_of(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_micros() as i64,
        Err(e) => -(e.duration().as_micros() as i64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_round_trips() {
        for ms in [
            0i64,
            1_669_892_941_123,
            1_709_164_800_000,
            951_782_400_999,
            -1_500,
        ] {
            assert_eq!(
                parse_unix_us(&format_utc_ms(ms)).unwrap(),
                ms * 1000,
                "{ms}"
            );
        }
        assert_eq!(format_utc_ms(1_669_892_941_123), "2022-12-01T11:09:01.123");
    }

    #[test]
    fn forms_table() {
        // 2022-12-01T11:09:01.123Z = 1669892941.123 s
        let base = 1_669_892_941_123_000i64;
        let table: &[(&str, Option<i64>)] = &[
            ("2022-12-01T11:09:01.123", Some(base)),
            ("2022-12-01T11:09:01.123Z", Some(base)),
            ("2022-12-01T12:09:01.123+01:00", Some(base)),
            ("2022-12-01T10:09:01.123-0100", Some(base)),
            ("2022-12-01T13:09:01.123+02", Some(base)),
            ("2022-12-01 11:09:01.123", Some(base)),
            ("2022-12-01T11:09:01", Some(base - 123_000)),
            ("2022-12-01T11:09:01.123456789", Some(base + 456)),
            ("1970-01-01T00:00:00Z", Some(0)),
            ("2024-02-29T00:00:00Z", Some(1_709_164_800_000_000)),
            ("2023-02-29T00:00:00Z", None),
            ("2022-13-01T11:09:01", None),
            ("2022-12-01T25:09:01", None),
            ("2022-12-01", None),
            ("yesterday", None),
            ("2022-12-01T11:09:01.", None),
            ("2022-12-01T11:09:01+1", None),
            ("2022-12-01T11:09:01 UTC", None),
        ];
        for (text, want) in table {
            assert_eq!(parse_unix_us(text).ok(), *want, "{text}");
        }
    }

    #[test]
    fn time_conversions() {
        for us in [-1_500_000i64, 0, 1, 1_669_892_941_123_456] {
            assert_eq!(unix_us_of(system_time_of(us)), us);
        }
    }
}
