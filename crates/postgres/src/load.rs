//! Loading SQL files into a golden under construction with psql (schema and
//! seed files, plain dumps), and the schema hash. Archives are restored by
//! the golden service's import.
//!
//! Everything loaded runs in a session that logged in as the owner role (peer
//! authentication, during a build only), so every object belongs to a role that
//! is not a superuser, and nothing loaded can become one: `SET ROLE` and `SET
//! SESSION AUTHORIZATION` to the admin need a superuser session.

use std::io::Read;
use std::path::Path;
use std::process::Stdio;

use sha2::{Digest, Sha256};
use tokio::process::Command;

use crate::bin::PgBin;
use crate::loader::Loader;
use airlock_core::dsn::{ADMIN_ROLE, DATABASE, OWNER_ROLE, SOCKET_PORT};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::InstanceDir;
use airlock_host::users::Identity;

/// A client tool connected as admin to the instance's app database, with
/// nothing from the daemon's environment.
pub fn admin_tool(bin: &PgBin, tool: &str, dir: &InstanceDir) -> Command {
    let mut cmd = Command::new(bin.tool(tool));
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C")
        .env("PGHOST", dir.socket_dir())
        .env("PGPORT", SOCKET_PORT.to_string())
        .env("PGUSER", ADMIN_ROLE)
        .env("PGDATABASE", DATABASE)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Fails with a clear error when `path` cannot be read by the daemon, or is
/// neither a regular file nor a directory.
pub fn check_readable(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    airlock_host::storage::tree::open_request_file(path).map(|_| ())
}

/// Runs one SQL file with psql, stopping at its first error. The error names the
/// file, the line and PostgreSQL's message.
///
/// psql runs jailed as the loader user ([`crate::jail`]), or as the
/// daemon's user when it is not root, and a file's backslash commands are psql's
/// own (`\!` runs a shell, `\o` and `\copy` write files, `\connect` logs in
/// again): psql starts in its restricted mode (`\restrict`, with a key the file
/// cannot know, sent down psql's input ahead of the file, never on a command
/// line another user could read), where the only command it takes is
/// `\unrestrict` with that key. A file is SQL and `COPY ... FROM stdin` data,
/// as pg_dump writes; the `\restrict` and `\unrestrict` lines pg_dump itself
/// puts first and last are blanked ([`feed`]), line numbers kept.
pub async fn run_sql_file(loader: &Loader<'_>, file: &Path, code: ErrorCode) -> Result<()> {
    let opened = tokio::fs::File::from_std(airlock_host::storage::tree::open_request_file(file)?);
    let mut child = loader
        .tool("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()?;
    let stdin = child.stdin.take().expect("stdin is piped");
    let (fed, out) = tokio::join!(feed(opened, stdin), child.wait_with_output());
    let out = out?;
    if out.status.success() {
        fed?;
        return Ok(());
    }
    let stderr = stdin_lines_as_file(&String::from_utf8_lossy(&out.stderr), file);
    Err(Error::new(
        code,
        psql_error(&stderr, file),
        format!("fix {} and run the command again; nothing was kept", file.display()),
    ))
}

/// Sends psql `\restrict` with a fresh key, then `file`, blanking pg_dump's
/// own `\restrict KEY` (when it comes before any statement) and `\unrestrict
/// KEY` (when it is the last line with anything on it). psql stopping early (an
/// error) ends the copy.
async fn feed(file: tokio::fs::File, mut to: tokio::process::ChildStdin) -> std::io::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let is = |line: &[u8], command: &str| {
        let text = String::from_utf8_lossy(line);
        let rest = text.trim_end().strip_prefix(command).and_then(|r| r.strip_prefix(' '));
        rest.is_some_and(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric()))
    };
    let key = airlock_core::secret::hex(&airlock_core::secret::random_bytes::<16>());
    if to.write_all(format!("\\restrict {key}\n").as_bytes()).await.is_err() {
        return Ok(());
    }
    let mut reader = tokio::io::BufReader::new(file);
    let mut before_statements = true;
    // The last line with anything on it, and the blank lines after it.
    let mut held: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line).await? == 0 {
            break;
        }
        let blank = line.iter().all(|b| b.is_ascii_whitespace());
        if before_statements && is(&line, "\\restrict") {
            line = b"\n".to_vec();
        } else if !blank && !line.starts_with(b"--") {
            before_statements = false;
        }
        if !blank {
            for earlier in held.drain(..) {
                if to.write_all(&earlier).await.is_err() {
                    return Ok(());
                }
            }
        }
        held.push(line);
    }
    if held.first().is_some_and(|l| is(l, "\\unrestrict")) {
        held[0] = b"\n".to_vec();
    }
    for line in held {
        if to.write_all(&line).await.is_err() {
            return Ok(());
        }
    }
    to.shutdown().await.or(Ok(()))
}

