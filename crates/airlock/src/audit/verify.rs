//! `airlock audit verify`: the walk over every segment and checkpoint that
//! names the first place where the log is not what was written.
//!
//! What it catches, and how:
//! - an edited byte: the record's body no longer hashes to the hash it carries;
//! - a record removed, inserted or moved: its sequence number or its `prev`
//!   does not follow the record before;
//! - a segment replaced by one consistent with itself: a checkpoint's signed
//!   hash differs from the record at its sequence number;
//! - a tail cut off: a checkpoint covers a record past the chain's end, or
//!   the anchor (an exported checkpoint's hash) is not in the chain;
//! - a checkpoint forged or altered: its signature does not verify.

use std::path::Path;

use serde::Serialize;

use super::checkpoint::{self, Checkpoint};
use super::read;
use super::record::GENESIS;
use crate::error::Result;

/// One place where the log is broken.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// The file it is in (a segment, `checkpoints.jsonl`).
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
    /// The fingerprint of the key checkpoints were checked against.
    pub key: String,
    /// Segments removed by retention before the first one present.
    pub retired_segments: usize,
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
    let key = match public_key {
        Some(key) => key,
        None => checkpoint::public_key(dir)?,
    };
    let mut problems = Vec::new();
    let checkpoint_file = checkpoint::CHECKPOINTS_FILE.to_owned();

    // Checkpoints first: only those that verify vouch for the chain.
    let mut signed: Vec<Checkpoint> = Vec::new();
    for (i, c) in read::checkpoints(dir)?.into_iter().enumerate() {
        match c {
            Ok(c) if c.verify(&key) => {
                if signed.last().is_some_and(|last: &Checkpoint| last.seq > c.seq) {
                    problems.push(Problem {
                        file: checkpoint_file.clone(),
                        line: Some(i + 1),
                        seq: Some(c.seq),
                        what: "this checkpoint covers an earlier record than the one before it: checkpoints were reordered".into(),
                    });
                }
                signed.push(c);
            }
            Ok(c) => problems.push(Problem {
                file: checkpoint_file.clone(),
                line: Some(i + 1),
                seq: Some(c.seq),
                what: format!(
                    "this checkpoint's signature does not verify under key {}: it was forged or altered",
                    checkpoint::fingerprint(&key)
                ),
            }),
            Err(line) => problems.push(Problem {
                file: checkpoint_file.clone(),
                line: Some(line),
                seq: None,
                what: "this line is not a checkpoint".into(),
            }),
        }
    }
    let mut pending = signed.clone();
    pending.sort_by_key(|c| c.seq);
    let mut pending = pending.into_iter().peekable();

    let retired = read::retired(dir)?;
    let (mut expected_seq, mut expected_prev) = match retired.last() {
        Some(r) => (r.last_seq + 1, r.last_hash.clone()),
        None => (1, GENESIS.to_owned()),
    };
    // Checkpoints of retired records cannot be checked any more.
    while pending.next_if(|c| c.seq < expected_seq).is_some() {}

    let (mut records, mut first_seq, mut last_seq, mut head) = (0u64, None, None, None);
    let mut anchor_found = anchor.map(|_| false);
    let segments = super::segments(dir)?;
    for (_, path) in &segments {
        if !read::ends_whole(path) {
            problems.push(Problem {
                file: file_name(path),
                line: None,
                seq: None,
                what: "the segment ends in the middle of a line: its end was cut off or a write was torn"
                    .into(),
            });
        }
    }
    for line in read::lines(dir)? {
        let line = line?;
        let file = file_name(&line.path);
        let sealed = match line.record {
            Ok(sealed) => sealed,
            Err(fault) => {
                problems.push(Problem {
                    file,
                    line: Some(line.number),
                    seq: Some(expected_seq),
                    what: format!("the record expected here (seq {expected_seq}) {fault}"),
                });
                // Go on past it as if it were the record expected.
                expected_seq += 1;
                expected_prev = String::new();
                continue;
            }
        };
        let r = &sealed.record;
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
            problems.push(Problem { file: file.clone(), line: Some(line.number), seq: Some(r.seq), what });
        } else if !expected_prev.is_empty() && r.prev != expected_prev {
            problems.push(Problem {
                file: file.clone(),
                line: Some(line.number),
                seq: Some(r.seq),
                what: format!(
                    "record {} does not follow the record before it (its prev is {}, the record before hashes to {}): records were replaced, inserted or moved",
                    r.seq,
                    short(&r.prev),
                    short(&expected_prev)
                ),
            });
        }
        while let Some(c) = pending.next_if(|c| c.seq <= r.seq) {
            if c.seq == r.seq && c.hash != sealed.hash {
                problems.push(Problem {
                    file: file.clone(),
                    line: Some(line.number),
                    seq: Some(r.seq),
                    what: format!(
                        "record {} is not the record the checkpoint signed at {} covers (it hashes to {}, the checkpoint says {}): the chain was rewritten",
                        r.seq,
                        c.at.to_rfc3339(),
                        short(&sealed.hash),
                        short(&c.hash)
                    ),
                });
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
    for c in pending {
        problems.push(Problem {
            file: checkpoint_file.clone(),
            line: None,
            seq: Some(c.seq),
            what: format!(
                "the checkpoint signed at {} covers record {}, but the chain ends at record {}: the records after it were removed",
                c.at.to_rfc3339(),
                c.seq,
                last_seq.unwrap_or(0)
            ),
        });
    }
    if anchor_found == Some(false) {
        problems.push(Problem {
            file: "(anchor)".into(),
            line: None,
            seq: None,
            what: format!(
                "no record hashes to the anchor {}: the records up to it were removed or rewritten",
                short(anchor.unwrap_or_default())
            ),
        });
    }
    Ok(Report {
        ok: problems.is_empty(),
        records,
        segments: segments.len(),
        first_seq,
        last_seq,
        head,
        checkpoints: signed.len(),
        last_checkpoint: signed.into_iter().max_by_key(|c| c.seq),
        key: checkpoint::fingerprint(&key),
        retired_segments: retired.len(),
        anchor_found,
        problems,
    })
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(16)]
}
