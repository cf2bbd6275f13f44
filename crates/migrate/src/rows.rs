//! What a migration test did to each row, kept for promote to hold the
//! target to.
//!
//! Promote compares a part's row changes on the target with its test's over
//! the rows alike on both before the part: same key, same contents. Each such
//! row must come out of the part as it did in the test — left alone,
//! deleted, or changed to the same contents. Rows the target holds that the
//! golden did not (new since it was built, or changed since) are not compared
//! row by row; the counts of what the part did are (`verify::surprises`). So a
//! migration that tells the test from production by anything at all (its
//! data's size, a sign in a catalog, the time) and acts on that changes rows
//! alike on both differently, and is refused, whatever its code looked like;
//! while one that merely meets other data does not.
//!
//! Rows are kept as 64-bit hashes of their keys and contents (a table without
//! a key is keyed by its contents): the golden generation's rows once, in
//! `migration-rows/GOLDEN-GEN-CATALOGHASH.rows`, and each tested candidate's
//! changes, part by part, in `migration-rows/runs/RUN/SHA256.changes`, which
//! the sealed report names. They are the daemon's (root's, 0700): they say
//! nothing of a value but whether two are alike.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::Digest;

use airlock_core::error::{Error, ErrorCode, Result};

/// Each row of each table: its key's hash and its contents' hash.
pub type RowSet = BTreeMap<String, BTreeMap<u64, u64>>;

/// What a part did to rows: per table it touched, each changed key with its
/// contents after (`None`: deleted).
pub type RowChanges = BTreeMap<String, BTreeMap<u64, Option<u64>>>;

/// A candidate's changes, part by part: `(from, to, changes)` by statement index.
pub type RunRecord = Vec<(usize, usize, RowChanges)>;

/// How long a test's row record is kept for promote.
pub const KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

fn hash(text: &str) -> u64 {
    let d = sha2::Sha256::digest(text.as_bytes());
    u64::from_le_bytes(d[..8].try_into().expect("eight bytes"))
}

/// Each row of a table by its key, as a digest of its columns that are not
/// NULL, each by its name: a column added changes no row until a value is put
/// in it, one dropped changes those that held a value, and the digest does
/// not depend on the columns' order, so a test's images and a target's read
/// alike whatever each added first. Values are read through their types'
/// output functions (`ROW(v)::text`), never a cast a database could define,
/// so reading runs no code of theirs.
///
/// A row's key is the golden's primary key (kept whatever a migration does to
/// the constraint meanwhile), else the table's own, else its contents (rows
/// alike counted one by one). Columns whose default reads the clock or chance
/// (`DEFAULT now()`, `DEFAULT gen_random_uuid()`), whose values differ
/// between any two copies once a default fills them, are digested apart
/// ([`RowImage::rows`]'s second part), so that a fill is not a difference but
/// a later change of their values is.
#[derive(Debug, Clone, Default)]
pub struct RowImage {
    /// Each row's digest, and its clock-filled columns' digest, by its key.
    rows: BTreeMap<String, (String, String)>,
    /// The clock-filled columns, by name.
    filled: Vec<String>,
}

impl RowImage {
    /// An image of `rows` (each row's digest and its clock-filled columns'
    /// digest, by its key), with the clock-filled columns named.
    pub(crate) fn new(rows: BTreeMap<String, (String, String)>, filled: Vec<String>) -> RowImage {
        RowImage { rows, filled }
    }

    /// Each row's digest and its clock-filled columns' digest, by its key.
    pub fn rows(&self) -> &BTreeMap<String, (String, String)> {
        &self.rows
    }

    /// The columns whose default fills them by clock or chance.
    pub fn filled(&self) -> &[String] {
        &self.filled
    }
}

/// The rows of `images`, hashed: each key with its contents (the columns a
/// default fills by clock or chance left out, which differ between copies).
pub fn set_of(images: &BTreeMap<String, RowImage>) -> RowSet {
    images
        .iter()
        .map(|(table, image)| {
            (table.clone(), image.rows().iter().map(|(k, (d, _))| (hash(k), hash(d))).collect())
        })
        .collect()
}

