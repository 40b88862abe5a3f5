//! A connection to a target as the client reads and writes it: plain
//! glommio TCP, or TLS over it. Chosen once per connection; what reads a
//! response or writes a request does not ask which.

use crate::http::conn::GlommioConn;
use crate::http::tls::TlsConn;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;

/// A connection to a target: plain, or TLS over it (chosen once, when the
/// connection is made; a plain one runs glommio's stream as before).
pub(super) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsConn<GlommioConn>>),
}

impl Stream {
    pub(super) async fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf).await,
            Stream::Tls(s) => s.read_plain(buf).await,
        }
    }

    pub(super) async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.write_all(data).await,
            Stream::Tls(s) => s.write_plain(data).await,
        }
    }
}
