//! The audit log read back: records in order, the last one of a segment, the
//! checkpoints, and the segments retired by retention (and retiring them).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::checkpoint::{Checkpoint, Retired, Signer, CHECKPOINTS_FILE, RETIRED_FILE};
use super::record::{self, LineFault, Sealed};
use airlock_core::error::{Error, Result};

/// The end of a file of lines: its last whole line, and the bytes after it
/// when the file does not end with a newline (a write cut short).
pub struct Tail {
    /// The last line that ends with a newline (without it).
    pub last: Option<String>,
    /// What follows that line, if anything.
    pub torn: Option<Vec<u8>>,
}

/// Reads the end of `path` backwards until a whole last line is found.
pub fn tail(path: &Path) -> Result<Tail> {
    let io = |e: std::io::Error| Error::io(format!("reading {}", path.display()), &e);
    let mut file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    // Records are a few hundred bytes; a window that is too small grows.
    let mut window = 4096u64;
    loop {
        let start = len.saturating_sub(window);
        file.seek(SeekFrom::Start(start)).map_err(io)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        // Split off a torn end: whatever follows the last newline.
        let (whole, torn) = match bytes.iter().rposition(|b| *b == b'\n') {
            Some(i) => (&bytes[..i], (i + 1 < bytes.len()).then(|| bytes[i + 1..].to_vec())),
            None if start == 0 => (&bytes[..0], (!bytes.is_empty()).then(|| bytes.clone())),
            None => {
                window *= 4;
                continue;
            }
        };
        match whole.iter().rposition(|b| *b == b'\n') {
            Some(i) => {
                return Ok(Tail { last: Some(String::from_utf8_lossy(&whole[i + 1..]).into_owned()), torn })
            }
            None if start == 0 => {
                let last = (!whole.is_empty()).then(|| String::from_utf8_lossy(whole).into_owned());
                return Ok(Tail { last, torn });
            }
            None => window *= 4,
        }
    }
}

/// The last record of a segment, if it has one; a torn end is left out.
pub fn last_record(path: &Path) -> Result<Option<Sealed>> {
    tail(path)?.last.map(|line| opened(&line, path)).transpose()
}

/// The newest checkpoint (read from the end of the file).
pub fn last_checkpoint(dir: &Path) -> Option<Checkpoint> {
    let last = tail(&dir.join(CHECKPOINTS_FILE)).ok()?.last?;
    serde_json::from_str(&last).ok()
}

/// How many lines `path` holds before its end (the number of newlines).
pub fn count_lines(path: &Path) -> Result<usize> {
    let file = File::open(path).map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
    let mut reader = BufReader::new(file);
    let mut count = 0;
    loop {
        let buf = reader.fill_buf().map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
        if buf.is_empty() {
            return Ok(count);
        }
        count += buf.iter().filter(|b| **b == b'\n').count();
        let n = buf.len();
        reader.consume(n);
    }
}

fn opened(line: &str, path: &Path) -> Result<Sealed> {
    record::open(line).map_err(|fault| {
        Error::new(
            airlock_core::error::ErrorCode::AuditBroken,
            format!("the last record of {} {fault}", path.display()),
            "run `airlock audit verify` to see where the chain breaks; the log is not written past a broken head",
        )
    })
}

/// The head left by retired segments: the last record of the newest one retired.
pub fn retired_head(dir: &Path) -> Result<Option<(u64, String)>> {
    Ok(retired(dir)?.into_iter().filter_map(|r| r.ok()).next_back().map(|r| (r.last_seq, r.last_hash)))
}

/// The segments retired so far, oldest first; a line that is not a note is an
/// `Err` with its line number.
pub fn retired(dir: &Path) -> Result<Vec<std::result::Result<Retired, usize>>> {
    json_lines(&dir.join(RETIRED_FILE))
}

/// Removes the oldest segments until `keep` are left, noting each, signed, in
/// [`RETIRED_FILE`] first (so the chain's start stays known, and vouched for).
pub fn retire(dir: &Path, keep: usize, signer: &Signer) -> Result<()> {
    let segments = super::segments(dir)?;
    for (n, path) in segments.iter().take(segments.len().saturating_sub(keep.max(1))) {
        let Some(last) = last_record(path)? else { continue };
        let note = signer.sign_retired(*n, last.record.seq, &last.hash);
        super::append_json_line(&dir.join(RETIRED_FILE), &note)?;
        std::fs::remove_file(path).map_err(|e| Error::io(format!("removing {}", path.display()), &e))?;
    }
    Ok(())
}

/// The checkpoints, oldest first; a line that is not one is an `Err` with its line number.
pub fn checkpoints(dir: &Path) -> Result<Vec<std::result::Result<Checkpoint, usize>>> {
    json_lines(&dir.join(CHECKPOINTS_FILE))
}

/// The checkpoints appended past byte `offset` of their file (whole lines
/// only), and the offset to read from next.
pub fn checkpoints_after(dir: &Path, offset: u64) -> (Vec<Checkpoint>, u64) {
    let Ok(mut file) = File::open(dir.join(CHECKPOINTS_FILE)) else { return (Vec::new(), offset) };
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(offset)).and_then(|_| file.read_to_end(&mut bytes)).is_err() {
        return (Vec::new(), offset);
    }
    let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let found =
        bytes[..whole].split(|b| *b == b'\n').filter_map(|l| serde_json::from_slice(l).ok()).collect();
    (found, offset + whole as u64)
}

/// Each line of a file of JSON objects, oldest first (none when there is no
/// file); a line that is not one is an `Err` with its line number.
fn json_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<std::result::Result<T, usize>>> {
    let text = match std::fs::read_to_string(path) {
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
    /// The line's bytes, without its newline.
    pub bytes: Vec<u8>,
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
            let record = record::open(&String::from_utf8_lossy(&bytes));
            Ok(Line { segment, path: path2.clone(), number: i + 1, bytes, record })
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