/// What changed from `before` to `after`, for every table imaged in both
/// (an entry, maybe empty, for each). A row changed when its contents did,
/// or its clock-filled columns did (when the same columns are such at both
/// ends: a column's first fill is no change); its contents after then carry
/// those columns' new values, so a later change of them is compared. A row
/// added carries its contents only.
pub fn changes_of(before: &BTreeMap<String, RowImage>, after: &BTreeMap<String, RowImage>) -> RowChanges {
    let mut out = RowChanges::new();
    for (table, was) in before {
        let Some(now) = after.get(table) else { continue };
        let same_filled = was.filled() == now.filled();
        let (was, now) = (was.rows(), now.rows());
        let mut changed = BTreeMap::new();
        for (k, (d, f)) in was {
            match now.get(k) {
                Some((d2, f2)) => {
                    let refilled = same_filled && f2 != f;
                    if d2 == d && !refilled {
                        continue;
                    }
                    let after = if refilled { format!("{d2}:{f2}") } else { format!("{d2}:=") };
                    changed.insert(hash(k), Some(hash(&after)));
                }
                None => {
                    changed.insert(hash(k), None);
                }
            }
        }
        for (k, (d, _)) in now.iter().filter(|(k, _)| !was.contains_key(*k)) {
            changed.insert(hash(k), Some(hash(&format!("{d}:="))));
        }
        out.insert(table.clone(), changed);
    }
    out
}

/// `set` once `changes` are made to it (the state the next part starts from).
pub fn apply(set: &mut RowSet, changes: &RowChanges) {
    for (table, changed) in changes {
        let rows = set.entry(table.clone()).or_default();
        for (k, after) in changed {
            match after {
                Some(d) => rows.insert(*k, *d),
                None => rows.remove(k),
            };
        }
    }
}

/// How the target's changes differ from the test's over the rows alike on
/// both before the part, and the rows added on both under a key the golden
/// held (moved away and back, or deleted and made again), per table, in
/// words. (A row added under a key the golden did not hold is not compared:
/// a serial key is another on each side.)
pub fn differences(
    golden: &RowSet,
    test_before: &RowSet,
    test: &RowChanges,
    target_before: &RowSet,
    target: &RowChanges,
) -> Vec<String> {
    let mut out = Vec::new();
    let tables: std::collections::BTreeSet<&String> = test.keys().chain(target.keys()).collect();
    for table in tables {
        let (Some(theirs_before), Some(mine_before)) = (test_before.get(table), target_before.get(table))
        else {
            continue;
        };
        let empty = BTreeMap::new();
        let (theirs, mine) = (test.get(table).unwrap_or(&empty), target.get(table).unwrap_or(&empty));
        let (mut here_only, mut test_only, mut otherwise, mut alike) = (0, 0, 0, 0);
        for (k, contents) in mine_before {
            if theirs_before.get(k) != Some(contents) {
                continue;
            }
            alike += 1;
            match (theirs.get(k), mine.get(k)) {
                (None, None) => {}
                (Some(a), Some(b)) if a == b => {}
                (None, Some(_)) => here_only += 1,
                (Some(_), None) => test_only += 1,
                (Some(_), Some(_)) => otherwise += 1,
            }
        }
        let held = golden.get(table);
        for (k, mine_after) in mine
            .iter()
            .filter(|(k, _)| !mine_before.contains_key(*k) && held.is_some_and(|h| h.contains_key(*k)))
        {
            let theirs_after = theirs.get(k).filter(|_| !theirs_before.contains_key(k));
            if let (Some(Some(a)), Some(b)) = (theirs_after, mine_after) {
                if a != b {
                    otherwise += 1;
                }
            }
        }
        if here_only + test_only + otherwise > 0 {
            let mut said = Vec::new();
            if here_only > 0 {
                said.push(format!("{here_only} changed here but not in the test"));
            }
            if test_only > 0 {
                said.push(format!("{test_only} changed in the test but not here"));
            }
            if otherwise > 0 {
                said.push(format!("{otherwise} came out otherwise than in the test"));
            }
            out.push(format!(
                "of the {alike} rows of {table} alike here and in its test before, {}",
                said.join(", ")
            ));
        }
    }
    out
}

