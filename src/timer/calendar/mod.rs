//! Wall-clock and calendar timing (issue 42): an absolute instant (`at`),
//! a cron schedule in a time zone, its next occurrence, and the misfire
//! rule. Pure functions of their arguments: no clock is read, no I/O is
//! done, and nothing allocates once a schedule and a zone are parsed.
//! Checked against Python's `croniter` with `zoneinfo` by
//! `tests/calendar.rs`.
//!
//! # Instants
//!
//! [`parse_at`] takes an RFC 3339 `date-time`: `2026-12-01T09:00:00+01:00`,
//! `2026-12-01T08:00:00Z`, with 1 to 9 fractional digits; `T` and `Z` in
//! either case, or a space for `T`. Anything else (no offset, a bracketed
//! zone, ISO 8601's basic format, February 30) is refused with a message
//! that shows the expected form. At most 64 bytes. Sub-millisecond
//! fractions round up: never early; a leap second (`:60`) reads as `:59`.
//!
//! # Cron expressions
//!
//! [`Schedule::parse`] takes 5 fields, `minute hour day-of-month month
//! day-of-week` (then second 0), or 6 with `second` first (seconds
//! resolution), separated by spaces or tabs. A field is a comma-separated
//! list of items; an item is `*`, a value `a`, a range `a-b`, each with an
//! optional step `/n` (`*/15`, `10-50/5`; `a/n` runs from `a` to the end of
//! the field). Ranges
//! are minute and second 0-59, hour 0-23, day-of-month 1-31, month 1-12 or
//! `JAN`-`DEC`, day-of-week 0-7 or `SUN`-`SAT` (0 and 7 are both Sunday;
//! names in any case). If both day-of-month and day-of-week are
//! restricted, a day matching either fires, as in Vixie cron and croniter;
//! otherwise a day must match both. Restricted means not every value: `*`,
//! `*/1` and `1-31` alike leave the day of the month unrestricted (croniter
//! counts `*/1` and `1-31` as restricted unless the other field has a `*`;
//! Vixie cron counts a field as unrestricted when it starts with `*`, so
//! `*/2` too). Not accepted: `L`,
//! `W`, `#`, `?`, `H`, a year field, `@daily` and the like, ranges that run
//! backward, a day-of-month no chosen month has (`0 0 30 2 *`). At most
//! [`EXPRESSION_MAX`] (256) bytes. The parsed [`Schedule`] is six bitsets,
//! 27 bytes (32 with padding).
//!
//! # Time zones
//!
//! [`Zone::parse`] takes an IANA name (`Europe/Paris`, `UTC`) from the
//! copy of the time zone database built into the binary (jiff's bundled
//! tzdb), the same on every node; an unknown name is refused.
//!
//! # The next occurrence, and DST
//!
//! [`next_after`] gives the first occurrence strictly after an instant, on
//! a whole second, in Unix ms. Local times are matched on the wall clock of
//! the zone. Around a change of offset:
//!
//! - **A local time that does not exist** (the clock is set forward past
//!   it) is *moved* to the first local time after the change, by whole
//!   minutes (02:30 in Paris on the last Sunday of March fires at 03:00;
//!   02:15:30 on Lord Howe's half-hour change fires at 02:30:30); several
//!   such times in one gap fire once. A schedule that allows *every hour*
//!   skips them instead (`*/20 * * * *` fires at 01:40, then 03:00): it
//!   fires within the hour anyway. This is croniter's rule, so the corpus
//!   test compares every case.
//! - **A local time that occurs twice** (the clock is set back) fires
//!   once, at its first instant. `30 2 * * *` fires at 02:30 before the
//!   change and not again an hour later, and `*/20 * * * *` fires at 02:00,
//!   02:20 and 02:40 once each, then next at 03:00: about an hour without a
//!   pop. croniter fires both passes; the corpus test drops its second
//!   ones and compares the rest.
//!
//! The search is bounded: the year of the instant and the next
//! [`HORIZON_YEARS`] (8, the longest wait between two February 29ths), at
//! most [`TURNS_MAX`] candidates; past that, or past the year 9999, `None`.
//! Every schedule `Schedule::parse` accepts fires within the horizon.
//!
//! # Misfire
//!
//! [`recover`]: after an outage (every replica down, a restart), given the
//! last pop and now, the first occurrence after the last pop fires once,
//! at once, if it is due; every other missed occurrence is dropped, and the
//! timer waits for the first occurrence after now. One pop on recovery,
//! not one per missed occurrence.

mod at;
mod civil;
mod cron;
mod next;
mod zone;

pub use at::{parse_at, AT_MAX};
pub use cron::{Schedule, EXPRESSION_MAX};
pub use next::{next_after, recover, Recovery, HORIZON_YEARS, TURNS_MAX};
pub use zone::{Zone, ZONE_NAME_MAX};
