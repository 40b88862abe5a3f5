//! The messages shards exchange over the cross-core mesh
//! ([`crate::runtime::mesh`]): a request for a timer another shard owns
//! travels with a oneshot for the reply. The composition root decides what
//! each message does on its receiver.

use super::resync::Query;
use super::OpError;
use crate::timer::{TimerHead, TimerSpec};
use glommio::channels::oneshot::SharedSender;

/// A message from one shard to another.
pub enum MeshMsg {
    /// Store an incarnation on its owner (`spec: None`: a tombstone).
    Apply {
        head: TimerHead,
        spec: Option<Box<TimerSpec<'static>>>,
        from_client: bool,
        reply: SharedSender<Reply>,
    },
    Tags {
        reply: SharedSender<Reply>,
    },
    /// Resync GET: this shard's matching timers.
    Resync {
        query: Query,
        reply: SharedSender<Reply>,
    },
    /// Resync DELETE: drop an old-view copy every new replica knows.
    DropReference {
        unique: u64,
        reply: SharedSender<Reply>,
    },
}

/// The owner's answer.
pub enum Reply {
    Applied(Result<(), OpError>),
    Tags(Vec<(String, i64)>),
    Resync(Vec<(u64, String)>),
    Dropped(bool),
}
