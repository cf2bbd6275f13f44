//! `airlock audit`: verify, list, export and checkpoint the audit log.
//!
//! `verify`, `ls` and `export` read `$AIRLOCK_HOME/audit/` directly, so an
//! auditor can check a log whose daemon is gone; `checkpoint` asks the daemon
//! to sign one now.

use std::io::Write;

use axum::http::Method;
use clap::Subcommand;

use super::output;
use super::Cli;
use airlock_core::clock::Timestamp;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_state::audit::checkpoint::{self, Checkpoint};
use airlock_state::audit::record::Sealed;
use airlock_state::audit::verify::Report;

#[derive(Debug, Subcommand)]
pub(super) enum AuditCommand {
    /// Walk the chain and the checkpoints' signatures; name the first broken record.
    Verify {
        /// A record hash the chain must hold (the `hash` of a checkpoint kept off
        /// this host): catches a tail cut off together with its checkpoints.
        #[arg(long)]
        anchor: Option<String>,
        /// The Ed25519 public key checkpoints must verify under (64 hex digits;
        /// default: $AIRLOCK_HOME/audit/signing.pub).
        #[arg(long)]
        public_key: Option<String>,
    },
    /// List records, oldest first.
    Ls {
        /// Only records of this sandbox (its id).
        #[arg(long)]
        sandbox: Option<String>,
        /// Only records of the last span of time (e.g. 1h, 30m).
        #[arg(long)]
        since: Option<String>,
        /// Only records of this kind (e.g. credential_issued, deleted).
        #[arg(long)]
        kind: Option<String>,
        /// At most this many, the most recent.
        #[arg(long, default_value_t = 200)]
        limit: usize,
    },
    /// Write records as JSON lines (each with its hash), for a SIEM.
    Export {
        /// Only records of this sandbox (its id).
        #[arg(long)]
        sandbox: Option<String>,
        /// Only records of the last span of time (e.g. 24h).
        #[arg(long)]
        since: Option<String>,
        /// Only records after this sequence number (to export what is new since the last run).
        #[arg(long)]
        after: Option<u64>,
    },
    /// Sign a checkpoint of the chain's head now and print it (keep it off this
    /// host: it is what `verify --anchor` checks against).
    Checkpoint,
}

/// Which records to show.
struct Filter {
    sandbox: Option<String>,
    since: Option<Timestamp>,
    kind: Option<String>,
    after: Option<u64>,
}

impl Filter {
    fn new(
        sandbox: &Option<String>,
        since: &Option<String>,
        kind: &Option<String>,
        after: Option<u64>,
    ) -> Result<Filter> {
        let since = match since {
            Some(text) => {
                let span = airlock_core::validate::duration("--since", text)?;
                Some(Timestamp(Timestamp::now().0 - span.as_millis() as i64))
            }
            None => None,
        };
        Ok(Filter { sandbox: sandbox.clone(), since, kind: kind.clone(), after })
    }

    fn keeps(&self, s: &Sealed) -> bool {
        let r = &s.record;
        self.sandbox.as_ref().is_none_or(|id| r.sandbox.as_ref() == Some(id))
            && self.since.is_none_or(|t| r.at >= t)
            && self.kind.as_ref().is_none_or(|k| &r.kind == k)
            && self.after.is_none_or(|a| r.seq > a)
    }
}

/// The records that pass `filter`, oldest first. A line that is not a sound
/// record (a write a crash cut short, or tampering) is left out and said on
/// stderr; `verify` tells which it is.
fn records(cli: &Cli, filter: &Filter, mut each: impl FnMut(Sealed) -> Result<()>) -> Result<()> {
    let dir = cli.layout().audit();
    for line in airlock_state::audit::read::lines(&dir)? {
        let line = line?;
        let sealed = match line.record {
            Ok(sealed) => sealed,
            Err(fault) => {
                eprintln!(
                    "airlock: line {} of {} {fault}; left out (`airlock audit verify` says whether it was repaired)",
                    line.number,
                    line.path.display()
                );
                continue;
            }
        };
        if filter.keeps(&sealed) {
            each(sealed)?;
        }
    }
    Ok(())
}

