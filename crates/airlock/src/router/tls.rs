//! The router's TLS identity: a certificate authority and server certificate
//! generated on first start under `tls/` (or files the operator names), loaded
//! into a rustls server configuration.
//!
//! The generated CA (`tls/ca.crt`) is what clients pass as `sslrootcert` for
//! `sslmode=verify-full`; the server certificate names `localhost`, the loopback
//! addresses and the host the router advertises. Keys are written 0600.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Error, ErrorCode, Result};

/// Certificate and key files the operator supplies instead of generated ones.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// PEM certificate chain, server certificate first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// A loaded TLS identity.
pub struct Identity {
    /// The rustls server configuration.
    pub config: Arc<rustls::ServerConfig>,
    /// The CA clients should trust, when Airlock generated it.
    pub ca: Option<PathBuf>,
}

/// Loads the configured certificate, or the generated one under `dir` (making it
/// first if it is missing or does not name `advertised_host`).
pub fn identity(dir: &Path, configured: Option<&CertFiles>, advertised_host: &str) -> Result<Identity> {
    let (files, ca) = match configured {
        Some(files) => (files.clone(), None),
        None => {
            generated(dir, advertised_host)?;
            (
                CertFiles { cert: dir.join("server.crt"), key: dir.join("server.key") },
                Some(dir.join("ca.crt")),
            )
        }
    };
    let bad = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        Error::new(
            ErrorCode::InvalidRequest,
            format!("the router's TLS {what} {} cannot be used: {e}", path.display()),
            "pass a PEM certificate chain with --tls-cert and its PEM key with --tls-key, or leave both out to use a generated one",
        )
    };
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| bad("certificate", &files.cert, &e))?;
    if certs.is_empty() {
        return Err(bad("certificate", &files.cert, &"no certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| bad("key", &files.key, &e))?;
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::internal(format!("TLS setup failed: {e}")))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| bad("certificate and key", &files.cert, &e))?;
    Ok(Identity { config: Arc::new(config), ca })
}

/// The names every generated server certificate carries besides the advertised host.
const LOCAL_NAMES: &[&str] = &["localhost", "127.0.0.1", "::1"];

/// Makes `ca.crt`, `ca.key`, `server.crt` and `server.key` in `dir` unless they
/// exist and the server certificate names `host`.
fn generated(dir: &Path, host: &str) -> Result<()> {
    let names_file = dir.join("server.names");
    let mut names: Vec<String> = LOCAL_NAMES.iter().map(|s| s.to_string()).collect();
    if !names.iter().any(|n| n == host) {
        names.push(host.to_owned());
    }
    let wanted = names.join("\n");
    let complete = ["ca.crt", "ca.key", "server.crt", "server.key"].iter().all(|f| dir.join(f).exists());
    if complete && std::fs::read_to_string(&names_file).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let failed =
        |e: rcgen::Error| Error::internal(format!("generating the router's certificate failed: {e}"));
    let ca_key = match std::fs::read_to_string(dir.join("ca.key")) {
        Ok(pem) if complete => rcgen::KeyPair::from_pem(&pem).map_err(failed)?,
        _ => rcgen::KeyPair::generate().map_err(failed)?,
    };
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "Airlock router CA");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    ca_params.not_after = rcgen::date_time_ymd(2099, 12, 31);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).map_err(failed)?;

    let server_key = rcgen::KeyPair::generate().map_err(failed)?;
    let mut params = rcgen::CertificateParams::new(names).map_err(failed)?;
    params.distinguished_name.push(rcgen::DnType::CommonName, host);
    params.not_after = rcgen::date_time_ymd(2099, 12, 31);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let server = params.signed_by(&server_key, &ca).map_err(failed)?;

    write_private(&dir.join("ca.key"), &ca.key().serialize_pem())?;
    write_private(&dir.join("server.key"), &server_key.serialize_pem())?;
    std::fs::write(dir.join("server.crt"), format!("{}{}", server.pem(), ca.pem()))?;
    std::fs::write(dir.join("ca.crt"), ca.pem())?;
    std::fs::write(names_file, wanted)?;
    Ok(())
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().create_new(true).write(true).mode(0o600).open(&tmp)?;
    f.write_all(text.as_bytes())?;
    std::fs::rename(tmp, path)?;
    Ok(())
}
