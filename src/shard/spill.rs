//! A node is full only when every shard is (issue 43).
//!
//! A `POST` picks an ID that the shard which took the connection owns, so
//! a client's timers spread over the shards as its connections do, not as
//! the node's room does: one busy connection can fill its shard while the
//! others stay empty. A `POST` that finds its shard at
//! `timers-per-shard-max` is created instead by the shard of this node
//! with the most room, with an ID that shard owns, over the mesh
//! ([`MeshMsg::Create`]), and answered as any create is (logged, taken by
//! a replica). Only when every shard is full does the client get `503`.
//!
//! Bounds: at most one try per other shard per `POST`, most room first
//! (read from the shards' `timers_pending` gauges, which each shard keeps
//! after every change; a stale reading costs one more try, since the
//! receiving shard checks its own store again).

use super::error::OpError;
use super::mesh::{MeshMsg, Reply};
use super::Shard;
use crate::stats::ShardStats;
use crate::timer::{TimerId, TimerSpec};
use std::sync::atomic::Ordering::Relaxed;

/// The reason of the `503` a create gets from a full shard (`apply`).
pub const SHARD_FULL: &str = "timer capacity of this shard is exhausted";

impl Shard {
    /// Whether this shard holds its `timers-per-shard-max`: a new timer
    /// stored here would be refused.
    pub fn is_full(&self) -> bool {
        self.timers.store.borrow().len() >= self.base.resolved.config.timers.timers_per_shard_max
    }

    /// A client's `POST`, whole: the timer created here, logged (with
    /// `[storage]`) and, where this node is not a replica, taken by one.
    pub async fn create_settled(&self, spec: &TimerSpec<'_>) -> Result<TimerId, OpError> {
        self.storage_admits_growth()?;
        let (id, ticket) = self.create(spec)?;
        self.settle().await?;
        self.replica_acked(id, ticket).await?;
        Ok(id)
    }

    /// A client's `POST` on this shard, or, when it is full, on the shard
    /// of this node with the most room. `503` only when every shard is
    /// full (or this one is and the others could not be asked).
    pub async fn create_anywhere(&self, spec: &TimerSpec<'_>) -> Result<TimerId, OpError> {
        if !self.is_full() || self.base.shards == 1 {
            return self.create_settled(spec).await;
        }
        let mut others = self.shards_with_room();
        // Most room first: ascending by timers pending.
        others.sort_unstable_by_key(|&(_, pending)| pending);
        for (target, _) in others {
            ShardStats::add(&self.base.my_stats().mesh_forwarded, 1);
            let owned = Box::new(spec.clone().into_owned());
            let reply = self
                .base
                .mesh
                .ask(target, |reply| MeshMsg::Create { spec: owned, reply })
                .await;
            match reply {
                Some(Reply::Created(Err(e))) if e.reason == SHARD_FULL => continue,
                Some(Reply::Created(result)) => return result,
                // No answer (the mesh closed at shutdown): the target may
                // have made the timer, so no other shard tries again.
                _ => return Err(OpError::new(503, "the shard with room did not answer")),
            }
        }
        // None had room: this shard's own answer (a create whose replicas
        // do not include this node still succeeds; one that does is the
        // node's 503).
        self.create_settled(spec).await.map_err(|e| match e.reason == SHARD_FULL {
            true => OpError::new(
                503,
                format!(
                    "timer capacity of this node is exhausted: each of its {} shards holds timers-per-shard-max ({}) timers",
                    self.base.shards, self.base.resolved.config.timers.timers_per_shard_max
                ),
            ),
            false => e,
        })
    }

    /// The other shards whose gauge says they have room, with their
    /// timers pending.
    fn shards_with_room(&self) -> Vec<(usize, i64)> {
        let max = self.base.resolved.config.timers.timers_per_shard_max as i64;
        (0..self.base.shards)
            .filter(|&k| k != self.base.id)
            .map(|k| (k, self.base.stats[k].timers_pending.load(Relaxed)))
            .filter(|&(_, pending)| pending < max)
            .collect()
    }
}
