//! The messages shards exchange over the cross-core mesh
//! ([`crate::runtime::mesh`]): a request for a timer another shard owns
//! travels with a oneshot for the reply. The composition root decides what
//! each message does on its receiver.

use super::error::OpError;
use super::resync::query::{Query, ShardPage};
use crate::timer::{TimerHead, TimerSpec};
use glommio::channels::oneshot::SharedSender;

/// A message from one shard to another.
pub enum MeshMsg {
    /// Store an incarnation on its owner (`spec: None`: a tombstone).
    Apply {
        head: TimerHead,
        spec: Option<Box<TimerSpec<'static>>>,
        source: super::conflict::Source,
        reply: SharedSender<Reply>,
    },
    Tags {
        reply: SharedSender<Reply>,
    },
    /// `GET /timers/<id>`: this shard's copy of `unique`, rendered.
    LookUp {
        unique: u64,
        reply: SharedSender<Reply>,
    },
    /// A client's `POST` that found its own shard full: create it here,
    /// with an ID this shard owns (`shard/spill.rs`).
    Create {
        spec: Box<TimerSpec<'static>>,
        reply: SharedSender<Reply>,
    },
    /// Resync GET: this shard's matching timers.
    Resync {
        query: Query,
        reply: SharedSender<Reply>,
    },
    /// Resync DELETE: mark `(ID, ReplicaIndex)` pairs this shard owns.
    MarkReferences {
        list: Vec<(u64, u8)>,
        reply: SharedSender<Reply>,
    },
    /// What this shard still owes the node at `node` (`GET /handoff`).
    Owed {
        node: String,
        reply: SharedSender<Reply>,
    },
    /// Start a resync (it runs on shard 0): `all_views` restores every
    /// replica this node holds, not only old-view ones.
    StartResync {
        all_views: bool,
        reply: SharedSender<Reply>,
    },
}

/// What this node holds of a timer (`GET /timers/<id>`, `lookup.rs`).
pub enum Found {
    /// A live copy, as the JSON answer.
    Live(String),
    /// A tombstone: the timer was deleted (or moved to other replicas).
    Deleted,
    /// No copy at all.
    Absent,
}

/// The owner's answer.
pub enum Reply {
    /// The factor the copy stored before asked for (see `Shard::apply`).
    Applied(Result<u8, OpError>),
    /// A copy looked up (`shard/lookup.rs`).
    Found(Found),
    /// The ID a spilled create got, or why it failed.
    Created(Result<crate::timer::TimerId, OpError>),
    Tags(Vec<(String, i64)>),
    Resync(ShardPage),
    Marked(usize),
    /// The number of the resync run that will serve the request.
    ResyncRun(u64),
    /// Messages ever queued for and ever settled with the node asked
    /// about, and whether a repair is owed to it.
    Owed(u64, u64, bool),
}
