//! The tamper-evident audit log: every event, hash-chained, in append-only
//! segments under `$AIRLOCK_HOME/audit/`, with Ed25519-signed checkpoints.
//!
//! The store writes each event here before keeping it ([`airlock_core::events::Journal`]),
//! so an operation that grants access fails when its record cannot be written,
//! and a teardown's record waits, after a gap record, for the next write. The
//! daemon and its router process both write: an exclusive `flock` on
//! `audit/lock` orders them, and each re-reads the head when the other moved it.
//!
//! - [`record`]: one record and its line, hashed;
//! - [`checkpoint`]: the signing key and the signed checkpoints;
//! - [`read`]: the segments read back (`audit ls`, `export`);
//! - [`follow`]: new records read as they come (metrics, traces);
//! - [`verify`]: the walk that names the first broken record.

pub mod checkpoint;
pub mod follow;
pub mod read;
pub mod record;
pub mod verify;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use serde_json::json;

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{Door, EventKind, Journal, JournalEntry, Journaled};
use checkpoint::{Checkpoint, Signer};
use record::{Record, GENESIS};
use sha2::Digest;

/// How the audit log writes (flags of `airlock serve`; the router process
/// gets the same).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AuditOptions {
    /// `fdatasync` after every record (survives a power cut, costs a disk flush).
    pub fsync: bool,
    /// A segment past this size is closed and the next record starts a new one.
    pub segment_bytes: u64,
    /// Segments kept (the oldest go first); 0 keeps them all.
    pub keep_segments: usize,
    /// A checkpoint is signed after this many records.
    pub checkpoint_every: u64,
    /// ... and at least this often while records are written.
    pub checkpoint_interval: Duration,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            fsync: false,
            segment_bytes: 64 << 20,
            keep_segments: 0,
            checkpoint_every: 1000,
            checkpoint_interval: Duration::from_secs(60),
        }
    }
}

/// Where the chain stands: the newest segment and the last record in it.
struct Head {
    /// The newest segment's number (0 before the first record, `u64::MAX`
    /// before the first look).
    segment: u64,
    /// Its length when this process last read or wrote it.
    len: u64,
    /// The last record's sequence number and hash.
    seq: u64,
    hash: String,
    /// When this process last signed a checkpoint, and the newest record a
    /// checkpoint it knows of covers.
    checkpointed_at: Instant,
    checkpointed_seq: u64,
}

/// The audit log, open for writing.
pub struct AuditLog {
    dir: PathBuf,
    options: AuditOptions,
    signer: Signer,
    lock: File,
    head: Mutex<Head>,
    /// Entries that could not be written, oldest first.
    deferred: Mutex<Deferred>,
}

/// Entries waiting for the log to be writable again. Bounded: past
/// [`DEFERRED_KEPT`] the newest are counted, not kept, and the gap record says
/// how many were lost.
#[derive(Default)]
struct Deferred {
    entries: std::collections::VecDeque<JournalEntry>,
    /// The first failure's error.
    error: Option<String>,
    /// Entries past the bound, not kept.
    lost: u64,
}

/// Entries kept while the log cannot be written (a flood of refused
/// connections during an outage must not grow the daemon without bound).
pub const DEFERRED_KEPT: usize = 100_000;

/// The file name of segment `n`.
pub fn segment_name(n: u64) -> String {
    format!("segment-{n:08}.jsonl")
}

/// The segments in `dir`, oldest first.
pub fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("reading {}", dir.display()), &e)),
    };
    let mut found: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name.strip_prefix("segment-")?.strip_suffix(".jsonl")?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// Appends `value` to `path` as one JSON line (the file made 0600) and
/// flushes it to disk: checkpoints and retirement notes, which are rare.
fn append_json_line(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let mut line = serde_json::to_string(value).expect("a note serializes");
    line.push('\n');
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| {
            f.write_all(line.as_bytes())?;
            f.sync_data()
        })
        .map_err(|e| Error::io(format!("writing {}", path.display()), &e))
}

