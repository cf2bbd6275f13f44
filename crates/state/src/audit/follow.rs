//! Following the audit log: every record written (by the daemon or its router
//! process) is read once, in order.
//!
//! The metrics and the trace exporter follow the log rather than hook each call
//! site: one place sees every door, the router's process included, and nothing
//! is counted or traced that has no record.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::record::{self, Sealed};

/// Where reading has got to: a segment and a byte offset in it.
#[derive(Debug, Clone, Default)]
pub struct Cursor {
    segment: u64,
    offset: u64,
}

/// Reads audit records past a cursor.
pub struct Follower {
    dir: PathBuf,
    cursor: Cursor,
}

impl Follower {
    /// A follower of the log in `dir` that starts at its current end.
    pub fn at_end(dir: &Path) -> Follower {
        let cursor = match crate::audit::segments(dir).ok().and_then(|s| s.last().cloned()) {
            Some((segment, path)) => {
                Cursor { segment, offset: std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) }
            }
            None => Cursor::default(),
        };
        Follower { dir: dir.to_owned(), cursor }
    }

    /// The records written since the last call (at most about `max_bytes` of them).
    pub fn next_batch(&mut self, max_bytes: u64) -> Vec<Sealed> {
        let mut out = Vec::new();
        let Ok(segments) = crate::audit::segments(&self.dir) else { return out };
        let mut budget = max_bytes;
        let from = self.cursor.segment;
        for (n, path) in segments.into_iter().filter(|(n, _)| *n >= from) {
            if n != self.cursor.segment {
                self.cursor = Cursor { segment: n, offset: 0 };
            }
            let Ok(mut file) = std::fs::File::open(&path) else { break };
            if file.seek(SeekFrom::Start(self.cursor.offset)).is_err() {
                break;
            }
            let mut bytes = Vec::new();
            if (&mut file).take(budget).read_to_end(&mut bytes).is_err() {
                break;
            }
            // Only whole lines: a line being written is read next time.
            let whole = bytes.iter().rposition(|b| *b == b'\n').map(|i| i + 1).unwrap_or(0);
            for line in bytes[..whole].split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                if let Ok(sealed) = record::open(&String::from_utf8_lossy(line)) {
                    out.push(sealed);
                }
            }
            self.cursor.offset += whole as u64;
            budget = budget.saturating_sub(whole as u64);
            if budget == 0 {
                break;
            }
        }
        out
    }
}
