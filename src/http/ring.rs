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

use crate::runtime::notify::Notify;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::task::{Poll, Waker};
use std::time::Duration;

/// Provided receive buffers per shard (a power of two).
pub const BUFS_COUNT: u16 = 1024;
/// Bytes per provided receive buffer.
pub const BUF_BYTES: usize = 2048;
/// Submission queue entries; the completion queue is four times larger.
const SQ_ENTRIES: u32 = 1024;
/// CQEs reaped into one stack batch before they are dispatched.
const REAP_BATCH: usize = 256;
/// Output a connection may have queued before its writer waits.
pub const OUT_BYTES_HIGH: usize = 256 * 1024;
/// Buffer group id of the provided buffers.
const BGID: u16 = 0;
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

/// The ring of provided receive buffers (the kernel picks one per
/// completion; the driver copies it out and gives it back in the same pass).
struct BufRing {
    /// `BUFS_COUNT` entries, page-aligned (mmap), shared with the kernel.
    entries: *mut types::BufRingEntry,
    /// `BUFS_COUNT * BUF_BYTES` bytes the entries point into.
    memory: *mut u8,
    /// Next tail to publish (entries written up to here).
    tail: Cell<u16>,
}

impl BufRing {
    fn new() -> io::Result<BufRing> {
        let entries_bytes = usize::from(BUFS_COUNT) * std::mem::size_of::<types::BufRingEntry>();
        let memory_bytes = usize::from(BUFS_COUNT) * BUF_BYTES;
        let entries = map_anonymous(entries_bytes)? as *mut types::BufRingEntry;
        let memory = map_anonymous(memory_bytes)?;
        let ring = BufRing {
            entries,
            memory,
            tail: Cell::new(0),
        };
        for bid in 0..BUFS_COUNT {
            ring.give_back(bid);
        }
        ring.publish();
        Ok(ring)
    }

    /// Write buffer `bid` at the tail (visible to the kernel at `publish`).
    fn give_back(&self, bid: u16) {
        assert!(bid < BUFS_COUNT);
        let tail = self.tail.get();
        let slot = usize::from(tail & (BUFS_COUNT - 1));
        // SAFETY: `slot < BUFS_COUNT`, inside the mapping; the kernel reads
        // entries only between head and the published tail, and this slot
        // is past the published tail.
        unsafe {
            let e = &mut *self.entries.add(slot);
            e.set_addr(self.memory.add(usize::from(bid) * BUF_BYTES) as u64);
            e.set_len(BUF_BYTES as u32);
            e.set_bid(bid);
        }
        self.tail.set(tail.wrapping_add(1));
    }

    fn publish(&self) {
        // SAFETY: the tail field lives in the first entry of the mapping and
        // is only ever accessed atomically by the kernel and by us.
        unsafe {
            let tail = types::BufRingEntry::tail(self.entries) as *const AtomicU16;
            (*tail).store(self.tail.get(), Ordering::Release);
        }
    }

    fn buffer(&self, bid: u16, len: usize) -> &[u8] {
        assert!(bid < BUFS_COUNT && len <= BUF_BYTES);
        // SAFETY: in bounds; the kernel finished writing this buffer when it
        // posted the CQE and will not touch it until it is given back.
        unsafe { std::slice::from_raw_parts(self.memory.add(usize::from(bid) * BUF_BYTES), len) }
    }
}

/// An anonymous private read-write mapping of `bytes`. Never unmapped: the
/// kernel tears a closed ring's requests down asynchronously, so the buffer
/// ring and its memory stay mapped until the process exits.
fn map_anonymous(bytes: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh anonymous mapping; checked for failure.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as *mut u8)
}

