//! Builds the in-server guard (`guard/airlock_guard.c`) against every PostgreSQL
//! server whose headers this host has, and embeds the libraries in the binary so
//! the daemon can give each sandbox the one matching its server's major version.
//!
//! A host without server headers (Debian: `postgresql-server-dev-N`) builds an
//! Airlock with no guard for that major; its daemon then refuses to start rather
//! than run sandboxes without it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=guard/airlock_guard.c");
    println!("cargo:rerun-if-env-changed=AIRLOCK_PG_CONFIG");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let source = Path::new("guard/airlock_guard.c").canonicalize().expect("guard source");
    let mut built: Vec<(u32, PathBuf)> = Vec::new();
    for pg_config in pg_configs() {
        let Some(major) = output(&pg_config, "--version").and_then(|v| major_of(&v)) else { continue };
        if built.iter().any(|(m, _)| *m == major) {
            continue;
        }
        let Some(include) = output(&pg_config, "--includedir-server") else { continue };
        // Headers installed after a build without them make the next build
        // look again (else the guard-less result would be kept).
        let mut watched = Path::new(include.trim());
        while !watched.exists() {
            let Some(parent) = watched.parent() else { break };
            watched = parent;
        }
        println!("cargo:rerun-if-changed={}", watched.display());
        if !Path::new(include.trim()).join("postgres.h").exists() {
            println!(
                "cargo:warning=no server headers for PostgreSQL {major} (install postgresql-server-dev-{major}); \
                 this build has no in-server guard for it"
            );
            continue;
        }
        let library = out.join(format!("airlock_guard_{major}.so"));
        // Linked to bind every symbol at load (`-z now`): preloaded, as a
        // fork's server loads it, a function the server lacks fails the
        // server's start rather than the first backend that calls it.
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let status = Command::new(&cc)
            .args(["-O2", "-Wall", "-Werror", "-fPIC", "-shared", "-Wl,-z,now", "-I"])
            .arg(include.trim())
            .arg("-o")
            .arg(&library)
            .arg(&source)
            .status()
            .unwrap_or_else(|e| panic!("could not run {cc}: {e}"));
        assert!(status.success(), "compiling the guard for PostgreSQL {major} failed");
        built.push((major, library));
    }
    let entries: Vec<String> = built
        .iter()
        .map(|(major, lib)| format!("({major}, include_bytes!({:?}))", lib.display().to_string()))
        .collect();
    let code = format!(
        "/// The in-server guard, compiled for each PostgreSQL major version: (major, shared library).\n\
         pub const GUARDS: &[(u32, &[u8])] = &[{}];\n",
        entries.join(", ")
    );
    std::fs::write(out.join("guards.rs"), code).expect("write guards.rs");
}

/// `AIRLOCK_PG_CONFIG` if set, else every `/usr/lib/postgresql/*/bin/pg_config`,
/// else `pg_config` on the PATH.
fn pg_configs() -> Vec<PathBuf> {
    if let Some(configured) = std::env::var_os("AIRLOCK_PG_CONFIG") {
        return vec![PathBuf::from(configured)];
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/pg_config"))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    if found.is_empty() {
        found.push(PathBuf::from("pg_config"));
    }
    found
}

fn output(program: &Path, arg: &str) -> Option<String> {
    let out = Command::new(program).arg(arg).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// 15 from "PostgreSQL 15.18 (Debian ...)".
fn major_of(version: &str) -> Option<u32> {
    let number = version.split_whitespace().nth(1)?;
    number.chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok()
}
