//! A report's seal: the MAC the daemon puts on every report `migrate test`
//! writes, so that `migrate promote` acts only on what a test measured.
//!
//! A report travels through the client's hands (a file, a request body). Its
//! hashes, hazards, per-statement records and changed-row digests are what
//! promote holds the target to, so a report edited on the way (a tested
//! file's hash put on an untested one, a table's key digest renamed away)
//! would turn promote's checks off. The seal is an HMAC-SHA256, under a key
//! only the daemon reads, of the report in its canonical form (serialized,
//! read back and serialized again, so that what any faithful copy parses to
//! seals alike); promote recomputes it before it reads anything else.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::report::Report;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::Layout;

/// What the MAC covers besides the report, so that no other MAC the daemon
/// makes can stand for a report's.
const DOMAIN: &[u8] = b"airlock migrate report v1\0";

/// The key's file in the data root (32 random bytes, readable by root alone).
pub const KEY_FILE: &str = "migrate-report.key";

/// The daemon's report key, made on first use.
fn key(layout: &Layout) -> Result<Vec<u8>> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = layout.home().join(KEY_FILE);
    match std::fs::read(&path) {
        Ok(key) if key.len() == 32 => return Ok(key),
        Ok(_) => {
            return Err(Error::internal(format!(
                "{} is not a report key (32 bytes): restore it, or remove it to make a new one (reports sealed with it will no longer promote)",
                path.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::internal(format!("reading {}: {e}", path.display()))),
    }
    let key: [u8; 32] = airlock_core::secret::random_bytes();
    let made = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path);
    match made {
        Ok(mut file) => {
            file.write_all(&key).and_then(|_| file.sync_all()).map_err(|e| {
                let _ = std::fs::remove_file(&path);
                Error::internal(format!("writing {}: {e}", path.display()))
            })?;
            Ok(key.to_vec())
        }
        // Another test made it first: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => key_made_by_another(&path),
        Err(e) => Err(Error::internal(format!("creating {}: {e}", path.display()))),
    }
}

fn key_made_by_another(path: &std::path::Path) -> Result<Vec<u8>> {
    for _ in 0..50 {
        match std::fs::read(path) {
            Ok(key) if key.len() == 32 => return Ok(key),
            _ => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
    Err(Error::internal(format!(
        "{} is being written by another process and never completed",
        path.display()
    )))
}

/// The MAC of `report` (its own seal left out), hex.
fn mac(key: &[u8], report: &Report) -> Result<String> {
    let mut unsealed = report.clone();
    unsealed.seal = String::new();
    let once =
        serde_json::to_vec(&unsealed).map_err(|e| Error::internal(format!("serializing a report: {e}")))?;
    let canonical: Report =
        serde_json::from_slice(&once).map_err(|e| Error::internal(format!("reading a report back: {e}")))?;
    let bytes =
        serde_json::to_vec(&canonical).map_err(|e| Error::internal(format!("serializing a report: {e}")))?;
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(DOMAIN);
    m.update(&bytes);
    Ok(airlock_core::secret::hex(&m.finalize().into_bytes()))
}

/// Seals `report` with the daemon's key.
pub fn seal(layout: &Layout, report: &mut Report) -> Result<()> {
    report.seal = mac(&key(layout)?, report)?;
    Ok(())
}

/// Whether `report` carries this daemon's seal over exactly what it holds.
pub fn check(layout: &Layout, report: &Report) -> Result<()> {
    let refused = |message: &str| {
        Error::new(
            ErrorCode::MigrationRefused,
            message,
            "promote with the report exactly as `airlock migrate test --report` wrote it on this Airlock; \
             test again to get a new one",
        )
    };
    if report.seal.is_empty() {
        return Err(refused("the report carries no seal (it was not written by `migrate test` here)"));
    }
    let expected = mac(&key(layout)?, report)?;
    // Compared in constant time: the seal is a MAC.
    let same = expected.len() == report.seal.len()
        && expected.bytes().zip(report.seal.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    if !same {
        return Err(refused(
            "the report's seal does not match what it holds: it was changed after `migrate test` wrote it, \
             or was written by another Airlock",
        ));
    }
    Ok(())
}
