//! One audit record and its line: the record's JSON with its own hash and MAC
//! put first.
//!
//! A line reads `{"hash":"<64 hex>","mac":"<64 hex>",<the rest of the body>}`.
//! The hash is the SHA-256 of the body exactly as written (`{<the rest of the
//! body>}`), and the body holds `prev`, the hash of the record before: changing
//! a byte changes the hash; removing, inserting or moving a record breaks the
//! next one's `prev`. The MAC is an HMAC-SHA256 of the hash under a key derived
//! from the log's signing key: anyone can compute a hash, only the daemon a MAC,
//! so a record written, or a chain rewritten, without the key shows.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use airlock_core::clock::Timestamp;
use airlock_core::events::{Door, JournalEntry};

/// The `prev` of the first record of a chain.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What the line of a record starts with, before its hash.
const HASH_PREFIX: &str = "{\"hash\":\"";
/// What comes between the hash and the MAC.
const MAC_PREFIX: &str = "\",\"mac\":\"";

/// The key records' MACs are made with (derived from the signing key).
#[derive(Clone)]
pub struct MacKey(pub [u8; 32]);

impl MacKey {
    /// An HMAC-SHA256 of `hash`, fed and ready to finish or check.
    fn over(&self, hash: &str) -> hmac::Hmac<Sha256> {
        use hmac::Mac;
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(hash.as_bytes());
        mac
    }

    /// The MAC of a record's hash.
    pub fn mac(&self, hash: &str) -> String {
        use hmac::Mac;
        airlock_core::secret::hex(&self.over(hash).finalize().into_bytes())
    }

    /// Whether `mac` is the MAC of `hash` (compared in constant time).
    pub fn verifies(&self, hash: &str, mac: &str) -> bool {
        use hmac::Mac;
        airlock_core::secret::unhex(mac).is_some_and(|bytes| self.over(hash).verify_slice(&bytes).is_ok())
    }
}

/// The body of an audit record: everything its hash covers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Its place in the chain, from 1, with no gaps.
    pub seq: u64,
    /// When the event happened.
    pub at: Timestamp,
    /// What happened (an event kind).
    pub kind: String,
    /// The way into the daemon it came through.
    pub door: Door,
    /// The sandbox concerned, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// The golden concerned, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub golden: Option<String>,
    /// The golden generation concerned, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Why (a deletion's or a suspension's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Extra facts; never secrets.
    pub detail: serde_json::Value,
    /// The hash of the record before (or [`GENESIS`]).
    pub prev: String,
}

/// A record with the hash of its body, as read back or exported.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Sealed {
    /// SHA-256 of the record's body, hex.
    pub hash: String,
    /// HMAC-SHA256 of the hash under the log's key, hex.
    pub mac: String,
    /// The record.
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub record: Record,
}

impl Record {
    /// The record of `entry` following the record `prev` at `seq - 1`.
    pub fn of(entry: &JournalEntry, seq: u64, prev: &str) -> Record {
        Record {
            seq,
            at: entry.at,
            kind: entry.kind.as_str().to_owned(),
            door: entry.door,
            sandbox: entry.sandbox.clone(),
            golden: entry.golden.clone(),
            generation: entry.generation,
            reason: entry.reason.clone(),
            detail: entry.detail.clone(),
            prev: prev.to_owned(),
        }
    }

    /// Its line (with the newline) and its hash, MAC'd with `key`.
    pub fn seal(&self, key: &MacKey) -> (String, String) {
        let body = json_line_safe(&serde_json::to_string(self).expect("a record serializes"));
        let hash = airlock_core::secret::hex(&Sha256::digest(body.as_bytes()));
        let mac = key.mac(&hash);
        // The body is an object with at least `seq`: it starts with "{" and is not "{}".
        let line = format!("{HASH_PREFIX}{hash}{MAC_PREFIX}{mac}\",{}\n", &body[1..]);
        (line, hash)
    }
}

/// JSON text with the characters some readers take for line ends (U+0085,
/// U+2028, U+2029), which serde_json leaves raw, escaped: a record stays one
/// line for every reader. The same JSON value either way.
pub fn json_line_safe(json: &str) -> String {
    if !json.contains(['\u{85}', '\u{2028}', '\u{2029}']) {
        return json.to_owned();
    }
    json.replace('\u{85}', "\\u0085").replace('\u{2028}', "\\u2028").replace('\u{2029}', "\\u2029")
}

