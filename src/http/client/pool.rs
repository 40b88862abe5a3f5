//! The pools: per target (an address, and for `https://` the server name
//! verified), the idle keep-alive connections, the connection permits,
//! the callbacks queued for lanes and the target's batch size, and when
//! it last failed. Bounds: [`IDLE_PER_HOST_MAX`] idle connections and
//! [`QUEUED_PER_HOST_MAX`] waiting requests to a failing target per pool,
//! [`HOSTS_MAX`] pools (beyond it, the ones nobody uses are dropped).

use super::job::Job;
use super::stream::Stream;
use super::Client;
use crate::http::permits::Permits;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Idle connections kept per target.
pub const IDLE_PER_HOST_MAX: usize = 64;
/// Requests waiting for a connection to a failing target; beyond it they fail at once.
pub const QUEUED_PER_HOST_MAX: usize = 1024;
/// How long after a failure a target counts as failing.
const FAILING_FOR: Duration = Duration::from_secs(2);
/// Targets with a pool; beyond it, pools with no busy connection are dropped.
pub const HOSTS_MAX: usize = 4096;

/// Requests per pipelined callback batch.
pub const LANE_BATCH_MAX: usize = 256;
/// Requests in the first batch to a target, before its speed is known.
const LANE_BATCH_FIRST: usize = 4;

/// What a pool is for: an address, and for `https://` the server name its
/// certificate is verified for (the URI's host), so that two names on one
/// address never share a connection. A plain key allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct PoolKey {
    pub(super) addr: SocketAddr,
    pub(super) tls: Option<Box<str>>,
    /// A peer (replication, resync, another site): TLS with the cluster's
    /// configuration, not the callbacks'.
    pub(super) peer: bool,
}

pub(super) struct HostPool {
    pub(super) idle: RefCell<Vec<Stream>>,
    /// Requests waiting for a lane (callbacks), oldest first; entries a
    /// lane took out of order or whose caller withdrew them stay until
    /// they reach the front (every lane drops those first).
    pub(super) jobs: RefCell<VecDeque<Rc<Job>>>,
    /// Jobs in `jobs` neither taken nor withdrawn.
    pub(super) queued: Cell<usize>,
    /// Requests per pipelined batch to this target (adapted per batch).
    pub(super) batch_limit: Cell<usize>,
    pub(super) permits: Permits,
    /// Requests waiting for a connection permit.
    pub(super) waiting: Cell<usize>,
    /// When a request to this target last failed (cleared by a success).
    pub(super) failed_at: Cell<Option<Instant>>,
}

impl HostPool {
    /// `job` leaves the waiting state (taken or withdrawn): counted once.
    pub(super) fn settle(&self, job: &Job) {
        if !job.taken.get() && !job.withdrawn.get() {
            assert!(self.queued.get() > 0, "a waiting job is counted");
            self.queued.set(self.queued.get() - 1);
        }
    }

    /// A target that has just failed takes at most `QUEUED_PER_HOST_MAX`
    /// waiting requests (`queued` now): beyond it they fail at once, so a
    /// dead target cannot hold every in-flight slot.
    pub(super) fn admit_waiter(&self, addr: SocketAddr, queued: usize) -> Result<(), String> {
        let failing = self
            .failed_at
            .get()
            .is_some_and(|t| t.elapsed() < FAILING_FOR);
        if failing && queued >= QUEUED_PER_HOST_MAX {
            return Err(format!(
                "{addr} is failing and {QUEUED_PER_HOST_MAX} requests already wait for it"
            ));
        }
        Ok(())
    }

    /// Keep a connection that can be reused (up to `IDLE_PER_HOST_MAX`).
    pub(super) fn give_back(&self, stream: Stream) {
        let mut idle = self.idle.borrow_mut();
        if idle.len() < IDLE_PER_HOST_MAX {
            idle.push(stream);
        }
    }
}

impl Client {
    /// The pool key of peer `addr`: TLS (its IP as the server name) with
    /// `[cluster] tls`.
    pub(super) fn peer_key(&self, addr: SocketAddr) -> PoolKey {
        PoolKey {
            addr,
            tls: self
                .peer_tls
                .is_some()
                .then(|| addr.ip().to_string().into()),
            peer: true,
        }
    }

    pub(super) fn pool(&self, key: &PoolKey) -> Rc<HostPool> {
        let mut pools = self.pools.borrow_mut();
        if let Some(p) = pools.get(key) {
            return p.clone();
        }
        if pools.len() >= HOSTS_MAX {
            // Drop pools nobody is using (their idle connections close).
            pools.retain(|_, p| Rc::strong_count(p) > 1);
        }
        let pool = Rc::new(HostPool {
            idle: RefCell::new(Vec::new()),
            permits: Permits::new(self.per_host_max),
            jobs: RefCell::new(VecDeque::new()),
            queued: Cell::new(0),
            batch_limit: Cell::new(LANE_BATCH_FIRST),
            waiting: Cell::new(0),
            failed_at: Cell::new(None),
        });
        pools.insert(key.clone(), pool.clone());
        pool
    }
}
