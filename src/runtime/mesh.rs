//! The cross-core mesh: a bounded single-producer channel between every pair
//! of shards (glommio's `channel_mesh`), generic over the message type. A
//! request travels with a oneshot for the reply ([`Mesh::ask`]); what a
//! message does is the receiver's business ([`serve`] takes the handler).

use glommio::channels::channel_mesh::{Receivers, Senders};
use glommio::channels::oneshot::{self, SharedSender};

/// Default capacity of each shard-to-shard channel, in messages.
pub const CHANNEL_CAPACITY: usize = 1024;

/// This shard's sending end of the mesh (`None` with a single shard).
pub struct Mesh<M: Send> {
    senders: Option<Senders<M>>,
}

impl<M: Send + 'static> Mesh<M> {
    pub fn new(senders: Option<Senders<M>>) -> Mesh<M> {
        Mesh { senders }
    }

    /// Send a request to `peer` and wait for its reply. `None` if the peer
    /// has gone (shutdown). Waits while the channel is full: backpressure.
    pub async fn ask<R: Send + 'static>(
        &self,
        peer: usize,
        make: impl FnOnce(SharedSender<R>) -> M,
    ) -> Option<R> {
        let senders = self.senders.as_ref()?;
        assert!(
            peer < senders.nr_consumers(),
            "mesh peer {peer} out of range"
        );
        let (tx, rx) = oneshot::shared();
        senders.send_to(peer, make(tx)).await.ok()?;
        rx.await.ok()
    }

    /// Close this shard's channels (at shutdown): peers' receivers end.
    pub fn close(&self) {
        if let Some(s) = &self.senders {
            s.close();
        }
    }
}

/// Serve every peer's channel with `handle` until the channel closes. The
/// tasks hold no gate pass: they end when the peers close their senders.
pub fn serve<M: Send + 'static>(mut receivers: Receivers<M>, handle: impl Fn(M) + Clone + 'static) {
    for (_, receiver) in receivers.streams() {
        let handle = handle.clone();
        super::spawn::spawn_local(async move {
            while let Some(msg) = receiver.recv().await {
                handle(msg);
            }
        })
        .detach();
    }
}
