//! The driver: one glommio task per shard ([`NetRing::run`]) that arms,
//! submits, reaps and dispatches in passes, parks on a [`Notify`] when a
//! pass finds nothing (woken by a connection's task or the ring's
//! eventfd), and its two helpers: the eventfd reader and the idle sweep
//! every `SWEEP_PERIOD`. It alone touches the ring.
//!
//! [`Notify`]: crate::runtime::notify::Notify

use super::{split, sweeps, Acceptor, NetRing, OP_ACCEPT, OP_CANCEL, OP_RECV, OP_SEND};
use super::{REAP_BATCH, SWEEP_PERIOD};
use io_uring::cqueue;
use std::cell::Cell;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl NetRing {
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
        crate::runtime::spawn::spawn_local(async move {
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
        crate::runtime::spawn::spawn_local(async move {
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
