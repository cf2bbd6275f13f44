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

use airlock_core::error::{Error, ErrorCode, Result};

/// Certificate and key files the operator supplies instead of generated ones.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// The `tls-server-end-point` channel binding data (RFC 5929): the server
    /// certificate's hash, by the hash its signature uses. None when that hash
    /// is not one the binding defines, and SCRAM-SHA-256-PLUS is then not offered.
    pub end_point: Option<Vec<u8>>,
}

/// The ALPN protocol PostgreSQL 17+ clients send, and require for direct TLS.
pub const ALPN: &[u8] = b"postgresql";

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
    let end_point = end_point(&certs[0]);
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::internal(format!("TLS setup failed: {e}")))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| bad("certificate and key", &files.cert, &e))?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(Identity { config: Arc::new(config), ca, end_point })
}

/// The certificate's hash for `tls-server-end-point`: SHA-256 for signatures
/// made with MD5, SHA-1 or SHA-256, else the signature's own hash.
fn end_point(cert: &[u8]) -> Option<Vec<u8>> {
    use sha2::Digest;
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04];
    let oid = signature_algorithm(cert)?;
    let hash = match oid {
        [rsa @ .., last] if rsa == RSA => match last {
            0x04 | 0x05 | 0x0b => 256,
            0x0c => 384,
            0x0d => 512,
            _ => return None,
        },
        [ecdsa @ .., 0x01] if ecdsa == ECDSA => 256,
        [ecdsa @ .., 0x03, n] if ecdsa == ECDSA => match n {
            0x02 => 256,
            0x03 => 384,
            0x04 => 512,
            _ => return None,
        },
        _ => return None,
    };
    Some(match hash {
        256 => sha2::Sha256::digest(cert).to_vec(),
        384 => sha2::Sha384::digest(cert).to_vec(),
        _ => sha2::Sha512::digest(cert).to_vec(),
    })
}

/// The OID of a DER certificate's `signatureAlgorithm` (the second element of
/// the outer SEQUENCE), as its content bytes.
fn signature_algorithm(der: &[u8]) -> Option<&[u8]> {
    /// One DER element at the start of `der`: its tag, content and what follows.
    fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = der.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (first as usize, rest)
        } else {
            let n = (first & 0x7f) as usize;
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            (rest[..n].iter().fold(0usize, |acc, &b| acc << 8 | b as usize), &rest[n..])
        };
        (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
    }
    let (0x30, cert, _) = element(der)? else { return None };
    let (0x30, _, rest) = element(cert)? else { return None };
    let (0x30, algorithm, _) = element(rest)? else { return None };
    let (0x06, oid, _) = element(algorithm)? else { return None };
    Some(oid)
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

    write_private(&dir.join("ca.key"), ca.key().serialize_pem().as_bytes())?;
    write_private(&dir.join("server.key"), server_key.serialize_pem().as_bytes())?;
    std::fs::write(dir.join("server.crt"), format!("{}{}", server.pem(), ca.pem()))?;
    std::fs::write(dir.join("ca.crt"), ca.pem())?;
    std::fs::write(names_file, wanted)?;
    Ok(())
}

/// Writes a file only its owner can read, whole or not at all (written aside,
/// then renamed into place).
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().create_new(true).write(true).mode(0o600).open(&tmp)?;
    f.write_all(bytes)?;
    std::fs::rename(tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_certificate_binds_with_its_sha_256() {
        use sha2::Digest;
        let dir = std::env::temp_dir().join(format!("airlock-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let id = identity(&dir, None, "localhost").unwrap();
        let pem = std::fs::read(dir.join("server.crt")).unwrap();
        let cert = CertificateDer::pem_slice_iter(&pem).next().unwrap().unwrap();
        assert_eq!(signature_algorithm(&cert), Some(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02][..]));
        assert_eq!(id.end_point.unwrap(), sha2::Sha256::digest(&cert).to_vec());
        assert_eq!(signature_algorithm(b"\x30\x03\x02\x01"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
