//! A time zone by IANA name, and what a local time is in it.
//!
//! One concern: turning civil time (`civil.rs`'s local seconds) into
//! instants and back, with jiff's copy of the IANA time zone database
//! compiled into the binary (the `tzdb-bundle-always` feature). The bundled
//! copy, not the system's `/usr/share/zoneinfo`, so that every node of a
//! cluster, whatever its packages, computes the same instants for the same
//! timer, and a look-up never reads a file on a shard's thread; a new
//! release of the database comes with a new build. Looking a name up
//! parses its rules once per process (jiff caches them); after that, every
//! question here is a search in memory and allocates nothing.

use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone, TimeZoneDatabase};
use jiff::Timestamp;

use super::civil;

/// The longest time zone name accepted, in bytes (the longest IANA name
/// today has 32).
pub const ZONE_NAME_MAX: usize = 64;

/// A time zone from the IANA database, such as `Europe/Paris` or `UTC`.
#[derive(Clone, Debug)]
pub struct Zone {
    tz: TimeZone,
}

/// What a local time is in a zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Local {
    /// One instant (Unix seconds).
    One(i64),
    /// Two instants: the clock was set back and showed this time twice.
    Fold { first: i64, second: i64 },
    /// None: the clock was set forward past it. The offsets (seconds east
    /// of UTC) before and after the change.
    Gap { before: i64, after: i64 },
}

impl Zone {
    /// The zone of this IANA name (matched without regard to case), or
    /// why there is none.
    pub fn parse(name: &str) -> Result<Zone, String> {
        let plain = name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-' | b'+'));
        if name.is_empty() || name.len() > ZONE_NAME_MAX || !plain {
            return Err(format!(
                "`time-zone` must be an IANA time zone name such as Europe/Paris or UTC \
                 (letters, digits, `/_-+`, at most {ZONE_NAME_MAX} bytes)"
            ));
        }
        match TimeZoneDatabase::bundled().get(name) {
            Ok(tz) => Ok(Zone { tz }),
            Err(_) => Err(format!(
                "`time-zone` {name} is not in the IANA time zone database \
                 (a name such as Europe/Paris, America/New_York or UTC)"
            )),
        }
    }

    /// UTC.
    pub fn utc() -> Zone {
        Zone { tz: TimeZone::UTC }
    }

    /// The zone's IANA name as the database spells it.
    pub fn name(&self) -> &str {
        self.tz.iana_name().unwrap_or("UTC")
    }

    /// The offset from UTC, in seconds, at an instant (Unix seconds), or
    /// `None` outside the years -9999 to 9999.
    pub fn offset_at(&self, unix: i64) -> Option<i64> {
        let at = Timestamp::from_second(unix).ok()?;
        Some(i64::from(self.tz.to_offset(at).seconds()))
    }

    /// What the local time `local` (local seconds) is in this zone, or
    /// `None` outside the years -9999 to 9999.
    pub(super) fn resolve(&self, local: i64) -> Option<Local> {
        let c = civil::split(local);
        let year = i16::try_from(c.year).ok()?;
        let narrow = |v: u32| v as i8;
        let dt = DateTime::new(
            year,
            narrow(c.month),
            narrow(c.day),
            narrow(c.hour),
            narrow(c.minute),
            narrow(c.second),
            0,
        )
        .ok()?;
        let seconds = |offset: jiff::tz::Offset| i64::from(offset.seconds());
        Some(match self.tz.to_ambiguous_timestamp(dt).offset() {
            AmbiguousOffset::Unambiguous { offset } => Local::One(local - seconds(offset)),
            AmbiguousOffset::Fold { before, after } => Local::Fold {
                first: local - seconds(before),
                second: local - seconds(after),
            },
            AmbiguousOffset::Gap { before, after } => Local::Gap {
                before: seconds(before),
                after: seconds(after),
            },
        })
    }

    /// The first change of offset strictly after an instant (Unix seconds).
    pub fn change_after(&self, unix: i64) -> Option<i64> {
        let at = Timestamp::from_second(unix).ok()?;
        let change = self.tz.following(at).next()?;
        Some(change.timestamp().as_second())
    }

    /// The last change of offset at or before an instant (Unix seconds).
    pub(super) fn change_at_or_before(&self, unix: i64) -> Option<i64> {
        let at = Timestamp::from_second(unix.checked_add(1)?).ok()?;
        let change = self.tz.preceding(at).next()?;
        Some(change.timestamp().as_second())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_looked_up_in_the_bundled_database() {
        assert_eq!(Zone::parse("Europe/Paris").unwrap().name(), "Europe/Paris");
        assert_eq!(Zone::parse("europe/paris").unwrap().name(), "Europe/Paris");
        assert_eq!(Zone::parse("UTC").unwrap().name(), "UTC");
        assert_eq!(Zone::utc().name(), "UTC");
        for bad in [
            "Europe/Atlantis",
            "",
            "../../etc/passwd",
            "Europe/Paris ",
            "+01:00",
        ] {
            let error = Zone::parse(bad).unwrap_err();
            assert!(error.contains("time-zone"), "{bad}: {error}");
        }
        assert!(Zone::parse(&"A".repeat(65))
            .unwrap_err()
            .contains("at most 64 bytes"));
    }

    #[test]
    fn local_times_around_the_changes() {
        let paris = Zone::parse("Europe/Paris").unwrap();
        let local = |y, mo, d, h, mi| {
            civil::join(civil::Civil {
                year: y,
                month: mo,
                day: d,
                hour: h,
                minute: mi,
                second: 0,
            })
        };
        // 2026-03-29 02:30 does not exist in Paris.
        assert_eq!(
            paris.resolve(local(2026, 3, 29, 2, 30)),
            Some(Local::Gap {
                before: 3_600,
                after: 7_200
            })
        );
        // 2026-10-25 02:30 happens twice: 00:30Z and 01:30Z.
        let twice = paris.resolve(local(2026, 10, 25, 2, 30));
        assert_eq!(
            twice,
            Some(Local::Fold {
                first: 1_792_888_200,
                second: 1_792_891_800
            })
        );
        assert_eq!(
            paris.resolve(local(2026, 7, 1, 12, 0)),
            Some(Local::One(1_782_900_000))
        );
        assert_eq!(paris.offset_at(1_782_900_000), Some(7_200));
        // The change of 2026-10-25 is at 01:00Z.
        assert_eq!(paris.change_after(1_792_888_200), Some(1_792_890_000));
        assert_eq!(
            paris.change_at_or_before(1_792_890_000),
            Some(1_792_890_000)
        );
        assert_eq!(
            paris.change_at_or_before(1_792_891_800),
            Some(1_792_890_000)
        );
        assert_eq!(Zone::utc().change_after(0), None);
    }
}
