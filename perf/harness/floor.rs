//! `chronos-perf floor <epoll|uring> <ip:port> [seconds]`: the least a
//! server can do per keep-alive `GET` on this kernel, as a reference for
//! issue 22's "server CPU per request" figure.
//!
//! Each is one thread that answers every request (a head ending in an
//! empty line) with chronos's `/ping` answer, and does nothing else: no
//! parsing, no routing, no headers read, no limits beyond a connection
//! count. It is not a server to deploy; it is the floor under any server
//! that reads a request and writes an answer per request with the kernel's
//! TCP, so `perf/http-bench.sh` (with `FLOOR=1`) can show how far nginx
//! and chronos are from it, measured the same way in the same run.
//!
//! - `epoll`: level-triggered `epoll_wait`, `accept4`, one `read` and one
//!   `write` per readable connection (what nginx does, less everything
//!   else nginx does).
//! - `uring`: one io_uring (`SINGLE_ISSUER` + `DEFER_TASKRUN`), multishot
//!   `ACCEPT`, multishot `RECV` into provided buffers and one `SEND` of the
//!   static answer per request, one `io_uring_enter` per loop (what
//!   chronos's network ring does, less everything else chronos does).
//!
//! Bounded: at most [`CONNECTIONS_MAX`] connections (more are closed at
//! once) and `seconds` of running (default 600), then it exits.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// chronos's answer to `GET /ping` (src/http/mod.rs `PING_OK`), so the
/// bytes on the wire are the same as the chronos rows'.
const ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 2\r\n\r\nOK";
/// Connections held at once; fds at or past this are closed on accept.
const CONNECTIONS_MAX: usize = 4096;
/// Bytes read per `read` / per provided buffer.
const READ_BYTES: usize = 4096;
/// Answers written per readable event at most (a pipelining client gets
/// the rest on its next event; wrk does not pipeline).
const ANSWERS_PER_READ_MAX: usize = 16;
/// Provided receive buffers (a power of two).
const BUFS_COUNT: u16 = 256;

pub fn main(args: &[String]) -> i32 {
    let (kind, addr, secs) = match parse(args) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("chronos-perf floor: {e}\nusage: chronos-perf floor <epoll|uring> <ip:port> [seconds]");
            return 2;
        }
    };
    let listener = match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("chronos-perf floor: bind {addr}: {e}");
            return 1;
        }
    };
    let deadline = Instant::now() + Duration::from_secs(secs);
    let result = match kind.as_str() {
        "epoll" => epoll_serve(&listener, deadline),
        _ => uring_serve(&listener, deadline),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("chronos-perf floor: {e}");
            1
        }
    }
}

fn parse(args: &[String]) -> Result<(String, SocketAddr, u64), String> {
    let kind = args.first().ok_or("a kind is needed")?.clone();
    if kind != "epoll" && kind != "uring" {
        return Err(format!("kind {kind}: epoll or uring"));
    }
    let addr = args.get(1).ok_or("an address is needed")?;
    let addr: SocketAddr = addr.parse().map_err(|e| format!("address {addr}: {e}"))?;
    let secs = match args.get(2) {
        Some(s) => s.parse().map_err(|e| format!("seconds {s}: {e}"))?,
        None => 600,
    };
    Ok((kind, addr, secs))
}

/// Counts request heads (each ends in `\r\n\r\n`) across reads: the state
/// is how many bytes of the terminator the previous read ended with.
#[derive(Clone, Copy, Default)]
struct Heads {
    matched: u8,
}

impl Heads {
    fn count(&mut self, bytes: &[u8]) -> usize {
        const END: &[u8; 4] = b"\r\n\r\n";
        let mut n = 0;
        for &b in bytes {
            let m = usize::from(self.matched);
            self.matched = if b == END[m] {
                m as u8 + 1
            } else if b == b'\r' {
                1
            } else {
                0
            };
            if self.matched == 4 {
                n += 1;
                self.matched = 0;
            }
        }
        n
    }
}

/// A ring connection: its request count state, its `SEND`s in flight and
/// whether its `RECV` ended. The fd is closed only once both are done, so
/// its number cannot be reused by a new connection while an answer meant
/// for the old one is still in the kernel's hands.
#[derive(Clone, Copy, Default)]
struct Conn {
    heads: Heads,
    sends: u32,
    recv_done: bool,
}

