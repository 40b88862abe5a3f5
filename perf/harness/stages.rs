//! The queue run's breakdown: the node's per-stage histograms
//! (`chronos_queue_stage_seconds{stage}`, scraped at the end of a run) and
//! the CPU each process of the run used while it ran (from `/proc`: the
//! chronos node, the broker, every Postgres process, this harness).

use std::net::SocketAddr;

/// The stages the node reports, in pipeline order.
const STAGES: [&str; 9] = [
    "broker",
    "inbox",
    "insert",
    "stored",
    "claim",
    "claimed_late",
    "fire_late",
    "publish_ack",
    "delete",
];

/// One stage: observations, mean, and the upper bound of the bucket that
/// holds each percentile (ms; `inf` past the last bucket).
pub struct Stage {
    name: &'static str,
    count: u64,
    mean_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
}

/// The node's stage histograms (none from a node that does not report them).
pub fn scrape_stages(addr: SocketAddr) -> Vec<Stage> {
    let text = super::metrics_text(addr);
    STAGES
        .iter()
        .filter_map(|&name| stage_of(&text, name))
        .collect()
}

fn stage_of(text: &str, name: &'static str) -> Option<Stage> {
    let bucket = format!("chronos_queue_stage_seconds_bucket{{stage=\"{name}\",le=\"");
    let mut buckets: Vec<(f64, u64)> = Vec::new();
    for rest in text.lines().filter_map(|l| l.strip_prefix(&bucket)) {
        let (le, n) = rest.split_once("\"} ")?;
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse::<f64>().ok()? * 1000.0
        };
        buckets.push((le, n.trim().parse().ok()?));
    }
    let sum_line = format!("chronos_queue_stage_seconds_sum{{stage=\"{name}\"}} ");
    let sum_s: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(&sum_line))?
        .trim()
        .parse()
        .ok()?;
    let count = buckets.last()?.1;
    let at = |q: f64| {
        let want = (q * count as f64).ceil() as u64;
        buckets
            .iter()
            .find(|(_, n)| *n >= want.max(1))
            .map_or(f64::INFINITY, |b| b.0)
    };
    Some(Stage {
        name,
        count,
        mean_ms: if count > 0 {
            sum_s * 1000.0 / count as f64
        } else {
            0.0
        },
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        p999_ms: at(0.999),
    })
}

pub fn print_stages(stages: &[Stage]) {
    if stages.is_empty() {
        println!("stages: the node reports none (an older binary)");
        return;
    }
    println!(
        "{:<14} {:>9} {:>9} {:>9} {:>9} {:>9}   (percentiles: bucket upper bounds)",
        "stage", "count", "mean ms", "p50 ≤", "p99 ≤", "p99.9 ≤"
    );
    for s in stages {
        println!(
            "{:<14} {:>9} {:>9.2} {:>9} {:>9} {:>9}",
            s.name, s.count, s.mean_ms, s.p50_ms, s.p99_ms, s.p999_ms
        );
    }
}

pub fn stages_json(stages: &[Stage]) -> serde_json::Value {
    let bound = |v: f64| {
        if v.is_finite() {
            serde_json::json!(v)
        } else {
            serde_json::json!("inf")
        }
    };
    serde_json::Value::Array(
        stages
            .iter()
            .map(|s| {
                serde_json::json!({
                    "stage": s.name, "count": s.count, "mean_ms": s.mean_ms,
                    "p50_le_ms": bound(s.p50_ms), "p99_le_ms": bound(s.p99_ms),
                    "p999_le_ms": bound(s.p999_ms),
                })
            })
            .collect(),
    )
}

/// CPU seconds (user + system) of the run's processes, sampled at the
/// start and the end of a window.
pub struct CpuWindow {
    pids: Vec<(&'static str, u32)>,
    start: Vec<(&'static str, f64)>,
    started: std::time::Instant,
}

/// `utime + stime` of a process (all its threads), in seconds.
fn cpu_s(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command (which may hold spaces), from field 3 on.
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15: 11 and 12 after the state.
    (ticks(11) + ticks(12)) / 100.0
}

/// Every process named `postgres` (the server and its backends).
fn postgres_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .collect()
}

impl CpuWindow {
    /// Start a window over `pids` (labelled), Postgres and this process.
    pub fn start(mut pids: Vec<(&'static str, u32)>) -> CpuWindow {
        pids.push(("harness", std::process::id()));
        let mut w = CpuWindow {
            pids,
            start: Vec::new(),
            started: std::time::Instant::now(),
        };
        w.start = w.sample();
        w
    }

    fn sample(&self) -> Vec<(&'static str, f64)> {
        let mut v: Vec<(&'static str, f64)> =
            self.pids.iter().map(|&(n, pid)| (n, cpu_s(pid))).collect();
        // Backends come and go; those that stay for the run are what counts.
        let pg: f64 = postgres_pids().into_iter().map(cpu_s).sum();
        v.push(("postgres", pg));
        v
    }

    /// Cores used by each process over the window (CPU s / wall s).
    pub fn finish(self) -> Vec<(&'static str, f64)> {
        let wall = self.started.elapsed().as_secs_f64().max(1e-3);
        self.sample()
            .into_iter()
            .zip(&self.start)
            .map(|((n, end), (_, start))| (n, (end - start).max(0.0) / wall))
            .collect()
    }
}
