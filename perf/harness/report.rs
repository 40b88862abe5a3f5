//! The harness's arithmetic: lateness against a schedule, loss and
//! duplicate detection, percentile summaries, and the SVG picture.

use hdrhistogram::Histogram;
use std::collections::HashMap;
use std::fmt::Write;

/// A latency distribution in microseconds.
pub struct Dist {
    pub hist: Histogram<u64>,
}

impl Default for Dist {
    fn default() -> Self {
        Dist {
            // 1 µs .. 1 h, 3 significant digits.
            hist: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"),
        }
    }
}

impl Dist {
    pub fn record_us(&mut self, us: u64) {
        self.hist.saturating_record(us.max(1));
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// Value at quantile `q` (0..=1), in ms.
    pub fn ms_at(&self, q: f64) -> f64 {
        if self.hist.is_empty() {
            return 0.0;
        }
        self.hist.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn max_ms(&self) -> f64 {
        self.hist.max() as f64 / 1000.0
    }

    pub fn summary(&self) -> Summary {
        Summary {
            count: self.count(),
            p50_ms: self.ms_at(0.5),
            p99_ms: self.ms_at(0.99),
            p999_ms: self.ms_at(0.999),
            max_ms: self.max_ms(),
        }
    }

    /// `(ms, fraction ≤ ms)` points of the CDF.
    pub fn cdf(&self) -> Vec<(f64, f64)> {
        let total = self.count().max(1) as f64;
        let mut out = Vec::new();
        let mut seen = 0u64;
        for v in self.hist.iter_recorded() {
            seen += v.count_at_value();
            out.push((v.value_iterated_to() as f64 / 1000.0, seen as f64 / total));
        }
        out
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "count": self.count, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms,
            "p999_ms": self.p999_ms, "max_ms": self.max_ms,
        })
    }
}

/// What was expected to arrive, and when: item → due times (µs on a
/// common clock), one per expected arrival (sequence 1, 2, ...).
#[derive(Default)]
pub struct Schedule {
    pub due_us: HashMap<u64, Vec<u64>>,
}

/// One arrival: item, sequence number (1-based), when (µs).
#[derive(Clone, Copy, Debug)]
pub struct Arrival {
    pub item: u64,
    pub sequence: u32,
    pub at_us: u64,
}

/// The verdict on a run.
#[derive(Default)]
pub struct Tally {
    pub lateness: Dist,
    pub expected: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicates: u64,
    /// Arrivals before their due time (must be 0).
    pub early: u64,
    /// Arrivals nobody expected (unknown item or sequence).
    pub unexpected: u64,
}

/// Match arrivals against the schedule.
pub fn tally(schedule: &Schedule, arrivals: &[Arrival]) -> Tally {
    let mut t = Tally {
        expected: schedule.due_us.values().map(|v| v.len() as u64).sum(),
        ..Tally::default()
    };
    let mut seen: HashMap<(u64, u32), u32> = HashMap::new();
    for a in arrivals {
        let Some(dues) = schedule.due_us.get(&a.item) else {
            t.unexpected += 1;
            continue;
        };
        let Some(&due) = dues.get((a.sequence as usize).wrapping_sub(1)) else {
            t.unexpected += 1;
            continue;
        };
        let n = seen.entry((a.item, a.sequence)).or_default();
        *n += 1;
        if *n > 1 {
            t.duplicates += 1;
            continue;
        }
        t.delivered += 1;
        if a.at_us < due {
            t.early += 1;
            t.lateness.record_us(0);
        } else {
            t.lateness.record_us(a.at_us - due);
        }
    }
    t.lost = t.expected - t.delivered;
    t
}