impl Conn {
    fn close_if_done(&self, fd: RawFd) {
        if self.recv_done && self.sends == 0 {
            close(fd);
        }
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn set_nodelay(fd: RawFd) {
    let one: libc::c_int = 1;
    // SAFETY: a valid option pointer and length for an open socket.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        );
    }
}

fn close(fd: RawFd) {
    // SAFETY: closing an fd this server owns, once.
    unsafe { libc::close(fd) };
}

fn epoll_serve(listener: &TcpListener, deadline: Instant) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let lfd = listener.as_raw_fd();
    // SAFETY: plain syscalls on fds this function owns.
    let ep = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    epoll_add(ep, lfd)?;
    let mut heads = vec![Heads::default(); CONNECTIONS_MAX];
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let mut buf = vec![0u8; READ_BYTES];
    let mut out = Vec::with_capacity(ANSWER.len() * ANSWERS_PER_READ_MAX);
    while Instant::now() < deadline {
        // SAFETY: `events` has room for 256 entries.
        let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), 256, 100) };
        for e in &events[..n.max(0) as usize] {
            let fd = e.u64 as RawFd;
            if fd == lfd {
                epoll_accept(ep, lfd, &mut heads);
                continue;
            }
            // SAFETY: `buf` has READ_BYTES bytes.
            let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), READ_BYTES) };
            if r <= 0 {
                if r == 0 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock {
                    close(fd);
                }
                continue;
            }
            let answers = heads[fd as usize].count(&buf[..r as usize]);
            out.clear();
            for _ in 0..answers.min(ANSWERS_PER_READ_MAX) {
                out.extend_from_slice(ANSWER);
            }
            if !out.is_empty() {
                // SAFETY: `out` is valid for its length. A short write of
                // an 83-byte answer into an empty send buffer does not
                // happen under a request-answer client; the floor ignores it.
                unsafe { libc::write(fd, out.as_ptr().cast(), out.len()) };
            }
        }
    }
    close(ep);
    Ok(())
}

fn epoll_add(ep: RawFd, fd: RawFd) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: `ev` is a valid event for an open fd.
    cvt(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) }).map(|_| ())
}

fn epoll_accept(ep: RawFd, lfd: RawFd, heads: &mut [Heads]) {
    loop {
        // SAFETY: accept on a listening socket; no address wanted.
        let fd = unsafe {
            libc::accept4(
                lfd,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK,
            )
        };
        if fd < 0 {
            return;
        }
        if fd as usize >= heads.len() || epoll_add(ep, fd).is_err() {
            close(fd);
            continue;
        }
        set_nodelay(fd);
        heads[fd as usize] = Heads::default();
    }
}

/// User data: the kind in the top byte, the fd below.
const UD_ACCEPT: u64 = 1 << 56;
const UD_RECV: u64 = 2 << 56;
const UD_SEND: u64 = 3 << 56;
const BGID: u16 = 7;

