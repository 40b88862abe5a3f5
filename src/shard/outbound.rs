//! What a shard sends out: the HTTP client (callbacks, and through the
//! replicators replication), the replicator to this site's nodes, the one
//! to the remote sites (GR), and the callback guard a reload replaces.
//! Built once at start; a reload changes the peers and the guard, not the
//! queues.

use crate::cluster::replicate::{Replicator, ReplicatorConfig};
use crate::cluster::Cluster;
use crate::config::Resolved;
use crate::http::client::{Client, ClientConfig};
use crate::http::guard::Guard;
use crate::http::tls;
use crate::runtime::gate::Gate;
use crate::stats::ShardStats;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// The client, the replicators and the guard.
pub struct Outbound {
    /// The HTTP client: callbacks, and (through the replicator) replication.
    pub client: Rc<Client>,
    pub replicator: Replicator,
    /// Cross-site (GR) replication: one queue per remote site.
    pub sites_out: Replicator,
    /// `[timers] callback-allow` (a reload replaces it); `None`: callbacks
    /// may go anywhere.
    guard: RefCell<Option<Arc<Guard>>>,
}

impl Outbound {
    pub(super) fn new(
        resolved: &Resolved,
        gate: &Rc<Gate>,
        stats: &Arc<[ShardStats]>,
        id: usize,
    ) -> Outbound {
        let timers = &resolved.config.timers;
        let client = Rc::new(
            Client::new(ClientConfig {
                timeout: Duration::from_millis(timers.callback_timeout_ms),
                connect_timeout: Duration::from_millis(timers.callback_connect_timeout_ms),
                per_host_max: timers.callback_connections_per_host_max,
            })
            .with_tls(resolved.callback_tls.as_ref().map(tls::for_shard))
            .with_peer_tls(resolved.peer_tls.as_ref().map(tls::for_shard)),
        );
        let c = &resolved.config.cluster;
        let replicator = Replicator::new(
            &replication_peers(&resolved.cluster),
            ReplicatorConfig {
                queue_max: c.replication_queue_max,
                queue_bytes_max: c.replication_queue_bytes_max,
                deliver_within: Duration::from_millis(c.replication_deliver_within_ms),
                timeout: Duration::from_millis(c.replication_timeout_ms),
                sites: false,
                authorization: authorization(resolved),
            },
            client.clone(),
            gate.clone(),
            stats.clone(),
            id,
        );
        let sites_out = sites_replicator(resolved, &client, gate, stats, id);
        Outbound {
            client,
            replicator,
            sites_out,
            guard: RefCell::new(None),
        }
    }

    /// A new cluster view's peers for the replicator (a reload).
    pub(super) fn set_peers(&self, cluster: &Cluster) {
        self.replicator.set_peers(&replication_peers(cluster));
    }

    /// Take a callback guard (at start, and at each reload): checked when
    /// a client creates or updates a timer, and by the client on the
    /// address each callback is about to use.
    pub fn set_guard(&self, guard: Option<Arc<Guard>>) {
        self.client.set_guard(guard.clone());
        *self.guard.borrow_mut() = guard;
    }

    /// The callback guard now (`None`: none configured).
    pub fn guard(&self) -> Option<Arc<Guard>> {
        self.guard.borrow().clone()
    }
}

/// The `Authorization` value internal requests carry: made once per
/// process and kept for its life (replicators hold it as `&'static`).
pub fn authorization(resolved: &Resolved) -> Option<&'static str> {
    static VALUE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let secret = resolved.config.cluster.shared_secret.as_ref();
    VALUE.get_or_init(|| secret.map(|s| s.bearer())).as_deref()
}

/// `GET path` of another node of this cluster with `client`, carrying the
/// shared secret (if any) and `extra` headers: the hand-off's and the
/// look-up's one question to a peer.
pub async fn get_from_peer(
    client: &Client,
    resolved: &Resolved,
    node: &crate::cluster::Node,
    path: &str,
    extra: &[(&str, &[u8])],
) -> Result<crate::http::client::Response, String> {
    let mut headers: Vec<(&str, &[u8])> = extra.to_vec();
    if let Some(value) = authorization(resolved) {
        headers.push(("Authorization", value.as_bytes()));
    }
    let host = node.socket.ip().to_string();
    let port = node.socket.port();
    let address = &node.address;
    client
        .request(&host, port, address, "GET", path, &headers, b"", true)
        .await
}

/// A shard's replicator to the remote sites (GR): a queue per site, with
/// the sites' own timeout.
fn sites_replicator(
    resolved: &Resolved,
    client: &Rc<Client>,
    gate: &Rc<Gate>,
    stats: &Arc<[ShardStats]>,
    id: usize,
) -> Replicator {
    let c = &resolved.config.cluster;
    let site_peers: Vec<(String, std::net::SocketAddr)> = resolved
        .sites
        .remote
        .iter()
        .map(|r| (r.address.clone(), r.socket))
        .collect();
    Replicator::new(
        &site_peers,
        ReplicatorConfig {
            queue_max: c.replication_queue_max,
            queue_bytes_max: c.replication_queue_bytes_max,
            deliver_within: Duration::from_millis(resolved.config.sites.site_deliver_within_ms),
            timeout: Duration::from_millis(resolved.config.sites.site_timeout_ms),
            sites: true,
            authorization: authorization(resolved),
        },
        client.clone(),
        gate.clone(),
        stats.clone(),
        id,
    )
}

/// Every node's `(address, socket)` in the cluster's peer order: the
/// replicator's peer list.
fn replication_peers(cluster: &Cluster) -> Vec<(String, std::net::SocketAddr)> {
    cluster
        .all_nodes()
        .map(|n| (n.address.clone(), n.socket))
        .collect()
}
