//! Receiving: one multishot `RECV` per connection into the provided
//! buffers, each completion copied into the connection's input and its
//! buffer handed straight back; paused (cancelled) while the connection
//! holds `in_bytes_high` unread bytes, re-armed once half of that drains.

use super::buffers::BGID;
use super::conn::ConnShared;
use super::{user_data, NetRing, OP_CANCEL, OP_RECV};
use io_uring::{cqueue, opcode, types};

impl NetRing {
    /// (Re-)arm the connection's multishot `RECV` unless it is closed,
    /// paused above the high mark, or already armed.
    #[inline]
    pub(super) fn arm_input(&self, conn: &ConnShared) {
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

    pub(super) fn cancel_recv(&self, conn: &ConnShared) {
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

    /// A multishot `RECV` completion: copy the data to the connection's
    /// input and hand the buffer back; pause above the high mark.
    pub(super) fn received(&self, index: u32, gen: u32, res: i32, flags: u32) {
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
}
