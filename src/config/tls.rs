//! The TLS files a configuration names, read and checked at start: the
//! listener's certificate (`[http]`), the peers' roots and client identity
//! (`[cluster]`, which needs the listener's TLS too), the callbacks' roots
//! (`[timers]`). A bad path or PEM is an error naming the key and the file.

use super::Config;
use crate::http::tls::{self, ListenerTls};
use std::sync::Arc;

impl Config {
    /// `[cluster] tls`: the peers' client configuration, and with mutual
    /// TLS the roots the listener verifies peers' certificates against.
    /// Refused: TLS to peers while the listener is plain (the peers would
    /// send the secret and the timers in clear), or half a setting.
    #[allow(clippy::type_complexity)]
    pub(super) fn load_cluster_tls(
        &self,
    ) -> Result<
        (
            Option<Arc<rustls::ClientConfig>>,
            Option<rustls::RootCertStore>,
        ),
        String,
    > {
        let c = &self.cluster;
        let identity = match (&c.tls_client_certificate, &c.tls_client_private_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            _ => return Err("[cluster] tls-client-certificate and tls-client-private-key: set both (mutual TLS) or neither".into()),
        };
        if !c.tls {
            if c.tls_ca_file.is_some() || identity.is_some() {
                return Err("[cluster] tls-ca-file and tls-client-certificate take effect only with [cluster] tls = true; set it, or remove them".into());
            }
            return Ok((None, None));
        }
        if self.http.tls_certificate.is_none() {
            return Err("[cluster] tls = true needs [http] tls-certificate and tls-private-key: the peers reach this node's listener, which must speak TLS too (the shared secret and the timers must never cross in clear)".into());
        }
        let ca = c.tls_ca_file.as_deref().ok_or(
            "[cluster] tls = true needs tls-ca-file (PEM: the CA that signs the peers' certificates)",
        )?;
        let (roots, _) = tls::roots(Some(("[cluster] tls-ca-file", ca)))?;
        let identity = match identity {
            Some((cert, key)) => Some(tls::client_identity(
                ("[cluster] tls-client-certificate", cert),
                ("[cluster] tls-client-private-key", key),
            )?),
            None => None,
        };
        let mutual = identity.is_some();
        let client = tls::client_config(roots.clone(), identity)?;
        Ok((Some(client), mutual.then_some(roots)))
    }

    /// `[http] tls-certificate` and `tls-private-key`: both or neither.
    /// `client_roots`: verify the client certificates peers present.
    pub(super) fn load_tls(
        &self,
        client_roots: Option<rustls::RootCertStore>,
    ) -> Result<Option<Arc<ListenerTls>>, String> {
        let h = &self.http;
        match (&h.tls_certificate, &h.tls_private_key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => ListenerTls::load(
                ("[http] tls-certificate", cert),
                ("[http] tls-private-key", key),
                client_roots,
            )
            .map(|t| Some(Arc::new(t))),
            (Some(_), None) => Err("[http] tls-certificate is set without tls-private-key: set both (TLS) or neither (plain HTTP)".into()),
            (None, Some(_)) => Err("[http] tls-private-key is set without tls-certificate: set both (TLS) or neither (plain HTTP)".into()),
        }
    }

    /// `https://` callbacks: the roots of `[timers] callback-ca-file`,
    /// else the system's, and what start-up should log about them.
    pub(super) fn load_callback_tls(
        &self,
    ) -> Result<(Arc<rustls::ClientConfig>, Option<String>), String> {
        let ca = self.timers.callback_ca_file.as_deref();
        let (roots, warning) = tls::roots(ca.map(|p| ("[timers] callback-ca-file", p)))?;
        Ok((tls::client_config(roots, None)?, warning))
    }
}