/// The file a golden generation's rows are kept in, beside its costs.
pub fn generation_path(
    layout: &airlock_core::layout::Layout,
    golden: &str,
    generation: i64,
) -> Result<PathBuf> {
    let costs = super::costs::costs_path(layout, golden, generation)?;
    let stem = costs.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
    Ok(layout.migration_rows().join(format!("{stem}.rows")))
}

/// Where a run's records go: a fresh directory under `migration-rows/runs`.
pub fn run_dir(layout: &airlock_core::layout::Layout) -> PathBuf {
    layout.migration_rows().join("runs").join(airlock_core::secret::sandbox_id())
}

/// The mark that the file of SHA-256 `sha` was promoted to `target` (a
/// database, as its redacted DSN and name) from the run whose record is
/// `row_record`: beside that record, so it goes when the record is pruned.
pub fn promotion_mark(
    layout: &airlock_core::layout::Layout,
    row_record: &str,
    sha: &str,
    target: &str,
) -> PathBuf {
    let id = airlock_core::secret::hex(&sha2::Sha256::digest(target.as_bytes()));
    let run = Path::new(row_record).parent().unwrap_or(Path::new(""));
    let sha = sha.get(..16).unwrap_or(sha);
    layout.migration_rows().join(run).join(format!("promoted-{sha}-{}", &id[..16]))
}

/// Writes `bytes` to `path` whole (a temporary file renamed into place), in
/// directories only root reads.
fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = path.parent().ok_or_else(|| Error::internal("a row record's path has no directory"))?;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let tmp = dir.join(format!(".{}.tmp", airlock_core::secret::sandbox_id()));
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    let written = file.write_all(bytes).and_then(|_| file.sync_all());
    if let Err(e) = written.and_then(|_| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.into());
    }
    Ok(())
}

/// Keeps a generation's rows, unless they are kept already.
pub fn keep_generation(path: &Path, set: &RowSet) -> Result<()> {
    if path.is_file() {
        return Ok(());
    }
    let mut out = Vec::new();
    put_u64(&mut out, set.len() as u64);
    for (table, rows) in set {
        put_str(&mut out, table);
        put_u64(&mut out, rows.len() as u64);
        for (k, d) in rows {
            put_u64(&mut out, *k);
            put_u64(&mut out, *d);
        }
    }
    write_whole(path, &out)
}

/// Keeps a candidate's changes, part by part.
pub fn keep_run(path: &Path, record: &RunRecord) -> Result<()> {
    let mut out = Vec::new();
    put_u64(&mut out, record.len() as u64);
    for (from, to, changes) in record {
        put_u64(&mut out, *from as u64);
        put_u64(&mut out, *to as u64);
        put_u64(&mut out, changes.len() as u64);
        for (table, rows) in changes {
            put_str(&mut out, table);
            put_u64(&mut out, rows.len() as u64);
            for (k, after) in rows {
                put_u64(&mut out, *k);
                out.push(u8::from(after.is_some()));
                put_u64(&mut out, after.unwrap_or(0));
            }
        }
    }
    write_whole(path, &out)
}

/// Reads a kept generation's rows.
pub fn load_generation(path: &Path) -> Result<RowSet> {
    Reader::open(path)?.generation()
}

/// Reads a kept candidate's changes.
pub fn load_run(path: &Path) -> Result<RunRecord> {
    Reader::open(path)?.run()
}

/// The file a report names as a kept record (its `rows`, or a candidate's
/// `row_record`), if `name` is one: `GOLDEN-GEN-HASH.rows`, or
/// `runs/RUN/SHA256.changes`. Anything else (an absolute path, a `..`, a
/// dot file) names no record: another node asks for records by these names
/// and is answered from this directory alone.
pub fn record_path(layout: &airlock_core::layout::Layout, name: &str) -> Result<PathBuf> {
    let plain = |part: &str| {
        !part.is_empty()
            && part.len() <= 200
            && !part.starts_with('.')
            && part.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    let parts: Vec<&str> = name.split('/').collect();
    let named = match parts.as_slice() {
        [file] => file.ends_with(".rows") && plain(file),
        ["runs", run, file] => plain(run) && plain(file) && file.ends_with(".changes"),
        _ => false,
    };
    if !named {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("{name:?} names no kept row record"),
            "ask for a report's `rows` or a candidate's `row_record` as the report gives it",
        ));
    }
    Ok(layout.migration_rows().join(name))
}

