//! The metrics APIs' TLS: the serving certificate (from files, re-read when they change,
//! or a self-signed pair made at start), the client certificates the server accepts (the
//! front proxy's, and users' from the cluster's client CA, both from
//! `extension-apiserver-authentication`), and who a verified certificate names.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};

/// Why a serving certificate cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM certificate or key.
    #[error("{path} holds no PEM {what}: {detail}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// `certificate` or `private key`.
        what: &'static str,
        /// The parser's words.
        detail: String,
    },
    /// The key does not fit the certificate, or rustls cannot sign with it.
    #[error("the key in {key} cannot serve the certificate in {cert}: {detail}")]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        detail: String,
    },
    /// The self-signed pair could not be made.
    #[error("cannot make a self-signed certificate: {0}")]
    SelfSigned(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a PEM certificate chain and key into a signing pair.
pub fn load_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, CertError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| CertError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let (cert_pem, key_pem) = (read(cert)?, read(key)?);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::Pem {
            path: cert.to_path_buf(),
            what: "certificate",
            detail: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(CertError::Pem {
            path: cert.to_path_buf(),
            what: "certificate",
            detail: "no CERTIFICATE block".into(),
        });
    }
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| CertError::Pem {
        path: key.to_path_buf(),
        what: "private key",
        detail: e.to_string(),
    })?;
    let mismatch = |detail: String| CertError::Mismatch {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        detail,
    };
    let signer = provider()
        .key_provider
        .load_private_key(private)
        .map_err(|e| mismatch(e.to_string()))?;
    let pair = CertifiedKey::new(chain, signer);
    pair.keys_match().map_err(|e| mismatch(e.to_string()))?;
    Ok(pair)
}

/// A signing pair from PEM text: a certificate chain and its key.
pub fn pair_from_pem(cert: &str, key: &str) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("no PEM certificate: {e}"))?;
    if chain.is_empty() {
        return Err("no PEM certificate".into());
    }
    let private =
        PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| format!("no PEM key: {e}"))?;
    let signer = provider()
        .key_provider
        .load_private_key(private)
        .map_err(|e| e.to_string())?;
    let pair = CertifiedKey::new(chain, signer);
    pair.keys_match().map_err(|e| e.to_string())?;
    Ok(pair)
}

/// A self-signed serving pair for `names` (DNS names or IP addresses), valid for a year.
pub fn self_signed(names: &[String]) -> Result<(CertifiedKey, String), CertError> {
    let e = |e: rcgen::Error| CertError::SelfSigned(e.to_string());
    let key = rcgen::KeyPair::generate().map_err(e)?;
    let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(e)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "ballast-operator metrics API");
    params.not_after = rcgen::date_time_ymd(2100, 1, 1);
    let cert = params.self_signed(&key).map_err(e)?;
    let pem = cert.pem();
    let der = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| CertError::SelfSigned(e.to_string()))?;
    let signer = provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| CertError::SelfSigned(e.to_string()))?;
    Ok((CertifiedKey::new(vec![cert.der().clone()], signer), pem))
}

/// The serving pair in use; with files, a reload replaces it only with a good pair.
#[derive(Debug)]
pub struct ServingCert {
    files: Option<(PathBuf, PathBuf)>,
    current: RwLock<Arc<CertifiedKey>>,
    stamp: RwLock<Option<FileStamp>>,
}

/// What the files looked like when last read.
type FileStamp = (Option<SystemTime>, Option<SystemTime>, u64);

fn stamp(cert: &Path, key: &Path) -> FileStamp {
    let m = |p: &Path| std::fs::metadata(p).ok();
    let (c, k) = (m(cert), m(key));
    (
        c.as_ref().and_then(|m| m.modified().ok()),
        k.as_ref().and_then(|m| m.modified().ok()),
        c.map_or(0, |m| m.len()) ^ k.map_or(0, |m| m.len()).rotate_left(32),
    )
}

