//! Accepting: the one multishot `ACCEPT` on the shard's listener, kept
//! armed (re-armed by the next sweep after a failure) and cancelled at
//! shutdown; each accepted socket gets a slot of the slab and goes to the
//! [`Acceptor`], or, when the slab is full, a best-effort `503`.

use super::conn::{ConnShared, RingConn};
use super::{user_data, Acceptor, NetRing, Slot, OP_ACCEPT, OP_CANCEL};
use io_uring::{opcode, types};
use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::rc::Rc;

impl NetRing {
    /// Keep the multishot `ACCEPT` armed, or cancel it once stopping.
    pub(super) fn drive_accept(&self, stopping: bool) {
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

    pub(super) fn accepted<A: Acceptor>(self: &Rc<Self>, acceptor: &A, fd: RawFd) {
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
