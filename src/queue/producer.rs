//! Publishing: the producer side of the queue. Every publish has a token
//! (the shard in its top bits); librdkafka's delivery callback routes each
//! report back to that shard over a bounded channel. A publish that failed
//! for a transient reason is retried with backoff, and so is one refused
//! for a reason that belongs to the configuration or the cluster
//! ([`is_configuration`]: no right to write the output topic, a topic that
//! does not exist or cannot be named): the output is then blocked, which
//! `/ready` and `chronos_queue_output_blocked` say until a publish
//! succeeds ([`super::output::Output`]). One refused for good
//! ([`is_permanent`]: too large, an invalid record) is logged, counted as
//! `unpublishable` and skipped, but
//! only once the refusal is known to be about that message ([`next_step`]):
//! the producer's own check when it is handed over, or the broker's reply
//! to a batch of that message alone. A broker's error applies to a whole
//! partition batch (librdkafka reports it for every message in it), so a
//! message refused in a batch is first sent again alone, through a second
//! producer that makes batches of one message. Either end, acknowledged or
//! skipped, completes its message: the row is queued for deletion, or the
//! enqueue batch that waits is told.

use super::{id_bytes, Kind, Pending, QueueConfig, QueueShard, CLAIMED_IN_HAND_BATCHES};
use crate::runtime::clock;
use crate::stats::{Reject, ShardStats, Stage};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext};
use rdkafka::ClientContext;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Delivery reports waiting per shard: never reached, since a report
/// exists only for a publish in the shard's pending table, which holds at
/// most the claimed messages in hand plus one enqueue batch's late ones.
pub fn deliveries_max(cfg: &QueueConfig) -> usize {
    cfg.claim_batch_max * CLAIMED_IN_HAND_BATCHES + cfg.insert_batch_max
}
/// At most one publish-failure log line per shard this often.
const PUBLISH_LOG_EVERY: Duration = Duration::from_secs(10);
/// Publish retry backoff.
const PUBLISH_BACKOFF_MS_MIN: u64 = 100;
const PUBLISH_BACKOFF_MS_MAX: u64 = 5_000;

/// A publish acknowledgement (or failure) for the shard that sent it.
pub struct Delivery {
    pub(super) token: usize,
    pub(super) result: Result<(), Refusal>,
}

/// Why a publish failed, and whether for good.
pub struct Refusal {
    why: String,
    permanent: bool,
    /// The refusal belongs to the configuration or the cluster (retried;
    /// the output is blocked until a publish succeeds).
    configuration: bool,
}

/// What to do with a publish that failed.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Transient: send it again after a backoff.
    Retry,
    /// Refused in a batch: send it again alone, to learn whether the
    /// refusal is about it.
    Alone,
    /// Refused for good, and the refusal is about this message: skip it.
    Refuse,
}

/// The decision for a failed publish. A permanent refusal is about the
/// message itself only when the producer refused it as it was handed over
/// (`synchronous`: its own size check), or when the broker refused a batch
/// holding it `alone`; any other is about a batch, which may have held a
/// neighbour at fault.
pub fn next_step(permanent: bool, synchronous: bool, alone: bool) -> Step {
    match (permanent, synchronous || alone) {
        (false, _) => Step::Retry,
        (true, true) => Step::Refuse,
        (true, false) => Step::Alone,
    }
}

impl Refusal {
    fn of(e: &KafkaError) -> Refusal {
        let code = e.rdkafka_error_code();
        Refusal {
            why: e.to_string(),
            permanent: code.is_some_and(is_permanent),
            configuration: code.is_some_and(is_configuration),
        }
    }
}

/// The errors that refuse a message for good, because of the message
/// itself: the same message to the same topic can never be accepted, so
/// retrying would hold it (and everything waiting behind it) for ever.
/// Everything else is retried: the broker or the network away, leader
/// changes, timeouts, a full local queue, the configuration errors of
/// [`is_configuration`], too few in-sync replicas, quotas, a corrupt
/// message (a CRC error: retriable in Kafka), a reply librdkafka could not
/// parse (`BadMessage`), a timestamp outside the broker's bounds
/// (`InvalidTimestamp`: no timestamp is set on the record, so it is this
/// node's clock, which may be corrected), and a fatal idempotent-producer
/// error (the node must be restarted).
pub fn is_permanent(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        // Over `message.max.bytes`: the producer's (checked when handed
        // over), or the broker's or the topic's.
        C::MessageSizeTooLarge
            | C::InvalidMessageSize
            // The broker's record validation (e.g. no key on a compacted
            // topic, headers on an old format), or one librdkafka cannot
            // encode.
            | C::InvalidRecord
            | C::UnsupportedForMessageFormat
    )
}

