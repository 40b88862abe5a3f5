//! The checks that need several sections, or the cluster resolved: the
//! bind address with the shard count and the log filter, every section's
//! own checks in turn, the callback guard's rules, the skew rule, and the
//! instance field of this node's timer IDs.

use super::{check_log_filter, Config, POP_REPLICATION_ALLOWANCE_MS};
use crate::cluster::Cluster;
use crate::http::guard::Guard;
use crate::http::sign::SigningKeys;
use std::net::IpAddr;
use std::sync::Arc;

impl Config {
    /// The bind IP and the shard count, or why not.
    pub(super) fn check_engine(&self, available_cores: usize) -> Result<(IpAddr, usize), String> {
        let ip = self.http.bind_ip()?;
        let shards = self.runtime.shards(available_cores)?;
        check_log_filter(&self.log.level)?;
        Ok((ip, shards))
    }

    /// Every bound and timeout in range (and the queue's own checks).
    pub(super) fn check_limits(&self) -> Result<(), String> {
        self.http.check()?;
        self.timers.check()?;
        self.cluster.check()?;
        if let Some(th) = &self.throttling {
            th.check()?;
        }
        self.storage.check()?;
        match &self.queue {
            Some(q) => q.check(),
            None => Ok(()),
        }
    }

    /// `[timers] callback-signing-keys`, parsed (a bad key is named by
    /// its place in the list, never by its text); `None` when none is set.
    pub(super) fn resolve_signing_keys(&self) -> Result<Option<Arc<SigningKeys>>, String> {
        let secrets = &self.timers.callback_signing_keys;
        if secrets.malformed {
            return Err(
                "[timers] callback-signing-keys: must be a list of strings, each whsec_ and base64"
                    .into(),
            );
        }
        let secrets = &secrets.keys;
        if secrets.is_empty() {
            return Ok(None);
        }
        SigningKeys::parse(secrets)
            .map(|k| Some(Arc::new(k)))
            .map_err(|e| format!("[timers] callback-signing-keys: {e}"))
    }

    /// `[timers] callback-allow`, parsed (a bad rule is named).
    pub(super) fn resolve_guard(&self) -> Result<Option<Arc<Guard>>, String> {
        match &self.timers.callback_allow {
            None => Ok(None),
            Some(rules) => Guard::parse(rules).map(|g| Some(Arc::new(g))),
        }
    }

    /// The skew rule (tuning.md): in a cluster, a backup must not pop while
    /// the replica before it may still call back successfully. The slowest
    /// success is the wait for a connection plus the callback timeout; the
    /// pop's replication to the backup then needs its round trip.
    pub(super) fn check_skew_rule(&self, cluster: &Cluster) -> Result<(), String> {
        let t = &self.timers;
        if cluster.nodes.len() + cluster.leaving.len() < 2 {
            return Ok(());
        }
        let slowest_ms = t.callback_wait_ms + t.callback_timeout_ms + POP_REPLICATION_ALLOWANCE_MS;
        if slowest_ms > t.replica_skew_ms {
            return Err(format!(
                "[timers] replica-skew-ms {} must cover callback-wait-ms {} + callback-timeout-ms {} + {POP_REPLICATION_ALLOWANCE_MS} ms for the pop's replication = {slowest_ms} ms; otherwise a backup pops while the callback before it can still succeed (a duplicate with no failure)",
                t.replica_skew_ms, t.callback_wait_ms, t.callback_timeout_ms
            ));
        }
        Ok(())
    }

    /// The 10-bit instance field of this node's timer IDs. An explicit
    /// `instance_id` that another member derives from the member list
    /// would hand out that member's IDs: refused, naming both.
    pub fn resolve_instance(&self, cluster: &Cluster) -> Result<u16, String> {
        use crate::timer::{instance_field, DEPLOYMENT_ID_MAX, NODE_INSTANCE_MAX};
        let identity = &self.identity;
        if identity.deployment_id > DEPLOYMENT_ID_MAX {
            return Err(format!(
                "[identity] deployment_id must be at most {DEPLOYMENT_ID_MAX}"
            ));
        }
        let instance = match identity.instance_id {
            None => cluster.local_instance(),
            Some(id) if id > NODE_INSTANCE_MAX => {
                return Err(format!(
                    "[identity] instance_id must be at most {NODE_INSTANCE_MAX}"
                ))
            }
            Some(id) => {
                let local = cluster.local_address.as_str();
                let clash = cluster
                    .member_instances()
                    .into_iter()
                    .find(|&(address, derived)| derived == id && address != local);
                if let Some((other, _)) = clash {
                    return Err(format!(
                        "[identity] instance_id {id} of {local} is the instance ID {other} derives from the member list: both would hand out the same timer IDs; choose another, or leave it unset on every node"
                    ));
                }
                id
            }
        };
        Ok(instance_field(identity.deployment_id, instance))
    }
}
