//! The audit log read back: records in order, the last one of a segment, the
//! checkpoints, and the segments retired by retention.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::checkpoint::{Checkpoint, CHECKPOINTS_FILE};
use super::record::{self, LineFault, Sealed};
use crate::error::{Error, Result};

/// Where segments removed by retention are noted, with the last record of each.
pub const RETIRED_FILE: &str = "retired.jsonl";

/// A segment removed by retention: the chain after it starts from its last record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Retired {
    /// The segment's number.
    pub segment: u64,
    /// Its last record's sequence number and hash.
    pub last_seq: u64,
    /// See `last_seq`.
    pub last_hash: String,
}

/// The last record of a segment, if it has one (reading backwards from its end).
pub fn last_record(path: &Path) -> Result<Option<Sealed>> {
    let mut file = File::open(path).map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
    let len = file.metadata().map_err(|e| Error::io(format!("reading {}", path.display()), &e))?.len();
    let mut window = 64 * 1024u64;
    loop {
        let start = len.saturating_sub(window);
        file.seek(SeekFrom::Start(start))
            .map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
        let mut tail = Vec::new();
        file.read_to_end(&mut tail).map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
        let text = String::from_utf8_lossy(&tail);
        let text = text.strip_suffix('\n').unwrap_or(&text);
        if text.is_empty() {
            return Ok(None);
        }
        match text.rfind('\n') {
            Some(i) => return opened(&text[i + 1..], path).map(Some),
            None if start == 0 => return opened(text, path).map(Some),
            None => window *= 4,
        }
    }
}

fn opened(line: &str, path: &Path) -> Result<Sealed> {
    record::open(line).map_err(|fault| {
        Error::new(
            crate::error::ErrorCode::AuditBroken,
            format!("the last record of {} {fault}", path.display()),
            "run `airlock audit verify` to see where the chain breaks; the log is not written past a broken head",
        )
    })
}

/// The head left by retired segments: the last record of the newest one retired.
pub fn retired_head(dir: &Path) -> Result<Option<(u64, String)>> {
    Ok(retired(dir)?.last().map(|r| (r.last_seq, r.last_hash.clone())))
}

/// The segments retired so far, oldest first.
pub fn retired(dir: &Path) -> Result<Vec<Retired>> {
    let path = dir.join(RETIRED_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), &e)),
    };
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// Removes the oldest segments until `keep` are left, noting each in
/// [`RETIRED_FILE`] first (so the chain's start stays known).
pub fn retire(dir: &Path, keep: usize) -> Result<()> {
    let segments = super::segments(dir)?;
    for (n, path) in segments.iter().take(segments.len().saturating_sub(keep.max(1))) {
        let Some(last) = last_record(path)? else { continue };
        let note = Retired { segment: *n, last_seq: last.record.seq, last_hash: last.hash };
        let mut line = serde_json::to_string(&note).expect("a note serializes");
        line.push('\n');
        let retired = dir.join(RETIRED_FILE);
        OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&retired)
            .and_then(|mut f| {
                f.write_all(line.as_bytes())?;
                f.sync_data()
            })
            .map_err(|e| Error::io(format!("writing {}", retired.display()), &e))?;
        std::fs::remove_file(path).map_err(|e| Error::io(format!("removing {}", path.display()), &e))?;
    }
    Ok(())
}

/// The checkpoints, oldest first; a line that is not one is an `Err` with its line number.
pub fn checkpoints(dir: &Path) -> Result<Vec<std::result::Result<Checkpoint, usize>>> {
    let path = dir.join(CHECKPOINTS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), &e)),
    };
    Ok(text.lines().enumerate().map(|(i, l)| serde_json::from_str(l).map_err(|_| i + 1)).collect())
}

/// One line of a segment, read in order.
pub struct Line {
    /// The segment's number and file.
    pub segment: u64,
    /// See `segment`.
    pub path: PathBuf,
    /// The line's number in its segment, from 1.
    pub number: usize,
    /// The record, or why the line is not a sound one.
    pub record: std::result::Result<Sealed, LineFault>,
}

/// Every line of every segment, oldest first.
pub fn lines(dir: &Path) -> Result<impl Iterator<Item = Result<Line>>> {
    let segments = super::segments(dir)?;
    Ok(segments.into_iter().flat_map(|(segment, path)| {
        let file = File::open(&path);
        let (reader, error) = match file {
            Ok(f) => (Some(BufReader::new(f)), None),
            Err(e) => (None, Some(Error::io(format!("reading {}", path.display()), &e))),
        };
        let path2 = path.clone();
        let read = reader.into_iter().flat_map(|r| r.split(b'\n')).enumerate().map(move |(i, bytes)| {
            let bytes = bytes.map_err(|e| Error::io(format!("reading {}", path2.display()), &e))?;
            let text = String::from_utf8_lossy(&bytes);
            Ok(Line { segment, path: path2.clone(), number: i + 1, record: record::open(&text) })
        });
        error.map(Err).into_iter().chain(read)
    }))
}

/// Whether a segment ends with a whole line (a write cut short does not).
pub fn ends_whole(path: &Path) -> bool {
    let Ok(mut file) = File::open(path) else { return false };
    let Ok(len) = file.metadata().map(|m| m.len()) else { return false };
    if len == 0 {
        return true;
    }
    let mut last = [0u8];
    file.seek(SeekFrom::Start(len - 1)).is_ok() && file.read_exact(&mut last).is_ok() && last[0] == b'\n'
}