/// psql's `psql:<stdin>:N:` locations as the file's own: `FILE:N-1:`, the
/// first line of psql's input being the `\restrict` that [`feed`] sends.
fn stdin_lines_as_file(stderr: &str, file: &Path) -> String {
    let mut out = String::with_capacity(stderr.len());
    let mut rest = stderr;
    while let Some(at) = rest.find("<stdin>:") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "<stdin>:".len()..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        match after[..digits].parse::<u64>() {
            Ok(n) => out.push_str(&format!("{}:{}", file.display(), n.saturating_sub(1))),
            Err(_) => out.push_str(&format!("{}:", file.display())),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// Turns psql's stderr into `FILE:LINE: ERROR: message (DETAIL ...)`.
fn psql_error(stderr: &str, file: &Path) -> String {
    let mut lines = stderr
        .lines()
        .skip_while(|l| !(l.contains(": ERROR:") || l.contains(": FATAL:") || l.contains(": error:")));
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

/// Whether a dump file is an archive for pg_restore (custom or tar format, or a
/// directory dump) rather than a plain SQL script.
pub fn is_archive(path: &Path) -> Result<bool> {
    if path.is_dir() {
        return Ok(true);
    }
    let mut head = [0u8; 512];
    let mut f = airlock_host::storage::tree::open_request_file(path)?;
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

/// The PostgreSQL major an archive was dumped from (its header's "Dumped from
/// database version"); `None` for a plain SQL script or an unreadable archive.
/// pg_restore reads what the daemon opened, never a path the dump's owner
/// could swap: a file's descriptor as its input, a directory's `toc.dat`
/// (opened without following links, a regular file only) copied alone into a
/// private directory.
pub async fn dump_major(bin: &PgBin, path: &Path, scratch: &Path) -> Option<u32> {
    if !is_archive(path).ok()? {
        return None;
    }
    let mut cmd = Command::new(bin.tool("pg_restore"));
    cmd.arg("--list").env_clear().stderr(Stdio::null());
    if path.is_dir() {
        crate::loader::stage_toc(path, scratch).ok()?;
        cmd.arg(scratch).stdin(Stdio::null());
    } else {
        cmd.stdin(airlock_host::storage::tree::open_request_file(path).ok()?);
    }
    let out = cmd.output().await.ok();
    if path.is_dir() {
        let _ = std::fs::remove_dir_all(scratch);
    }
    let list = String::from_utf8_lossy(&out?.stdout).into_owned();
    let line = list.lines().find_map(|l| l.split_once("Dumped from database version:"))?.1;
    crate::bin::major_of(line)
}

/// SHA-256 of the application database's schema-only dump, ignoring comments and
/// the random `\restrict` keys newer pg_dump versions write.
pub async fn schema_hash(bin: &PgBin, dir: &InstanceDir, os_user: Option<&Identity>) -> Result<String> {
    // Logged in as the owner role, never a superuser: pg_dump calls the
    // server's functions on what the agent made.
    let mut dump = admin_tool(bin, "pg_dump", dir);
    dump.env("PGUSER", OWNER_ROLE);
    if let Some(user) = os_user.filter(|_| nix::unistd::geteuid().is_root()) {
        dump.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
    let out = dump.args(["--schema-only", "--no-owner", "--no-acl"]).output().await?;
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
    Ok(airlock_core::secret::hex(&hasher.finalize()))
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

    #[test]
    fn stdin_lines_are_the_files_less_the_restrict_line() {
        let stderr = "psql:<stdin>:4: ERROR:  boom\npsql:<stdin>:x: odd\n";
        assert_eq!(
            stdin_lines_as_file(stderr, Path::new("/s.sql")),
            "psql:/s.sql:3: ERROR:  boom\npsql:/s.sql:x: odd\n"
        );
    }
}
