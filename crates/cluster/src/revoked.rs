//! Revoked node certificates. `airlock cluster revoke NODE`, on the node
//! that keeps the CA, lists every certificate the CA issued to NODE (by
//! SHA-256 fingerprint) in a numbered list signed with the CA's key. The
//! list reaches the other nodes through etcd; each checks the signature
//! against the CA certificate, takes only a list newer than the one it holds
//! (so an older list put back cannot let a certificate in again), keeps it
//! in its cluster directory, and refuses a listed certificate in every
//! handshake from then on: on its peer port and its router's relay port, and
//! as a client of either. Sessions are never resumed on those ports, so a
//! revoked certificate cannot come back through a session it began before.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};

use airlock_core::error::{Error, ErrorCode, Result};

/// The list's file in a node's cluster directory.
pub const FILE: &str = "revoked.json";
/// What the CA's node records of each certificate it issued.
const ISSUED: &str = "issued.json";
/// What the signature covers besides the list, so no other signature of the CA's key stands for one.
const DOMAIN: &[u8] = b"airlock revoked node certificates v1\0";

/// The revoked certificates, numbered: a higher number replaces a lower.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct List {
    /// Its number: each revocation adds one.
    pub number: u64,
    /// Each revoked certificate's SHA-256 fingerprint (hex), with the node it was issued to.
    pub certificates: BTreeMap<String, String>,
}

/// A list as it travels: its JSON, and the CA key's signature over it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Signed {
    list: String,
    signature: String,
}

/// A certificate's SHA-256 over its DER, hex: how a certificate is named here.
pub(crate) fn fingerprint(der: &[u8]) -> String {
    use sha2::Digest;
    airlock_core::secret::hex(&sha2::Sha256::digest(der))
}

fn signed_bytes(list_b64: &str) -> Vec<u8> {
    [DOMAIN, list_b64.as_bytes()].concat()
}

/// Records, on the CA's node, that `cert` (DER) was issued to `node`.
pub(crate) fn record_issued(dir: &Path, node: &str, cert: &[u8]) -> Result<()> {
    let path = dir.join(ISSUED);
    // Tokens issued at once each add their certificate: one at a time.
    let _held = exclusive(dir)?;
    let mut issued: BTreeMap<String, String> = match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| Error::internal(format!("{} does not read: {e}", path.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => return Err(e.into()),
    };
    issued.insert(fingerprint(cert), node.to_owned());
    let bytes = serde_json::to_vec_pretty(&issued).map_err(|e| Error::internal(e.to_string()))?;
    Ok(airlock_host::storage::tree::write_private(&path, &bytes, 0o600)?)
}

/// The CA directory's lock, held while its records change.
fn exclusive(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(dir.join("ca.lock"))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| Error::internal(format!("locking {}: {e}", dir.display())))
}

/// What `cluster revoke` did.
#[derive(Debug, Serialize, Deserialize)]
pub struct Revocation {
    /// The node whose certificates were revoked.
    pub node: String,
    /// Their fingerprints.
    pub certificates: Vec<String>,
    /// The list's new number.
    pub number: u64,
}

/// Revokes every certificate the CA in `dir` (`ca`, its key `ca_key_pem`)
/// issued to `node`: a new list, signed with the CA's key, kept in `dir`
/// (the node's daemon puts it in etcd at its next round).
pub fn revoke(dir: &Path, node: &str, ca: &CertificateDer<'_>, ca_key_pem: &str) -> Result<Revocation> {
    // Two revocations at once must not both take the same number.
    let _held = exclusive(dir)?;
    let issued: BTreeMap<String, String> = std::fs::read(dir.join(ISSUED))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let theirs: Vec<String> = issued.iter().filter(|(_, n)| *n == node).map(|(f, _)| f.clone()).collect();
    if theirs.is_empty() {
        return Err(Error::new(
            ErrorCode::InvalidArguments,
            format!("the CA in {} issued no certificate to node {node:?}", dir.display()),
            "name a node a token was issued for here (`airlock nodes` lists them)",
        ));
    }
    let mut list = read_verified(dir, ca)?.unwrap_or_default();
    list.number += 1;
    for f in &theirs {
        list.certificates.insert(f.clone(), node.to_owned());
    }
    let key = rcgen::KeyPair::from_pem(ca_key_pem)
        .map_err(|e| Error::internal(format!("the cluster CA's key does not read: {e}")))?;
    let body = B64.encode(serde_json::to_vec(&list).map_err(|e| Error::internal(e.to_string()))?);
    let signature = rcgen::SigningKey::sign(&key, &signed_bytes(&body))
        .map_err(|e| Error::internal(format!("signing the revoked list failed: {e}")))?;
    let signed = Signed { list: body, signature: B64.encode(signature) };
    let bytes = serde_json::to_vec(&signed).map_err(|e| Error::internal(e.to_string()))?;
    airlock_host::storage::tree::write_private(&dir.join(FILE), &bytes, 0o600)?;
    Ok(Revocation { node: node.to_owned(), certificates: theirs, number: list.number })
}

