//! What a node's `/metrics` says: one series' value, a family's sum, the
//! live timers, and whether replication has settled. Read as the harness
//! reads a node ([`Node::get`]: with its shared secret, if it has one).

use super::Node;
use std::time::{Duration, Instant};

/// The value of the series `name` (a metric's name, or its name and
/// labels: `name{label="v"}`) in a `/metrics` text; `None` if it has no
/// such line.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The sum of every series whose line starts with `name` (each label set
/// of a family; comments skipped).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

impl Node {
    /// `/metrics` as text; `Err` naming the status if it did not answer 200.
    pub fn metrics(&self) -> Result<String, String> {
        let r = self.get("/metrics");
        match r.status {
            200 => Ok(r.text()),
            status => Err(format!("{}: /metrics answered {status}", self.addr)),
        }
    }

    /// The value of a metric line (`name` or `name{labels}`) from
    /// `/metrics`; fails if `/metrics` does not answer 200 or has no such
    /// line.
    pub fn metric(&self, name: &str) -> f64 {
        let text = self.metrics().unwrap_or_else(|e| panic!("{e}"));
        metric_value(&text, name).unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    }

    /// As [`Node::metric`], for a wait's check: `Err` instead of a failure.
    pub fn try_metric(&self, name: &str) -> Result<f64, String> {
        metric_value(&self.metrics()?, name).ok_or_else(|| format!("no metric {name}"))
    }

    /// Live timers: those pending less the tombstones (which never pop).
    pub fn live_timers(&self) -> f64 {
        self.metric("chronos_timers_pending") - self.metric("chronos_tombstones")
    }

    /// Wait until every replication message this node queued has been
    /// answered or given up on (sent + failed == enqueued).
    pub fn wait_replication_settled(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let queued = self.metric("chronos_replication_enqueued_total");
            let done = self.metric("chronos_replication_sent_total")
                + self.metric("chronos_replication_failed_total");
            if done >= queued {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "replication did not settle: {done} of {queued}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// [`Node::wait_replication_settled`] for each of `nodes`, 5 s each.
pub fn wait_settled<'a>(nodes: impl IntoIterator<Item = &'a Node>) {
    for node in nodes {
        node.wait_replication_settled(Duration::from_secs(5));
    }
}