/// An SVG of CDFs (x: ms, linear up to the largest p99.9 × 1.5; y: 0..1).
pub fn svg_cdf(title: &str, series: &[(&str, &Dist)]) -> String {
    let (w, h, left, bottom, top, right) = (720.0, 420.0, 60.0, 50.0, 40.0, 20.0);
    let x_max = series
        .iter()
        .map(|(_, d)| d.ms_at(0.999))
        .fold(1.0f64, f64::max)
        * 1.5;
    let px = |ms: f64| left + (ms.min(x_max) / x_max) * (w - left - right);
    let py = |f: f64| h - bottom - f * (h - bottom - top);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        w / 2.0,
        escape(title)
    );
    for i in 0..=4 {
        let f = i as f64 / 4.0;
        let _ = write!(
            s,
            r##"<line x1="{left}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{f:.2}</text>"##,
            w - right,
            left - 5.0,
            py(f) + 4.0,
            y = py(f)
        );
        let ms = x_max * f;
        let _ = write!(
            s,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{ms:.1}</text>"##,
            top,
            h - bottom,
            h - bottom + 16.0,
            x = px(ms)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">lateness (ms)</text><text x="15" y="{}" transform="rotate(-90 15 {})" text-anchor="middle">fraction ≤ x</text>"#,
        (left + w - right) / 2.0,
        h - 10.0,
        h / 2.0,
        h / 2.0
    );
    let colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    for (i, (name, d)) in series.iter().enumerate() {
        let c = colours[i % colours.len()];
        let mut points = format!("{},{}", px(0.0), py(0.0));
        for (ms, f) in d.cdf() {
            let _ = write!(points, " {:.1},{:.1}", px(ms), py(f));
        }
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{points}"/><text x="{}" y="{}" fill="{c}">{} (p99 {:.2} ms)</text>"#,
            left + 10.0,
            top + 16.0 + 16.0 * i as f64,
            escape(name),
            d.ms_at(0.99)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut d = Dist::default();
        for ms in 1..=1000u64 {
            d.record_us(ms * 1000);
        }
        let s = d.summary();
        assert_eq!(s.count, 1000);
        assert!((s.p50_ms - 500.0).abs() <= 1.0, "{s:?}");
        assert!((s.p99_ms - 990.0).abs() <= 1.0, "{s:?}");
        assert!((s.p999_ms - 999.0).abs() <= 1.0, "{s:?}");
        assert!((s.max_ms - 1000.0).abs() <= 1.0, "{s:?}");
        let cdf = d.cdf();
        assert!((cdf.last().unwrap().1 - 1.0).abs() < 1e-9);
    }

    #[test]
    fn lateness_against_a_known_schedule() {
        let mut s = Schedule::default();
        s.due_us.insert(1, vec![1_000_000, 2_000_000]);
        s.due_us.insert(2, vec![1_500_000]);
        let arrivals = [
            Arrival {
                item: 1,
                sequence: 1,
                at_us: 1_002_000,
            },
            Arrival {
                item: 1,
                sequence: 2,
                at_us: 2_005_000,
            },
            Arrival {
                item: 2,
                sequence: 1,
                at_us: 1_500_500,
            },
        ];
        let t = tally(&s, &arrivals);
        assert_eq!(
            (t.expected, t.delivered, t.lost, t.duplicates, t.early),
            (3, 3, 0, 0, 0)
        );
        assert!((t.lateness.max_ms() - 5.0).abs() < 0.01);
        assert!((t.lateness.ms_at(0.0) - 0.5).abs() < 0.01);
    }

    #[test]
    fn loss_duplicates_early_and_strays_are_counted() {
        let mut s = Schedule::default();
        s.due_us.insert(1, vec![1_000]);
        s.due_us.insert(2, vec![1_000, 2_000]);
        let arrivals = [
            Arrival {
                item: 1,
                sequence: 1,
                at_us: 900,
            },
            Arrival {
                item: 1,
                sequence: 1,
                at_us: 1_100,
            },
            Arrival {
                item: 2,
                sequence: 2,
                at_us: 2_000,
            },
            Arrival {
                item: 3,
                sequence: 1,
                at_us: 2_000,
            },
            Arrival {
                item: 2,
                sequence: 9,
                at_us: 2_000,
            },
        ];
        let t = tally(&s, &arrivals);
        assert_eq!(t.expected, 3);
        assert_eq!(t.delivered, 2);
        assert_eq!(t.lost, 1, "item 2 sequence 1 never came");
        assert_eq!(t.duplicates, 1);
        assert_eq!(t.early, 1);
        assert_eq!(t.unexpected, 2);
    }

    #[test]
    fn svg_is_well_formed() {
        let mut d = Dist::default();
        d.record_us(1500);
        let svg = svg_cdf("a <b>", &[("x", &d)]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a &lt;b&gt;"));
    }
}
