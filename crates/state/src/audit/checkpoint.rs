//! Signed checkpoints of the chain's head, and the Ed25519 key that signs them.
//!
//! A checkpoint says "record `seq` has hash `hash`", signed. It pins the chain:
//! a segment rebuilt to be consistent with itself no longer matches the hashes
//! the checkpoints signed, and a chain that ends before a checkpoint's record
//! was cut short. Checkpoints are appended to `checkpoints.jsonl`; shipped off
//! the host (`airlock audit checkpoint`, the trace exporter) they also catch a
//! tail removed together with the checkpoints that covered it.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use base64::Engine as _;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::record::MacKey;
use airlock_core::clock::Timestamp;
use airlock_core::error::{Error, Result};

/// The private key file (PKCS#8, mode 0600).
pub const KEY_FILE: &str = "signing.key";
/// The public key file (32 bytes, hex).
pub const PUBLIC_KEY_FILE: &str = "signing.pub";
/// Where checkpoints are appended, one JSON object per line.
pub const CHECKPOINTS_FILE: &str = "checkpoints.jsonl";

/// Where removed segments are noted, one signed [`Retired`] per line.
pub const RETIRED_FILE: &str = "retired.jsonl";

/// A signed statement of the chain's head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Checkpoint {
    /// The sequence number of the record it covers.
    pub seq: u64,
    /// That record's hash.
    pub hash: String,
    /// When it was signed.
    pub at: Timestamp,
    /// The fingerprint of the public key that signed it ([`airlock_core::secret::fingerprint`]).
    pub key: String,
    /// The Ed25519 signature of [`Checkpoint::message`], base64.
    pub signature: String,
}

impl Checkpoint {
    /// The bytes signed: a fixed tag, then the record's number, hash and the time.
    pub fn message(seq: u64, hash: &str, at: Timestamp) -> Vec<u8> {
        format!("airlock-audit-checkpoint-v1\n{seq}\n{hash}\n{}", at.0).into_bytes()
    }

    /// Whether `public_key` signed this checkpoint.
    pub fn verify(&self, public_key: &[u8]) -> bool {
        signed_by(public_key, &Checkpoint::message(self.seq, &self.hash, self.at), &self.signature)
    }
}

/// Whether `signature` (base64) is `public_key`'s Ed25519 signature of `message`.
fn signed_by(public_key: &[u8], message: &[u8], signature: &str) -> bool {
    base64::engine::general_purpose::STANDARD.decode(signature).is_ok_and(|signature| {
        UnparsedPublicKey::new(&ED25519, public_key).verify(message, &signature).is_ok()
    })
}

/// A segment removed by retention, signed: the chain after it starts from its
/// last record, and only the key's holder can say where that is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Retired {
    /// The segment's number.
    pub segment: u64,
    /// Its last record's sequence number.
    pub last_seq: u64,
    /// Its last record's hash.
    pub last_hash: String,
    /// When it was removed.
    pub at: Timestamp,
    /// The fingerprint of the key that signed this note.
    pub key: String,
    /// The Ed25519 signature of [`Retired::message`], base64.
    pub signature: String,
}

impl Retired {
    /// The bytes signed.
    pub fn message(segment: u64, last_seq: u64, last_hash: &str, at: Timestamp) -> Vec<u8> {
        format!("airlock-audit-retired-v1\n{segment}\n{last_seq}\n{last_hash}\n{}", at.0).into_bytes()
    }

    /// Whether `public_key` signed this note.
    pub fn verify(&self, public_key: &[u8]) -> bool {
        let message = Retired::message(self.segment, self.last_seq, &self.last_hash, self.at);
        signed_by(public_key, &message, &self.signature)
    }
}

/// The audit log's signing key, and the MAC key derived from it.
pub struct Signer {
    pair: Ed25519KeyPair,
    fingerprint: String,
    mac: MacKey,
}

/// The MAC key of a signing key's PKCS#8 document.
fn mac_key_of(pkcs8: &[u8]) -> MacKey {
    let mut digest = Sha256::new();
    digest.update(b"airlock-audit-mac-v1\n");
    digest.update(pkcs8);
    MacKey(digest.finalize().into())
}

/// The keys in `dir`, when its private key can be read: the MAC key and the
/// public key the private one goes with (so `signing.pub` can be checked).
pub fn local_keys(dir: &Path) -> Option<(MacKey, Vec<u8>)> {
    let pkcs8 = std::fs::read(dir.join(KEY_FILE)).ok()?;
    let pair = Ed25519KeyPair::from_pkcs8(&pkcs8).ok()?;
    Some((mac_key_of(&pkcs8), pair.public_key().as_ref().to_vec()))
}