impl ServingCert {
    /// The pair in `cert` and `key`; an error names the file.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Arc<Self>, CertError> {
        let pair = load_pair(cert, key)?;
        Ok(Arc::new(Self {
            files: Some((cert.to_path_buf(), key.to_path_buf())),
            current: RwLock::new(Arc::new(pair)),
            stamp: RwLock::new(Some(stamp(cert, key))),
        }))
    }

    /// A fixed pair (self-signed).
    pub fn fixed(pair: CertifiedKey) -> Arc<Self> {
        Arc::new(Self {
            files: None,
            current: RwLock::new(Arc::new(pair)),
            stamp: RwLock::new(None),
        })
    }

    /// Re-reads the files if they changed since the last read. A bad pair keeps the last
    /// good one; the error says why. `Ok(true)` when a new pair is in use.
    pub fn reload(&self) -> Result<bool, CertError> {
        let Some((cert, key)) = &self.files else {
            return Ok(false);
        };
        let now = stamp(cert, key);
        if self
            .stamp
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            == Some(&now)
        {
            return Ok(false);
        }
        *self.stamp.write().unwrap_or_else(|e| e.into_inner()) = Some(now);
        let pair = load_pair(cert, key)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pair);
        Ok(true)
    }

    /// Serves `pair` from now on (the operator's own Secret changed).
    pub fn replace(&self, pair: CertifiedKey) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pair);
    }

    /// The pair in use.
    pub fn current(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Re-reads the files every `every` until the process ends, logging what happens.
    pub fn watch(self: Arc<Self>, every: Duration) {
        if self.files.is_none() {
            return;
        }
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match self.reload() {
                    Ok(true) => {
                        tracing::info!(target: "ballast::metrics_api", "serving certificate reloaded")
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(target: "ballast::metrics_api", error = %e, "keeping the last good serving certificate")
                    }
                }
            }
        });
    }
}

#[derive(Debug)]
struct Resolver(Arc<ServingCert>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

/// The CAs of client certificates, from `extension-apiserver-authentication`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientCas {
    /// PEM of `requestheader-client-ca-file`: the front proxy's (the aggregator's) CA.
    pub requestheader: String,
    /// PEM of `client-ca-file`: the CA of users' client certificates.
    pub client: String,
}

fn roots(pem: &str) -> RootCertStore {
    let mut store = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()).flatten() {
        if let Err(e) = store.add(cert) {
            tracing::warn!(target: "ballast::metrics_api", error = %e, "skipping a CA certificate");
        }
    }
    store
}

fn verifier(store: RootCertStore) -> Option<Arc<dyn ClientCertVerifier>> {
    if store.is_empty() {
        return None;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider())
        .allow_unauthenticated()
        .build()
        .ok()
}

/// Which CA a client's certificate chains to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerCert {
    /// No certificate.
    None,
    /// The front proxy's CA, with the certificate's common name.
    FrontProxy { common_name: String },
    /// The cluster's client CA: a user (CN) and groups (O).
    User { name: String, groups: Vec<String> },
}

/// The TLS configuration for one set of client CAs: the server config (handshakes
/// verify against either CA, and a client may present none) and the verifiers that tell
/// which CA a presented chain belongs to.
pub struct Tls {
    /// For `TlsAcceptor`.
    pub server: Arc<ServerConfig>,
    front_proxy: Option<Arc<dyn ClientCertVerifier>>,
    users: Option<Arc<dyn ClientCertVerifier>>,
}

impl Tls {
    /// The configuration serving `cert` and accepting client certificates from `cas`.
    pub fn new(cert: Arc<ServingCert>, cas: &ClientCas) -> Tls {
        let mut both = roots(&cas.requestheader);
        for c in CertificateDer::pem_slice_iter(cas.client.as_bytes()).flatten() {
            let _ = both.add(c);
        }
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(rustls::DEFAULT_VERSIONS)
            .expect("ring supports the default protocol versions");
        let builder = match verifier(both) {
            Some(v) => builder.with_client_cert_verifier(v),
            None => builder.with_no_client_auth(),
        };
        let mut server = builder.with_cert_resolver(Arc::new(Resolver(cert)));
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Tls {
            server: Arc::new(server),
            front_proxy: verifier(roots(&cas.requestheader)),
            users: verifier(roots(&cas.client)),
        }
    }

