//! One connection on the ring: the state its task and the driver share
//! ([`ConnShared`]: input received, output queued and in flight, wakers,
//! what is armed) and the task's end of it ([`RingConn`]: read what
//! arrived, queue what to send, wait while more than [`OUT_BYTES_HIGH`]
//! is queued). The task never touches the ring; it marks the connection
//! for the driver and wakes it. Also the socket options both drivers use
//! ([`reset_on_close`], [`peer_ip_of`]).

use super::NetRing;
use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// Output a connection may have queued before its writer waits.
pub const OUT_BYTES_HIGH: usize = 256 * 1024;

/// The state a connection's task and the driver share.
pub struct ConnShared {
    pub(super) fd: RawFd,
    pub(super) index: u32,
    pub(super) gen: u32,
    /// Received bytes not yet taken by the task: `input[in_start..]`.
    pub(super) input: RefCell<Vec<u8>>,
    pub(super) in_start: Cell<usize>,
    /// Peer closed, the socket failed, or the connection idled out.
    pub(super) eof: Cell<bool>,
    pub(super) reader: RefCell<Option<Waker>>,
    /// Queued by the task, not yet handed to the kernel. With `sending`,
    /// at most [`OUT_BYTES_HIGH`] plus one `write_all` (which the server
    /// bounds to about 1 MiB).
    pub(super) out: RefCell<Vec<u8>>,
    /// Owned by the kernel while `send_inflight`: `sending[sent..]` remains.
    pub(super) sending: RefCell<Vec<u8>>,
    pub(super) sent: Cell<usize>,
    pub(super) send_inflight: Cell<bool>,
    pub(super) write_failed: Cell<bool>,
    pub(super) writer: RefCell<Option<Waker>>,
    pub(super) recv_armed: Cell<bool>,
    /// The RECV was cancelled for backpressure (re-armed when input drains).
    pub(super) recv_paused: Cell<bool>,
    pub(super) cancel_inflight: Cell<bool>,
    /// The task is gone: send what is queued, then close.
    pub(super) task_done: Cell<bool>,
    pub(super) in_dirty: Cell<bool>,
    /// Sweep count at the last byte received.
    pub(super) active_sweep: Cell<u32>,
    /// Sweep count when the queued output last made progress (a `SEND`
    /// took bytes) or began waiting (queued with none pending).
    pub(super) out_sweep: Cell<u32>,
}

impl ConnShared {
    pub(super) fn ops_inflight(&self) -> bool {
        self.recv_armed.get() || self.send_inflight.get() || self.cancel_inflight.get()
    }
    pub(super) fn out_pending(&self) -> bool {
        self.send_inflight.get() || !self.out.borrow().is_empty()
    }
    pub(super) fn wake_reader(&self) {
        if let Some(w) = self.reader.borrow_mut().take() {
            w.wake();
        }
    }
    pub(super) fn wake_writer(&self) {
        if let Some(w) = self.writer.borrow_mut().take() {
            w.wake();
        }
    }

    /// The peer stopped taking output: shut the socket down, so the
    /// kernel ends its `SEND` and `RECV` (the slot is freed once their CQEs
    /// are reaped), reset it at close, and fail the task's reads and writes.
    pub(super) fn abort(&self) {
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

/// A connection's task's end: read what arrived, queue what to send.
/// Dropping it closes the connection once its output is sent.
pub struct RingConn {
    pub(super) shared: Rc<ConnShared>,
    pub(super) ring: std::rc::Weak<NetRing>,
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
    // SAFETY: `sockaddr_storage` is plain old data: all zeros is a valid
    // (empty) address.
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
