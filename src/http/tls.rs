//! TLS with rustls, which is sans-IO: it is handed the ciphertext the
//! connection already reads and hands back the ciphertext to write, so
//! it runs on whatever drives the socket (the shard's network ring or
//! glommio's stream) with no thread and no blocking socket of its own.
//!
//! The listener's side: [`ListenerTls`] (the certificate and key from
//! `[http] tls-certificate` and `tls-private-key`, swapped in place by a
//! SIGHUP) and [`TlsConn`], a [`Conn`] around a plain one. The server
//! picks it once per connection, so a plain connection runs the plain
//! code and pays nothing for TLS.
//!
//! Bounds: rustls's buffered output per connection ([`TLS_BUFFER_BYTES`]:
//! [`TlsConn`] hands it to the socket before it takes more plaintext);
//! its received plaintext (rustls's own limit, 16 KiB: the ciphertext
//! beyond it waits in [`TlsConn`]'s one read buffer of `READ_BYTES`);
//! the handshake's time (the server's `header-timeout-ms`).

use crate::http::conn::Conn;
use rustls::client::ClientConnection;
use rustls::server::WebPkiClientVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, ServerConfig, ServerConnection};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

/// What rustls may buffer per connection for the socket (plaintext not
/// yet encrypted plus ciphertext not yet handed over): beyond it a write
/// waits for the socket. Four full records: a large response is written
/// as several buffers, each handed to the socket before the next.
pub const TLS_BUFFER_BYTES: usize = 64 * 1024;
/// Ciphertext read from the socket per read (one buffer per connection).
const READ_BYTES: usize = 16 * 1024 + 512;

/// The crypto provider every TLS configuration here uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in the PEM file `path`, set by `key` (named in the
/// error, with the file and the reason).
pub fn read_certificates(key: &str, path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let iter = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{key} = {path:?}: cannot read the file: {e}"))?;
    let certs = iter
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{key} = {path:?}: not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{key} = {path:?}: no certificate in the file (want PEM \"BEGIN CERTIFICATE\" blocks)"
        ));
    }
    Ok(certs)
}

/// The first private key in the PEM file `path` (PKCS#8, PKCS#1 or SEC1).
pub fn read_private_key(key: &str, path: &str) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            format!(
                "{key} = {path:?}: no private key in the file (want a PEM \"PRIVATE KEY\" block)"
            )
        }
        e => format!("{key} = {path:?}: cannot read a PEM private key: {e}"),
    })
}

/// A certificate chain and the key that matches it, from two PEM files
/// named by their keys: `(key, path)` each.
pub fn certified_key(cert: (&str, &str), key: (&str, &str)) -> Result<CertifiedKey, String> {
    let chain = read_certificates(cert.0, cert.1)?;
    let private = read_private_key(key.0, key.1)?;
    CertifiedKey::from_der(chain, private, &provider()).map_err(|e| {
        format!(
            "{} = {:?} and {} = {:?} do not go together: {e}",
            cert.0, cert.1, key.0, key.1
        )
    })
}

/// The listener's certificate: read by each handshake, replaced whole by
/// a reload. A lock, but taken once per handshake (never per request or
/// per byte) and only ever for a pointer copy.
#[derive(Debug)]
struct CertSlot {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A poisoned lock (a panic while swapping, which cannot happen: the
        // swap is a pointer store) fails the handshake rather than the shard.
        self.current.read().ok().map(|c| c.clone())
    }
}

/// The listener's TLS: its rustls configuration and the files its
/// certificate is (re)read from.
pub struct ListenerTls {
    pub config: Arc<ServerConfig>,
    slot: Arc<CertSlot>,
    certificate: (String, String),
    private_key: (String, String),
}

impl std::fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerTls")
            .field("certificate", &self.certificate)
            .field("private_key", &self.private_key)
            .finish_non_exhaustive()
    }
}

impl ListenerTls {
    /// Read the certificate chain and key: `(key, path)` each, the keys
    /// named in errors. `client_roots`: ask clients for a certificate and
    /// verify one presented against these (one not presented is let in:
    /// the routes decide, see `Conn::peer_certified`).
    pub fn load(
        certificate: (&str, &str),
        private_key: (&str, &str),
        client_roots: Option<RootCertStore>,
    ) -> Result<ListenerTls, String> {
        let key = certified_key(certificate, private_key)?;
        let slot = Arc::new(CertSlot {
            current: RwLock::new(Arc::new(key)),
        });
        let config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let config = match client_roots {
            None => config.with_no_client_auth(),
            Some(roots) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .allow_unauthenticated()
                        .build()
                        .map_err(|e| format!("TLS client verification: {e}"))?;
                config.with_client_cert_verifier(verifier)
            }
        };
        let mut config = config.with_cert_resolver(slot.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let owned = |(k, p): (&str, &str)| (k.to_string(), p.to_string());
        Ok(ListenerTls {
            config: Arc::new(config),
            slot,
            certificate: owned(certificate),
            private_key: owned(private_key),
        })
    }

