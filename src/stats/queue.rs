//! The delay queue's labels: why an input message was rejected, and the
//! stages a message or statement is timed in. Enums, so that a counter or
//! histogram is picked by name and its index is always in bounds; `ALL`
//! fixes the order in which `/metrics` renders them.

/// Why a queue input message was rejected, logged and skipped
/// (`chronos_queue_rejected_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    /// A missing or invalid chronos header.
    InvalidHeader,
    /// Postgres refused its data.
    Unstorable,
    /// The producer, or the broker in a batch of it alone, refused it for
    /// good: too large, an invalid record, no right to write the output
    /// topic.
    Unpublishable,
}

impl Reject {
    /// Every reason, in the order of their counters.
    pub const ALL: [Reject; 3] = [
        Reject::InvalidHeader,
        Reject::Unstorable,
        Reject::Unpublishable,
    ];

    /// The metric's `reason` label.
    pub const fn label(self) -> &'static str {
        match self {
            Reject::InvalidHeader => "invalid_header",
            Reject::Unstorable => "unstorable",
            Reject::Unpublishable => "unpublishable",
        }
    }
}

/// The delay queue's stages, timed per message or per statement
/// (`chronos_queue_stage_seconds{stage}`), so that a run's breakdown can be
/// read from `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// A message polled by the consumer thread until its shard takes it
    /// into an enqueue batch.
    Inbox,
    /// One insert statement (per batch).
    Insert,
    /// A batch's first message polled until its offsets are stored for
    /// commit (inserted, or its late messages acknowledged).
    Stored,
    /// One claim statement (per batch).
    Claim,
    /// Per claimed row, how far past its publish time (deadline - timing
    /// advance) it was claimed (0 when ahead of it).
    ClaimedLate,
    /// Per message, its wheel slot's time until the fire task handed it to
    /// the producer.
    FireLate,
    /// Per publish, handed to the producer until the broker's
    /// acknowledgement was reported to the shard.
    PublishAck,
    /// One delete statement (per batch).
    Delete,
    /// A message's producer timestamp until the consumer thread polled it
    /// (the input's broker and fetch path; 0 without a timestamp, or one
    /// from a clock ahead of this node's).
    Broker,
}

impl Stage {
    /// Every stage, in the order of their histograms.
    pub const ALL: [Stage; 9] = [
        Stage::Inbox,
        Stage::Insert,
        Stage::Stored,
        Stage::Claim,
        Stage::ClaimedLate,
        Stage::FireLate,
        Stage::PublishAck,
        Stage::Delete,
        Stage::Broker,
    ];

    /// The metric's `stage` label.
    pub const fn label(self) -> &'static str {
        match self {
            Stage::Inbox => "inbox",
            Stage::Insert => "insert",
            Stage::Stored => "stored",
            Stage::Claim => "claim",
            Stage::ClaimedLate => "claimed_late",
            Stage::FireLate => "fire_late",
            Stage::PublishAck => "publish_ack",
            Stage::Delete => "delete",
            Stage::Broker => "broker",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_label_sits_at_its_own_index() {
        for (i, r) in Reject::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{}", r.label());
        }
        for (i, s) in Stage::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{}", s.label());
        }
    }
}