/// The state a connection's task and the driver share.
pub struct ConnShared {
    fd: RawFd,
    index: u32,
    gen: u32,
    /// Received bytes not yet taken by the task: `input[in_start..]`.
    input: RefCell<Vec<u8>>,
    in_start: Cell<usize>,
    /// Peer closed, the socket failed, or the connection idled out.
    eof: Cell<bool>,
    reader: RefCell<Option<Waker>>,
    /// Queued by the task, not yet handed to the kernel. With `sending`,
    /// at most [`OUT_BYTES_HIGH`] plus one `write_all` (which the server
    /// bounds to about 1 MiB).
    out: RefCell<Vec<u8>>,
    /// Owned by the kernel while `send_inflight`: `sending[sent..]` remains.
    sending: RefCell<Vec<u8>>,
    sent: Cell<usize>,
    send_inflight: Cell<bool>,
    write_failed: Cell<bool>,
    writer: RefCell<Option<Waker>>,
    recv_armed: Cell<bool>,
    /// The RECV was cancelled for backpressure (re-armed when input drains).
    recv_paused: Cell<bool>,
    cancel_inflight: Cell<bool>,
    /// The task is gone: send what is queued, then close.
    task_done: Cell<bool>,
    in_dirty: Cell<bool>,
    /// Sweep count at the last byte received.
    active_sweep: Cell<u32>,
    /// Sweep count when the queued output last made progress (a `SEND`
    /// took bytes) or began waiting (queued with none pending).
    out_sweep: Cell<u32>,
}

impl ConnShared {
    fn ops_inflight(&self) -> bool {
        self.recv_armed.get() || self.send_inflight.get() || self.cancel_inflight.get()
    }
    fn out_pending(&self) -> bool {
        self.send_inflight.get() || !self.out.borrow().is_empty()
    }
    fn wake_reader(&self) {
        if let Some(w) = self.reader.borrow_mut().take() {
            w.wake();
        }
    }
    fn wake_writer(&self) {
        if let Some(w) = self.writer.borrow_mut().take() {
            w.wake();
        }
    }

    /// The peer stopped taking output: shut the socket down, so the
    /// kernel ends its `SEND` and `RECV` (the slot is freed once their CQEs
    /// are reaped), reset it at close, and fail the task's reads and writes.
    fn abort(&self) {
        reset_on_close(self.fd);
        // SAFETY: shutdown on our own, still open fd (closed only at release).
        unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
        self.write_failed.set(true);
        self.eof.set(true);
        self.wake_reader();
        self.wake_writer();
    }
}

