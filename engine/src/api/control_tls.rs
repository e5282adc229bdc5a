//! TLS for the control API (`--control-tls-cert` and `--control-tls-key`).
//!
//! The pair is read at start, where a missing or unusable file is an error naming it, and
//! then every [`RELOAD_INTERVAL`]: when either file's bytes change the new pair serves the
//! next handshakes, so a certificate renewed in a mounted Secret takes effect without a
//! restart; a pair that breaks later keeps the last good one and says why in the log.
//! Handshakes run on tasks of their own, bounded by [`HANDSHAKE_TIMEOUT`], so a client that
//! connects and says nothing holds no one else up.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::config::tls::{Contents, pair, provider, read};
pub use crate::config::tls::{TlsError, TlsFiles, load};

/// How often the certificate and key files are read to see whether they changed.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// The longest a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The pair handshakes use now.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// A TLS server for the control API over `files`, whose pair follows the files while the
/// returned value lives (inside a Tokio runtime).
pub struct ControlTls {
    acceptor: TlsAcceptor,
    reload: tokio::task::JoinHandle<()>,
}

impl Drop for ControlTls {
    fn drop(&mut self) {
        self.reload.abort();
    }
}

impl ControlTls {
    /// Loads the pair (an error names the file) and starts following the files.
    pub fn new(files: TlsFiles) -> Result<Self, TlsError> {
        let contents = read(&files)?;
        let current = Arc::new(Current(RwLock::new(pair(&files, &contents)?)));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Mismatch {
                cert: files.cert.clone(),
                key: files.key.clone(),
                detail: e.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        // gRPC is HTTP/2.
        config.alpn_protocols = vec![b"h2".to_vec()];
        let reload = tokio::spawn(follow(files, contents, current));
        Ok(ControlTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            reload,
        })
    }

    /// The TLS connections of `listener`, each handshake on a task of its own; a failed or
    /// slow handshake is dropped (and logged at debug). Ends when the receiver is dropped.
    pub fn incoming(
        &self,
        listener: TcpListener,
    ) -> tokio_stream::wrappers::ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let acceptor = self.acceptor.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    () = tx.closed() => return,
                };
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors, say: wait rather than spin.
                        tracing::warn!(error = %e, "control API accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send(Ok(tls)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "control API TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "control API TLS handshake timed out"),
                    }
                });
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}

/// Re-reads the files every [`RELOAD_INTERVAL`] and swaps in a changed pair that works.
async fn follow(files: TlsFiles, mut seen: Contents, current: Arc<Current>) {
    let mut tick = tokio::time::interval(RELOAD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut complained: Option<String> = None;
    loop {
        tick.tick().await;
        let f = files.clone();
        let read = tokio::task::spawn_blocking(move || read(&f)).await;
        let contents = match read {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                complain(&mut complained, e.to_string());
                continue;
            }
            Err(_) => continue,
        };
        if contents == seen {
            continue;
        }
        match pair(&files, &contents) {
            Ok(p) => {
                *current.0.write().unwrap_or_else(|e| e.into_inner()) = p;
                seen = contents;
                complained = None;
                tracing::info!(cert = %files.cert.display(), "control API TLS certificate changed; new handshakes use it");
            }
            Err(e) => complain(&mut complained, e.to_string()),
        }
    }
}

/// Logs why the files cannot be used, once per different reason.
fn complain(last: &mut Option<String>, why: String) {
    if last.as_deref() != Some(why.as_str()) {
        tracing::error!(error = %why, "control API TLS files unusable; keeping the last good certificate");
        *last = Some(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn pem_pair(name: &str) -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    fn files(dir: &Path, cert: &str, key: &str) -> TlsFiles {
        std::fs::write(dir.join("tls.crt"), cert).unwrap();
        std::fs::write(dir.join("tls.key"), key).unwrap();
        TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        }
    }

    #[test]
    fn each_bad_file_is_named() {
        let dir = std::env::temp_dir().join(format!("ballast-ctl-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = pem_pair("a");
        let (_, other_key) = pem_pair("b");
        assert!(load(&files(&dir, &cert, &key)).is_ok());
        let cases = [
            ("", key.as_str(), "tls.crt holds no PEM certificate"),
            (&cert, "not a key", "tls.key holds no PEM private key"),
            (&key, &key, "tls.crt holds no PEM certificate"),
            (&cert, &other_key, "cannot serve the certificate in"),
        ];
        for (c, k, words) in cases {
            let e = load(&files(&dir, c, k)).unwrap_err().to_string();
            assert!(e.contains(words), "{words}: {e}");
        }
        let missing = TlsFiles {
            cert: dir.join("nope.crt"),
            key: dir.join("tls.key"),
        };
        let e = load(&missing).unwrap_err().to_string();
        assert!(e.contains("cannot read") && e.contains("nope.crt"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
