//! Random identifiers and credentials from the operating system's CSPRNG.

const ALPHABET: &[u8] = b"abcdefghijkmnpqrstuvwxyz23456789";

/// `N` bytes from the operating system's random source.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    getrandom::fill(&mut buf).expect("the OS random source failed");
    buf
}

/// Lowercase hex of `bytes`: how ids, tokens and digests are written.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of lowercase or uppercase hex text; `None` if it is not hex.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len() / 2).map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()).collect()
}

/// A fingerprint for records: the first 16 hex digits of the SHA-256 of a
/// secret (which names the credential without revealing it) or of a key.
pub fn fingerprint(bytes: impl AsRef<[u8]>) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(bytes.as_ref()))[..16].to_owned()
}

/// A short sandbox id such as `sb-k3v9q2mx7a`: 50 bits, unambiguous characters.
pub fn sandbox_id() -> String {
    format!("sb-{}", id_tail())
}

/// A short grant id such as `gr-k3v9q2mx7a`, in the same alphabet.
pub fn grant_id() -> String {
    format!("gr-{}", id_tail())
}

/// Ten characters of an id: 50 bits, unambiguous characters.
fn id_tail() -> String {
    let bytes = random_bytes::<10>();
    bytes.iter().map(|b| ALPHABET[(*b as usize) % ALPHABET.len()] as char).collect()
}

/// A fresh password: 256 random bits, hex-encoded so it needs no quoting in a DSN.
pub fn password() -> String {
    hex(&random_bytes::<32>())
}

/// `text` with every occurrence of `secret` replaced by `***`; unchanged when
/// there is no secret (an empty one would match between every character).
pub fn scrub(text: &str, secret: &str) -> String {
    if secret.is_empty() {
        return text.to_owned();
    }
    text.replace(secret, "***")
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_and_passwords_are_distinct_and_well_formed() {
        let a = super::sandbox_id();
        assert_ne!(a, super::sandbox_id());
        assert!(a.starts_with("sb-") && a.len() == 13);
        let p = super::password();
        assert_eq!(p.len(), 64);
        assert_ne!(p, super::password());
    }

    #[test]
    fn scrubbing_hides_a_secret_and_leaves_text_alone_without_one() {
        let text = "pg_dump: error: password authentication failed for hunter2";
        assert_eq!(super::scrub(text, "hunter2"), "pg_dump: error: password authentication failed for ***");
        assert_eq!(super::scrub(text, ""), text);
    }
}
