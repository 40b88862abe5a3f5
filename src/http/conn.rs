//! A connection as the server and TLS see it: the [`Conn`] trait, and its
//! two plain drivers, the shard's network ring ([`RingConn`]) and glommio's
//! stream ([`GlommioConn`]). Beneath both `server.rs` and `tls.rs`: TLS
//! wraps a `Conn` and is one, the server serves any `Conn`, and neither
//! needs the other for it.

use crate::http::ring::RingConn;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

/// A connection as `serve` sees it.
pub trait Conn {
    /// Read into `buf`; `Ok(0)` at end of stream or idle timeout.
    fn read<'a>(&'a mut self, buf: &'a mut [u8]) -> impl Future<Output = io::Result<usize>> + 'a;
    /// Write all of `data`.
    fn write_all<'a>(&'a mut self, data: &'a [u8]) -> impl Future<Output = io::Result<()>> + 'a;
    /// Write all of `data` and leave it empty (the connection may take
    /// the buffer rather than copy it).
    fn write_buf<'a>(
        &'a mut self,
        data: &'a mut Vec<u8>,
    ) -> impl Future<Output = io::Result<()>> + 'a;
    /// The peer's IP address, if known.
    fn peer_ip(&self) -> Option<IpAddr>;
    /// A write failed or timed out: reset the connection when it closes
    /// rather than leave the kernel sending to a peer that does not read.
    fn reset_on_close(&self);
    /// The peer presented a client certificate the listener verified.
    fn peer_certified(&self) -> bool {
        false
    }
}

impl Conn for RingConn {
    fn read<'a>(&'a mut self, buf: &'a mut [u8]) -> impl Future<Output = io::Result<usize>> + 'a {
        RingConn::read(self, buf)
    }
    fn peer_ip(&self) -> Option<IpAddr> {
        RingConn::peer_ip(self)
    }
    fn write_all<'a>(&'a mut self, data: &'a [u8]) -> impl Future<Output = io::Result<()>> + 'a {
        RingConn::write_all(self, data)
    }
    fn write_buf<'a>(
        &'a mut self,
        data: &'a mut Vec<u8>,
    ) -> impl Future<Output = io::Result<()>> + 'a {
        RingConn::write_buf(self, data)
    }
    fn reset_on_close(&self) {
        RingConn::reset_on_close(self);
    }
}

/// glommio's stream, with the idle timeout as its read timeout and the
/// write timeout as its write timeout (which glommio counts from the last
/// progress of a blocked write).
pub struct GlommioConn(pub TcpStream);

impl Conn for GlommioConn {
    fn read<'a>(&'a mut self, buf: &'a mut [u8]) -> impl Future<Output = io::Result<usize>> + 'a {
        AsyncReadExt::read(&mut self.0, buf)
    }
    fn write_all<'a>(&'a mut self, data: &'a [u8]) -> impl Future<Output = io::Result<()>> + 'a {
        AsyncWriteExt::write_all(&mut self.0, data)
    }
    async fn write_buf<'a>(&'a mut self, data: &'a mut Vec<u8>) -> io::Result<()> {
        let written = AsyncWriteExt::write_all(&mut self.0, data).await;
        data.clear();
        written
    }
    fn peer_ip(&self) -> Option<IpAddr> {
        self.0.peer_addr().ok().map(|a| a.ip())
    }
    fn reset_on_close(&self) {
        crate::http::ring::reset_on_close(self.0.as_raw_fd());
    }
}