/// Why a line is not a sound record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineFault {
    /// It is not of the form a record line has, or not the JSON of a record.
    Malformed(String),
    /// Its body does not hash to the hash it carries (it was edited).
    HashMismatch { carried: String, computed: String },
}

impl std::fmt::Display for LineFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineFault::Malformed(why) => write!(f, "is not a record ({why})"),
            LineFault::HashMismatch { carried, computed } => write!(
                f,
                "was altered: its content hashes to {} but it carries {}",
                &computed[..16],
                &carried[..carried.len().min(16)]
            ),
        }
    }
}

/// Reads one line (without its newline) back into a record, checking its hash
/// (not its MAC: see [`Sealed::mac_verifies`]).
pub fn open(line: &str) -> Result<Sealed, LineFault> {
    let rest = line
        .strip_prefix(HASH_PREFIX)
        .ok_or_else(|| LineFault::Malformed("it does not start with its hash".into()))?;
    let (hash, rest) =
        rest.split_at_checked(64).ok_or_else(|| LineFault::Malformed("its hash is cut short".into()))?;
    let rest = rest
        .strip_prefix(MAC_PREFIX)
        .ok_or_else(|| LineFault::Malformed("its hash is not followed by its MAC".into()))?;
    let (mac, rest) =
        rest.split_at_checked(64).ok_or_else(|| LineFault::Malformed("its MAC is cut short".into()))?;
    let rest = rest
        .strip_prefix("\",")
        .ok_or_else(|| LineFault::Malformed("its MAC is not 64 characters".into()))?;
    let body = format!("{{{rest}");
    let computed = airlock_core::secret::hex(&Sha256::digest(body.as_bytes()));
    if computed != hash {
        return Err(LineFault::HashMismatch { carried: hash.to_owned(), computed });
    }
    let record: Record = serde_json::from_str(&body).map_err(|e| LineFault::Malformed(e.to_string()))?;
    Ok(Sealed { hash: hash.to_owned(), mac: mac.to_owned(), record })
}

impl Sealed {
    /// Whether its MAC is the one `key` gives its hash (the record was written
    /// by a holder of the log's key).
    pub fn mac_verifies(&self, key: &MacKey) -> bool {
        key.verifies(&self.hash, &self.mac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::events::EventKind;

    fn entry() -> JournalEntry {
        JournalEntry {
            at: Timestamp(1_700_000_000_123),
            kind: EventKind::ToolCall,
            door: Door::McpHttp,
            sandbox: Some("sb1".into()),
            golden: Some("shop".into()),
            generation: Some(3),
            reason: None,
            detail: serde_json::json!({"tool": "run_sql", "statement": "SELECT '\"}\\n'"}),
        }
    }

    fn key() -> MacKey {
        MacKey([7; 32])
    }

    #[test]
    fn a_sealed_line_opens_to_the_same_record_and_hash() {
        let record = Record::of(&entry(), 7, GENESIS);
        let (line, hash) = record.seal(&key());
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        let opened = open(line.trim_end_matches('\n')).unwrap();
        assert_eq!(opened.record, record);
        assert_eq!(opened.hash, hash);
        assert!(opened.mac_verifies(&key()));
        assert!(!opened.mac_verifies(&MacKey([8; 32])), "another key's MAC differs");
        // The line is JSON whose `hash` is the record's.
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["hash"], hash.as_str());
        assert_eq!(v["door"], "mcp_http");
    }

    #[test]
    fn line_ending_characters_in_text_stay_escaped() {
        let mut e = entry();
        e.detail = serde_json::json!({"statement": "SELECT '\u{2028}\u{2029}\u{85}\u{202e}'"});
        let (line, _) = Record::of(&e, 1, GENESIS).seal(&key());
        assert_eq!(line.lines().count(), 1);
        assert!(!line.contains(['\u{2028}', '\u{2029}', '\u{85}']), "{line}");
        let opened = open(line.trim_end_matches('\n')).unwrap();
        assert_eq!(opened.record.detail, e.detail);
    }

    #[test]
    fn any_changed_byte_is_caught() {
        let (line, _) = Record::of(&entry(), 7, GENESIS).seal(&key());
        let line = line.trim_end_matches('\n');
        for i in 0..line.len() {
            let mut bytes = line.as_bytes().to_vec();
            bytes[i] ^= 0x01;
            let Ok(text) = String::from_utf8(bytes) else { continue };
            let seen = open(&text).map(|s| !s.mac_verifies(&key())).unwrap_or(true);
            assert!(seen, "a change at byte {i} went unseen: {text}");
        }
    }
}