pub(super) async fn run(cli: &Cli, command: &AuditCommand, json: bool) -> Result<i32> {
    match command {
        AuditCommand::Verify { anchor, public_key } => {
            let dir = cli.layout().audit();
            if !dir.join(checkpoint::PUBLIC_KEY_FILE).exists() && public_key.is_none() {
                return Err(Error::new(
                    ErrorCode::FileUnreadable,
                    format!("there is no audit log in {}", dir.display()),
                    "point --home (or AIRLOCK_HOME) at the daemon's data root; the log is made when the daemon starts",
                ));
            }
            let key = public_key.as_deref().map(checkpoint::parse_public_key).transpose()?;
            let report = airlock_state::audit::verify::verify(&dir, key, anchor.as_deref())?;
            output::print(json, &report, || verify_text(&report));
            Ok(if report.ok { 0 } else { ErrorCode::AuditBroken.exit_code() })
        }
        AuditCommand::Ls { sandbox, since, kind, limit } => {
            let filter = Filter::new(sandbox, since, kind, None)?;
            let mut kept = std::collections::VecDeque::new();
            records(cli, &filter, |s| {
                if kept.len() == *limit {
                    kept.pop_front();
                }
                kept.push_back(s);
                Ok(())
            })?;
            let kept: Vec<Sealed> = kept.into();
            output::print(json, &kept, || ls_text(&kept));
            Ok(0)
        }
        AuditCommand::Export { sandbox, since, after } => {
            let filter = Filter::new(sandbox, since, &None, *after)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let written = records(cli, &filter, |s| {
                let line = airlock_state::audit::record::json_line_safe(
                    &serde_json::to_string(&s).expect("a record serializes"),
                );
                writeln!(out, "{line}").map_err(|e| Error::io("writing the export", &e))
            });
            match written.and_then(|()| out.flush().map_err(|e| Error::io("writing the export", &e))) {
                Ok(()) => Ok(0),
                // A reader that went away (`| head`) is not an error.
                Err(e) if e.message.contains("Broken pipe") => Ok(0),
                Err(e) => Err(e),
            }
        }
        AuditCommand::Checkpoint => {
            let c: Checkpoint = cli.client()?.call(Method::POST, "/v1/audit/checkpoint", None::<&()>).await?;
            output::print(json, &c, || {
                format!(
                    "record {} hash {}\nsigned {} by key {}\nsignature {}\n(keep this off the host; `airlock audit verify --anchor {}` checks the chain still holds it)",
                    c.seq,
                    c.hash,
                    c.at.to_rfc3339(),
                    c.key,
                    c.signature,
                    c.hash
                )
            });
            Ok(0)
        }
    }
}

fn verify_text(r: &Report) -> String {
    let mut out = String::new();
    if r.ok {
        out += &format!(
            "ok: {} records in {} segment(s), records {}..{}, head {}\n",
            r.records,
            r.segments,
            r.first_seq.unwrap_or(0),
            r.last_seq.unwrap_or(0),
            r.head.as_deref().map(|h| &h[..16]).unwrap_or("-")
        );
    } else {
        out += &format!("BROKEN: {} problem(s) found\n", r.problems.len());
        for (i, p) in r.problems.iter().enumerate() {
            let place = match p.line {
                Some(line) => format!("{} line {line}", p.file),
                None => p.file.clone(),
            };
            out += &format!("{} {place}: {}\n", if i == 0 { "first:" } else { "      " }, p.what);
        }
        out += &format!("read {} records in {} segment(s)\n", r.records, r.segments);
    }
    out += &format!(
        "{} checkpoint(s) verified under key {}{}",
        r.checkpoints,
        r.key,
        r.last_checkpoint
            .as_ref()
            .map(|c| format!(", the newest covering record {}", c.seq))
            .unwrap_or_default()
    );
    if r.unsigned_records > 0 {
        out += &format!(
            "\n{} record(s) after the newest checkpoint, vouched for by their MACs only",
            r.unsigned_records
        );
    }
    out += if r.macs_checked {
        "\nevery record's MAC checked"
    } else {
        "\nMACs not checked (the private key cannot be read here)"
    };
    if r.repaired > 0 {
        out += &format!("\n{} line(s) a crash cut short, closed and recorded by the daemon", r.repaired);
    }
    if r.retired_segments > 0 {
        out += &format!(
            "\n{} older segment(s) removed by retention; the chain is checked from where they ended",
            r.retired_segments
        );
    }
    if r.anchor_found == Some(true) {
        out += "\nthe anchor is in the chain";
    }
    out
}

fn ls_text(records: &[Sealed]) -> String {
    let mut out = String::from(
        "SEQ      AT                        DOOR       KIND                 SANDBOX          DETAIL\n",
    );
    for s in records {
        let r = &s.record;
        let detail = output::printable(&r.detail.to_string());
        let detail: String = detail.chars().take(100).collect();
        out += &format!(
            "{:<8} {:<25} {:<10} {:<20} {:<16} {}{}\n",
            r.seq,
            r.at.to_rfc3339(),
            r.door.as_str(),
            r.kind,
            r.sandbox.as_deref().unwrap_or("-"),
            r.reason.as_deref().map(|x| format!("reason={x} ")).unwrap_or_default(),
            detail
        );
    }
    out
}
