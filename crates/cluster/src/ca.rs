//! The cluster's certificate authority and each node's identity under it:
//! every node-to-node connection is TLS 1.3 with both ends' certificates
//! checked against the cluster CA.
//!
//! `airlock cluster init` makes the CA on one node (`cluster/ca.key` stays
//! there); `airlock cluster token --node NAME --advertise ADDR` issues a
//! node's certificate and packs it with its key and the CA certificate into
//! a join token, a secret the new node's `serve --join FILE` installs once.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

use airlock_core::error::{Error, ErrorCode, Result};

/// What a join token starts with.
const TOKEN_PREFIX: &str = "airlock-join-1.";

/// The files of a node's cluster directory.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }
    fn node_cert(&self) -> PathBuf {
        self.dir.join("node.crt")
    }
    fn node_key(&self) -> PathBuf {
        self.dir.join("node.key")
    }
    fn node_name(&self) -> PathBuf {
        self.dir.join("node.name")
    }
}

/// What `cluster init` made.
#[derive(Debug, Serialize, Deserialize)]
pub struct Initialized {
    /// Where the CA's certificate is.
    pub ca_cert: PathBuf,
    /// The SHA-256 of the CA's certificate (DER), hex: what a joining node's token carries.
    pub fingerprint: String,
}

/// Makes the cluster CA in `dir`; refused if one is there.
pub fn init(dir: &Path) -> Result<Initialized> {
    let files = Files { dir: dir.to_owned() };
    if files.ca_cert().exists() || files.ca_key().exists() {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("a cluster CA is already in {}", dir.display()),
            "one CA serves the whole cluster: issue tokens with `airlock cluster token` instead",
        ));
    }
    private_dir(dir)?;
    let key = rcgen::KeyPair::generate().map_err(failed)?;
    let ca = ca_params()?.self_signed(&key).map_err(failed)?;
    write_private(&files.ca_key(), key.serialize_pem().as_bytes())?;
    write_private(&files.ca_cert(), ca.pem().as_bytes())?;
    Ok(Initialized { ca_cert: files.ca_cert(), fingerprint: crate::revoked::fingerprint(ca.der()) })
}

/// The CA's parameters: the same each time, so the key alone makes the issuer again.
fn ca_params() -> Result<rcgen::CertificateParams> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
    params.distinguished_name.push(rcgen::DnType::CommonName, "Airlock cluster CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    params.not_after = rcgen::date_time_ymd(2099, 12, 31);
    Ok(params)
}

/// What a join token holds: the node's certificate and key, and the CA's certificate.
#[derive(Serialize, Deserialize)]
struct Token {
    node: String,
    ca: String,
    cert: String,
    key: String,
}

/// Issues `node`'s certificate (naming it and `advertise`'s address) with
/// the CA in `dir`; returns the join token, a secret.
pub fn token(dir: &Path, node: &str, advertise: &str) -> Result<String> {
    let token = issued(dir, node, advertise)?;
    Ok(format!("{TOKEN_PREFIX}{}", B64.encode(serde_json::to_vec(&token).unwrap_or_default())))
}

/// `node`'s certificate and key, issued with the CA in `dir`.
fn issued(dir: &Path, node: &str, advertise: &str) -> Result<Token> {
    let files = Files { dir: dir.to_owned() };
    let ca_pem = std::fs::read_to_string(files.ca_cert()).map_err(|_| no_ca(dir))?;
    let ca_key = std::fs::read_to_string(files.ca_key()).map_err(|_| no_ca(dir))?;
    let (cert, der, key) = issue(&ca_key, node, advertise)?;
    crate::revoked::record_issued(dir, node, &der)?;
    Ok(Token { node: node.to_owned(), ca: ca_pem, cert, key })
}

