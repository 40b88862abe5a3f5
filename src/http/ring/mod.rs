//! The per-shard network ring: the HTTP server's sockets driven by an
//! io_uring of the shard's own, beside glommio's.
//!
//! Why: glommio reads a socket by trying `recv` and, when that would block,
//! submitting one `POLL_ADD` per read; every time the shard runs out of work
//! it flushes three rings and issues a process-wide `membarrier`. Under a
//! keep-alive load that is ~3.3 `io_uring_enter` per request on top of a
//! `recv` and a `send` (perf/README.md, "HTTP"). Here a connection costs no
//! syscall per request in steady state:
//!
//! - one multishot `ACCEPT` on the shard's `SO_REUSEPORT` listener;
//! - one multishot `RECV` per connection, into a ring of provided buffers
//!   ([`BUFS_COUNT`] × [`BUF_BYTES`] per shard), copied into the
//!   connection's input and handed straight back to the kernel;
//! - one `SEND` per connection in flight at a time, carrying everything the
//!   connection's task wrote since the last one;
//! - all SQEs of a driver pass go to the kernel in one `io_uring_enter`,
//!   which also runs the completions the kernel deferred to it
//!   (`DEFER_TASKRUN`, [`build_ring`]).
//!
//! The driver ([`NetRing::run`]) is one glommio task per shard. It never
//! blocks the thread: when a pass reaps nothing, has nothing to submit and
//! the kernel holds nothing more for it, it parks on a [`Notify`], woken
//! either by a connection task that queued output or closed, or by the
//! ring's eventfd (registered with the ring, read through glommio, so the
//! executor sleeps in its own `io_uring_enter`; turned off while a pass
//! runs, so it posts only to a parked driver).
//!
//! Bounds: connections per shard (`[http] connections-max`, the slab
//! length); input held per connection ([`NetRing::in_bytes_high`]: beyond it
//! the connection's `RECV` is cancelled until its task catches up); output
//! queued per connection ([`OUT_BYTES_HIGH`]: beyond it the writer waits;
//! the caller bounds each write, the server to about 1 MiB); the time queued
//! output may make no progress (the acceptor's write timeout: the idle
//! sweep then shuts the socket down, which ends its `SEND` and `RECV`, so
//! the slot is freed even if the peer never reads again); CQEs handled per
//! pass ([`REAP_BATCH`]); submits tried to make room for an SQE
//! ([`PUSH_ATTEMPTS_MAX`], after which that operation fails and its
//! connection ends).
//!
//! Invariants: a connection's slot (and so its buffers, which the kernel may
//! be reading or writing) is freed only when it has no operation in flight;
//! CQEs carry the slot's generation, so a late CQE never reaches a reused
//! slot; the driver is the only code that touches the ring.
//!
//! One concern per file: the ring, its slab and its SQE queue (here); the
//! provided-buffer ring, the one unsafe memory handling (`buffers.rs`); a
//! connection's shared state and its task's end (`conn.rs`); the driver's
//! passes, its eventfd and idle sweep (`driver.rs`); accepting
//! (`accept.rs`), receiving (`receive.rs`) and sending (`send.rs`).

mod accept;
mod buffers;
mod conn;
mod driver;
mod receive;
mod send;

pub use buffers::{BUFS_COUNT, BUF_BYTES};
pub use conn::{peer_ip_of, reset_on_close, ConnShared, RingConn, OUT_BYTES_HIGH};

use crate::runtime::notify::Notify;
use buffers::{BufRing, BGID};
use io_uring::{opcode, squeue, IoUring};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::Duration;

/// Submission queue entries; the completion queue is four times larger.
const SQ_ENTRIES: u32 = 1024;
/// CQEs reaped into one stack batch before they are dispatched.
const REAP_BATCH: usize = 256;

/// How often idle connections are looked for.
const SWEEP_PERIOD: Duration = Duration::from_millis(500);
/// Submits tried to make room for one SQE before its operation fails (one
/// normally suffices: the kernel consumes the whole queue).
const PUSH_ATTEMPTS_MAX: usize = 4;

// user_data: op in the top byte, slot generation in the next 24 bits, slot
// index in the low 32.
const OP_ACCEPT: u64 = 1;
const OP_RECV: u64 = 2;
const OP_SEND: u64 = 3;
const OP_CANCEL: u64 = 4;
const GEN_MASK: u32 = (1 << 24) - 1;

