//! The one HTTP/1.1 client of a shard: callbacks, replication, and the
//! resync and cross-site traffic to come.
//!
//! Per shard, per target `ip:port`: a pool of keep-alive connections and at
//! most `per_host_max` connection permits (FIFO, `permits.rs`). A single
//! request ([`Client::request`]) waits for a permit within its timeout. A
//! callback ([`Client::callback`]) joins the target's queue; whichever
//! waiting callback gets a permit becomes a lane and sends the queue in
//! pipelined batches sized to the target's answer rate. A pipelined batch
//! ([`Client::pipeline`]) is written in one `write_all` on one pooled
//! connection and answered in order. Every
//! request has a connect timeout and a total timeout. Responses are framed
//! with `httparse` by one reader ([`read_response`]): Content-Length,
//! chunked, or close-delimited bodies, bounded in size.
//!
//! One concern per file: the [`Client`] type, its settings and public
//! surface (here); what a callback and a dead letter say, signed or not
//! (`deliver.rs`); the pools (`pool.rs`); callback lanes (`lane.rs`) and
//! the queued callbacks they send (`job.rs`); single requests and
//! pipelined batches (`request.rs`); permits, connect and TLS
//! (`connect.rs`); the connection itself (`stream.rs`); the DNS cache
//! (`resolve.rs`); response framing and chunked decoding
//! (`response.rs`); the error types (`error.rs`); what is kept for reuse
//! (`spare.rs`).
//!
//! [`read_response`]: response::read_response

mod connect;
mod deliver;
mod error;
mod job;
mod lane;
mod pool;
mod request;
mod resolve;
mod response;
mod spare;
mod stream;

pub use deliver::DeadLetter;
pub use error::RequestError;
pub use job::{CallbackKey, Sent, Wanted};
pub use pool::{HOSTS_MAX, IDLE_PER_HOST_MAX, LANE_BATCH_MAX, QUEUED_PER_HOST_MAX};
pub use resolve::NAMES_MAX;
pub use response::{frame_response, Response, RESPONSE_BODY_MAX, RESPONSE_HEAD_MAX};

use super::guard::Guard;
use super::sign::{self, SigningKeys};
use job::{Job, LaneVecs};
use pool::{HostPool, PoolKey};
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Client {
    timeout: Duration,
    connect_timeout: Duration,
    per_host_max: usize,
    pools: RefCell<HashMap<PoolKey, Rc<HostPool>>>,
    /// For `https://` targets: the shard's own rustls configuration, so
    /// its session store (resumption) is the shard's alone.
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `[cluster] tls`: peers are reached over TLS with this (the
    /// cluster's CA, and this node's client certificate when set).
    peer_tls: Option<Arc<rustls::ClientConfig>>,
    /// Host name → the port it was resolved with, its address, when.
    names: RefCell<HashMap<String, (u16, SocketAddr, Instant)>>,
    spare: RefCell<Vec<Vec<u8>>>,
    /// Queued requests no caller holds, kept for reuse.
    spare_jobs: RefCell<Vec<Rc<Job>>>,
    /// Batch buffers kept for reuse ([`Client::take_batch_buffer`]).
    spare_batch_buffers: RefCell<Vec<Vec<u8>>>,
    /// A lane's batch and its statuses, kept for reuse (emptied).
    spare_batches: RefCell<Vec<LaneVecs>>,
    /// Asked by lanes before a callback is sent.
    wanted: RefCell<Option<Wanted>>,
    /// Told by lanes when a batch of callbacks went on the wire.
    sent: RefCell<Option<Sent>>,
    /// `[timers] callback-allow`: checked on the address a callback is
    /// about to use (`None`: every address).
    guard: RefCell<Option<Arc<Guard>>>,
    /// `[timers] callback-signing-keys` (`None`: callbacks go unsigned).
    signing_keys: RefCell<Option<Arc<SigningKeys>>>,
    /// The signature headers' buffer, signed into again for each request.
    signed: RefCell<sign::Headers>,
}

/// A client's timeouts and bounds.
#[derive(Clone, Copy, Debug)]
pub struct ClientConfig {
    /// Total time for one request, counted from when it is sent.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Connections open at once per target for single requests.
    pub per_host_max: usize,
}

impl Client {
    pub fn new(cfg: ClientConfig) -> Client {
        assert!(cfg.per_host_max > 0, "at least one connection per target");
        Client {
            timeout: cfg.timeout,
            connect_timeout: cfg.connect_timeout.min(cfg.timeout),
            per_host_max: cfg.per_host_max,
            pools: RefCell::new(HashMap::new()),
            names: RefCell::new(HashMap::new()),
            spare: RefCell::new(Vec::new()),
            spare_jobs: RefCell::new(Vec::new()),
            spare_batches: RefCell::new(Vec::new()),
            spare_batch_buffers: RefCell::new(Vec::new()),
            wanted: RefCell::new(None),
            sent: RefCell::new(None),
            tls: None,
            peer_tls: None,
            guard: RefCell::new(None),
            signing_keys: RefCell::new(None),
            signed: RefCell::new(sign::Headers::default()),
        }
    }

    /// Set what lanes tell when callbacks go on the wire.
    pub fn set_sent(&self, sent: Sent) {
        *self.sent.borrow_mut() = Some(sent);
    }

    /// Reach `https://` targets with `tls` (without it they fail, saying so).
    pub fn with_tls(mut self, tls: Option<Arc<rustls::ClientConfig>>) -> Client {
        self.tls = tls;
        self
    }

    /// Reach peers (`pipeline`, `request`) over TLS with `tls`, each
    /// verified for its address (an IP SAN).
    pub fn with_peer_tls(mut self, tls: Option<Arc<rustls::ClientConfig>>) -> Client {
        self.peer_tls = tls;
        self
    }

    /// Set (or clear) the callback guard; a reload calls it again.
    pub fn set_guard(&self, guard: Option<Arc<Guard>>) {
        *self.guard.borrow_mut() = guard;
    }

    /// Set the check lanes make before sending a queued callback.
    pub fn set_wanted(&self, wanted: Wanted) {
        *self.wanted.borrow_mut() = Some(wanted);
    }
}
