//! The cross-core mesh: a bounded single-producer channel between every pair
//! of shards (glommio's `channel_mesh`). A request for a timer another shard
//! owns travels here with a oneshot for the reply; the owner's receiver task
//! applies it and answers.

use crate::shard::{OpError, Shard};
use crate::timer::{TimerHead, TimerSpec};
use glommio::channels::channel_mesh::{Receivers, Senders};
use glommio::channels::oneshot::{self, SharedSender};
use std::rc::Rc;

/// Default capacity of each shard-to-shard channel, in messages.
pub const CHANNEL_CAPACITY: usize = 1024;

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
        query: crate::shard::resync::Query,
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

/// This shard's end of the mesh (`None` with a single shard).
pub struct Mesh {
    senders: Option<Senders<MeshMsg>>,
}

impl Mesh {
    pub fn new(senders: Option<Senders<MeshMsg>>) -> Mesh {
        Mesh { senders }
    }

    /// Send a request to `peer` and wait for its reply. `None` if the peer
    /// has gone (shutdown). Waits while the channel is full: backpressure.
    pub async fn ask(
        &self,
        peer: usize,
        make: impl FnOnce(SharedSender<Reply>) -> MeshMsg,
    ) -> Option<Reply> {
        let senders = self.senders.as_ref()?;
        let (tx, rx) = oneshot::shared();
        senders.send_to(peer, make(tx)).await.ok()?;
        rx.await.ok()
    }

    pub fn close(&self) {
        if let Some(s) = &self.senders {
            s.close();
        }
    }
}

/// Serve every peer's channel until it closes.
pub fn serve(shard: &Rc<Shard>, mut receivers: Receivers<MeshMsg>) {
    for (_, receiver) in receivers.streams() {
        let shard = shard.clone();
        glommio::spawn_local(async move {
            while let Some(msg) = receiver.recv().await {
                shard.handle_mesh(msg);
            }
        })
        .detach();
    }
}