fn user_data(op: u64, index: u32, gen: u32) -> u64 {
    (op << 56) | (u64::from(gen & GEN_MASK) << 32) | u64::from(index)
}

fn split(ud: u64) -> (u64, u32, u32) {
    (ud >> 56, ((ud >> 32) as u32) & GEN_MASK, ud as u32)
}

struct Slot {
    gen: u32,
    conn: Option<Rc<ConnShared>>,
}

/// The ring, with the cheapest completion mode the kernel has: deferred
/// task work and no SQ index array (Linux 6.6+), else deferred task work
/// alone (6.1+), else cooperative task work (5.19+).
///
/// All keep completions from interrupting the shard (no IPI while it runs
/// user code) and raise `IORING_SQ_TASKRUN` when an enter is needed to run
/// them. With `DEFER_TASKRUN` the kernel queues them on the ring itself and
/// runs them only when the driver enters with `GETEVENTS` (which
/// `submit` does whenever that flag is up), in one batch per enter, instead
/// of at whichever kernel entry the thread makes next (glommio's own
/// rings' included), one task-work list walk each. The eventfd still posts
/// when the first one is queued, so a parked driver wakes; the kernel runs a
/// bounded number per enter and keeps the rest without a new post, which
/// is why the driver looks at the flag before it parks
/// ([`NetRing::kernel_pending`]).
fn build_ring() -> io::Result<IoUring> {
    let modes: [(bool, bool); 3] = [(true, true), (true, false), (false, false)];
    let mut last = None;
    for (defer, no_sqarray) in modes {
        let mut b = IoUring::builder();
        b.setup_cqsize(SQ_ENTRIES * 4)
            .setup_single_issuer()
            .setup_coop_taskrun()
            .setup_taskrun_flag();
        if defer {
            b.setup_defer_taskrun();
        }
        if no_sqarray {
            b.setup_no_sqarray();
        }
        match b.build(SQ_ENTRIES) {
            Ok(ring) => return Ok(ring),
            // An older kernel refuses a flag it does not know.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::ErrorKind::Unsupported.into()))
}

/// What the driver asks of the server.
pub trait Acceptor {
    /// A new connection; dropping `conn` closes it once its output is sent.
    fn accept(&self, conn: RingConn);
    /// The server is shutting down: stop accepting, drain, return.
    fn stopping(&self) -> bool;
    /// Requests are being handled right now (shutdown waits for them).
    fn in_hand(&self) -> bool;
    /// Resolves when shutdown begins (wakes a parked driver).
    fn stop_wait(&self) -> impl Future<Output = ()> + '_;
    /// Idle keep-alive connections are closed after this many ms.
    fn idle_timeout_ms(&self) -> u64;
    /// A connection whose queued output makes no progress for this many ms
    /// is shut down (its peer stopped reading).
    fn write_timeout_ms(&self) -> u64;
}

/// One shard's network ring. See the module doc.
pub struct NetRing {
    // The ring closes first; the buffer mappings are never unmapped.
    uring: RefCell<IoUring>,
    bufs: BufRing,
    slots: RefCell<Vec<Slot>>,
    /// The slab's length bound.
    slots_max: usize,
    free: RefCell<Vec<u32>>,
    /// Connections with something for the driver to do (each at most once).
    dirty: RefCell<Vec<u32>>,
    wake: Notify,
    listener_fd: RawFd,
    accept_armed: Cell<bool>,
    accept_cancelled: Cell<bool>,
    /// Accept failed (EMFILE, ...): re-armed by the next sweep, not at once.
    accept_backoff: Cell<bool>,
    /// Incremented every [`SWEEP_PERIOD`].
    sweep: Cell<u32>,
    in_bytes_high: usize,
}

impl NetRing {
    /// Set up the ring for `listener_fd` (kept open by the caller for the
    /// ring's lifetime), with at most `connections_max` connections each
    /// holding at most `in_bytes_high` unread input bytes.
    pub fn new(
        listener_fd: RawFd,
        connections_max: usize,
        in_bytes_high: usize,
    ) -> io::Result<Rc<NetRing>> {
        assert!(
            connections_max > 0 && connections_max < (1 << 31),
            "the connection bound fits the ring's user data"
        );
        let uring = build_ring()?;
        let bufs = BufRing::new()?;
        // SAFETY: the entry ring stays mapped for the ring's lifetime (it is
        // never unmapped, see `map_anonymous`).
        unsafe {
            uring.submitter().register_buf_ring_with_flags(
                bufs.entries as u64,
                BUFS_COUNT,
                BGID,
                0,
            )?;
        }
        // Probe multishot RECV support up front: kernels before 6.0 lack it.
        let mut probe = io_uring::Probe::new();
        uring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::RecvMulti::CODE)
            || !probe.is_supported(opcode::AcceptMulti::CODE)
        {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring lacks RECV/ACCEPT",
            ));
        }
        Ok(Rc::new(NetRing {
            uring: RefCell::new(uring),
            bufs,
            slots: RefCell::new(Vec::with_capacity(connections_max)),
            slots_max: connections_max,
            free: RefCell::new(Vec::new()),
            dirty: RefCell::new(Vec::with_capacity(connections_max)),
            wake: Notify::default(),
            listener_fd,
            accept_armed: Cell::new(false),
            accept_cancelled: Cell::new(false),
            accept_backoff: Cell::new(false),
            sweep: Cell::new(0),
            in_bytes_high,
        }))
    }

    /// Any connection with a `SEND` in flight, or output it can still send.
    pub fn output_pending(&self) -> bool {
        self.slots
            .borrow()
            .iter()
            .filter_map(|s| s.conn.as_ref())
            .any(|c| c.send_inflight.get() || (c.out_pending() && !c.write_failed.get()))
    }

    /// Queue an SQE. `false` if the queue stayed full after
    /// [`PUSH_ATTEMPTS_MAX`] submits: the caller fails the operation.
    #[must_use]
    fn push(&self, entry: squeue::Entry) -> bool {
        let mut uring = self.uring.borrow_mut();
        for _ in 0..PUSH_ATTEMPTS_MAX {
            // SAFETY: every buffer an entry points at is owned by a slot
            // that is not freed while the operation is in flight.
            if unsafe { uring.submission().push(&entry) }.is_ok() {
                return true;
            }
            // Full: hand what is queued to the kernel and retry.
            if let Err(e) = uring.submit() {
                tracing::warn!(target: "chronos::http", "io_uring submit: {e}");
            }
        }
        tracing::warn!(target: "chronos::http", "io_uring submission queue stays full");
        false
    }

    /// Queue `conn` for the driver's next pass (from the driver itself).
    fn mark_dirty(&self, conn: &ConnShared) {
        if !conn.in_dirty.replace(true) {
            self.dirty.borrow_mut().push(conn.index);
        }
    }

    /// Queue `conn` and wake the driver (from a connection's task).
    fn kick(&self, conn: &ConnShared) {
        self.mark_dirty(conn);
        self.wake.notify();
    }

    /// Close the socket and free the slot (no operation may be in flight).
    fn release(&self, conn: &ConnShared) {
        assert!(
            !conn.ops_inflight(),
            "a connection is freed only with no operation in flight"
        );
        let mut slots = self.slots.borrow_mut();
        let slot = &mut slots[conn.index as usize];
        if slot.conn.is_none() || slot.gen != conn.gen {
            return;
        }
        slot.conn = None;
        slot.gen = (slot.gen + 1) & GEN_MASK;
        self.free.borrow_mut().push(conn.index);
        // SAFETY: the fd is ours and nothing in flight refers to it.
        unsafe { libc::close(conn.fd) };
    }

    fn conn(&self, index: u32, gen: u32) -> Option<Rc<ConnShared>> {
        let slots = self.slots.borrow();
        let slot = slots.get(index as usize)?;
        if slot.gen != gen {
            return None;
        }
        slot.conn.clone()
    }
}

/// Whole sweep periods in `timeout_ms` (at least one).
fn sweeps(timeout_ms: u64) -> u32 {
    let period_ms = SWEEP_PERIOD.as_millis() as u64;
    u32::try_from(timeout_ms.div_ceil(period_ms).max(1)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips() {
        for &(op, index, gen) in &[
            (OP_ACCEPT, 0, 0),
            (OP_RECV, 8191, GEN_MASK),
            (OP_SEND, u32::MAX - 1, 12345),
            (OP_CANCEL, u32::MAX, 0),
        ] {
            assert_eq!(split(user_data(op, index, gen)), (op, gen, index));
        }
    }
}