    /// Which CA `chain` (end entity first, as the handshake verified it) chains to.
    pub fn classify(&self, chain: Option<&[CertificateDer<'static>]>) -> PeerCert {
        let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else {
            return PeerCert::None;
        };
        let now = UnixTime::now();
        let verifies = |v: &Option<Arc<dyn ClientCertVerifier>>| {
            v.as_ref()
                .is_some_and(|v| v.verify_client_cert(leaf, intermediates, now).is_ok())
        };
        let Some((cn, orgs)) = subject(leaf) else {
            return PeerCert::None;
        };
        if verifies(&self.front_proxy) {
            PeerCert::FrontProxy { common_name: cn }
        } else if verifies(&self.users) {
            PeerCert::User {
                name: cn,
                groups: orgs,
            }
        } else {
            PeerCert::None
        }
    }
}

/// The subject's common name and organizations.
fn subject(cert: &CertificateDer<'_>) -> Option<(String, Vec<String>)> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())?
        .to_string();
    let orgs = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(str::to_string))
        .collect();
    Some((cn, orgs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA and a client certificate it signed.
    fn ca_and_client(cn: &str, org: &str) -> (String, CertificateDer<'static>) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "test-ca");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut leaf = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        leaf.distinguished_name.push(rcgen::DnType::CommonName, cn);
        leaf.distinguished_name
            .push(rcgen::DnType::OrganizationName, org);
        leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        (ca_cert.pem(), cert.der().clone())
    }

    #[test]
    fn a_chain_is_told_apart_by_its_ca() {
        let (proxy_ca, proxy) = ca_and_client("front-proxy-client", "");
        let (user_ca, user) = ca_and_client("alice", "team-a");
        let (_, stranger) = ca_and_client("mallory", "x");
        let (pair, _) = self_signed(&["localhost".into()]).unwrap();
        let tls = Tls::new(
            ServingCert::fixed(pair),
            &ClientCas {
                requestheader: proxy_ca,
                client: user_ca,
            },
        );
        assert_eq!(
            tls.classify(Some(&[proxy])),
            PeerCert::FrontProxy {
                common_name: "front-proxy-client".into()
            }
        );
        assert_eq!(
            tls.classify(Some(&[user])),
            PeerCert::User {
                name: "alice".into(),
                groups: vec!["team-a".into()]
            }
        );
        assert_eq!(tls.classify(Some(&[stranger])), PeerCert::None);
        assert_eq!(tls.classify(None), PeerCert::None);
    }

    #[test]
    fn files_load_reload_and_bad_files_keep_the_last_pair() {
        let dir = std::env::temp_dir().join(format!("ballast-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let write = |names: &[&str]| {
            let k = rcgen::KeyPair::generate().unwrap();
            let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
            let c = rcgen::CertificateParams::new(names)
                .unwrap()
                .self_signed(&k)
                .unwrap();
            std::fs::write(&cert, c.pem()).unwrap();
            std::fs::write(&key, k.serialize_pem()).unwrap();
            c.der().clone()
        };
        let first = write(&["one.example"]);
        let s = ServingCert::from_files(&cert, &key).unwrap();
        assert_eq!(s.current().cert[0], first);
        // A new pair (a different length, so the stamp changes even within one mtime tick).
        let second = write(&["a-longer-name.two.example"]);
        assert!(s.reload().unwrap());
        assert_eq!(s.current().cert[0], second);
        assert!(!s.reload().unwrap(), "unchanged files are not re-read");
        // A bad key: an error, and the last good pair stays.
        std::fs::write(&key, "not a key at all, and longer than before").unwrap();
        let e = s.reload().unwrap_err().to_string();
        assert!(e.contains("tls.key"), "{e}");
        assert_eq!(s.current().cert[0], second);
        // At start a missing or bad file is an error naming it.
        let missing = dir.join("missing.crt");
        let e = ServingCert::from_files(&missing, &key)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.crt"), "{e}");
        std::fs::write(&cert, "garbage").unwrap();
        let e = ServingCert::from_files(&cert, &key)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tls.crt"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