/// Keeps a record another node made (`bytes`, read from that node under the
/// same `name`), once it reads as one: a generation's rows are kept once, as
/// [`keep_generation`] keeps them.
pub fn keep_fetched(layout: &airlock_core::layout::Layout, name: &str, bytes: &[u8]) -> Result<()> {
    let path = record_path(layout, name)?;
    let generation = name.ends_with(".rows");
    if generation && path.is_file() {
        return Ok(());
    }
    let reads = if generation {
        Reader::from(bytes.to_vec()).generation().map(drop)
    } else {
        Reader::from(bytes.to_vec()).run().map(drop)
    };
    reads
        .map_err(|e| Error::internal(format!("a fetched row record {name} does not read: {}", e.message)))?;
    // A run's records are named by a fresh run id: one kept already is
    // another run's, never replaced. A generation's may have been kept
    // meanwhile from another node (shares fetched at once): the same rows,
    // read and checked like these, so either copy does.
    if path.exists() && !generation {
        return Err(Error::internal(format!("a row record {name} is kept here already")));
    }
    write_whole(&path, bytes)
}

/// Removes run records older than [`KEPT_FOR`].
pub fn prune(layout: &airlock_core::layout::Layout) {
    let Ok(runs) = std::fs::read_dir(layout.migration_rows().join("runs")) else { return };
    for run in runs.flatten() {
        let old =
            run.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|e| e > KEPT_FOR));
        if old && run.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(run.path());
        }
    }
}

/// The error when a report's row record is gone or unreadable.
pub fn gone(what: &str, e: &Error) -> Error {
    Error::new(
        ErrorCode::MigrationRefused,
        format!("the test's record of {what} cannot be read ({}): promote compares the target's rows with it", e.message),
        format!(
            "test the file again with `airlock migrate test` (records are kept {} days), then promote with the new report",
            KEPT_FOR.as_secs() / 86_400
        ),
    )
}

