//! A shard's base: where it sits in the node. Its index among the shards,
//! the node's resolved configuration, every shard's stats (it writes its
//! own slot, `/metrics` sums them all), the mesh to the other shards and
//! the shutdown gate. Set once at start; the other parts lean on it.

use super::mesh::MeshMsg;
use crate::config::Resolved;
use crate::runtime::gate::Gate;
use crate::runtime::mesh::Mesh;
use crate::stats::ShardStats;
use std::rc::Rc;
use std::sync::Arc;

/// Where a shard sits in the node.
pub struct Base {
    pub id: usize,
    pub shards: usize,
    pub resolved: Arc<Resolved>,
    pub stats: Arc<[ShardStats]>,
    pub mesh: Mesh<MeshMsg>,
    /// Closed at shutdown; the pop loop and the replication senders hold it.
    pub gate: Rc<Gate>,
}

impl Base {
    /// This shard's own stats.
    pub fn my_stats(&self) -> &ShardStats {
        &self.stats[self.id]
    }

    /// `[timers] replica-skew-ms`.
    pub fn skew_ms(&self) -> u64 {
        self.resolved.config.timers.replica_skew_ms
    }
}
