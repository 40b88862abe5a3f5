//! The provided-buffer ring: [`BUFS_COUNT`] receive buffers of
//! [`BUF_BYTES`] each, in memory shared with the kernel, which picks one
//! per `RECV` completion. The only unsafe memory handling of the network
//! ring is here: the entries and buffers are raw pointers into anonymous
//! mappings that are never unmapped (the kernel tears a closed ring's
//! requests down asynchronously). Bounds: a buffer is read only between
//! its completion and its return, and written back only past the tail
//! the kernel was last shown.

use io_uring::types;
use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicU16, Ordering};

/// Provided receive buffers per shard (a power of two).
pub const BUFS_COUNT: u16 = 1024;
/// Bytes per provided receive buffer.
pub const BUF_BYTES: usize = 2048;

/// Buffer group id of the provided buffers.
pub(super) const BGID: u16 = 0;

/// The ring of provided receive buffers (the kernel picks one per
/// completion; the driver copies it out and gives it back in the same pass).
pub(super) struct BufRing {
    /// `BUFS_COUNT` entries, page-aligned (mmap), shared with the kernel.
    pub(super) entries: *mut types::BufRingEntry,
    /// `BUFS_COUNT * BUF_BYTES` bytes the entries point into.
    pub(super) memory: *mut u8,
    /// Next tail to publish (entries written up to here).
    pub(super) tail: Cell<u16>,
}

impl BufRing {
    pub(super) fn new() -> io::Result<BufRing> {
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
    pub(super) fn give_back(&self, bid: u16) {
        assert!(bid < BUFS_COUNT, "a buffer ID of the ring");
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

    pub(super) fn publish(&self) {
        // SAFETY: the tail field lives in the first entry of the mapping and
        // is only ever accessed atomically by the kernel and by us.
        unsafe {
            let tail = types::BufRingEntry::tail(self.entries) as *const AtomicU16;
            (*tail).store(self.tail.get(), Ordering::Release);
        }
    }

    pub(super) fn buffer(&self, bid: u16, len: usize) -> &[u8] {
        assert!(
            bid < BUFS_COUNT && len <= BUF_BYTES,
            "a buffer ID of the ring, within its size"
        );
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
