//! Sending: at most one `SEND` in flight per connection, carrying
//! everything its task queued since the last one; a short send is
//! continued from where it stopped.

use super::conn::ConnShared;
use super::{user_data, NetRing, OP_SEND};
use io_uring::{opcode, types};

impl NetRing {
    /// Queue one `SEND` of what the connection's task wrote (no send may
    /// be in flight for it).
    #[inline]
    pub(super) fn flush_output(&self, conn: &ConnShared) {
        debug_assert!(
            !conn.send_inflight.get(),
            "one send in flight per connection"
        );
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

    /// A `SEND` completion.
    pub(super) fn sent(&self, index: u32, gen: u32, res: i32) {
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
}