/// A record the log makes about itself (a gap, a repair): the daemon's, now.
fn own_entry(kind: EventKind, detail: serde_json::Value) -> JournalEntry {
    JournalEntry {
        at: airlock_core::clock::Timestamp::now(),
        kind,
        door: Door::Daemon,
        sandbox: None,
        golden: None,
        generation: None,
        reason: None,
        detail,
    }
}

/// The error when the log ends in something this log's key did not write.
fn foreign_tail(path: &Path, what: &str) -> Error {
    Error::new(
        ErrorCode::AuditBroken,
        format!("the audit log ends in something it did not write ({}: {what}); nothing is written after it", path.display()),
        "run `airlock audit verify` to see what was changed; move the audit directory aside to start a new log",
    )
}

/// The error an operation gets when its record cannot be written.
fn unavailable(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorCode::AuditUnavailable,
        format!("the audit log could not be written ({what}: {e}); nothing was granted"),
        "free space on the volume holding $AIRLOCK_HOME/audit and check its permissions, then try again",
    )
}

impl AuditLog {
    /// Opens (creating if needed, mode 0700) the audit log in `dir`.
    pub fn open(dir: &Path, options: AuditOptions) -> Result<AuditLog> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), &e))?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| Error::io(format!("securing {}", dir.display()), &e))?;
        let signer = Signer::load_or_create(dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(dir.join("lock"))
            .map_err(|e| Error::io(format!("opening {}", dir.join("lock").display()), &e))?;
        let log = AuditLog {
            dir: dir.to_owned(),
            options,
            signer,
            lock,
            head: Mutex::new(Head {
                segment: u64::MAX,
                len: 0,
                seq: 0,
                hash: GENESIS.into(),
                checkpointed_at: Instant::now(),
                checkpointed_seq: 0,
            }),
            deferred: Mutex::new(Deferred::default()),
        };
        match log.locked(|_| Ok(())) {
            Ok(()) => {}
            // A daemon must start to tear sandboxes down and expire them even
            // when its log is broken; it grants nothing until it is put right.
            Err(e) if e.code == ErrorCode::AuditBroken => {
                tracing::error!(error = %e, "the audit log is broken: nothing will be granted until it is put right")
            }
            Err(e) => return Err(e),
        }
        Ok(log)
    }

    /// The directory it writes in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last record's sequence number and hash, as this process last saw them.
    pub fn head(&self) -> (u64, String) {
        let head = self.head.lock().unwrap_or_else(|p| p.into_inner());
        (head.seq, head.hash.clone())
    }

    /// Runs `work` holding this process's mutex and the cross-process lock, with
    /// the head brought up to date first.
    fn locked<T>(&self, work: impl FnOnce(&mut Head) -> Result<T>) -> Result<T> {
        let mut head = self.head.lock().unwrap_or_else(|p| p.into_inner());
        let lock = self.lock.try_clone().map_err(|e| unavailable("its lock", e))?;
        let _held =
            Flock::lock(lock, FlockArg::LockExclusive).map_err(|(_, e)| unavailable("its lock", e))?;
        self.catch_up(&mut head)?;
        work(&mut head)
    }

    /// Re-reads the head if another process wrote since this one last did. A
    /// last record this log's key did not MAC is never chained onto (the log
    /// would launder it into its checkpoints); a write cut short is closed and
    /// an `audit_repaired` record says so, so the log goes on.
    fn catch_up(&self, head: &mut Head) -> Result<()> {
        if self.unmoved(head) {
            return Ok(());
        }
        let segments = segments(&self.dir)?;
        let Some((newest, path)) = segments.last().cloned() else {
            // No segment yet, or all retired: the chain goes on from the last retired one.
            if head.segment != 0 {
                let (seq, hash) = read::retired_head(&self.dir)?.unwrap_or((0, GENESIS.into()));
                (head.segment, head.len, head.seq, head.hash) = (0, 0, seq, hash);
            }
            return Ok(());
        };
        let len = std::fs::metadata(&path).map_err(|e| unavailable("reading its newest segment", e))?.len();
        if newest == head.segment && len == head.len {
            return Ok(());
        }
        let tail = read::tail(&path)?;
        let (seq, hash) = match tail.last.as_deref().map(record::open) {
            Some(Ok(sealed)) if sealed.mac_verifies(self.signer.mac_key()) => {
                (sealed.record.seq, sealed.hash)
            }
            Some(Ok(sealed)) => {
                return Err(foreign_tail(
                    &path,
                    &format!("record {} was not written with this log's key", sealed.record.seq),
                ))
            }
            Some(Err(fault)) => return Err(foreign_tail(&path, &format!("its last record {fault}"))),
            None => read::retired_head(&self.dir)?.unwrap_or((0, GENESIS.into())),
        };
        head.segment = newest;
        head.len = len;
        head.seq = seq;
        head.hash = hash;
        if let Some(last) = read::last_checkpoint(&self.dir) {
            head.checkpointed_seq = head.checkpointed_seq.max(last.seq);
        }
        if let Some(torn) = tail.torn {
            self.close_torn(head, &path, &torn)?;
        }
        Ok(())
    }

    /// Whether nobody wrote since this process did: its segment is as long as
    /// it left it and no later one exists (two `stat`s, not a directory read,
    /// on the path every record takes).
    fn unmoved(&self, head: &Head) -> bool {
        if head.segment == 0 || head.segment == u64::MAX {
            return false;
        }
        let len = std::fs::metadata(self.dir.join(segment_name(head.segment))).map(|m| m.len());
        len.is_ok_and(|len| len == head.len) && !self.dir.join(segment_name(head.segment + 1)).exists()
    }

    /// Ends a line a write left cut short, and records where it is.
    fn close_torn(&self, head: &mut Head, path: &Path, torn: &[u8]) -> Result<()> {
        let mut file =
            OpenOptions::new().append(true).open(path).map_err(|e| unavailable("opening its segment", e))?;
        file.write_all(b"\n").map_err(|e| unavailable("closing a line cut short", e))?;
        head.len += 1;
        let line = read::count_lines(path)?;
        tracing::warn!(segment = %path.display(), line, bytes = torn.len(), "an audit record was cut short; closed and recorded");
        let repaired = own_entry(
            EventKind::AuditRepaired,
            json!({
                "segment": path.file_name().map(|n| n.to_string_lossy().into_owned()),
                "line": line,
                "bytes": torn.len(),
                "sha256": airlock_core::secret::hex(&sha2::Sha256::digest(torn)),
            }),
        );
        self.write(head, &repaired).map(|_| ())
    }

    /// Writes one record after the head. The segment is opened for each
    /// record, so a segment that can no longer be written (a full volume, an
    /// immutable file, a retired segment) fails the write instead of going to
    /// a stale descriptor.
    fn write(&self, head: &mut Head, entry: &JournalEntry) -> Result<Journaled> {
        let record = Record::of(entry, head.seq + 1, &head.hash);
        let (line, hash) = record.seal(self.signer.mac_key());
        let starting = head.segment == 0 || head.segment == u64::MAX;
        if starting || (head.len > 0 && head.len + line.len() as u64 > self.options.segment_bytes) {
            self.rotate(head)?;
        }
        let path = self.dir.join(segment_name(head.segment));
        let mut file =
            OpenOptions::new().append(true).open(&path).map_err(|e| unavailable("opening its segment", e))?;
        if let Err(e) = file.write_all(line.as_bytes()) {
            // Whatever part of the line went in was never part of the chain.
            let _ = file.set_len(head.len);
            return Err(unavailable("writing a record", e));
        }
        if self.options.fsync {
            file.sync_data().map_err(|e| unavailable("flushing a record", e))?;
        }
        head.len += line.len() as u64;
        head.seq = record.seq;
        head.hash = hash.clone();
        Ok(Journaled { seq: record.seq, hash })
    }

    /// Starts the next segment, and retires the oldest past the number kept.
    fn rotate(&self, head: &mut Head) -> Result<()> {
        let next = if head.segment == u64::MAX { 1 } else { head.segment + 1 };
        let path = self.dir.join(segment_name(next));
        OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| unavailable("starting a segment", e))?;
        head.segment = next;
        head.len = 0;
        if self.options.keep_segments > 0 {
            if let Err(e) = read::retire(&self.dir, self.options.keep_segments, &self.signer) {
                tracing::error!(error = %e, "retiring old audit segments failed; they are kept");
            }
        }
        Ok(())
    }

    /// Writes the deferred entries, after a record of the gap.
    fn write_deferred(&self, head: &mut Head) -> Result<()> {
        let mut deferred = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        if deferred.entries.is_empty() && deferred.lost == 0 {
            return Ok(());
        }
        let gap = own_entry(
            EventKind::AuditGap,
            json!({
                "deferred": deferred.entries.len(),
                "lost": deferred.lost,
                "first_at": deferred.entries.front().map(|e| e.at),
                "error": deferred.error,
            }),
        );
        self.write(head, &gap)?;
        // Once the gap is on record, what was lost is said; what was kept follows.
        deferred.lost = 0;
        deferred.error = None;
        while let Some(entry) = deferred.entries.front() {
            self.write(head, entry)?;
            deferred.entries.pop_front();
        }
        Ok(())
    }

    /// Signs a checkpoint of the head if one is due (`force`: if any record
    /// was written since the last).
    fn checkpoint_if_due(&self, head: &mut Head, force: bool) {
        // Counted on the chain, so the router process's records count too.
        let due = head.seq >= head.checkpointed_seq + self.options.checkpoint_every
            || (head.seq > head.checkpointed_seq
                && (force || head.checkpointed_at.elapsed() >= self.options.checkpoint_interval));
        if !due || head.seq == 0 {
            return;
        }
        let checkpoint = self.signer.sign(head.seq, &head.hash);
        match append_json_line(&self.dir.join(checkpoint::CHECKPOINTS_FILE), &checkpoint) {
            Ok(()) => {
                head.checkpointed_at = Instant::now();
                head.checkpointed_seq = head.seq;
                tracing::debug!(seq = checkpoint.seq, "audit checkpoint signed");
            }
            Err(e) => tracing::error!(error = %e, "an audit checkpoint could not be written"),
        }
    }

    /// Writes what was deferred and signs a checkpoint when one is due by
    /// time; the daemon calls it every few seconds.
    pub fn tick(&self) -> Result<()> {
        self.locked(|head| {
            self.write_deferred(head)?;
            self.checkpoint_if_due(head, false);
            Ok(())
        })
    }

    /// Signs a checkpoint of the head now (if a record was written since the
    /// last one) and returns the newest checkpoint.
    pub fn checkpoint_now(&self) -> Result<Option<Checkpoint>> {
        self.locked(|head| {
            self.write_deferred(head)?;
            self.checkpoint_if_due(head, true);
            Ok(())
        })?;
        read::checkpoints(&self.dir).map(|all| all.into_iter().filter_map(|c| c.ok()).next_back())
    }

    /// Entries waiting to be written.
    pub fn deferred(&self) -> usize {
        let deferred = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        deferred.entries.len() + deferred.lost as usize
    }
}

impl Journal for AuditLog {
    fn append(&self, entry: &JournalEntry) -> Result<Journaled> {
        self.locked(|head| {
            self.write_deferred(head)?;
            let written = self.write(head, entry)?;
            self.checkpoint_if_due(head, false);
            Ok(written)
        })
    }

    fn defer(&self, entry: JournalEntry, error: &Error) {
        let mut deferred = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        deferred.error.get_or_insert_with(|| error.message.clone());
        if deferred.entries.len() < DEFERRED_KEPT {
            deferred.entries.push_back(entry);
        } else {
            deferred.lost += 1;
        }
    }
}

/// Every second, writes what was deferred and signs the checkpoints due by
/// time, until the daemon exits.
pub fn spawn_ticks(log: std::sync::Arc<AuditLog>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let log = log.clone();
            if let Ok(Err(e)) = tokio::task::spawn_blocking(move || log.tick()).await {
                tracing::error!(error = %e, "the audit log could not be written; records wait");
            }
        }
    })
}
