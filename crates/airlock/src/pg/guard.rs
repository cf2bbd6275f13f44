//! The in-server guard: a small library (`guard/airlock_guard.c`, built by
//! `build.rs`) every sandbox's server loads with `shared_preload_libraries`. It
//! refuses, to every role but a superuser, the statements that would outlive the
//! session: `ALTER ROLE` (password, attributes, settings) and `ALTER DATABASE`
//! (settings, options, name, owner). PostgreSQL has no privilege that could be
//! revoked to the same effect.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::Digest;

use crate::error::{Error, ErrorCode, Result};

include!(concat!(env!("OUT_DIR"), "/guards.rs"));

/// The guard's shared library for a PostgreSQL major version, if this build has one.
pub fn library(major: u32) -> Option<&'static [u8]> {
    GUARDS.iter().find(|(m, _)| *m == major).map(|(_, bytes)| *bytes)
}

/// Writes the guard for `major` into `dir` (root-owned, readable by instance
/// users) under a name that changes with its contents, so a running server's
/// mapped copy is never overwritten; returns its path.
pub fn install(dir: &Path, major: u32) -> Result<PathBuf> {
    let bytes = library(major).ok_or_else(|| {
        Error::new(
            ErrorCode::PostgresFailed,
            format!("this Airlock was built without its in-server guard for PostgreSQL {major}"),
            format!(
                "install PostgreSQL's server headers (Debian: postgresql-server-dev-{major}) and build Airlock again \
                 (`make build` does both), or point --pg-bin at a PostgreSQL this build has a guard for ({})",
                GUARDS.iter().map(|(m, _)| m.to_string()).collect::<Vec<_>>().join(", ")
            ),
        )
    })?;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let digest = crate::secret::hex(&sha2::Sha256::digest(bytes)[..6]);
    let path = dir.join(format!("airlock_guard-{major}-{digest}.so"));
    if std::fs::read(&path).is_ok_and(|have| have == bytes) {
        return Ok(path);
    }
    let staged = dir.join(format!(".airlock_guard-{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&staged);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&staged)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&staged, &path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_build_carries_a_guard_for_the_hosts_postgresql() {
        let bin = crate::pg::PgBin::locate(None).expect("a PostgreSQL server");
        let major = bin.major().expect("a version");
        assert!(super::library(major).is_some_and(|b| b.starts_with(b"\x7fELF")), "no guard for {major}");
    }
}