    /// Re-read the files; a chain and key that do not load (or do not
    /// match) are refused and the current ones stay. New handshakes take
    /// the new certificate; established connections keep theirs.
    pub fn reload(&self) -> Result<(), String> {
        let (c, k) = (&self.certificate, &self.private_key);
        let key = certified_key((&c.0, &c.1), (&k.0, &k.1))?;
        let mut current = self
            .slot
            .current
            .write()
            .map_err(|_| "the certificate slot is poisoned".to_string())?;
        *current = Arc::new(key);
        Ok(())
    }
}

/// A connection over TLS, either side: `C` carries the ciphertext.
pub struct TlsConn<C: Conn> {
    inner: C,
    tls: rustls::Connection,
    /// Ciphertext read, `raw[raw_start..raw_end]` not yet taken by rustls.
    raw: Vec<u8>,
    raw_start: usize,
    raw_end: usize,
    /// Ciphertext for the socket (handed over whole, then empty again).
    out: Vec<u8>,
    /// The longest a read may wait for plaintext (`None`: as long as the
    /// reads of `inner` allow). Records that carry none (a key update, a
    /// ticket) return a read of `inner` each, so without it a peer sending
    /// one now and then would keep an idle connection open for ever.
    plain_wait_max: Option<std::time::Duration>,
}

impl<C: Conn> TlsConn<C> {
    /// Run the server's handshake over `inner`. The caller bounds its time.
    pub async fn accept(inner: C, config: &Arc<ServerConfig>) -> io::Result<TlsConn<C>> {
        let tls = ServerConnection::new(config.clone()).map_err(io::Error::other)?;
        TlsConn::handshake(inner, tls.into()).await
    }

    /// Run the client's handshake with `name` over `inner` (the peer's
    /// certificate is verified against `config`'s roots for `name`). The
    /// caller bounds its time.
    pub async fn connect(
        inner: C,
        config: &Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    ) -> io::Result<TlsConn<C>> {
        let tls = ClientConnection::new(config.clone(), name).map_err(io::Error::other)?;
        TlsConn::handshake(inner, tls.into()).await
    }

    async fn handshake(inner: C, mut tls: rustls::Connection) -> io::Result<TlsConn<C>> {
        tls.set_buffer_limit(Some(TLS_BUFFER_BYTES));
        let mut conn = TlsConn {
            inner,
            tls,
            raw: vec![0; READ_BYTES],
            raw_start: 0,
            raw_end: 0,
            out: Vec::new(),
            plain_wait_max: None,
        };
        while conn.tls.is_handshaking() {
            conn.flush().await?;
            if !conn.tls.is_handshaking() {
                break;
            }
            if !conn.pull().await? {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during the TLS handshake",
                ));
            }
        }
        conn.flush().await?;
        Ok(conn)
    }

    /// Bound every plaintext read by `max` (the server's idle timeout): a
    /// read that gets no plaintext within it ends the stream.
    pub fn with_plain_wait_max(mut self, max: std::time::Duration) -> TlsConn<C> {
        self.plain_wait_max = Some(max);
        self
    }

    /// Whether the handshake resumed an earlier session.
    pub fn resumed(&self) -> bool {
        self.tls.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
    }

    /// Hand rustls's pending ciphertext to the socket.
    async fn flush(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            self.tls.write_tls(&mut self.out)?;
            self.inner.write_buf(&mut self.out).await?;
        }
        Ok(())
    }

    /// Give rustls ciphertext (reading the socket when none is held) and
    /// process it; `false` at end of stream. A protocol error sends its
    /// alert, then fails.
    async fn pull(&mut self) -> io::Result<bool> {
        if self.raw_start == self.raw_end {
            let n = self.inner.read(&mut self.raw).await?;
            if n == 0 {
                return Ok(false);
            }
            (self.raw_start, self.raw_end) = (0, n);
        }
        let mut rest = &self.raw[self.raw_start..self.raw_end];
        let before = rest.len();
        self.tls.read_tls(&mut rest)?;
        self.raw_start += before - rest.len();
        if let Err(e) = self.tls.process_new_packets() {
            let _ = self.flush().await;
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        Ok(true)
    }

    /// Read plaintext: `Ok(0)` at the peer's close_notify or end of stream.
    /// With a plaintext wait bound, also `Ok(0)` once it passed with
    /// records but no plaintext.
    pub async fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let started = std::time::Instant::now();
        loop {
            match self.tls.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if self
                .plain_wait_max
                .is_some_and(|max| started.elapsed() >= max)
            {
                return Ok(0);
            }
            // A key update or an alert to answer.
            self.flush().await?;
            if !self.pull().await? {
                return Ok(0);
            }
        }
    }

    /// Write all of `data`, at most [`TLS_BUFFER_BYTES`] of it in rustls
    /// at a time.
    pub async fn write_plain(&mut self, data: &[u8]) -> io::Result<()> {
        let mut rest = data;
        while !rest.is_empty() {
            let n = self.tls.writer().write(rest)?;
            if n == 0 && !self.tls.wants_write() {
                return Err(io::ErrorKind::WriteZero.into());
            }
            rest = &rest[n..];
            self.flush().await?;
        }
        Ok(())
    }
}

