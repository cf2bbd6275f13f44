//! `airlock audit verify`: the walk over every segment, checkpoint and
//! retirement note that names the first place where the log is not what was
//! written.
//!
//! What it catches, and how:
//! - an edited byte: the record's body no longer hashes to the hash it carries;
//! - a record removed, inserted or moved: its sequence number or its `prev`
//!   does not follow the record before;
//! - a record written, or a chain rewritten, without the key: its MAC does not
//!   verify (checked when the private key can be read, as root on the host);
//! - a segment replaced by one consistent with itself: a checkpoint's signed
//!   hash differs from the record at its sequence number;
//! - a segment removed: the numbering of segments has a hole, or the first one
//!   does not start where the signed retirement notes say the chain goes on;
//! - a tail cut off: a checkpoint covers a record past the chain's end, or
//!   the anchor (an exported checkpoint's hash) is not in the chain;
//! - a checkpoint or retirement note forged or altered: its signature does not
//!   verify; `signing.pub` replaced: it is not the private key's public half.
//!
//! A line a crash cut short is not tampering when the next record is the
//! daemon's `audit_repaired` naming it, with the hash of its bytes.

use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::checkpoint::{self, Checkpoint};
use super::read;
use super::record::{LineFault, MacKey, GENESIS};
use airlock_core::error::Result;

/// One place where the log is broken.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// The file it is in (a segment, `checkpoints.jsonl`, `retired.jsonl`).
    pub file: String,
    /// The line, from 1, when it is one line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// The record's sequence number, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// What is wrong, in a sentence.
    pub what: String,
}

/// What `audit verify` found.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Report {
    /// No problem found.
    pub ok: bool,
    /// Records read.
    pub records: u64,
    /// Segments read.
    pub segments: usize,
    /// The first record present (after any retired segments).
    pub first_seq: Option<u64>,
    /// The last record: its sequence number and hash.
    pub last_seq: Option<u64>,
    /// See `last_seq`.
    pub head: Option<String>,
    /// Checkpoints whose signature verified.
    pub checkpoints: usize,
    /// The newest checkpoint that verified.
    pub last_checkpoint: Option<Checkpoint>,
    /// Records after the newest checkpoint: vouched for by their MACs only.
    pub unsigned_records: u64,
    /// The fingerprint of the key checkpoints were checked against.
    pub key: String,
    /// Whether each record's MAC was checked (the private key could be read).
    pub macs_checked: bool,
    /// Segments removed by retention before the first one present.
    pub retired_segments: usize,
    /// Lines a crash cut short that the daemon closed and recorded.
    pub repaired: usize,
    /// Whether the anchor given was found in the chain (absent without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anchor_found: Option<bool>,
    /// Every problem found, in order; the first is the first broken place.
    pub problems: Vec<Problem>,
}