/// The errors that belong to the configuration or the cluster, not to a
/// message: no right to write the output topic (or the cluster), failed
/// authentication, an output topic that does not exist or whose name the
/// broker refuses. Every message would meet them alike, and an operator
/// can fix them (an ACL, a topic created or renamed), so they are retried
/// and never skip a message; meanwhile the output is blocked and says so.
/// (Skipping on them would delete every due message while an ACL is
/// wrong: issue 39.)
pub fn is_configuration(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::SaslAuthenticationFailed
            | C::Authentication
            | C::InvalidTopic
            | C::UnknownTopic
            | C::UnknownTopicOrPartition
            | C::UnknownPartition
    )
}

/// Routes delivery reports to the sending shard (the shard is in the
/// token's top bits).
pub struct DeliveryRouter {
    pub(super) senders: Vec<async_channel::Sender<Delivery>>,
}

const TOKEN_SHARD_SHIFT: u32 = 48;

impl ClientContext for DeliveryRouter {}

impl ProducerContext for DeliveryRouter {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, token: usize) {
        let result = match result {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(Refusal::of(e)),
        };
        let shard = token >> TOKEN_SHARD_SHIFT;
        let Some(tx) = self.senders.get(shard) else {
            tracing::error!(target: "chronos::queue", "delivery report for unknown shard {shard}");
            return;
        };
        // Never full: a report exists only for a publish in a shard's
        // pending table, which holds fewer than the channel's capacity.
        if tx.try_send(Delivery { token, result }).is_err() {
            tracing::error!(target: "chronos::queue", "delivery channel of shard {shard} full or closed; the message will be retried by failure detection");
        }
    }
}

impl QueueShard {
    /// Hand a message to the producer (retried with backoff while its queue
    /// is full; skipped if refused for good).
    pub(super) fn publish(self: &Rc<Self>, p: Pending) {
        let token = (self.shard << TOKEN_SHARD_SHIFT)
            | (self.next_token.get() & ((1 << TOKEN_SHARD_SHIFT) - 1));
        self.next_token.set(self.next_token.get().wrapping_add(1));
        let mut pending = self.pending.borrow_mut();
        assert!(
            pending.len() < deliveries_max(self.cfg()),
            "pending publishes stay bounded"
        );
        let replaced = pending.insert(token, p);
        assert!(
            replaced.is_none(),
            "tokens are unique among pending publishes"
        );
        drop(pending);
        self.send(token);
    }

