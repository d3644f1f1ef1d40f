//! The TLS a mirror uses to reach an `https` upstream (its discovery and snapshot requests and
//! its `wss` replication socket): the system's trusted roots, plus any certificates the operator
//! names for an upstream signed by a private authority.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio_rustls::rustls;

#[derive(Debug, thiserror::Error)]
pub enum MirrorTlsError {
    #[error("cannot read the mirror's CA certificates {path}: {source}")]
    Certificates {
        path: String,
        source: rustls_pki_types::pem::Error,
    },
    #[error("the mirror's CA file {0} holds no certificate")]
    NoCertificate(String),
    #[error("the mirror's CA file {path} holds a certificate that cannot be trusted: {source}")]
    Untrusted { path: String, source: rustls::Error },
    #[error("the mirror's TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The client configuration for `https` and `wss` upstreams: the system's roots (those it cannot
/// read are skipped, with a warning) and the certificates in `extra_roots`, a PEM file.
pub fn client_config(
    extra_roots: Option<&Path>,
) -> Result<Arc<rustls::ClientConfig>, MirrorTlsError> {
    let mut roots = rustls::RootCertStore::empty();
    let system = rustls_native_certs::load_native_certs();
    for error in &system.errors {
        tracing::warn!(%error, "skipping a system root certificate the mirror cannot read");
    }
    let (_, unusable) = roots.add_parsable_certificates(system.certs);
    if unusable > 0 {
        tracing::warn!(
            unusable,
            "skipping system root certificates the mirror cannot use"
        );
    }
    if let Some(path) = extra_roots {
        let shown = || path.display().to_string();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect())
            .map_err(|source| MirrorTlsError::Certificates {
                path: shown(),
                source,
            })?;
        if certs.is_empty() {
            return Err(MirrorTlsError::NoCertificate(shown()));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|source| MirrorTlsError::Untrusted {
                    path: shown(),
                    source,
                })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_without_a_certificate_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let error = client_config(Some(&empty)).unwrap_err().to_string();
        assert!(error.contains("empty.pem"), "{error}");
        let missing = dir.path().join("missing.pem");
        assert!(client_config(Some(&missing)).is_err());
    }

    #[test]
    fn a_ca_file_with_a_certificate_is_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, cert.cert.pem()).unwrap();
        assert!(client_config(Some(&path)).is_ok());
    }
}