/// Revokes every certificate the CA in `dir` issued to `node` (see [`crate::revoked`]).
pub fn revoke(dir: &Path, node: &str) -> Result<crate::revoked::Revocation> {
    let files = Files { dir: dir.to_owned() };
    let key = std::fs::read_to_string(files.ca_key()).map_err(|_| no_ca(dir))?;
    let pem = std::fs::read(files.ca_cert()).map_err(|_| no_ca(dir))?;
    let ca = CertificateDer::from_pem_slice(&pem).map_err(|_| {
        Error::internal(format!("the cluster CA certificate in {} does not read", dir.display()))
    })?;
    crate::revoked::revoke(dir, node, &ca, &key)
}

fn no_ca(dir: &Path) -> Error {
    Error::new(
        ErrorCode::InvalidRequest,
        format!("no cluster CA in {}", dir.display()),
        "run `airlock cluster init` on the node that keeps the CA, and issue tokens there",
    )
}

/// A node certificate (PEM and DER) and its key (PEM), signed by the CA.
fn issue(ca_key: &str, node: &str, advertise: &str) -> Result<(String, Vec<u8>, String)> {
    let ca_key = rcgen::KeyPair::from_pem(ca_key).map_err(failed)?;
    let issuer = rcgen::Issuer::new(ca_params()?, ca_key);
    let host = host_of(advertise)?;
    let mut names = vec![node.to_owned()];
    if host != node {
        names.push(host);
    }
    let mut params = rcgen::CertificateParams::new(names).map_err(failed)?;
    params.distinguished_name.push(rcgen::DnType::CommonName, node);
    params.not_after = rcgen::date_time_ymd(2099, 12, 31);
    params.extended_key_usages =
        vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().map_err(failed)?;
    let cert = params.signed_by(&key, &issuer).map_err(failed)?;
    Ok((cert.pem(), cert.der().to_vec(), key.serialize_pem()))
}

/// The host part of `HOST:PORT`.
pub fn host_of(advertise: &str) -> Result<String> {
    airlock_core::validate::host_of(advertise).map(str::to_owned).ok_or_else(|| {
        Error::new(
            ErrorCode::InvalidArguments,
            format!("{advertise:?} is not HOST:PORT"),
            "give the address other nodes reach this node's API on, such as 10.0.0.2:7440",
        )
    })
}

/// Installs a join token's files in `dir`, once; the token must be `node`'s.
pub fn join(dir: &Path, token: &str, node: &str) -> Result<()> {
    let bad = |why: &str| {
        Error::new(
            ErrorCode::InvalidArguments,
            format!("the join token does not read: {why}"),
            "issue one with `airlock cluster token --node NAME --advertise ADDR` on the node that keeps the CA",
        )
    };
    let body =
        token.trim().strip_prefix(TOKEN_PREFIX).ok_or_else(|| bad("it does not start as a token does"))?;
    let bytes = B64.decode(body).map_err(|_| bad("it is not base64"))?;
    let token: Token = serde_json::from_slice(&bytes).map_err(|_| bad("its contents are not a token's"))?;
    if token.node != node {
        return Err(Error::new(
            ErrorCode::InvalidArguments,
            format!("the join token is node {:?}'s, not {node:?}'s", token.node),
            "give --node the name the token was issued for, or issue a token for this name",
        ));
    }
    install(dir, &token)
}

/// Writes a token's files into `dir` (a CA certificate there must be the token's).
fn install(dir: &Path, token: &Token) -> Result<()> {
    let files = Files { dir: dir.to_owned() };
    private_dir(dir)?;
    if files.ca_cert().exists() && std::fs::read_to_string(files.ca_cert())? != token.ca {
        return Err(Error::new(
            ErrorCode::InvalidArguments,
            "the join token is of another cluster's CA than this node's",
            "a node belongs to one cluster: give it a data root of its own for another",
        ));
    }
    write_private(&files.ca_cert(), token.ca.as_bytes())?;
    write_private(&files.node_key(), token.key.as_bytes())?;
    write_private(&files.node_cert(), token.cert.as_bytes())?;
    write_private(&files.node_name(), token.node.as_bytes())?;
    Ok(())
}