    fn send(self: &Rc<Self>, token: usize) {
        let outcome = {
            let mut pending = self.pending.borrow_mut();
            let Some(p) = pending.get_mut(&token) else {
                return;
            };
            p.sent = Instant::now();
            let mut headers = OwnedHeaders::new_with_capacity(p.headers.len());
            for (k, v) in &p.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: v.as_deref(),
                });
            }
            let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(
                &self.shared.config.output_topic,
                token,
            )
            .headers(headers);
            if let Some(k) = &p.key {
                record = record.key(k.as_slice());
            }
            if let Some(v) = &p.value {
                record = record.payload(v.as_slice());
            }
            let producer = if p.alone {
                &self.shared.solo
            } else {
                &self.shared.producer
            };
            producer.send(record).map_err(|(e, _)| e)
        };
        if let Err(e) = outcome {
            self.failed(token, Refusal::of(&e), true);
        }
    }

    /// A publish failed: when the producer refused it as it was handed
    /// over (`synchronous`), or as the broker's report.
    fn failed(self: &Rc<Self>, token: usize, r: Refusal, synchronous: bool) {
        let alone = {
            let pending = self.pending.borrow();
            let Some(p) = pending.get(&token) else {
                return;
            };
            p.alone
        };
        if r.configuration {
            self.shared.output.publish_refused(&r.why, &self.stats[0]);
        }
        match next_step(r.permanent, synchronous, alone) {
            Step::Retry => self.retry_later(token, &r.why),
            Step::Refuse => self.refused(token, &r.why),
            Step::Alone => self.resend_alone(token, &r.why),
        }
    }

    /// Refused in a batch: send it again in a batch of its own, at once.
    fn resend_alone(self: &Rc<Self>, token: usize, why: &str) {
        let Some(id) = self.pending.borrow_mut().get_mut(&token).map(|p| {
            p.alone = true;
            p.id().to_string()
        }) else {
            return;
        };
        tracing::debug!(target: "chronos::queue", "message {id} refused in a batch, sent again alone: {why}");
        self.send(token);
    }

    /// A publish refused for good: logged (every one, with its ID), counted
    /// and skipped, and then completed like an acknowledged one.
    fn refused(&self, token: usize, why: &str) {
        let Some(p) = self.pending.borrow_mut().remove(&token) else {
            return;
        };
        self.stats().queue_reject(Reject::Unpublishable);
        let id = p.id();
        tracing::warn!(target: "chronos::queue", "message {id} cannot be published, skipped (counted as unpublishable): {why}");
        self.complete(p, false);
    }

    /// A publish ended (`published`, or refused for good): a row is queued
    /// for deletion, a late message's batch is told.
    fn complete(&self, p: Pending, published: bool) {
        let bytes = p.bytes();
        match p.kind {
            Kind::Held { id, deadline_us } => {
                if published {
                    let stats = self.stats();
                    ShardStats::add(&stats.queue_fired, 1);
                    stats.record_queue_lateness(clock::unix_us() as i64 - deadline_us);
                }
                // Still in hand until deleted, as its ID only.
                self.in_hand.sub(0, bytes.saturating_sub(id_bytes(&id)));
                self.to_delete.borrow_mut().push((id, deadline_us));
                self.delete_wake.notify();
            }
            Kind::Immediate { wait, .. } => {
                wait.left.set(wait.left.get().saturating_sub(1));
                if wait.left.get() == 0 {
                    wait.done.notify();
                }
            }
        }
    }

    fn retry_later(self: &Rc<Self>, token: usize, why: &str) {
        ShardStats::add(&self.stats().queue_producer_errors, 1);
        let attempts = {
            let mut pending = self.pending.borrow_mut();
            let Some(p) = pending.get_mut(&token) else {
                return;
            };
            p.attempts += 1;
            p.attempts
        };
        // One line per `PUBLISH_LOG_EVERY` per shard, however many fail.
        let quiet = self.publish_warned.get();
        if quiet.is_none_or(|t| t.elapsed() >= PUBLISH_LOG_EVERY) {
            let more = self.publish_failures_unlogged.replace(0);
            tracing::warn!(target: "chronos::queue", "publish failed, retrying with backoff ({more} more failures since the last report): {why}");
            self.publish_warned.set(Some(Instant::now()));
        } else {
            self.publish_failures_unlogged
                .set(self.publish_failures_unlogged.get() + 1);
        }
        let backoff = (PUBLISH_BACKOFF_MS_MIN << attempts.min(10)).min(PUBLISH_BACKOFF_MS_MAX);
        let me = self.clone();
        self.gate.spawn(async move {
            me.pause(backoff).await;
            if !me.gate.is_closing() {
                me.send(token);
            }
        });
    }

    pub(super) async fn delivery_loop(self: Rc<Self>) {
        let rx = self.shared.deliveries[self.shard].clone();
        loop {
            let Some(Ok(d)) = self.gate.unless_closing(rx.recv()).await else {
                return;
            };
            if let Err(r) = d.result {
                self.failed(d.token, r, false);
                continue;
            }
            self.shared.output.published(&self.stats[0]);
            let Some(p) = self.pending.borrow_mut().remove(&d.token) else {
                continue;
            };
            self.stats()
                .record_queue_stage(Stage::PublishAck, p.sent.elapsed());
            self.complete(p, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RDKafkaErrorCode as C;

    /// Finding 1: only a refusal about the message alone skips it.
    #[test]
    fn a_refusal_in_a_batch_is_tried_alone_before_skipping() {
        // The producer's own size check, as the message is handed over.
        assert_eq!(next_step(true, true, false), Step::Refuse);
        // The broker refused its batch: maybe a neighbour's fault.
        assert_eq!(next_step(true, false, false), Step::Alone);
        // Refused again in a batch of its own: its own fault.
        assert_eq!(next_step(true, false, true), Step::Refuse);
        // Transient errors are retried, alone or not.
        for (sync, alone) in [(false, false), (true, false), (false, true)] {
            assert_eq!(next_step(false, sync, alone), Step::Retry);
        }
    }

    /// Finding 2: a reply librdkafka could not parse and a timestamp out
    /// of the broker's bounds are transient; size and record refusals are
    /// not.
    #[test]
    fn bad_replies_and_timestamps_are_retried() {
        assert!(!is_permanent(C::BadMessage));
        assert!(!is_permanent(C::InvalidTimestamp));
        assert!(!is_permanent(C::RequestTimedOut));
        assert!(!is_permanent(C::UnknownTopicOrPartition));
        for c in [
            C::MessageSizeTooLarge,
            C::InvalidMessageSize,
            C::InvalidRecord,
        ] {
            assert!(is_permanent(c), "{c:?}");
            assert!(!is_configuration(c), "{c:?}");
        }
    }

    /// Issue 39, finding 1: an ACL or a topic that is wrong blocks the
    /// output (retried, said) and never skips a message.
    #[test]
    fn configuration_errors_are_retried_never_skipped() {
        for c in [
            C::TopicAuthorizationFailed,
            C::ClusterAuthorizationFailed,
            C::SaslAuthenticationFailed,
            C::InvalidTopic,
            C::UnknownTopic,
            C::UnknownTopicOrPartition,
        ] {
            assert!(!is_permanent(c), "{c:?} must not skip messages");
            assert!(is_configuration(c), "{c:?}");
            assert_eq!(next_step(is_permanent(c), true, true), Step::Retry);
        }
    }
}