impl Signer {
    /// Loads the key in `dir`, generating it (0600) and its public half on first use.
    pub fn load_or_create(dir: &Path) -> Result<Signer> {
        let path = dir.join(KEY_FILE);
        let pkcs8 = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The daemon and its router process may both start here: the key
                // is written whole under another name, then linked into place,
                // so one of them makes it and neither reads half of it.
                let rng = ring::rand::SystemRandom::new();
                let document = Ed25519KeyPair::generate_pkcs8(&rng)
                    .map_err(|_| Error::internal("generating the audit signing key failed"))?;
                let staged = dir.join(format!("{KEY_FILE}.{}", std::process::id()));
                let _ = std::fs::remove_file(&staged);
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&staged)
                    .and_then(|mut file| {
                        file.write_all(document.as_ref())?;
                        file.sync_all()
                    })
                    .map_err(|e| Error::io(format!("writing {}", staged.display()), &e))?;
                let linked = std::fs::hard_link(&staged, &path);
                let _ = std::fs::remove_file(&staged);
                match linked {
                    Ok(()) => document.as_ref().to_vec(),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        return Signer::load_or_create(dir)
                    }
                    Err(e) => return Err(Error::io(format!("creating {}", path.display()), &e)),
                }
            }
            Err(e) => return Err(Error::io(format!("reading {}", path.display()), &e)),
        };
        let pair = Ed25519KeyPair::from_pkcs8(&pkcs8).map_err(|e| {
            Error::internal(format!(
                "{} is not an Ed25519 key ({e}); move it away to make a new one",
                path.display()
            ))
        })?;
        let public = pair.public_key().as_ref().to_vec();
        let public_path = dir.join(PUBLIC_KEY_FILE);
        let hex = airlock_core::secret::hex(&public);
        if std::fs::read_to_string(&public_path).map(|t| t.trim() != hex).unwrap_or(true) {
            std::fs::write(&public_path, format!("{hex}\n"))
                .map_err(|e| Error::io(format!("writing {}", public_path.display()), &e))?;
        }
        Ok(Signer { fingerprint: airlock_core::secret::fingerprint(&public), mac: mac_key_of(&pkcs8), pair })
    }

    /// The key records' MACs are made with.
    pub fn mac_key(&self) -> &MacKey {
        &self.mac
    }

    /// A signed note that segment `segment`, ending with record `last_seq`
    /// of hash `last_hash`, was removed.
    pub fn sign_retired(&self, segment: u64, last_seq: u64, last_hash: &str) -> Retired {
        let at = Timestamp::now();
        let signature = self.signature(&Retired::message(segment, last_seq, last_hash, at));
        Retired {
            segment,
            last_seq,
            last_hash: last_hash.to_owned(),
            at,
            key: self.fingerprint.clone(),
            signature,
        }
    }

    /// A checkpoint of record `seq` with hash `hash`, signed now.
    pub fn sign(&self, seq: u64, hash: &str) -> Checkpoint {
        let at = Timestamp::now();
        let signature = self.signature(&Checkpoint::message(seq, hash, at));
        Checkpoint { seq, hash: hash.to_owned(), at, key: self.fingerprint.clone(), signature }
    }

    /// The Ed25519 signature of `message`, base64.
    fn signature(&self, message: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.pair.sign(message).as_ref())
    }
}

/// The public key in `dir` (written next to the private one), as bytes.
pub fn public_key(dir: &Path) -> Result<Vec<u8>> {
    let path = dir.join(PUBLIC_KEY_FILE);
    let text =
        std::fs::read_to_string(&path).map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
    parse_public_key(text.trim())
}

/// A public key given as 64 hex digits.
pub fn parse_public_key(hex: &str) -> Result<Vec<u8>> {
    let bad = || {
        Error::new(
            airlock_core::error::ErrorCode::InvalidRequest,
            format!("{hex:?} is not an Ed25519 public key"),
            "give the 64 hex digits of $AIRLOCK_HOME/audit/signing.pub",
        )
    };
    airlock_core::secret::unhex(hex).filter(|key| key.len() == 32).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_verifies_only_under_its_key_and_as_signed() {
        let dir = std::env::temp_dir().join(format!("airlock-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let signer = Signer::load_or_create(&dir).unwrap();
        let key = public_key(&dir).unwrap();
        let mode = std::fs::metadata(dir.join(KEY_FILE)).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
        let checkpoint = signer.sign(42, &"ab".repeat(32));
        assert!(checkpoint.verify(&key));
        let mut moved = checkpoint.clone();
        moved.seq = 43;
        assert!(!moved.verify(&key));
        // The same key loads again; another directory's key does not verify.
        let again = Signer::load_or_create(&dir).unwrap();
        assert!(again.sign(1, GENESIS_LIKE).verify(&key));
        let other = dir.join("other");
        std::fs::create_dir_all(&other).unwrap();
        let stranger = Signer::load_or_create(&other).unwrap();
        assert!(!stranger.sign(42, &"ab".repeat(32)).verify(&key));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    const GENESIS_LIKE: &str = super::super::record::GENESIS;
}