/// A node's TLS identity in its cluster.
pub struct Identity {
    roots: Arc<rustls::RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    revoked: Arc<crate::revoked::Revoked>,
}

impl Identity {
    /// This node's identity from `dir`; a node keeping the CA issues its own
    /// certificate the first time.
    pub fn load(dir: &Path, node: &str, advertise: &str) -> Result<Identity> {
        let files = Files { dir: dir.to_owned() };
        if !files.node_cert().exists() && files.ca_key().exists() {
            install(dir, &issued(dir, node, advertise)?)?;
        }
        let missing = || {
            Error::new(
                ErrorCode::InvalidArguments,
                format!("this node has no cluster certificate in {}", dir.display()),
                "pass --join FILE with a token from `airlock cluster token --node NAME --advertise ADDR` (made where `airlock cluster init` ran)",
            )
        };
        let cert_pem = std::fs::read(files.node_cert()).map_err(|_| missing())?;
        let key_pem = std::fs::read(files.node_key()).map_err(|_| missing())?;
        let ca_pem = std::fs::read(files.ca_cert()).map_err(|_| missing())?;
        let unreadable =
            |what: &str| Error::internal(format!("the cluster {what} in {} does not read", dir.display()));
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| unreadable("certificate"))?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| unreadable("key"))?;
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&ca_pem)
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| unreadable("CA certificate"))?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in &cas {
            roots.add(ca.clone()).map_err(|_| unreadable("CA certificate"))?;
        }
        let ca = cas.first().cloned().ok_or_else(|| unreadable("CA certificate"))?;
        if std::fs::read_to_string(files.node_name()).ok().as_deref() != Some(node) {
            return Err(Error::new(
                ErrorCode::InvalidArguments,
                format!("this node's cluster certificate is not node {node:?}'s"),
                "a data root keeps its node name: start it with the --node it joined with",
            ));
        }
        let revoked = crate::revoked::Revoked::load(dir, ca)?;
        Ok(Identity { roots: Arc::new(roots), chain, key, revoked })
    }

    /// The certificates this node refuses.
    pub fn revoked(&self) -> Arc<crate::revoked::Revoked> {
        self.revoked.clone()
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// What this node's peer listener serves with: its certificate, and a
    /// client certificate the cluster CA signed, and not revoked, required
    /// of every peer. No session is resumed: each connection shows its
    /// certificate, so a revoked one cannot come back through an old session.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>> {
        let inner =
            rustls::server::WebPkiClientVerifier::builder_with_provider(self.roots.clone(), Self::provider())
                .build()
                .map_err(|e| Error::internal(format!("the cluster's client verifier: {e}")))?;
        let verifier = Arc::new(crate::revoked::RefusingClients { inner, revoked: self.revoked.clone() });
        let mut config = rustls::ServerConfig::builder_with_provider(Self::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| Error::internal(format!("TLS: {e}")))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| Error::internal(format!("the node's certificate: {e}")))?;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        Ok(Arc::new(config))
    }

    /// What this node connects to peers with: the cluster CA as the only root
    /// (a revoked peer refused), its own certificate for them to check, and
    /// no resumed session.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>> {
        let inner =
            rustls::client::WebPkiServerVerifier::builder_with_provider(self.roots.clone(), Self::provider())
                .build()
                .map_err(|e| Error::internal(format!("the cluster's server verifier: {e}")))?;
        let verifier = Arc::new(crate::revoked::RefusingServers { inner, revoked: self.revoked.clone() });
        let mut config = rustls::ClientConfig::builder_with_provider(Self::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| Error::internal(format!("TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| Error::internal(format!("the node's certificate: {e}")))?;
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Arc::new(config))
    }
}

fn failed(e: rcgen::Error) -> Error {
    Error::internal(format!("making a cluster certificate failed: {e}"))
}

fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}

/// Writes a file only its owner reads, whole or not at all.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(airlock_host::storage::tree::write_private(path, bytes, 0o600)?)
}