/// Make `fd`'s close reset the connection (`SO_LINGER` 0) and drop what the
/// kernel still holds for the peer, rather than keep sending it to a peer
/// that stopped reading.
pub fn reset_on_close(fd: RawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on an open fd with a valid `linger`.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
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
        assert!(connections_max > 0 && connections_max < (1 << 31));
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

    /// Drive the ring until `acceptor` stops and every connection is gone
    /// (or `drain_until` passes once stopping). Also spawns the eventfd
    /// watcher and the idle sweep.
    pub async fn run<A: Acceptor + 'static>(self: Rc<Self>, acceptor: Rc<A>, drain: Duration) {
        let Some(efd) = self.register_eventfd() else {
            return;
        };
        let stop = Rc::new(Cell::new(false));
        let timeouts_ms = (acceptor.idle_timeout_ms(), acceptor.write_timeout_ms());
        self.spawn_helpers(efd, stop.clone(), timeouts_ms);
        let mut stopping_since: Option<std::time::Instant> = None;
        loop {
            if acceptor.stopping() && stopping_since.is_none() {
                stopping_since = Some(std::time::Instant::now());
            }
            // The pass reaps what is there; no eventfd post is needed until
            // it parks (each would be a read completing on glommio's ring).
            self.uring.borrow_mut().completion().disable_eventfd();
            self.drive_accept(stopping_since.is_some());
            self.flush_dirty();
            self.submit_if_needed();
            self.reap(&acceptor);
            if let Some(since) = stopping_since {
                let drained = !acceptor.in_hand() && !self.output_pending();
                if drained || since.elapsed() > drain {
                    break;
                }
            }
            if !self.dirty.borrow().is_empty() {
                // Re-arms and sends the pass itself queued: go round again.
                continue;
            }
            if self.kernel_pending() {
                // Completions or task work the pass left (the kernel runs a
                // bounded batch per enter): let the tasks it woke run, then
                // go round again rather than wait for a post.
                futures_lite::future::yield_now().await;
                continue;
            }
            // Park until a connection task queues output or closes, or the
            // ring posts a CQE (eventfd). Tasks the pass woke run first.
            if stopping_since.is_some() {
                // Shutdown: also re-check the drain at a bounded rate.
                futures_lite::future::or(self.wake.wait(), async {
                    glommio::timer::sleep(Duration::from_millis(5)).await
                })
                .await;
            } else {
                // A safety net, not the wake-up path: if a post were ever
                // missed (the flag-then-eventfd ordering argued in
                // `kernel_pending` holds on x86's locked instructions; a
                // weaker architecture's kernel side is not audited), the
                // driver still looks again within a sweep period.
                let parked = futures_lite::future::or(self.wake.wait(), acceptor.stop_wait());
                futures_lite::future::or(parked, crate::runtime::sleep::sleep(SWEEP_PERIOD)).await;
            }
        }
        stop.set(true);
    }

    /// Turn the eventfd back on, then whether the kernel already holds
    /// completions, or task work that needs an enter, for the driver.
    /// `false` means anything arriving later posts the eventfd: the kernel
    /// raises `IORING_SQ_TASKRUN` before it checks whether the eventfd is
    /// on, and this reads the flag after turning it on (a full fence
    /// between, against the kernel's full barrier between its two).
    fn kernel_pending(&self) -> bool {
        let mut uring = self.uring.borrow_mut();
        uring.completion().enable_eventfd();
        std::sync::atomic::fence(Ordering::SeqCst);
        let task_work = {
            let sq = uring.submission();
            sq.taskrun() || sq.cq_overflow()
        };
        task_work || !uring.completion().is_empty()
    }

    /// An eventfd registered with the ring (it posts on every CQE), or
    /// `None` (logged) if that fails.
    fn register_eventfd(&self) -> Option<RawFd> {
        // SAFETY: plain syscall; a blocking eventfd (io_uring must not see
        // O_NONBLOCK or it returns EAGAIN instead of waiting).
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            tracing::error!(target: "chronos::http", "eventfd: {}", io::Error::last_os_error());
            return None;
        }
        if let Err(e) = self.uring.borrow().submitter().register_eventfd(fd) {
            tracing::error!(target: "chronos::http", "register eventfd: {e}");
            // SAFETY: ours, and not registered.
            unsafe { libc::close(fd) };
            return None;
        }
        Some(fd)
    }

    /// The eventfd reader (wakes the driver on CQEs) and the idle sweep
    /// (`timeouts_ms`: idle, write); both end once `stop` is set.
    fn spawn_helpers(self: &Rc<Self>, efd: RawFd, stop: Rc<Cell<bool>>, timeouts_ms: (u64, u64)) {
        let (ring, stopped) = (self.clone(), stop.clone());
        glommio::spawn_local(async move {
            // SAFETY: `efd` is ours; the file owns and closes it.
            let file = unsafe { glommio::io::BufferedFile::from_raw_fd(efd) };
            while !stopped.get() {
                if let Err(e) = file.read_at(0, 8).await {
                    tracing::error!(target: "chronos::http", "eventfd read: {e}");
                    glommio::timer::sleep(Duration::from_millis(1)).await;
                }
                ring.wake.notify();
            }
        })
        .detach();
        let ring = self.clone();
        glommio::spawn_local(async move {
            // A connection closes after more than `idle_sweeps` whole periods
            // without input (or `write_sweeps` without output progress):
            // never before the timeout, at most two periods after it.
            let (idle_sweeps, write_sweeps) = (sweeps(timeouts_ms.0), sweeps(timeouts_ms.1));
            while !stop.get() {
                glommio::timer::sleep(SWEEP_PERIOD).await;
                ring.idle_sweep(idle_sweeps, write_sweeps);
                if ring.accept_backoff.replace(false) {
                    ring.wake.notify();
                }
            }
        })
        .detach();
    }

    /// Keep the multishot `ACCEPT` armed, or cancel it once stopping.
    fn drive_accept(&self, stopping: bool) {
        if stopping {
            if self.accept_armed.get() && !self.accept_cancelled.replace(true) {
                let queued = self.push(
                    opcode::AsyncCancel::new(user_data(OP_ACCEPT, 0, 0))
                        .build()
                        .user_data(user_data(OP_CANCEL, u32::MAX, 0)),
                );
                // Not queued: try again next pass.
                self.accept_cancelled.set(queued);
            }
        } else if !self.accept_backoff.get() && !self.accept_armed.replace(true) {
            let queued = self.push(
                opcode::AcceptMulti::new(types::Fd(self.listener_fd))
                    .build()
                    .user_data(user_data(OP_ACCEPT, 0, 0)),
            );
            if !queued {
                // Re-armed by the next sweep.
                self.accept_armed.set(false);
                self.accept_backoff.set(true);
            }
        }
    }

    /// One `io_uring_enter` when there is anything to submit (or the kernel
    /// asks for one to run its task work or flush an overflow).
    fn submit_if_needed(&self) {
        let needs_enter = {
            let mut uring = self.uring.borrow_mut();
            let sq = uring.submission();
            !sq.is_empty() || sq.cq_overflow() || sq.taskrun()
        };
        if needs_enter {
            if let Err(e) = self.uring.borrow().submit() {
                // EBUSY/EAGAIN: the CQ is backed up; reaping frees it.
                let code = e.raw_os_error();
                if code != Some(libc::EBUSY) && code != Some(libc::EAGAIN) {
                    tracing::warn!(target: "chronos::http", "io_uring submit: {e}");
                }
            }
        }
    }

    /// Queue the SQEs dirty connections need; close finished ones.
    fn flush_dirty(&self) {
        let mut dirty = std::mem::take(&mut *self.dirty.borrow_mut());
        for &index in &dirty {
            let conn = match self.slots.borrow()[index as usize].conn.clone() {
                Some(c) => c,
                None => continue,
            };
            conn.in_dirty.set(false);
            if !conn.send_inflight.get() && !conn.write_failed.get() {
                self.flush_output(&conn);
            }
            self.arm_input(&conn);
            // Close: the task is gone and its output is out (or cannot go).
            if conn.task_done.get() && (!conn.out_pending() || conn.write_failed.get()) {
                if conn.recv_armed.get() && !conn.cancel_inflight.get() {
                    self.cancel_recv(&conn);
                }
                if !conn.ops_inflight() {
                    self.release(&conn);
                }
            }
        }
        dirty.clear();
        // Keep the allocation (bounded by the slab length).
        let mut d = self.dirty.borrow_mut();
        if d.is_empty() {
            *d = dirty;
        }
    }

    /// Queue one `SEND` of what the connection's task wrote (no send may
    /// be in flight for it).
    #[inline]
    fn flush_output(&self, conn: &ConnShared) {
        debug_assert!(!conn.send_inflight.get());
        let more = {
            let mut out = conn.out.borrow_mut();
            let mut sending = conn.sending.borrow_mut();
            if conn.sent.get() < sending.len() {
                true
            } else if !out.is_empty() {
                sending.clear();
                std::mem::swap(&mut *out, &mut *sending);
                conn.sent.set(0);
                true
            } else {
                false
            }
        };
        if !more {
            return;
        }
        let sending = conn.sending.borrow();
        let rest = &sending[conn.sent.get()..];
        let queued = self.push(
            opcode::Send::new(types::Fd(conn.fd), rest.as_ptr(), rest.len() as u32)
                .flags(libc::MSG_NOSIGNAL)
                .build()
                .user_data(user_data(OP_SEND, conn.index, conn.gen)),
        );
        conn.send_inflight.set(queued);
        if !queued {
            // The connection fails; nothing is in flight for it.
            conn.write_failed.set(true);
            conn.eof.set(true);
            conn.wake_reader();
            conn.wake_writer();
        }
    }

    /// (Re-)arm the connection's multishot `RECV` unless it is closed,
    /// paused above the high mark, or already armed.
    #[inline]
    fn arm_input(&self, conn: &ConnShared) {
        let unread = conn.input.borrow().len() - conn.in_start.get();
        if conn.recv_armed.get()
            || conn.cancel_inflight.get()
            || conn.eof.get()
            || conn.task_done.get()
            || unread >= self.in_bytes_high / 2
        {
            return;
        }
        conn.recv_paused.set(false);
        let queued = self.push(
            opcode::RecvMulti::new(types::Fd(conn.fd), BGID)
                .build()
                .user_data(user_data(OP_RECV, conn.index, conn.gen)),
        );
        conn.recv_armed.set(queued);
        if !queued {
            conn.eof.set(true);
            conn.wake_reader();
        }
    }

    fn cancel_recv(&self, conn: &ConnShared) {
        let queued = self.push(
            opcode::AsyncCancel::new(user_data(OP_RECV, conn.index, conn.gen))
                .build()
                .user_data(user_data(OP_CANCEL, conn.index, conn.gen)),
        );
        conn.cancel_inflight.set(queued);
        if !queued {
            // End the RECV from the socket's side instead: it completes
            // without `MORE` and the connection reads end of stream.
            // SAFETY: shutdown on our own, still open fd.
            unsafe { libc::shutdown(conn.fd, libc::SHUT_RD) };
        }
    }

    /// Close the socket and free the slot (no operation may be in flight).
    fn release(&self, conn: &ConnShared) {
        assert!(!conn.ops_inflight());
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

    /// Reap and dispatch completions; returns how many.
    fn reap<A: Acceptor>(self: &Rc<Self>, acceptor: &Rc<A>) -> usize {
        let mut total = 0;
        // Uninitialised: only the CQEs copied in are read (no 4 KiB memset
        // per pass).
        let mut space = [const { MaybeUninit::<cqueue::Entry>::uninit() }; REAP_BATCH];
        loop {
            let batch = self.uring.borrow_mut().completion().fill(&mut space);
            let n = batch.len();
            for cqe in batch.iter() {
                self.dispatch(&**acceptor, cqe.user_data(), cqe.result(), cqe.flags());
            }
            self.bufs.publish();
            total += n;
            if n < REAP_BATCH {
                return total;
            }
        }
    }

    fn dispatch<A: Acceptor>(self: &Rc<Self>, acceptor: &A, ud: u64, res: i32, flags: u32) {
        let (op, gen, index) = split(ud);
        match op {
            OP_ACCEPT => {
                if !cqueue::more(flags) {
                    self.accept_armed.set(false);
                }
                if res >= 0 {
                    self.accepted(acceptor, res);
                } else if res != -libc::ECANCELED {
                    self.accept_backoff.set(true);
                    tracing::warn!(
                        target: "chronos::http",
                        "accept failed: {}",
                        io::Error::from_raw_os_error(-res)
                    );
                }
            }
            OP_RECV => self.received(index, gen, res, flags),
            OP_SEND => self.sent(index, gen, res),
            OP_CANCEL => {
                if index == u32::MAX {
                    return;
                }
                if let Some(c) = self.conn(index, gen) {
                    c.cancel_inflight.set(false);
                    self.mark_dirty(&c);
                }
            }
            _ => unreachable!("unknown io_uring op {op}"),
        }
    }

    /// A multishot `RECV` completion: copy the data to the connection's
    /// input and hand the buffer back; pause above the high mark.
    fn received(&self, index: u32, gen: u32, res: i32, flags: u32) {
        let bid = cqueue::buffer_select(flags);
        let conn = self.conn(index, gen);
        if let (Some(bid), true) = (bid, res > 0) {
            if let Some(c) = &conn {
                let data = self.bufs.buffer(bid, res as usize);
                c.input.borrow_mut().extend_from_slice(data);
                c.active_sweep.set(self.sweep.get());
            }
        }
        if let Some(bid) = bid {
            self.bufs.give_back(bid);
        }
        let Some(c) = conn else { return };
        if !cqueue::more(flags) {
            c.recv_armed.set(false);
            if res == 0 || (res < 0 && res != -libc::ENOBUFS && res != -libc::ECANCELED) {
                c.eof.set(true);
            }
            // ENOBUFS, a pause, or a kernel that ended the multishot:
            // the dirty pass re-arms if still wanted.
            self.mark_dirty(&c);
        } else if c.input.borrow().len() - c.in_start.get() >= self.in_bytes_high
            && !c.cancel_inflight.get()
        {
            c.recv_paused.set(true);
            self.cancel_recv(&c);
        }
        c.wake_reader();
    }

    /// A `SEND` completion.
    fn sent(&self, index: u32, gen: u32, res: i32) {
        let Some(c) = self.conn(index, gen) else {
            return;
        };
        c.send_inflight.set(false);
        if res < 0 {
            c.write_failed.set(true);
            c.eof.set(true);
            c.wake_reader();
        } else {
            c.sent.set(c.sent.get() + res as usize);
            if res > 0 {
                c.out_sweep.set(self.sweep.get());
            }
        }
        c.wake_writer();
        let more = c.sent.get() < c.sending.borrow().len() || !c.out.borrow().is_empty();
        if more || c.write_failed.get() || c.task_done.get() {
            self.mark_dirty(&c);
        }
    }

    fn accepted<A: Acceptor>(self: &Rc<Self>, acceptor: &A, fd: RawFd) {
        let one: libc::c_int = 1;
        // SAFETY: setsockopt on our own fd with a valid int.
        unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                &one as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        let index = {
            let mut slots = self.slots.borrow_mut();
            match self.free.borrow_mut().pop() {
                Some(i) => i,
                None if slots.len() < self.slots_max => {
                    slots.push(Slot { gen: 0, conn: None });
                    (slots.len() - 1) as u32
                }
                None => {
                    // The slab is full: the acceptor's bound is larger than
                    // ours; refuse like the server would.
                    refuse(fd);
                    return;
                }
            }
        };
        let gen = self.slots.borrow()[index as usize].gen;
        let conn = Rc::new(ConnShared {
            fd,
            index,
            gen,
            input: RefCell::new(Vec::new()),
            in_start: Cell::new(0),
            eof: Cell::new(false),
            reader: RefCell::new(None),
            out: RefCell::new(Vec::new()),
            sending: RefCell::new(Vec::new()),
            sent: Cell::new(0),
            send_inflight: Cell::new(false),
            write_failed: Cell::new(false),
            writer: RefCell::new(None),
            recv_armed: Cell::new(false),
            recv_paused: Cell::new(false),
            cancel_inflight: Cell::new(false),
            task_done: Cell::new(false),
            in_dirty: Cell::new(false),
            active_sweep: Cell::new(self.sweep.get()),
            out_sweep: Cell::new(self.sweep.get()),
        });
        self.slots.borrow_mut()[index as usize].conn = Some(conn.clone());
        self.mark_dirty(&conn);
        acceptor.accept(RingConn {
            shared: conn,
            ring: Rc::downgrade(self),
        });
    }

    /// Close connections idle for more than `idle_sweeps` sweeps (wake
    /// their readers at end of stream), and abort those whose output made
    /// no progress for more than `write_sweeps`.
    fn idle_sweep(&self, idle_sweeps: u32, write_sweeps: u32) {
        let now = self.sweep.get().wrapping_add(1);
        self.sweep.set(now);
        for slot in self.slots.borrow().iter() {
            if let Some(c) = &slot.conn {
                if c.out_pending()
                    && !c.write_failed.get()
                    && now.wrapping_sub(c.out_sweep.get()) > write_sweeps
                {
                    c.abort();
                    self.kick(c);
                } else if !c.task_done.get()
                    && !c.eof.get()
                    && now.wrapping_sub(c.active_sweep.get()) > idle_sweeps
                    && c.input.borrow().len() == c.in_start.get()
                {
                    c.eof.set(true);
                    c.wake_reader();
                }
            }
        }
    }
}

