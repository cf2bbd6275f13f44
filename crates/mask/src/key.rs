//! The per-golden secret that keys every transformer.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A golden's masking secret: 32 random bytes. Whoever holds it and a masked
/// value can test guesses of the source value, so it is kept by the daemon
/// alone and never written into a golden, a fork, a log or an answer.
#[derive(Clone)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(***)")
    }
}

impl Key {
    /// A new random key.
    pub fn random() -> Key {
        Key(airlock_core::secret::random_bytes::<32>())
    }

    /// The key written as hex (for the daemon's store only).
    pub fn to_hex(&self) -> String {
        airlock_core::secret::hex(&self.0)
    }

    /// A key read back from [`Key::to_hex`].
    pub fn from_hex(text: &str) -> Option<Key> {
        if text.len() != 64 {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Key(bytes))
    }

    /// HMAC-SHA256 of `value` under this key, for transformer `tag` and draw
    /// `salt` (0 first; a collision draws again with the next).
    pub fn digest(&self, tag: &str, value: &str, salt: u32) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(tag.as_bytes());
        mac.update(&[0]);
        mac.update(value.as_bytes());
        mac.update(&[0]);
        mac.update(&salt.to_le_bytes());
        mac.finalize().into_bytes().into()
    }
}

/// Reads numbers off a digest, one after another.
pub(crate) struct Draw {
    bytes: [u8; 32],
    at: usize,
}

impl Draw {
    pub(crate) fn new(bytes: [u8; 32]) -> Draw {
        Draw { bytes, at: 0 }
    }

    /// A number below `n` (n > 0), from the next four bytes.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        let mut word = [0u8; 4];
        for w in &mut word {
            *w = self.bytes[self.at % 32];
            self.at += 1;
        }
        u32::from_le_bytes(word) as u64 % n.max(1)
    }

    /// One of `items`.
    pub(crate) fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }

    /// `n` hex digits.
    pub(crate) fn hex(&mut self, n: usize) -> String {
        let mut out = String::new();
        while out.len() < n {
            out.push_str(&format!("{:08x}", self.below(u32::MAX as u64 + 1)));
        }
        out.truncate(n);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_reads_back_and_never_prints() {
        let k = Key::random();
        let back = Key::from_hex(&k.to_hex()).unwrap();
        assert_eq!(k.digest("t", "v", 0), back.digest("t", "v", 0));
        assert_eq!(format!("{k:?}"), "Key(***)");
        assert!(Key::from_hex("zz").is_none());
    }

    #[test]
    fn digests_differ_by_key_tag_value_and_salt() {
        let (a, b) = (Key::random(), Key::random());
        let base = a.digest("email", "x@y.z", 0);
        assert_ne!(base, b.digest("email", "x@y.z", 0));
        assert_ne!(base, a.digest("name", "x@y.z", 0));
        assert_ne!(base, a.digest("email", "x@y.y", 0));
        assert_ne!(base, a.digest("email", "x@y.z", 1));
    }
}
