//! An absolute time (`"at"`, `"start-at"`): an RFC 3339 instant to Unix ms.
//!
//! One concern: the text of one instant. The shape is checked here, strictly
//! RFC 3339's `date-time` (section 5.6), and jiff reads the values (the
//! calendar's limits, the offset). At most [`AT_MAX`] bytes.

use jiff::Timestamp;

/// The longest instant accepted, in bytes (the longest RFC 3339 instant
/// with nanoseconds has 35).
pub const AT_MAX: usize = 64;

/// What the caller's error names.
const EXPECTED: &str = "an RFC 3339 instant such as 2026-12-01T09:00:00+01:00 or \
                        2026-12-01T08:00:00.250Z";

/// The last instant jiff's `Timestamp` holds (a later one of year 9999
/// is well formed, and refused as such).
const LAST: &str = "9999-12-30T22:00:00Z";

/// Parses an RFC 3339 instant (`2026-12-01T09:00:00+01:00`, `...Z`, with
/// up to 9 fractional digits) to Unix ms, or says what is wrong. A
/// fraction finer than a millisecond rounds up, so a timer set for it never
/// pops early; a leap second (`:60`) reads as the second before it.
pub fn parse_at(text: &str) -> Result<i64, String> {
    if text.len() > AT_MAX {
        return Err(format!(
            "expected {EXPECTED}; this is {} bytes long",
            text.len()
        ));
    }
    check_shape(text.as_bytes()).map_err(|what| format!("expected {EXPECTED}: {what}"))?;
    let at: Timestamp = text.parse().map_err(|e: jiff::Error| {
        let e = e.to_string();
        let last_days = text.starts_with("9999-12-30") || text.starts_with("9999-12-31");
        match last_days && e.contains("range") {
            // A well-formed instant past the library's last one.
            true => format!("{text} is after {LAST}, the last instant taken"),
            false => format!("expected {EXPECTED}: {e}"),
        }
    })?;
    let ms = at.as_nanosecond().div_euclid(1_000_000)
        + i128::from(at.as_nanosecond().rem_euclid(1_000_000) != 0);
    i64::try_from(ms).map_err(|_| format!("expected {EXPECTED}: out of range"))
}

/// Checks the shape `YYYY-MM-DDTHH:MM:SS[.F{1,9}](Z|+HH:MM|-HH:MM)`: `T`
/// and `Z` also lower case, and `T` also a space (RFC 3339 allows both).
fn check_shape(b: &[u8]) -> Result<(), &'static str> {
    let digits =
        |at: usize, n: usize| b.len() >= at + n && b[at..at + n].iter().all(u8::is_ascii_digit);
    let byte = |at: usize, want: &[u8]| b.get(at).is_some_and(|c| want.contains(c));
    if !(digits(0, 4) && byte(4, b"-") && digits(5, 2) && byte(7, b"-") && digits(8, 2)) {
        return Err("the date must be YYYY-MM-DD");
    }
    if !byte(10, b"Tt ") {
        return Err("the date and time must be separated by T");
    }
    if !(digits(11, 2) && byte(13, b":") && digits(14, 2) && byte(16, b":") && digits(17, 2)) {
        return Err("the time must be HH:MM:SS");
    }
    let mut at = 19;
    if byte(at, b".") {
        let count = b[at + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if !(1..=9).contains(&count) {
            return Err("a fraction of a second has 1 to 9 digits");
        }
        at += 1 + count;
    }
    let two = |at: usize| (b[at] - b'0') * 10 + (b[at + 1] - b'0');
    let zulu = b.len() == at + 1 && byte(at, b"Zz");
    let offset = b.len() == at + 6
        && byte(at, b"+-")
        && digits(at + 1, 2)
        && byte(at + 3, b":")
        && digits(at + 4, 2);
    if zulu || offset && two(at + 1) <= 23 && two(at + 4) <= 59 {
        Ok(())
    } else {
        Err("the time must end with Z or an offset +HH:MM or -HH:MM")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_in_any_offset() {
        let nine_paris = parse_at("2026-12-01T09:00:00+01:00").unwrap();
        assert_eq!(nine_paris, 1_796_112_000_000);
        assert_eq!(parse_at("2026-12-01T08:00:00Z"), Ok(nine_paris));
        assert_eq!(parse_at("2026-12-01t08:00:00z"), Ok(nine_paris));
        assert_eq!(parse_at("2026-12-01 08:00:00Z"), Ok(nine_paris));
        assert_eq!(parse_at("2026-12-01T03:00:00-05:00"), Ok(nine_paris));
        assert_eq!(parse_at("2026-12-01T08:00:00.25Z"), Ok(nine_paris + 250));
        assert_eq!(
            parse_at("2026-12-01T08:00:00.123456789Z"),
            Ok(nine_paris + 124)
        );
        assert_eq!(
            parse_at("2026-12-01T08:00:00.000000001Z"),
            Ok(nine_paris + 1)
        );
        assert_eq!(parse_at("1970-01-01T00:00:00Z"), Ok(0));
        // A leap second reads as the second before it; -00:00 is UTC.
        assert_eq!(parse_at("2016-12-31T23:59:60Z"), Ok(1_483_228_799_000));
        assert_eq!(parse_at("2026-12-01T08:00:00-00:00"), Ok(nine_paris));
        assert_eq!(parse_at("1969-12-31T23:59:59.9995Z"), Ok(0));
    }

    #[test]
    fn the_last_instant_is_named_past_it() {
        assert_eq!(parse_at(LAST), Ok(253_402_207_200_000));
        for text in ["9999-12-30T22:00:01Z", "9999-12-31T23:59:59Z"] {
            let error = parse_at(text).expect_err(text);
            assert!(error.contains("is after 9999-12-30T22:00:00Z"), "{error}");
        }
        for text in ["9999-02-30T00:00:00Z", "9999-12-32T00:00:00Z"] {
            let error = parse_at(text).expect_err("no such day");
            assert!(error.contains("RFC 3339"), "{error}");
        }
    }

    #[test]
    fn anything_else_says_what_is_expected() {
        let cases = [
            ("", "YYYY-MM-DD"),
            ("2026-12-01", "separated by T"),
            ("2026-12-01T09:00+01:00", "HH:MM:SS"),
            ("2026-12-01T09:00:00", "end with Z"),
            ("2026-12-01T09:00:00+0100", "end with Z"),
            ("2026-12-01T09:00:00+01", "end with Z"),
            ("2026-12-01T09:00:00Z[Europe/Paris]", "end with Z"),
            ("2026-12-01T09:00:00.Z", "1 to 9 digits"),
            ("2026-12-01T09:00:00.1234567891Z", "1 to 9 digits"),
            ("20261201T090000Z", "YYYY-MM-DD"),
            ("+2026-12-01T09:00:00Z", "YYYY-MM-DD"),
            ("2026-02-30T09:00:00Z", "RFC 3339"),
            ("2026-12-01T25:00:00Z", "RFC 3339"),
            ("2026-12-01T09:00:00+24:00", "offset +HH:MM"),
            ("2026-12-01T09:00:00+01:60", "offset +HH:MM"),
            ("next tuesday", "YYYY-MM-DD"),
        ];
        for (text, want) in cases {
            let error = parse_at(text).expect_err(text);
            assert!(error.contains(want), "{text}: {error}");
            assert!(
                error.contains("2026-12-01T09:00:00+01:00"),
                "{text}: {error}"
            );
        }
        assert!(parse_at(&"9".repeat(65)).unwrap_err().contains("65 bytes"));
    }
}