fn uring_serve(listener: &TcpListener, deadline: Instant) -> io::Result<()> {
    use io_uring::{opcode, types, IoUring};
    let mut ring: IoUring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_cqsize(8192)
        .build(4096)?;
    let bufs = ProvidedBufs::new()?;
    // SAFETY: the entries stay mapped until the process exits.
    unsafe {
        ring.submitter()
            .register_buf_ring_with_flags(bufs.entries as u64, BUFS_COUNT, BGID, 0)?;
    }
    let lfd = listener.as_raw_fd();
    let accept = opcode::AcceptMulti::new(types::Fd(lfd))
        .build()
        .user_data(UD_ACCEPT);
    // SAFETY: no buffer is involved.
    unsafe { ring.submission().push(&accept) }.map_err(|_| io::Error::other("sq full"))?;
    let mut conns = vec![Conn::default(); CONNECTIONS_MAX];
    let timeout = types::Timespec::new().nsec(100_000_000);
    let args = types::SubmitArgs::new().timespec(&timeout);
    let mut done: Vec<(u64, i32, u32)> = Vec::with_capacity(8192);
    while Instant::now() < deadline {
        match ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
        done.clear();
        done.extend(
            ring.completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for &(ud, res, flags) in &done {
            uring_complete(&mut ring, &bufs, &mut conns, lfd, ud, res, flags)?;
        }
        bufs.publish();
    }
    Ok(())
}

fn uring_complete(
    ring: &mut io_uring::IoUring,
    bufs: &ProvidedBufs,
    conns: &mut [Conn],
    lfd: RawFd,
    ud: u64,
    res: i32,
    flags: u32,
) -> io::Result<()> {
    use io_uring::{cqueue, opcode, types};
    let fd = (ud & ((1 << 56) - 1)) as RawFd;
    let mut push = |e: io_uring::squeue::Entry| {
        // SAFETY: every buffer an entry names is static or provided.
        while unsafe { ring.submission().push(&e) }.is_err() {
            ring.submit()?;
        }
        io::Result::Ok(())
    };
    match ud & (0xff << 56) {
        UD_ACCEPT => {
            if res >= 0 {
                if res as usize >= conns.len() {
                    close(res);
                } else {
                    set_nodelay(res);
                    conns[res as usize] = Conn::default();
                    push(recv_multi(res))?;
                }
            }
            if !cqueue::more(flags) {
                push(
                    opcode::AcceptMulti::new(types::Fd(lfd))
                        .build()
                        .user_data(UD_ACCEPT),
                )?;
            }
        }
        UD_RECV => {
            let conn = &mut conns[fd as usize];
            if let Some(bid) = cqueue::buffer_select(flags) {
                let answers = conn.heads.count(bufs.buffer(bid, res.max(0) as usize));
                bufs.give_back(bid);
                for _ in 0..answers.min(ANSWERS_PER_READ_MAX) {
                    let send =
                        opcode::Send::new(types::Fd(fd), ANSWER.as_ptr(), ANSWER.len() as u32);
                    push(send.build().user_data(UD_SEND | fd as u64))?;
                    conn.sends += 1;
                }
            }
            if res == 0 || (res < 0 && res != -libc::ENOBUFS) {
                if !cqueue::more(flags) {
                    conn.recv_done = true;
                    conn.close_if_done(fd);
                }
            } else if !cqueue::more(flags) {
                push(recv_multi(fd))?;
            }
        }
        UD_SEND => {
            let conn = &mut conns[fd as usize];
            assert!(conn.sends > 0, "a SEND completes once");
            conn.sends -= 1;
            conn.close_if_done(fd);
        }
        _ => {}
    }
    Ok(())
}

fn recv_multi(fd: RawFd) -> io_uring::squeue::Entry {
    io_uring::opcode::RecvMulti::new(io_uring::types::Fd(fd), BGID)
        .build()
        .user_data(UD_RECV | fd as u64)
}

/// The provided buffer ring: entries and memory mapped once, never unmapped.
struct ProvidedBufs {
    entries: *mut io_uring::types::BufRingEntry,
    memory: *mut u8,
    tail: std::cell::Cell<u16>,
}

impl ProvidedBufs {
    fn new() -> io::Result<ProvidedBufs> {
        let count = usize::from(BUFS_COUNT);
        let entries = map(count * std::mem::size_of::<io_uring::types::BufRingEntry>())?;
        let memory = map(count * READ_BYTES)?;
        let b = ProvidedBufs {
            entries: entries.cast(),
            memory,
            tail: std::cell::Cell::new(0),
        };
        for bid in 0..BUFS_COUNT {
            b.give_back(bid);
        }
        b.publish();
        Ok(b)
    }

    fn give_back(&self, bid: u16) {
        assert!(bid < BUFS_COUNT);
        let tail = self.tail.get();
        // SAFETY: the slot is inside the mapping and past the published tail.
        unsafe {
            let e = &mut *self.entries.add(usize::from(tail & (BUFS_COUNT - 1)));
            e.set_addr(self.memory.add(usize::from(bid) * READ_BYTES) as u64);
            e.set_len(READ_BYTES as u32);
            e.set_bid(bid);
        }
        self.tail.set(tail.wrapping_add(1));
    }

    fn publish(&self) {
        // SAFETY: the tail lives in the first entry and is accessed atomically.
        unsafe {
            let tail = io_uring::types::BufRingEntry::tail(self.entries)
                as *const std::sync::atomic::AtomicU16;
            (*tail).store(self.tail.get(), std::sync::atomic::Ordering::Release);
        }
    }

    fn buffer(&self, bid: u16, len: usize) -> &[u8] {
        assert!(bid < BUFS_COUNT && len <= READ_BYTES);
        // SAFETY: in bounds; the kernel is done with it until given back.
        unsafe { std::slice::from_raw_parts(self.memory.add(usize::from(bid) * READ_BYTES), len) }
    }
}

fn map(bytes: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh anonymous mapping, checked for failure.
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
    Ok(p.cast())
}

#[cfg(test)]
mod tests {
    use super::Heads;

    #[test]
    fn heads_are_counted_across_reads() {
        let mut h = Heads::default();
        assert_eq!(
            h.count(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\n\r"),
            1
        );
        assert_eq!(h.count(b"\n"), 1);
        assert_eq!(h.count(b"GET / HTTP/1.1\r\n\r\r\n\r\n"), 1);
        assert_eq!(h.count(b""), 0);
    }
}
