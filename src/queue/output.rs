//! The output's health: whether publishing is blocked by something an
//! operator must fix (a missing output topic, no right to write it, failed
//! authentication) rather than by one message. Two witnesses set it:
//! - a publish refused for such a reason (`producer.rs`,
//!   [`super::producer::is_configuration`]), until a publish succeeds;
//! - the consumer thread's probe of the output topic's metadata with the
//!   producer's client (`consumer.rs`, every two seconds), until the topic
//!   is seen again or a publish succeeds.
//!
//! While either holds, the messages are retried with backoff (none is
//! skipped), `/ready` answers 503 naming the topic and the error, and
//! `chronos_queue_output_blocked` reads 1. The fast path, a publish
//! acknowledged, costs one relaxed atomic load.

use crate::stats::ShardStats;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The output topic's health, shared by the shards and the consumer thread.
pub struct Output {
    topic: String,
    /// A publish was refused for a configuration reason, and none has
    /// succeeded since.
    refused: AtomicBool,
    /// The last probe could not find the output topic.
    missing: AtomicBool,
    /// Why, for each witness (written only as the state changes, or on a
    /// refusal, which is retried with backoff: never per message).
    why: Mutex<Why>,
}

#[derive(Default)]
struct Why {
    refused: String,
    missing: String,
}

impl Output {
    pub fn new(topic: &str) -> Output {
        Output {
            topic: topic.to_string(),
            refused: AtomicBool::new(false),
            missing: AtomicBool::new(false),
            why: Mutex::new(Why::default()),
        }
    }

    /// A publish was refused for a reason of the configuration or the
    /// cluster (`why`): blocked until one succeeds.
    pub fn publish_refused(&self, why: &str, stats: &ShardStats) {
        if let Ok(mut w) = self.why.lock() {
            if w.refused != why {
                w.refused = why.to_string();
            }
        }
        if !self.refused.swap(true, Ordering::AcqRel) {
            tracing::error!(target: "chronos::queue", topic = %self.topic, "publishing to the output topic is refused ({why}): messages are retried with backoff, none is skipped, until the configuration or the cluster is fixed");
        }
        self.mirror(stats);
    }

    /// A publish was acknowledged: the output works, whatever a probe or
    /// an earlier refusal said.
    pub fn published(&self, stats: &ShardStats) {
        if !self.refused.load(Ordering::Relaxed) && !self.missing.load(Ordering::Relaxed) {
            return;
        }
        let refused = self.refused.swap(false, Ordering::AcqRel);
        let missing = self.missing.swap(false, Ordering::AcqRel);
        if refused || missing {
            tracing::info!(target: "chronos::queue", topic = %self.topic, "publishing to the output topic works again");
            self.mirror(stats);
        }
    }

    /// The consumer thread's probe of the output topic: `Err` says why it
    /// cannot be used (missing, or its metadata refused).
    pub fn probed(&self, result: Result<(), String>, stats: &ShardStats) {
        match result {
            Ok(()) => {
                if self.missing.swap(false, Ordering::AcqRel) {
                    tracing::info!(target: "chronos::queue", topic = %self.topic, "the output topic is there again");
                }
            }
            Err(why) => {
                if let Ok(mut w) = self.why.lock() {
                    w.missing = why.clone();
                }
                if !self.missing.swap(true, Ordering::AcqRel) {
                    tracing::error!(target: "chronos::queue", topic = %self.topic, "the output topic cannot be used ({why}): messages due are held and retried until it can");
                }
            }
        }
        self.mirror(stats);
    }

    /// Why the output is blocked, for `/ready` (`None`: it is not).
    pub fn problem(&self) -> Option<String> {
        let refused = self.refused.load(Ordering::Acquire);
        let missing = self.missing.load(Ordering::Acquire);
        if !refused && !missing {
            return None;
        }
        let why = self.why.lock().ok()?;
        let mut parts = Vec::new();
        if missing {
            parts.push(why.missing.clone());
        }
        if refused && (!missing || why.refused != why.missing) {
            parts.push(format!("publishes refused: {}", why.refused));
        }
        Some(format!(
            "Kafka output topic {}: {}",
            self.topic,
            parts.join("; ")
        ))
    }

    fn mirror(&self, stats: &ShardStats) {
        let blocked = self.refused.load(Ordering::Acquire) || self.missing.load(Ordering::Acquire);
        stats.queue_output_blocked.store(blocked, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_while_either_witness_holds() {
        let stats = ShardStats::default();
        let o = Output::new("out");
        assert_eq!(o.problem(), None);
        o.publish_refused("Broker: Topic authorization failed", &stats);
        let p = o.problem().unwrap();
        assert!(p.contains("out") && p.contains("authorization"), "{p}");
        assert!(stats.queue_output_blocked.load(Ordering::Relaxed));
        o.probed(Err("unknown topic".into()), &stats);
        let p = o.problem().unwrap();
        assert!(
            p.contains("unknown topic") && p.contains("authorization"),
            "{p}"
        );
        o.probed(Ok(()), &stats);
        let p = o.problem().unwrap();
        assert!(
            !p.contains("unknown topic") && p.contains("authorization"),
            "{p}"
        );
        assert!(stats.queue_output_blocked.load(Ordering::Relaxed));
        // A publish acknowledged clears both witnesses.
        o.probed(Err("unknown topic".into()), &stats);
        o.published(&stats);
        assert_eq!(o.problem(), None);
        assert!(!stats.queue_output_blocked.load(Ordering::Relaxed));
    }
}
