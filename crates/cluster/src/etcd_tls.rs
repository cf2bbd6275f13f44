//! TLS to etcd: `--cluster https://...` with the CA that signed etcd's
//! server certificates (`--etcd-ca`), and this node's client certificate
//! when etcd asks for one (`--etcd-cert`, `--etcd-key`: etcd's
//! `--client-cert-auth`, which lets no one without a certificate of its CA
//! read or write the cluster's records).
//!
//! The files given are checked, then kept in the node's cluster directory
//! (root's, 0700), where the node's router, which reads etcd too, finds them;
//! later starts need no flags, and flags given again replace what is kept.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use airlock_core::error::{Error, ErrorCode, Result};

/// What `serve --etcd-ca/--etcd-cert/--etcd-key` names.
#[derive(Debug, Clone)]
pub struct Given {
    /// The CA certificate(s) etcd's server certificate is checked against.
    pub ca: PathBuf,
    /// This node's client certificate and its key, for etcd's client-certificate authentication.
    pub client: Option<(PathBuf, PathBuf)>,
}

const CA: &str = "etcd-ca.crt";
const CERT: &str = "etcd-client.crt";
const KEY: &str = "etcd-client.key";

fn bad(what: &str, path: &Path, why: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorCode::InvalidArguments,
        format!("{what} {} does not read: {why}", path.display()),
        "give PEM files: the CA that signed etcd's certificates (--etcd-ca), and this node's client certificate and key (--etcd-cert, --etcd-key)",
    )
}

/// A client configuration from PEM bytes: etcd checked against `ca`, and
/// `client` (certificate chain, key) shown when etcd asks.
fn config(ca: &[u8], client: Option<(&[u8], &[u8])>) -> std::result::Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        roots.add(cert.map_err(|e| format!("CA: {e}"))?).map_err(|e| format!("CA: {e}"))?;
    }
    if roots.is_empty() {
        return Err("CA: no certificate in it".into());
    }
    let builder =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
    match client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| format!("client certificate: {e}"))?;
            if chain.is_empty() {
                return Err("client certificate: no certificate in it".into());
            }
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("client key: {e}"))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| format!("client certificate and key: {e}"))
        }
    }
}

/// Checks the files `given` names and keeps them in `dir` (the node's
/// cluster directory), replacing what was kept.
pub fn install(dir: &Path, given: &Given) -> Result<()> {
    let read = |what: &str, path: &Path| std::fs::read(path).map_err(|e| bad(what, path, e));
    let ca = read("--etcd-ca", &given.ca)?;
    let client = match &given.client {
        Some((cert, key)) => Some((read("--etcd-cert", cert)?, read("--etcd-key", key)?)),
        None => None,
    };
    config(&ca, client.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice())))
        .map_err(|why| bad("--etcd-ca/--etcd-cert/--etcd-key", &given.ca, why))?;
    keep(dir, CA, &ca)?;
    match &client {
        Some((cert, key)) => {
            keep(dir, CERT, cert)?;
            keep(dir, KEY, key)?;
        }
        None => {
            for stale in [CERT, KEY] {
                match std::fs::remove_file(dir.join(stale)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

/// Writes `bytes` to `dir/name` whole, readable by root alone.
fn keep(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    Ok(airlock_host::storage::tree::write_private(&dir.join(name), bytes, 0o600)?)
}

/// The TLS configuration kept in `dir`, if any.
pub fn load(dir: &Path) -> Result<Option<Arc<rustls::ClientConfig>>> {
    let ca = match std::fs::read(dir.join(CA)) {
        Ok(ca) => ca,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let client = match (std::fs::read(dir.join(CERT)), std::fs::read(dir.join(KEY))) {
        (Ok(cert), Ok(key)) => Some((cert, key)),
        _ => None,
    };
    let config = config(&ca, client.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice()))).map_err(|why| {
        Error::internal(format!("the etcd TLS files kept in {} do not read: {why}", dir.display()))
    })?;
    Ok(Some(Arc::new(config)))
}
