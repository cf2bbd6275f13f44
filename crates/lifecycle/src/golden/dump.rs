//! Dumping a live source: in parallel, in one exported snapshot (which the
//! fidelity report's counts are read in too), into a directory kept until the
//! golden is built, so that a build that fails after the dump resumes from it
//! instead of dumping again.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;

use crate::golden::progress::Builds;
use crate::golden::source::{SourceFacts, SourceSession};
use airlock_core::dsn;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_postgres::bin::PgBin;
use airlock_postgres::imported::Exclusions;

/// A finished dump and what the source held when it was taken.
pub struct Dumped {
    /// The directory-format archive.
    pub archive: PathBuf,
    /// The source as of the dump's snapshot.
    pub facts: SourceFacts,
    /// Whether it was kept from an earlier build that failed after dumping.
    pub resumed: bool,
    /// How long the dump took (0 when resumed).
    pub seconds: f64,
    /// The archive's size.
    pub bytes: u64,
}

/// Dumps `source` into `keep` (or finds the finished dump of the same source
/// and exclusions there), with `jobs` parallel jobs.
pub async fn dump(
    bin: &PgBin,
    source: &str,
    exclude: &Exclusions,
    keep: &Path,
    jobs: usize,
    progress: (&Builds, &str),
) -> Result<Dumped> {
    let key = source_key(source, exclude);
    let archive = keep.join("dump");
    let facts_file = keep.join("facts.json");
    let finished = std::fs::read_to_string(keep.join("complete")).is_ok_and(|k| k == key);
    let kept_facts =
        std::fs::read(&facts_file).ok().and_then(|b| serde_json::from_slice::<SourceFacts>(&b).ok());
    if let (true, Some(facts)) = (finished, kept_facts) {
        let bytes = airlock_host::storage::tree_size(&archive);
        return Ok(Dumped { archive, facts, resumed: true, seconds: 0.0, bytes });
    }
    let _ = std::fs::remove_dir_all(keep);
    airlock_host::storage::tree::private_dir(keep)?;
    let began = Instant::now();
    let session = SourceSession::open(source).await?;
    let (builds, name) = progress;
    let tables = session.tables_with_data().await.unwrap_or(0);
    builds.update(name, |p| {
        p.phase = "dumping".into();
        p.tables_total = tables;
    });
    let dumped = run_pg_dump(bin, source, exclude, &archive, &session.snapshot, jobs, keep, progress).await;
    let facts = match dumped {
        Ok(()) => {
            builds.update(name, |p| p.phase = "counting the source's rows".into());
            session.facts(|table| exclude.leaves_out(table)).await
        }
        Err(e) => Err(e),
    };
    session.close().await;
    let facts = facts?;
    std::fs::write(&facts_file, serde_json::to_vec(&facts).expect("facts serialize"))?;
    std::fs::write(keep.join("complete"), &key)?;
    let bytes = airlock_host::storage::tree_size(&archive);
    Ok(Dumped { archive, facts, resumed: false, seconds: began.elapsed().as_secs_f64(), bytes })
}

/// Removes the dumps failed imports kept (`volume/imports/NAME`) that are older
/// than `keep_for`, each under a reservation of its golden's name so no build
/// is resuming from it meanwhile; returns how many went.
pub fn expire_kept(engine: &crate::engine::Engine, keep_for: Duration) -> usize {
    let mut removed = 0;
    for entry in std::fs::read_dir(engine.layout.imports()).into_iter().flatten().flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        let age = entry.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
        if age.is_none_or(|a| a < keep_for) {
            continue;
        }
        let Ok(_reserved) = engine.reserve_golden(&name, crate::engine::GoldenWork::ExpireDump) else {
            continue;
        };
        if std::fs::remove_dir_all(entry.path()).is_ok() {
            tracing::info!(golden = %name, "removed the dump a failed import kept, unused for {keep_for:?}");
            removed += 1;
        }
    }
    removed
}

/// What makes two dumps the same: the source (its password aside, which
/// nothing on disk may derive from) and what is left out.
fn source_key(source: &str, exclude: &Exclusions) -> String {
    let mut h = Sha256::new();
    h.update(dsn::redact(source).as_bytes());
    h.update(serde_json::to_vec(exclude).expect("exclusions serialize"));
    airlock_core::secret::hex(&h.finalize())
}

#[allow(clippy::too_many_arguments)]
async fn run_pg_dump(
    bin: &PgBin,
    source: &str,
    exclude: &Exclusions,
    archive: &Path,
    snapshot: &str,
    jobs: usize,
    keep: &Path,
    progress: (&Builds, &str),
) -> Result<()> {
    let redacted = dsn::redact(source);
    let passfile = keep.join("source.pgpass");
    let password = dsn::password(source).unwrap_or_default();
    dsn::write_passfile(&passfile, &password)?;
    // Client tools without TLS reach a TLS source through a tunnel of Airlock's.
    let tunnel = airlock_postgres::tunnel::Tunnel::open_if_needed(source, bin, &keep.join("t"))?;
    let dbname = tunnel.as_ref().map_or_else(|| redacted.clone(), |t| t.dsn.clone());
    let mut cmd = Command::new(bin.tool("pg_dump"));
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C")
        .env("PGPASSFILE", &passfile)
        .env("PGCONNECT_TIMEOUT", "15")
        .args([
            "--format=directory",
            "--verbose",
            "--no-subscriptions",
            "--no-tablespaces",
            "--no-security-labels",
        ])
        .arg(format!("--jobs={jobs}"))
        .arg(format!("--snapshot={snapshot}"));
    for table in &exclude.tables {
        cmd.arg(format!("--exclude-table={table}"));
    }
    for schema in &exclude.schemas {
        cmd.arg(format!("--exclude-schema={schema}"));
    }
    cmd.arg("--file").arg(archive).arg("--dbname").arg(&dbname);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let spawned = cmd.spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_file(&passfile);
            return Err(e.into());
        }
    };
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut said = Vec::new();
    let (builds, name) = progress;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => {
                    if line.contains("dumping contents of table") {
                        builds.update(name, |p| p.tables_done += 1);
                    } else if line.contains("reading") && line.contains("tables") {
                        // pg_dump reads the catalog first; the count of tables comes from the archive later.
                    } else if !line.starts_with("pg_dump: ") || line.to_ascii_lowercase().contains("error") {
                        said.push(line);
                    }
                }
                _ => break,
            },
            _ = tick.tick() => {
                let bytes = airlock_host::storage::tree_size(archive);
                builds.update(name, |p| p.bytes = bytes);
            }
        }
    }
    let status = child.wait().await;
    drop(tunnel);
    let _ = std::fs::remove_file(&passfile);
    if status?.success() {
        return Ok(());
    }
    let said = airlock_core::secret::scrub(&said.join("\n"), &password);
    let newer = said.contains("server version mismatch");
    Err(Error::new(
        ErrorCode::SourceFailed,
        format!("pg_dump of {redacted} failed: {}", said.trim()),
        if newer {
            format!(
                "the source runs a newer PostgreSQL than this host's pg_dump ({}); dump it with a pg_dump at least as new \
                 and use --from-dump",
                bin.version()
            )
        } else {
            "check that the database is reachable from this host, the credentials are right, and its user may read every table".into()
        },
    ))
}