/// Walks the log in `dir`, checking checkpoints against `public_key` (the
/// directory's own key when `None`) and, if given, that `anchor` (a record
/// hash) is in the chain.
pub fn verify(dir: &Path, public_key: Option<Vec<u8>>, anchor: Option<&str>) -> Result<Report> {
    let mut problems = Vec::new();
    let problem = |file: &str, line: Option<usize>, seq: Option<u64>, what: String| Problem {
        file: file.to_owned(),
        line,
        seq,
        what,
    };
    let local = checkpoint::local_keys(dir);
    let key = match public_key {
        Some(key) => key,
        None => checkpoint::public_key(dir)?,
    };
    if let Some((_, own)) = &local {
        if *own != key {
            problems.push(problem(
                checkpoint::PUBLIC_KEY_FILE,
                None,
                None,
                format!(
                    "the key checked against ({}) is not the public half of signing.key ({}): it was replaced",
                    airlock_core::secret::fingerprint(&key),
                    airlock_core::secret::fingerprint(own)
                ),
            ));
        }
    }
    let mac_key: Option<MacKey> = local.map(|(mac, _)| mac);

    // Checkpoints first: only those that verify vouch for the chain.
    let mut signed: Vec<Checkpoint> = Vec::new();
    for (i, c) in read::checkpoints(dir)?.into_iter().enumerate() {
        let file = checkpoint::CHECKPOINTS_FILE;
        match c {
            Ok(c) if c.verify(&key) => {
                if signed.last().is_some_and(|last: &Checkpoint| last.seq > c.seq) {
                    problems.push(problem(file, Some(i + 1), Some(c.seq), "this checkpoint covers an earlier record than the one before it: checkpoints were reordered".into()));
                }
                signed.push(c);
            }
            Ok(c) => problems.push(problem(
                file,
                Some(i + 1),
                Some(c.seq),
                format!(
                    "this checkpoint's signature does not verify under key {}: it was forged or altered",
                    airlock_core::secret::fingerprint(&key)
                ),
            )),
            Err(line) => {
                problems.push(problem(file, Some(line), None, "this line is not a checkpoint".into()))
            }
        }
    }

    // Retirement notes: signed, for segments 1, 2, ... in order, each ending
    // after the one before.
    let mut retired = Vec::new();
    for (i, note) in read::retired(dir)?.into_iter().enumerate() {
        let file = checkpoint::RETIRED_FILE;
        match note {
            Ok(note) if note.verify(&key) => {
                let expected = retired.len() as u64 + 1;
                let ordered = retired.last().is_none_or(|r: &checkpoint::Retired| note.last_seq > r.last_seq);
                if note.segment != expected || !ordered {
                    problems.push(problem(file, Some(i + 1), Some(note.last_seq), format!(
                        "this note retires segment {} where segment {expected} was next: notes were removed, duplicated or reordered",
                        note.segment
                    )));
                }
                retired.push(note);
            }
            Ok(note) => problems.push(problem(
                file,
                Some(i + 1),
                Some(note.last_seq),
                "this retirement note's signature does not verify: it was forged or altered".into(),
            )),
            Err(line) => {
                problems.push(problem(file, Some(line), None, "this line is not a retirement note".into()))
            }
        }
    }
    let (mut expected_seq, mut expected_prev) = match retired.last() {
        Some(r) => (r.last_seq + 1, r.last_hash.clone()),
        None => (1, GENESIS.to_owned()),
    };
    let mut pending = signed.clone();
    pending.sort_by_key(|c| c.seq);
    let mut pending = pending.into_iter().peekable();
    // Checkpoints of retired records cannot be checked any more.
    while pending.next_if(|c| c.seq < expected_seq).is_some() {}

    // Segments: numbered on from the retired ones, without a hole.
    let segments = super::segments(dir)?;
    let mut next_segment = retired.len() as u64 + 1;
    for (n, path) in &segments {
        let name = file_name(path);
        if retired.iter().any(|r| r.segment == *n) {
            problems.push(problem(&name, None, None, format!("segment {n} is present but noted as retired")));
        } else if *n != next_segment {
            problems.push(problem(
                &name,
                None,
                None,
                format!(
                    "segment {n} comes where segment {next_segment} should: {} segment(s) were removed",
                    n.saturating_sub(next_segment)
                ),
            ));
        }
        next_segment = n + 1;
        if !read::ends_whole(path) {
            problems.push(problem(
                &name,
                None,
                None,
                "the segment ends in the middle of a line: its end was cut off or a write was torn".into(),
            ));
        }
    }

    let (mut records, mut first_seq, mut last_seq, mut head) = (0u64, None, None, None);
    let mut anchor_found = anchor.map(|_| false);
    let mut repaired = 0usize;
    // A line cut short, held until the next record says whether it was repaired.
    let mut torn: Option<(String, usize, String, Problem)> = None;
    for line in read::lines(dir)? {
        let line = line?;
        let file = file_name(&line.path);
        let sealed = match line.record {
            Ok(sealed) => sealed,
            Err(fault) => {
                if let Some((_, _, _, held)) = torn.take() {
                    problems.push(held);
                }
                let what = format!("the record expected here (seq {expected_seq}) {fault}");
                let held = problem(&file, Some(line.number), Some(expected_seq), what);
                match fault {
                    // Perhaps a write a crash cut short: the next record may say so.
                    LineFault::Malformed(_) => {
                        torn = Some((file, line.number, sha256_hex(&line.bytes), held))
                    }
                    LineFault::HashMismatch { .. } => {
                        problems.push(held);
                        // Go on past it as if it were the record expected.
                        expected_seq += 1;
                        expected_prev = String::new();
                    }
                }
                continue;
            }
        };
        let r = &sealed.record;
        if let Some((torn_file, torn_line, digest, held)) = torn.take() {
            let names = |key: &str, value: serde_json::Value| r.detail.get(key) == Some(&value);
            let repairs = r.kind == "audit_repaired"
                && names("segment", torn_file.into())
                && names("line", torn_line.into())
                && names("sha256", digest.into());
            if repairs {
                repaired += 1;
            } else {
                problems.push(held);
                expected_seq += 1;
                expected_prev = String::new();
            }
        }
        if let Some(mac) = &mac_key {
            if !sealed.mac_verifies(mac) {
                problems.push(problem(&file, Some(line.number), Some(r.seq), format!(
                    "record {} was not written with this log's key (its MAC does not verify): it was forged or the chain rewritten",
                    r.seq
                )));
            }
        }
        if r.seq != expected_seq {
            let what = if r.seq > expected_seq {
                format!(
                    "record {} comes where record {expected_seq} should: {} record(s) before it were removed or moved",
                    r.seq,
                    r.seq - expected_seq
                )
            } else {
                format!(
                    "record {} comes where record {expected_seq} should: records were inserted or moved",
                    r.seq
                )
            };
            problems.push(problem(&file, Some(line.number), Some(r.seq), what));
        } else if !expected_prev.is_empty() && r.prev != expected_prev {
            problems.push(problem(&file, Some(line.number), Some(r.seq), format!(
                "record {} does not follow the record before it (its prev is {}, the record before hashes to {}): records were replaced, inserted or moved",
                r.seq,
                short(&r.prev),
                short(&expected_prev)
            )));
        }
        while let Some(c) = pending.next_if(|c| c.seq <= r.seq) {
            if c.seq == r.seq && c.hash != sealed.hash {
                problems.push(problem(&file, Some(line.number), Some(r.seq), format!(
                    "record {} is not the record the checkpoint signed at {} covers (it hashes to {}, the checkpoint says {}): the chain was rewritten",
                    r.seq,
                    c.at.to_rfc3339(),
                    short(&sealed.hash),
                    short(&c.hash)
                )));
            }
        }
        if anchor == Some(sealed.hash.as_str()) {
            anchor_found = Some(true);
        }
        records += 1;
        first_seq.get_or_insert(r.seq);
        last_seq = Some(r.seq);
        expected_seq = r.seq + 1;
        expected_prev = sealed.hash.clone();
        head = Some(sealed.hash);
    }
    if let Some((_, _, _, held)) = torn.take() {
        problems.push(held);
    }
    for c in pending {
        problems.push(problem(checkpoint::CHECKPOINTS_FILE, None, Some(c.seq), format!(
            "the checkpoint signed at {} covers record {}, but the chain ends at record {}: the records after it were removed",
            c.at.to_rfc3339(),
            c.seq,
            last_seq.unwrap_or(0)
        )));
    }
    if anchor_found == Some(false) {
        problems.push(problem(
            "(anchor)",
            None,
            None,
            format!(
                "no record hashes to the anchor {}: the records up to it were removed or rewritten",
                short(anchor.unwrap_or_default())
            ),
        ));
    }
    let newest = signed.iter().map(|c| c.seq).max().unwrap_or(0);
    Ok(Report {
        ok: problems.is_empty(),
        records,
        segments: segments.len(),
        first_seq,
        last_seq,
        head,
        checkpoints: signed.len(),
        unsigned_records: last_seq.unwrap_or(0).saturating_sub(newest.max(expected_floor(&retired))),
        last_checkpoint: signed.into_iter().max_by_key(|c| c.seq),
        key: airlock_core::secret::fingerprint(&key),
        macs_checked: mac_key.is_some(),
        retired_segments: retired.len(),
        repaired,
        anchor_found,
        problems,
    })
}

/// The last record the retirement notes vouch for.
fn expected_floor(retired: &[checkpoint::Retired]) -> u64 {
    retired.last().map(|r| r.last_seq).unwrap_or(0)
}

fn sha256_hex(bytes: &[u8]) -> String {
    airlock_core::secret::hex(&Sha256::digest(bytes))
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(16)]
}