/// Whole sweep periods in `timeout_ms` (at least one).
fn sweeps(timeout_ms: u64) -> u32 {
    let period_ms = SWEEP_PERIOD.as_millis() as u64;
    u32::try_from(timeout_ms.div_ceil(period_ms).max(1)).unwrap_or(u32::MAX)
}

/// Refuse a connection the slab cannot hold: a best-effort `503`, then close.
fn refuse(fd: RawFd) {
    let mut out = Vec::new();
    crate::http::write_response(&mut out, 503, &[], b"too many connections", true);
    // SAFETY: our own fd and buffer; non-blocking best effort.
    unsafe {
        libc::send(
            fd,
            out.as_ptr() as *const libc::c_void,
            out.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        );
        libc::close(fd);
    }
}

/// A connection's task's end: read what arrived, queue what to send.
/// Dropping it closes the connection once its output is sent.
pub struct RingConn {
    shared: Rc<ConnShared>,
    ring: std::rc::Weak<NetRing>,
}

impl RingConn {
    /// The peer's IP address (`getpeername`), if the socket still has one.
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        peer_ip_of(self.shared.fd)
    }

    /// Reset the connection when it closes (see [`reset_on_close`]).
    pub fn reset_on_close(&self) {
        reset_on_close(self.shared.fd);
    }

    /// Read into `buf`: `Ok(0)` at end of stream (or idle timeout).
    pub fn read<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + 'a {
        poll_fn(move |cx| {
            let c = &*self.shared;
            let mut input = c.input.borrow_mut();
            let start = c.in_start.get();
            let unread = input.len() - start;
            if unread > 0 {
                let n = unread.min(buf.len());
                buf[..n].copy_from_slice(&input[start..start + n]);
                if start + n == input.len() {
                    input.clear();
                    c.in_start.set(0);
                } else {
                    c.in_start.set(start + n);
                }
                drop(input);
                if c.recv_paused.get() {
                    if let Some(ring) = self.ring.upgrade() {
                        ring.kick(c);
                    }
                }
                return Poll::Ready(Ok(n));
            }
            if c.eof.get() {
                return Poll::Ready(Ok(0));
            }
            *c.reader.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
    }

    /// Queue `data`; waits while more than [`OUT_BYTES_HIGH`] is queued.
    /// So a connection holds at most that plus one `data` (which the caller
    /// bounds); an error once the write timeout aborted the connection.
    pub async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.enqueue(|out| out.extend_from_slice(data))?;
        self.until_room().await
    }

    /// As [`RingConn::write_all`], and leave `data` empty: when nothing is
    /// queued, the connection takes the buffer itself (a swap, no copy) and
    /// hands back its own empty one.
    pub async fn write_buf(&mut self, data: &mut Vec<u8>) -> io::Result<()> {
        let queued = self.enqueue(|out| {
            if out.is_empty() {
                std::mem::swap(out, data);
            } else {
                out.extend_from_slice(data);
            }
        });
        data.clear();
        queued?;
        self.until_room().await
    }

    /// Put bytes on the output queue with `fill` and wake the driver.
    fn enqueue(&mut self, fill: impl FnOnce(&mut Vec<u8>)) -> io::Result<()> {
        let c = &*self.shared;
        if c.write_failed.get() {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let ring = self.ring.upgrade();
        if let (false, Some(ring)) = (c.out_pending(), &ring) {
            // The write timeout counts from now, not from the last send.
            c.out_sweep.set(ring.sweep.get());
        }
        fill(&mut c.out.borrow_mut());
        if let Some(ring) = ring {
            ring.kick(c);
        }
        Ok(())
    }

    /// Wait while more than [`OUT_BYTES_HIGH`] is queued.
    async fn until_room(&self) -> io::Result<()> {
        let c = &*self.shared;
        poll_fn(|cx| {
            if c.write_failed.get() {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            let queued = c.out.borrow().len() + c.sending.borrow().len() - c.sent.get();
            if queued <= OUT_BYTES_HIGH {
                return Poll::Ready(Ok(()));
            }
            *c.writer.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

impl Drop for RingConn {
    fn drop(&mut self) {
        self.shared.task_done.set(true);
        if let Some(ring) = self.ring.upgrade() {
            ring.kick(&self.shared);
        }
    }
}

/// The IP address of a connected socket's peer.
pub fn peer_ip_of(fd: RawFd) -> Option<std::net::IpAddr> {
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `storage` is large enough for any address and `len` says so.
    let rc =
        unsafe { libc::getpeername(fd, &mut storage as *mut _ as *mut libc::sockaddr, &mut len) };
    if rc != 0 {
        return None;
    }
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says it is a `sockaddr_in`.
            let a = unsafe { &*(&storage as *const _ as *const libc::sockaddr_in) };
            Some(std::net::IpAddr::from(
                u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a `sockaddr_in6`.
            let a = unsafe { &*(&storage as *const _ as *const libc::sockaddr_in6) };
            Some(std::net::IpAddr::from(a.sin6_addr.s6_addr))
        }
        _ => None,
    }
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