fn put_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(&n.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Reads a record written above, bounded by the file's own length.
struct Reader {
    bytes: Vec<u8>,
    at: usize,
}

impl Reader {
    fn open(path: &Path) -> Result<Reader> {
        let mut bytes = Vec::new();
        std::fs::File::open(path)?.read_to_end(&mut bytes)?;
        Ok(Reader::from(bytes))
    }

    fn from(bytes: Vec<u8>) -> Reader {
        Reader { bytes, at: 0 }
    }

    /// A generation's rows, and nothing after them.
    fn generation(mut self) -> Result<RowSet> {
        let mut set = RowSet::new();
        for _ in 0..self.count()? {
            let table = self.string()?;
            let mut rows = BTreeMap::new();
            for _ in 0..self.count()? {
                rows.insert(self.u64()?, self.u64()?);
            }
            set.insert(table, rows);
        }
        self.end()?;
        Ok(set)
    }

    /// A candidate's changes, and nothing after them.
    fn run(mut self) -> Result<RunRecord> {
        let mut record = RunRecord::new();
        for _ in 0..self.count()? {
            let (from, to) = (self.u64()? as usize, self.u64()? as usize);
            let mut changes = RowChanges::new();
            for _ in 0..self.count()? {
                let table = self.string()?;
                let mut rows = BTreeMap::new();
                for _ in 0..self.count()? {
                    let k = self.u64()?;
                    let present = self.byte()? == 1;
                    let d = self.u64()?;
                    rows.insert(k, present.then_some(d));
                }
                changes.insert(table, rows);
            }
            record.push((from, to, changes));
        }
        self.end()?;
        Ok(record)
    }

    fn end(&self) -> Result<()> {
        if self.at != self.bytes.len() {
            return Err(Error::internal("a row record holds more than it counts"));
        }
        Ok(())
    }

    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end = end.ok_or_else(|| Error::internal("a row record ends early"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("eight bytes")))
    }

    fn byte(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    /// A count, no larger than what the rest of the file could hold.
    fn count(&mut self) -> Result<usize> {
        let n = self.u64()?;
        if n > (self.bytes.len() - self.at) as u64 {
            return Err(Error::internal("a row record counts more than it holds"));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String> {
        let n = self.count()?;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(rows: &[(u64, u64)]) -> RowSet {
        BTreeMap::from([("t".to_owned(), rows.iter().copied().collect())])
    }

    fn changes(rows: &[(u64, Option<u64>)]) -> RowChanges {
        BTreeMap::from([("t".to_owned(), rows.iter().copied().collect())])
    }

    #[test]
    fn rows_alike_before_must_come_out_alike() {
        let golden = set(&[(1, 10), (2, 20), (3, 30)]);
        let test = changes(&[(1, Some(11)), (3, None)]);
        // The same on a target that has a row more and one changed since.
        let target = set(&[(1, 10), (2, 21), (3, 30), (4, 40)]);
        let same = changes(&[(1, Some(11)), (3, None), (2, Some(22)), (4, None)]);
        assert!(differences(&golden, &golden, &test, &target, &same).is_empty());
        // A row alike before, changed to other contents; one left alone; one changed too.
        let other = changes(&[(1, Some(99)), (2, Some(22))]);
        let found = differences(&golden, &golden, &test, &target, &other);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("1 changed in the test but not here"), "{found:?}");
        assert!(found[0].contains("1 came out otherwise"), "{found:?}");
        let more = changes(&[(1, Some(11)), (3, None), (2, Some(22))]);
        assert!(differences(&golden, &golden, &test, &target, &more).is_empty(), "row 2 was not alike");
        let extra = changes(&[(1, Some(11)), (3, None)]);
        let untouched_in_test = set(&[(1, 10), (2, 20), (3, 30)]);
        assert!(differences(&golden, &golden, &test, &untouched_in_test, &extra).is_empty());
    }

    #[test]
    fn records_read_back_as_written() {
        let dir = std::env::temp_dir().join(format!("airlock-rows-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (g, r) = (dir.join("g.rows"), dir.join("runs/x/c.changes"));
        let golden = set(&[(1, 10), (u64::MAX, 7)]);
        keep_generation(&g, &golden).unwrap();
        assert_eq!(load_generation(&g).unwrap(), golden);
        let record = vec![(0, 2, changes(&[(1, Some(11)), (2, None)])), (2, 3, RowChanges::new())];
        keep_run(&r, &record).unwrap();
        assert_eq!(load_run(&r).unwrap(), record);
        std::fs::write(&r, [1u8, 0, 0, 0, 0, 0, 0, 0, 9]).unwrap();
        assert!(load_run(&r).is_err(), "a short file is an error, not a panic");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_a_reports_record_names_are_kept_or_served() {
        let layout = airlock_core::layout::Layout::new(std::path::PathBuf::from("/data"));
        let home = layout.migration_rows();
        for good in ["shop-1-0123456789abcdef.rows", "runs/sb-x1/ab12.changes"] {
            assert_eq!(record_path(&layout, good).unwrap(), home.join(good));
        }
        for bad in [
            "",
            "/etc/passwd",
            "../migrate-report.key",
            "runs/../../x.changes",
            "runs/x/../y.changes",
            "x.changes",
            "runs/x/y.rows",
            ".hidden.rows",
            "runs/.x/y.changes",
            "runs/x/y/z.changes",
            "a b.rows",
            "runs/x/y.changes/",
        ] {
            assert!(record_path(&layout, bad).is_err(), "{bad:?} must name no record");
        }
        let dir = std::env::temp_dir().join(format!("airlock-fetched-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let layout = airlock_core::layout::Layout::new(dir.clone());
        let mut record = Vec::new();
        put_u64(&mut record, 0);
        keep_fetched(&layout, "runs/r1/a.changes", &record).unwrap();
        assert_eq!(load_run(&layout.migration_rows().join("runs/r1/a.changes")).unwrap(), RunRecord::new());
        assert!(keep_fetched(&layout, "runs/r1/a.changes", &record).is_err(), "never replaced");
        record.push(0);
        assert!(keep_fetched(&layout, "runs/r1/b.changes", &record).is_err(), "trailing bytes");
        assert!(!layout.migration_rows().join("runs/r1/b.changes").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
