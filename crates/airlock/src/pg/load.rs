//! Loading data into a golden under construction: SQL files with psql, a live
//! database with pg_dump, dump files with pg_restore or psql; and the schema hash.
//!
//! Everything loaded runs as the owner role (`PGOPTIONS=-c role=airlock_owner`),
//! so every object belongs to a role that is not a superuser.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;

use sha2::{Digest, Sha256};
use tokio::process::Command;

use crate::error::{Error, ErrorCode, Result};
use crate::layout::InstanceDir;
use crate::pg::bin::PgBin;
use crate::pg::dsn::{self, ADMIN_ROLE, DATABASE, OWNER_ROLE, SOCKET_PORT};

/// A client tool connected as admin (acting as the owner role) to the instance's app database.
fn client(bin: &PgBin, tool: &str, dir: &InstanceDir) -> Command {
    let mut cmd = Command::new(bin.tool(tool));
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C")
        .env("PGOPTIONS", format!("-c role={OWNER_ROLE}"))
        .env("PGHOST", dir.socket_dir())
        .env("PGPORT", SOCKET_PORT.to_string())
        .env("PGUSER", ADMIN_ROLE)
        .env("PGDATABASE", DATABASE)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn check_readable(path: &Path) -> Result<()> {
    std::fs::File::open(path).map(|_| ()).map_err(|e| {
        Error::new(
            ErrorCode::FileUnreadable,
            format!("cannot read {}: {e}", path.display()),
            "check the path; the daemon reads the file itself, so it must be readable by the daemon's user",
        )
    })
}

/// Runs one SQL file with psql, stopping at its first error. The error names the
/// file, the line and PostgreSQL's message.
pub async fn run_sql_file(bin: &PgBin, dir: &InstanceDir, file: &Path, code: ErrorCode) -> Result<()> {
    check_readable(file)?;
    let out =
        client(bin, "psql", dir).args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f"]).arg(file).output().await?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(Error::new(
        code,
        psql_error(&stderr, file),
        format!("fix {} and run the command again; nothing was kept", file.display()),
    ))
}

/// Turns psql's stderr into `FILE:LINE: ERROR: message (DETAIL ...)`.
fn psql_error(stderr: &str, file: &Path) -> String {
    let mut lines = stderr.lines().skip_while(|l| !(l.contains(": ERROR:") || l.contains(": FATAL:")));
    let Some(first) = lines.next() else {
        return format!("{}: {}", file.display(), stderr.trim());
    };
    let mut msg =
        first.strip_prefix("psql:").unwrap_or(first).split_whitespace().collect::<Vec<_>>().join(" ");
    for extra in lines.filter(|l| l.starts_with("DETAIL:") || l.starts_with("HINT:")) {
        msg.push_str(&format!(" ({})", extra.split_whitespace().collect::<Vec<_>>().join(" ")));
    }
    msg
}

/// Copies a live database with pg_dump into `workdir`, then restores it. The
/// password goes to pg_dump through a private password file, never through its
/// command line or environment.
pub async fn copy_from_url(bin: &PgBin, dir: &InstanceDir, source: &str, workdir: &Path) -> Result<()> {
    let redacted = dsn::redact(source);
    let passfile = workdir.join("source.pgpass");
    let password = dsn::password(source).unwrap_or_default();
    dsn::write_passfile(&passfile, &password)?;
    let dump = workdir.join("source.dump");
    let out = Command::new(bin.tool("pg_dump"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C")
        .env("PGPASSFILE", &passfile)
        .env("PGCONNECT_TIMEOUT", "15")
        .args(["--format=custom", "--no-owner", "--no-acl", "--file"])
        .arg(&dump)
        .arg("--dbname")
        .arg(&redacted)
        .stdin(Stdio::null())
        .output()
        .await;
    let _ = std::fs::remove_file(&passfile);
    let out = out?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).replace(&password, "***");
        return Err(Error::new(
            ErrorCode::SourceFailed,
            format!("pg_dump of {redacted} failed: {}", stderr.trim()),
            "check that the database is reachable from this host, the credentials are right, and its major version is not newer than this host's pg_dump",
        ));
    }
    let result = restore_dump(bin, dir, &dump).await;
    let _ = std::fs::remove_file(&dump);
    result
}

/// Whether a dump file is an archive for pg_restore (custom or tar format, or a
/// directory dump) rather than a plain SQL script.
fn is_archive(path: &Path) -> Result<bool> {
    if path.is_dir() {
        return Ok(true);
    }
    let mut head = [0u8; 512];
    let mut f = std::fs::File::open(path)?;
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..])? {
            0 => break,
            k => n += k,
        }
    }
    let custom = head[..n].starts_with(b"PGDMP");
    let tar = n >= 262 && &head[257..262] == b"ustar";
    Ok(custom || tar)
}

/// Restores a dump file: archives with pg_restore, plain scripts with psql.
pub async fn restore_dump(bin: &PgBin, dir: &InstanceDir, path: &Path) -> Result<()> {
    check_readable(path)?;
    if !is_archive(path)? {
        return run_sql_file(bin, dir, path, ErrorCode::SourceFailed).await;
    }
    let out = client(bin, "pg_restore", dir)
        .args(["--exit-on-error", "--no-owner", "--no-acl", "--dbname", DATABASE])
        .arg(path)
        .output()
        .await?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::new(
        ErrorCode::SourceFailed,
        format!("pg_restore of {} failed: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim()),
        "check that the dump is complete and made by a pg_dump no newer than this host's PostgreSQL",
    ))
}

/// SHA-256 of the application database's schema-only dump, ignoring comments and
/// the random `\restrict` keys newer pg_dump versions write.
pub async fn schema_hash(bin: &PgBin, dir: &InstanceDir) -> Result<String> {
    let out = client(bin, "pg_dump", dir).args(["--schema-only", "--no-owner", "--no-acl"]).output().await?;
    if !out.status.success() {
        return Err(Error::postgres(format!(
            "pg_dump --schema-only failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let mut hasher = Sha256::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if line.starts_with("--") || line.starts_with("\\restrict") || line.starts_with("\\unrestrict") {
            continue;
        }
        hasher.update(line.as_bytes());
        hasher.update(b"\n");
    }
    Ok(crate::secret::hex(&hasher.finalize()))
}

/// Makes a private (0700) scratch directory for temporary files.
pub fn private_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psql_errors_name_file_line_and_message() {
        let stderr = "psql:/tmp/seed.sql:3: ERROR:  duplicate key value violates unique constraint \"t_pkey\"\nDETAIL:  Key (id)=(1) already exists.\n";
        let msg = psql_error(stderr, Path::new("/tmp/seed.sql"));
        assert_eq!(
            msg,
            "/tmp/seed.sql:3: ERROR: duplicate key value violates unique constraint \"t_pkey\" (DETAIL: Key (id)=(1) already exists.)"
        );
    }
}
