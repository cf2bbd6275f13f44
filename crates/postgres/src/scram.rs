//! SCRAM-SHA-256 verifiers: the router's, which clients authenticate against,
//! and the one inside each sandbox's server, which only the daemon's own
//! connections use.
//!
//! The router's verifier has PostgreSQL's default 4096 PBKDF2 iterations, because
//! drivers refuse fewer (pgjdbc and Bun require 4096). It is computed once per
//! credential, off the fork path where possible; checking a client's proof needs
//! no PBKDF2. The server's verifier has 16: agent passwords are 256 random bits,
//! which no amount of guessing reaches, and the router, the gateway and `exec`
//! repeat that work at every connection. The format and protocol are unchanged.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// PBKDF2 iterations in the verifier inside a sandbox's server.
pub const AGENT_ITERATIONS: u32 = 16;

/// PBKDF2 iterations in the router's verifier: PostgreSQL's default, the least
/// some drivers accept.
pub const ROUTER_ITERATIONS: u32 = 4096;

/// HMAC-SHA-256.
pub fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// PBKDF2-HMAC-SHA-256 with one output block (SCRAM's `Hi`).
pub fn salted_password(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut first = salt.to_vec();
    first.extend_from_slice(&1u32.to_be_bytes());
    let mut block = hmac(password, &first);
    let mut out = block;
    for _ in 1..iterations {
        block = hmac(password, &block);
        for (o, b) in out.iter_mut().zip(block) {
            *o ^= b;
        }
    }
    out
}

/// The `SCRAM-SHA-256$iterations:salt$StoredKey:ServerKey` verifier PostgreSQL
/// stores for `password`, with a fresh random salt. `password` must be ASCII
/// without spaces (SASLprep leaves it unchanged); agent passwords are hex.
pub fn verifier(password: &str, iterations: u32) -> String {
    let salt = airlock_core::secret::random_bytes::<16>();
    verifier_with_salt(password, &salt, iterations)
}

fn verifier_with_salt(password: &str, salt: &[u8], iterations: u32) -> String {
    debug_assert!(password.bytes().all(|b| b.is_ascii_graphic()));
    let salted = salted_password(password.as_bytes(), salt, iterations);
    let stored_key = Sha256::digest(hmac(&salted, b"Client Key"));
    let server_key = hmac(&salted, b"Server Key");
    format!(
        "SCRAM-SHA-256${iterations}:{}${}:{}",
        STANDARD.encode(salt),
        STANDARD.encode(stored_key),
        STANDARD.encode(server_key)
    )
}

/// A parsed `SCRAM-SHA-256$iterations:salt$StoredKey:ServerKey` verifier: what
/// the server side of SCRAM needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verifier {
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// The salt, raw.
    pub salt: Vec<u8>,
    /// SHA-256 of the client key.
    pub stored_key: [u8; 32],
    /// The server key.
    pub server_key: [u8; 32],
}

impl Verifier {
    /// Parses a verifier string; None if it is not one.
    pub fn parse(text: &str) -> Option<Verifier> {
        let rest = text.strip_prefix("SCRAM-SHA-256$")?;
        let (head, keys) = rest.split_once('$')?;
        let (iterations, salt) = head.split_once(':')?;
        let (stored, server) = keys.split_once(':')?;
        Some(Verifier {
            iterations: iterations.parse().ok().filter(|&i| i > 0)?,
            salt: STANDARD.decode(salt).ok()?,
            stored_key: STANDARD.decode(stored).ok()?.try_into().ok()?,
            server_key: STANDARD.decode(server).ok()?.try_into().ok()?,
        })
    }

    /// Whether `password` is the one this verifier was made from (for a door
    /// where the client sends the password itself, as Redis's `AUTH` does).
    pub fn accepts(&self, password: &str) -> bool {
        use sha2::Digest;
        let salted = salted_password(password.as_bytes(), &self.salt, self.iterations);
        let stored: [u8; 32] = sha2::Sha256::digest(hmac(&salted, b"Client Key")).into();
        // Compared in full, whatever the first difference.
        stored.iter().zip(self.stored_key.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_accepts_its_password_only() {
        let v = Verifier::parse(&verifier("right", 64)).unwrap();
        assert!(v.accepts("right"));
        assert!(!v.accepts("wrong"));
        assert!(!v.accepts(""));
    }

    #[test]
    fn matches_the_rfc_7677_example() {
        // RFC 7677, section 3: password "pencil", this salt, 4096 iterations. The
        // client proof there is ClientKey XOR ClientSignature; checking the server
        // signature needs the ServerKey, so compare ServerKey's use directly.
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = salted_password(b"pencil", &salt, 4096);
        let auth_message = "n=user,r=rOprNGfwEbeRWgbNEkqO,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let server_signature = hmac(&hmac(&salted, b"Server Key"), auth_message.as_bytes());
        assert_eq!(STANDARD.encode(server_signature), "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
    }

    #[test]
    fn verifiers_have_postgres_format_and_fresh_salts() {
        let a = verifier("abc123", AGENT_ITERATIONS);
        let b = verifier("abc123", AGENT_ITERATIONS);
        assert_ne!(a, b);
        let (head, keys) = a.split_once('$').unwrap().1.split_once('$').unwrap();
        assert!(head.starts_with(&format!("{AGENT_ITERATIONS}:")));
        assert_eq!(keys.split(':').count(), 2);
        let parsed = Verifier::parse(&a).unwrap();
        assert_eq!(parsed.iterations, AGENT_ITERATIONS);
        assert_eq!(parsed.salt.len(), 16);
        assert_eq!(Verifier::parse("SCRAM-SHA-256$0:AA==$AA==:AA=="), None);
        assert_eq!(Verifier::parse("md5abc"), None);
    }
}