/// The list in `bytes`, if the CA (`ca`, DER) signed it.
fn verified(ca: &CertificateDer<'_>, bytes: &[u8]) -> std::result::Result<List, String> {
    let signed: Signed = serde_json::from_slice(bytes).map_err(|e| format!("it does not read: {e}"))?;
    let signature = B64.decode(&signed.signature).map_err(|_| "its signature is not base64".to_owned())?;
    let ca = webpki::EndEntityCert::try_from(ca).map_err(|e| format!("the CA certificate: {e}"))?;
    ca.verify_signature(webpki::ring::ECDSA_P256_SHA256, &signed_bytes(&signed.list), &signature)
        .map_err(|_| "it is not signed by the cluster's CA".to_owned())?;
    let list = B64.decode(&signed.list).map_err(|_| "its list is not base64".to_owned())?;
    serde_json::from_slice(&list).map_err(|e| format!("its list does not read: {e}"))
}

fn read_verified(dir: &Path, ca: &CertificateDer<'_>) -> Result<Option<List>> {
    match std::fs::read(dir.join(FILE)) {
        Ok(bytes) => verified(ca, &bytes).map(Some).map_err(|why| {
            Error::internal(format!("the revoked list in {} is refused: {why}", dir.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The revoked certificates a node refuses, kept current from its cluster
/// directory.
pub struct Revoked {
    dir: PathBuf,
    ca: CertificateDer<'static>,
    held: RwLock<List>,
    /// The held list's number, read without the lock (connections check it on each read).
    number: AtomicU64,
    /// The file's modification time when it was last read.
    seen: RwLock<Option<SystemTime>>,
}

impl std::fmt::Debug for Revoked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Revoked").field("number", &self.number()).finish()
    }
}

impl Revoked {
    /// The list kept in `dir` (none yet: nothing revoked), checked against
    /// the cluster's CA certificate `ca`.
    pub fn load(dir: &Path, ca: CertificateDer<'static>) -> Result<Arc<Revoked>> {
        let revoked = Arc::new(Revoked {
            dir: dir.to_owned(),
            ca,
            held: RwLock::new(List::default()),
            number: AtomicU64::new(0),
            seen: RwLock::new(None),
        });
        revoked.reread()?;
        Ok(revoked)
    }

    /// Whether the certificate `der` is revoked.
    pub fn refuses(&self, der: &[u8]) -> bool {
        self.refuses_fingerprint(&fingerprint(der))
    }

    /// Whether the certificate of this SHA-256 fingerprint (hex) is revoked.
    pub fn refuses_fingerprint(&self, fingerprint: &str) -> bool {
        self.held.read().expect("not poisoned").certificates.contains_key(fingerprint)
    }

    /// The held list's number (0: none); it changes only when a newer list is taken.
    pub fn number(&self) -> u64 {
        self.number.load(Ordering::Acquire)
    }

    /// The held list as it travels, if there is one.
    pub fn signed(&self) -> Option<Vec<u8>> {
        std::fs::read(self.dir.join(FILE)).ok()
    }

    /// Takes the list in `bytes` if the CA signed it and it is newer than
    /// the one held, and keeps it; its number, and whether it was taken.
    pub fn offer(&self, bytes: &[u8]) -> Result<(u64, bool)> {
        let list = verified(&self.ca, bytes).map_err(|why| {
            Error::new(
                ErrorCode::ClusterUnavailable,
                format!("a revoked list was refused: {why}"),
                "see the daemon log",
            )
        })?;
        let number = list.number;
        if number <= self.number() {
            return Ok((number, false));
        }
        airlock_host::storage::tree::write_private(&self.dir.join(FILE), bytes, 0o600)?;
        Ok((number, self.take(list)))
    }

    fn take(&self, list: List) -> bool {
        let mut held = self.held.write().expect("not poisoned");
        if list.number <= held.number {
            return false;
        }
        let names: BTreeSet<&String> = list.certificates.values().collect();
        tracing::warn!(number = list.number, nodes = ?names, "node certificates revoked");
        self.number.store(list.number, Ordering::Release);
        *held = list;
        true
    }

    /// Reads the kept file again if it changed since it was last read;
    /// whether a newer list was taken.
    pub(crate) fn reread(&self) -> Result<bool> {
        let modified = std::fs::metadata(self.dir.join(FILE)).and_then(|m| m.modified()).ok();
        if modified.is_none() || *self.seen.read().expect("not poisoned") == modified {
            return Ok(false);
        }
        *self.seen.write().expect("not poisoned") = modified;
        match read_verified(&self.dir, &self.ca)? {
            Some(list) => Ok(self.take(list)),
            None => Ok(false),
        }
    }

    /// Follows the kept file (another process of the node keeps it current):
    /// read again every `every`, for as long as the process lives.
    pub fn follow(self: &Arc<Self>, every: Duration) {
        let revoked = Arc::downgrade(self);
        let _ = std::thread::Builder::new().name("revoked".into()).spawn(move || loop {
            std::thread::sleep(every);
            let Some(revoked) = revoked.upgrade() else { return };
            if let Err(e) = revoked.reread() {
                tracing::warn!(error = %e, "the revoked list kept here does not read");
            }
        });
    }
}

/// A verifier of peers' certificates that refuses revoked ones after the
/// CA's own checks pass.
#[derive(Debug)]
pub struct RefusingClients {
    pub(crate) inner: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    pub(crate) revoked: Arc<Revoked>,
}

fn revoked_error() -> rustls::Error {
    rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked)
}

impl rustls::server::danger::ClientCertVerifier for RefusingClients {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }
    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        if self.revoked.refuses(end_entity) {
            return Err(revoked_error());
        }
        Ok(verified)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A verifier of the nodes this node connects to, refusing revoked certificates.
#[derive(Debug)]
pub struct RefusingServers {
    pub(crate) inner: Arc<dyn rustls::client::danger::ServerCertVerifier>,
    pub(crate) revoked: Arc<Revoked>,
}

impl rustls::client::danger::ServerCertVerifier for RefusingServers {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let verified =
            self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
        if self.revoked.refuses(end_entity) {
            return Err(revoked_error());
        }
        Ok(verified)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("airlock-revoked-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        crate::ca::init(&dir).unwrap();
        dir
    }

    fn ca_of(dir: &Path) -> CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(&std::fs::read(dir.join("ca.crt")).unwrap()).unwrap()
    }

    fn cert_of(token: &str) -> Vec<u8> {
        use rustls::pki_types::pem::PemObject;
        let body = token.strip_prefix("airlock-join-1.").unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(body).unwrap())
                .unwrap();
        CertificateDer::from_pem_slice(json["cert"].as_str().unwrap().as_bytes()).unwrap().to_vec()
    }

    #[test]
    fn only_a_newer_list_the_ca_signed_is_taken() {
        let dir = cluster_dir("a");
        let key = std::fs::read_to_string(dir.join("ca.key")).unwrap();
        let b = cert_of(&crate::ca::token(&dir, "b", "10.0.0.2:7440").unwrap());
        let c = cert_of(&crate::ca::token(&dir, "c", "10.0.0.3:7440").unwrap());
        // A node elsewhere holds the same CA certificate and no list.
        let elsewhere = std::env::temp_dir().join(format!("airlock-revoked-e-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&elsewhere);
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::copy(dir.join("ca.crt"), elsewhere.join("ca.crt")).unwrap();
        let there = Revoked::load(&elsewhere, ca_of(&elsewhere)).unwrap();
        assert!(!there.refuses(&b));

        assert_eq!(revoke(&dir, "b", &ca_of(&dir), &key).unwrap().number, 1);
        let first = std::fs::read(dir.join(FILE)).unwrap();
        assert!(there.offer(&first).unwrap().1);
        assert!(there.refuses(&b) && !there.refuses(&c));
        assert_eq!(revoke(&dir, "c", &ca_of(&dir), &key).unwrap().number, 2);
        let second = std::fs::read(dir.join(FILE)).unwrap();
        assert!(there.offer(&second).unwrap().1);
        assert!(there.refuses(&b) && there.refuses(&c));
        // The older list, put back, lets nothing in again.
        assert_eq!(there.offer(&first).unwrap(), (1, false));
        assert!(there.refuses(&c));
        // A list with an entry taken out, its signature kept: refused.
        let mut signed: Signed = serde_json::from_slice(&second).unwrap();
        let mut list: List = serde_json::from_slice(&B64.decode(&signed.list).unwrap()).unwrap();
        list.certificates.clear();
        list.number = 9;
        signed.list = B64.encode(serde_json::to_vec(&list).unwrap());
        assert!(there.offer(&serde_json::to_vec(&signed).unwrap()).is_err());
        // Another CA's list: refused, however high its number.
        let other = cluster_dir("o");
        let other_key = std::fs::read_to_string(other.join("ca.key")).unwrap();
        crate::ca::token(&other, "x", "10.0.0.9:7440").unwrap();
        for _ in 0..3 {
            revoke(&other, "x", &ca_of(&other), &other_key).unwrap();
        }
        assert!(there.offer(&std::fs::read(other.join(FILE)).unwrap()).is_err());
        assert_eq!(there.number(), 2);
        // What was taken is kept, and read at the next start.
        assert!(Revoked::load(&elsewhere, ca_of(&elsewhere)).unwrap().refuses(&c));
        for d in [dir, other, elsewhere] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
