//! The metrics of delivery with a policy (issue 41): the retry-delay
//! histogram and the attempts and given-up pops per statistics tag.

use super::{series, ShardStats};
use std::fmt::Write;

/// Bounds of the retry-delay histogram: 100 ms to a day, in µs.
pub const RETRY_DELAY_BOUNDS_US: [u64; 12] = [
    100_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    300_000_000,
    900_000_000,
    3_600_000_000,
    86_400_000_000,
];

/// Tag names counted per shard in `delivery_by_tag`.
pub const DELIVERY_TAGS_MAX: usize = 1024;
/// Where the tags past [`DELIVERY_TAGS_MAX`] are counted.
pub const DELIVERY_TAG_OTHER: &str = "(other tags)";

impl ShardStats {
    /// `attempts` attempts and `given_up` given-up pops of timers with
    /// this tag.
    pub fn count_delivery_tag(&self, tag: &str, attempts: u64, given_up: u64) {
        let mut map = self
            .delivery_by_tag
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = match map.contains_key(tag) || map.len() < DELIVERY_TAGS_MAX {
            true => tag,
            false => DELIVERY_TAG_OTHER,
        };
        let counts = map.entry(key.to_string()).or_default();
        counts[0] += attempts;
        counts[1] += given_up;
    }

    pub fn record_retry_delay(&self, us: u64) {
        self.retry_delay.record(&RETRY_DELAY_BOUNDS_US, us);
    }
}

/// The retry delays and the counts per tag, every shard's.
pub(super) fn render(out: &mut String, shards: &[ShardStats]) {
    let name = "chronos_retry_delay_seconds";
    let _ = writeln!(out, "# HELP {name} The delay before each retry of a pop with a delivery policy (back-off with jitter, or Retry-After).\n# TYPE {name} histogram");
    let delays = shards.iter().map(|s| &s.retry_delay);
    series(out, name, "", &RETRY_DELAY_BOUNDS_US, delays);
    by_tag(out, shards);
}

/// The attempts and given-up pops per tag, every shard's summed.
fn by_tag(out: &mut String, shards: &[ShardStats]) {
    let mut merged: std::collections::BTreeMap<String, [u64; 2]> = Default::default();
    for s in shards {
        let map = s.delivery_by_tag.lock().unwrap_or_else(|e| e.into_inner());
        for (tag, counts) in map.iter() {
            let m = merged.entry(tag.clone()).or_default();
            m[0] += counts[0];
            m[1] += counts[1];
        }
    }
    let names = [
        (
            "chronos_delivery_attempts_by_tag_total",
            "Attempts of timers with a delivery policy, per statistics tag.",
        ),
        (
            "chronos_delivery_given_up_by_tag_total",
            "Pops with a delivery policy given up, per statistics tag.",
        ),
    ];
    for (i, (name, help)) in names.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (tag, counts) in &merged {
            let escaped = super::escape_label(tag);
            let _ = writeln!(out, "{name}{{tag=\"{escaped}\"}} {}", counts[i]);
        }
    }
}
