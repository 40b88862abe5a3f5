//! TLS for the tests of `tls.rs` and `tls_cluster.rs`: a test certificate
//! authority that issues leaf certificates into a temporary directory
//! (rcgen), a client that trusts it, one request over a new TLS
//! connection (rustls over std sockets), and a node started with a TLS
//! listener.

use super::*;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A test certificate authority and the files it issues.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: rcgen::Certificate,
    pub ca_key: rcgen::KeyPair,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("chronos-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("chronos test CA {name}"));
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca, ca_key }
    }

    pub fn ca_path(&self) -> String {
        self.dir.join("ca.pem").display().to_string()
    }

    /// A leaf for `sans` (IP literals become IP SANs), signed by this CA;
    /// writes `name.crt` and `name.key`, returns their paths and the DER.
    pub fn issue(&self, name: &str, sans: &[&str]) -> (String, String, Vec<u8>) {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(sans).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let (c, k) = (
            self.dir.join(format!("{name}.crt")),
            self.dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (
            c.display().to_string(),
            k.display().to_string(),
            cert.der().to_vec(),
        )
    }

    /// A client that trusts this CA only.
    pub fn client(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from(self.ca.der().to_vec()))
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    }
}

/// One request over a new TLS connection; the response and the server's
/// leaf certificate.
pub fn tls_try(
    addr: SocketAddr,
    client: &Arc<ClientConfig>,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(Response, Vec<u8>)> {
    let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let name = ServerName::IpAddress(addr.ip().into());
    let conn = ClientConnection::new(client.clone(), name).map_err(std::io::Error::other)?;
    let mut tls = StreamOwned::new(conn, sock);
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(req.as_bytes())?;
    let response = read_response(&mut BufReader::new(&mut tls))?;
    let leaf = tls.conn.peer_certificates().map(|c| c[0].to_vec());
    Ok((response, leaf.unwrap_or_default()))
}

pub fn tls_request(
    addr: SocketAddr,
    client: &Arc<ClientConfig>,
    method: &str,
    path: &str,
    body: &str,
) -> Response {
    tls_try(addr, client, method, path, body)
        .expect("TLS request")
        .0
}

/// Start a node whose listener speaks TLS with `cert`/`key`, and wait
/// until it answers `/ping` over TLS.
pub fn start_tls(client: &Arc<ClientConfig>, cert: &str, key: &str, extra: &str) -> Node {
    let config = format!("[http]\ntls-certificate = {cert:?}\ntls-private-key = {key:?}\n{extra}");
    start_tls_at(client, "127.0.0.1", free_port(), &config, &[])
}

pub fn tls_metric(addr: SocketAddr, client: &Arc<ClientConfig>, name: &str) -> f64 {
    metric_sum(
        &tls_request(addr, client, "GET", "/metrics", "").text(),
        name,
    )
}

/// Start a node on `ip:port` with `config`, waiting for `/ping` over TLS.
pub fn start_tls_at(
    client: &Arc<ClientConfig>,
    ip: &str,
    port: u16,
    config: &str,
    env: &[(&str, &str)],
) -> Node {
    let mut node = Node::spawn_in(None, ip, port, config, env);
    let addr = node.addr;
    wait_until("/ping over TLS", Duration::from_secs(20), || {
        if let Ok(Some(status)) = node.child.try_wait() {
            panic!(
                "chronos exited ({status}) at start; log:\n{}",
                node.log_text()
            );
        }
        match tls_try(addr, client, "GET", "/ping", "") {
            Ok((r, _)) if r.status == 200 => Ok(()),
            Ok((r, _)) => Err(format!("{}", r.status)),
            Err(e) => Err(e.to_string()),
        }
    });
    node
}

/// Node `i` of an `n`-node TLS cluster on 127.0.0.1..=n: its certificate
/// (IP SAN) from `own`, peers verified against `trusted`'s CA; `mutual`:
/// it presents its certificate to its peers too.
pub fn tls_node_config(
    own: &Pki,
    trusted: &Pki,
    n: usize,
    i: usize,
    port: u16,
    mutual: bool,
) -> String {
    let ip = format!("127.0.0.{i}");
    let (cert, key, _) = own.issue(&format!("node{i}"), &[&ip]);
    let ca = trusted.ca_path();
    let client = match mutual {
        true => format!("tls-client-certificate = {cert:?}\ntls-client-private-key = {key:?}\n"),
        false => String::new(),
    };
    let extra = format!(
        "tls = true\ntls-ca-file = {ca:?}\n{client}[http]\ntls-certificate = {cert:?}\ntls-private-key = {key:?}\n"
    );
    cluster_config(n, i, port, 1, &extra)
}
