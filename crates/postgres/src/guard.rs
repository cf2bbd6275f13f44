//! The in-server guard: a small library (`guard/airlock_guard.c`) every
//! sandbox's server loads with `shared_preload_libraries`. `build.rs` compiles
//! it into this binary for the host's own PostgreSQL; for majors `airlock
//! postgres install` added, the daemon compiles it against their headers. It
//! refuses, to every role but a superuser, the statements that would outlive the
//! session: `ALTER ROLE` (password, attributes, settings) and `ALTER DATABASE`
//! (settings, options, name, owner). PostgreSQL has no privilege that could be
//! revoked to the same effect.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::Digest;

use airlock_core::error::{Error, ErrorCode, Result};

include!(concat!(env!("OUT_DIR"), "/guards.rs"));

/// The guard's C source, compiled at run time for majors this build has no library for.
pub const SOURCE: &str = include_str!("../guard/airlock_guard.c");

/// The guard's shared library for a PostgreSQL major version, if this build has one.
pub fn library(major: u32) -> Option<&'static [u8]> {
    GUARDS.iter().find(|(m, _)| *m == major).map(|(_, bytes)| *bytes)
}

/// The guard for `major`: the one built in, else one compiled against the
/// server headers in `include` (once per guard source, kept in `cache`, an
/// installed major's own tree, or else in `dir`); written into `dir` as
/// [`install`] does. Without either, an error that says how to get one.
pub fn for_major(dir: &Path, major: u32, include: Option<&Path>, cache: Option<&Path>) -> Result<PathBuf> {
    if let Some(bytes) = library(major) {
        return install(dir, major, bytes);
    }
    let Some(include) = include.filter(|i| i.join("postgres.h").exists()) else {
        return Err(Error::new(
            ErrorCode::PostgresMissing,
            format!("this Airlock has no in-server guard for PostgreSQL {major}, and no server headers to build one"),
            format!(
                "install the server headers (Debian: postgresql-server-dev-{major}), or install PostgreSQL {major} \
                 with `airlock postgres install {major}`, which brings them"
            ),
        ));
    };
    let compiled = match cache {
        Some(tree) => compiled_in(tree, major, include).or_else(|_| compiled_in(dir, major, include))?,
        None => compiled_in(dir, major, include)?,
    };
    install(dir, major, &std::fs::read(compiled)?)
}

/// The guard compiled for `major` in directory `at`, compiled now if it is not there.
fn compiled_in(at: &Path, major: u32, include: &Path) -> Result<PathBuf> {
    let compiled = at.join(compiled_name(major));
    if !compiled.exists() {
        let staged = at.join(format!(".compiled-{major}-{}.tmp", std::process::id()));
        compile(include, &staged)?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o644))?;
        std::fs::rename(&staged, &compiled)?;
    }
    Ok(compiled)
}

/// The file a guard compiled from this source for `major` is kept as.
pub fn compiled_name(major: u32) -> String {
    let source_digest = airlock_core::secret::hex(&sha2::Sha256::digest(SOURCE.as_bytes())[..6]);
    format!("airlock_guard-compiled-{major}-{source_digest}.so")
}

/// Compiles the guard against the server headers in `include` into `out`,
/// with the host's C compiler (`CC`, else `cc`). The source is written beside
/// `out`, in a directory only its owner writes.
pub fn compile(include: &Path, out: &Path) -> Result<()> {
    let parent = out.parent().unwrap_or(Path::new("."));
    let source = parent.join(format!(
        ".airlock_guard-{}.c",
        airlock_core::secret::hex(&airlock_core::secret::random_bytes::<6>())
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&source)?
        .write_all(SOURCE.as_bytes())?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let result = std::process::Command::new(&cc)
        .args(["-O2", "-Wall", "-Werror", "-fPIC", "-shared", "-Wl,-z,now", "-I"])
        .arg(include)
        .arg("-o")
        .arg(out)
        .arg(&source)
        .output();
    let _ = std::fs::remove_file(&source);
    let fail = |what: String| {
        Error::new(
            ErrorCode::PostgresMissing,
            format!("compiling the in-server guard against {} failed: {what}", include.display()),
            "install a C compiler (Debian: gcc); forks never run without the guard",
        )
    };
    match result {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(fail(String::from_utf8_lossy(&o.stderr).trim().chars().take(2000).collect())),
        Err(e) => Err(fail(format!("cannot run {cc}: {e}"))),
    }
}

/// Writes the guard library `bytes` for `major` into `dir` (root-owned,
/// readable by instance users) under a name that changes with its contents,
/// so a running server's mapped copy is never overwritten; returns its path.
pub fn install(dir: &Path, major: u32, bytes: &[u8]) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let digest = airlock_core::secret::hex(&sha2::Sha256::digest(bytes)[..6]);
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
        let bin = crate::PgBin::locate(None).expect("a PostgreSQL server");
        let major = bin.major().expect("a version");
        assert!(super::library(major).is_some_and(|b| b.starts_with(b"\x7fELF")), "no guard for {major}");
    }
}