impl<C: Conn> Conn for TlsConn<C> {
    async fn read<'a>(&'a mut self, buf: &'a mut [u8]) -> io::Result<usize> {
        self.read_plain(buf).await
    }
    async fn write_all<'a>(&'a mut self, data: &'a [u8]) -> io::Result<()> {
        self.write_plain(data).await
    }
    async fn write_buf<'a>(&'a mut self, data: &'a mut Vec<u8>) -> io::Result<()> {
        let written = self.write_plain(data).await;
        data.clear();
        written
    }
    fn peer_ip(&self) -> Option<IpAddr> {
        self.inner.peer_ip()
    }
    fn reset_on_close(&self) {
        self.inner.reset_on_close();
    }
    fn peer_certified(&self) -> bool {
        // Only a listener with a client verifier asks for (and verifies)
        // certificates; one that passed the handshake was verified.
        self.tls.peer_certificates().is_some_and(|c| !c.is_empty())
    }
}

/// Trust anchors: the certificates of the PEM file `ca` (`(key, path)`)
/// when given, else the system's store (read once, here). The second
/// value is a warning for the log (a system store that is missing or
/// partly unreadable).
pub fn roots(ca: Option<(&str, &str)>) -> Result<(RootCertStore, Option<String>), String> {
    let mut roots = RootCertStore::empty();
    if let Some((key, path)) = ca {
        for cert in read_certificates(key, path)? {
            roots
                .add(cert)
                .map_err(|e| format!("{key} = {path:?}: not a usable CA certificate: {e}"))?;
        }
        return Ok((roots, None));
    }
    let found = rustls_native_certs::load_native_certs();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    let warning = match (added, found.errors.first()) {
        (0, first) => Some(format!(
            "no system CA certificates found{}: https:// callbacks will fail verification until [timers] callback-ca-file is set",
            first.map_or(String::new(), |e| format!(" ({e})"))
        )),
        (_, Some(e)) => Some(format!("some system CA certificates could not be read: {e}")),
        (_, None) => None,
    };
    Ok((roots, warning))
}

/// A client configuration trusting `roots`, presenting `identity` (a
/// certificate chain and its key, see [`client_identity`]) when given. Each shard takes its own copy
/// ([`for_shard`]).
pub fn client_config(
    roots: RootCertStore,
    identity: Option<Identity>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("TLS client certificate: {e}"))?,
    };
    Ok(Arc::new(config))
}

/// A certificate chain and its private key, as a client presents them.
pub type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// A client identity from two PEM files named by their keys (checked to
/// go together).
pub fn client_identity(cert: (&str, &str), key: (&str, &str)) -> Result<Identity, String> {
    certified_key(cert, key)?;
    Ok((
        read_certificates(cert.0, cert.1)?,
        read_private_key(key.0, key.1)?,
    ))
}

/// A shard's own copy of `base`, with a session store of its own
/// ([`SESSIONS_PER_SHARD`] entries): no store is shared across cores, and
/// a second connection to a target resumes the first one's session.
pub fn for_shard(base: &Arc<rustls::ClientConfig>) -> Arc<rustls::ClientConfig> {
    let mut config = (**base).clone();
    config.resumption = rustls::client::Resumption::in_memory_sessions(SESSIONS_PER_SHARD);
    Arc::new(config)
}

/// TLS sessions remembered per shard for resumption (one or two per
/// target server name; older ones are forgotten first).
pub const SESSIONS_PER_SHARD: usize = 256;
