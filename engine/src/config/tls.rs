//! The control API's certificate pair (`--control-tls-cert`, `--control-tls-key`): the
//! files, read and checked. Checked while flags are read, so a bad file is an error at
//! start that names it; [`crate::api::control_tls`] serves the pair and follows its files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// The certificate (PEM chain, leaf first) and key (PEM, PKCS#8, PKCS#1 or SEC1) files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `--control-tls-cert`.
    pub cert: PathBuf,
    /// `--control-tls-key`.
    pub key: PathBuf,
}

/// Why a pair cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM certificate or key.
    #[error("{path} holds no PEM {what}{detail}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// `certificate` or `private key`.
        what: &'static str,
        /// The parser's words, if any (with a leading `: `).
        detail: String,
    },
    /// The key does not belong to the certificate, or cannot sign.
    #[error("the key in {key} cannot serve the certificate in {cert}: {detail}")]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        detail: String,
    },
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The files' bytes (certificate, key), to tell a change.
pub(crate) type Contents = (Vec<u8>, Vec<u8>);

pub(crate) fn read(files: &TlsFiles) -> Result<Contents, TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    Ok((read(&files.cert)?, read(&files.key)?))
}

pub(crate) fn pair(
    files: &TlsFiles,
    (cert, key): &Contents,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let pem = |path: &Path, what, detail: String| TlsError::Pem {
        path: path.to_path_buf(),
        what,
        detail,
    };
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(&files.cert, "certificate", format!(": {e}")))?;
    if chain.is_empty() {
        return Err(pem(&files.cert, "certificate", String::new()));
    }
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|e| pem(&files.key, "private key", format!(": {e}")))?;
    let mismatch = |detail: String| TlsError::Mismatch {
        cert: files.cert.clone(),
        key: files.key.clone(),
        detail,
    };
    let certified =
        CertifiedKey::from_der(chain, key, &provider()).map_err(|e| mismatch(e.to_string()))?;
    Ok(Arc::new(certified))
}

/// Reads and checks the pair: what the engine does at start, and what makes a bad flag
/// an error that names the file.
pub fn load(files: &TlsFiles) -> Result<Arc<CertifiedKey>, TlsError> {
    pair(files, &read(files)?)
}
