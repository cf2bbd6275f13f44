//! Who owns files in the host's shared temporary directories, surveyed now
//! and then rather than at every lease.
//!
//! A uid found there is never leased, so no tenant finds a predecessor's file
//! as its own. Walking those directories at every fork cost as much CPU as a
//! tenth of the fork, so the walk is kept for a while ([`MAX_AGE`]), and a
//! released uid is quarantined instead: its release leaves a tombstone beside
//! the leases, and only a survey that *began after* the tombstone was made
//! (so whose walk saw everything that uid could have left) lifts it. A uid is
//! thus leased again only once a walk begun after its last process ended has
//! found nothing of it: the guarantee of a walk at every lease, without one.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a survey's findings are used before the next lease walks again.
pub const MAX_AGE: Duration = Duration::from_secs(30);
/// How deep a survey looks.
const DEPTH: usize = 6;
/// How many entries a survey reads at most, in all.
const ENTRIES: usize = 20_000;
/// The suffix of a released uid's tombstone in the lease directory.
pub const TOMBSTONE: &str = ".released";

/// One walk's findings.
#[derive(Debug, Clone)]
pub struct Survey {
    /// When the walk began.
    pub began: Instant,
    /// Owners of every entry found.
    pub owners: HashSet<u32>,
}

/// The last survey of each set of directories (a process normally has one).
static LAST: Mutex<Vec<(Vec<PathBuf>, Survey)>> = Mutex::new(Vec::new());

/// The owners of files under `dirs`, from a survey younger than [`MAX_AGE`]
/// unless `fresh`; a new survey also lifts the tombstones in `leases` that
/// existed before it began and whose uids it found nothing of.
pub fn owners(dirs: &[PathBuf], leases: &Path, fresh: bool) -> HashSet<u32> {
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if !fresh {
        if let Some((_, s)) = last.iter().find(|(d, s)| d == dirs && s.began.elapsed() < MAX_AGE) {
            return s.owners.clone();
        }
    }
    // Listed before the walk begins: only these may be lifted by it.
    let quarantined = tombstones(leases);
    let survey = walk(dirs);
    for uid in quarantined {
        if !survey.owners.contains(&uid) && !survey.owners.contains(&(uid + 1)) {
            let _ = std::fs::remove_file(tombstone(leases, uid));
        }
    }
    last.retain(|(d, _)| d != dirs);
    last.push((dirs.to_vec(), survey.clone()));
    survey.owners
}

/// The tombstone of `uid` (the pair's first) in the lease directory `leases`.
pub fn tombstone(leases: &Path, uid: u32) -> PathBuf {
    leases.join(format!("{uid}{TOMBSTONE}"))
}

/// Every uid with a tombstone in `leases`.
fn tombstones(leases: &Path) -> Vec<u32> {
    std::fs::read_dir(leases)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(TOMBSTONE)?.parse().ok())
        .collect()
}

/// Walks `dirs` [`DEPTH`] directories deep, staying on each directory's own
/// filesystem, following no link, reading at most [`ENTRIES`] entries.
fn walk(dirs: &[PathBuf]) -> Survey {
    let began = Instant::now();
    let mut owners = HashSet::new();
    let mut budget = ENTRIES;
    for dir in dirs {
        walk_owners(dir, DEPTH, &mut budget, &mut owners);
    }
    Survey { began, owners }
}

/// Adds the owner of every entry under `dir` (not `dir` itself) to `owners`.
fn walk_owners(dir: &Path, depth: usize, budget: &mut usize, owners: &mut HashSet<u32>) {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::symlink_metadata(dir) else { return };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let Ok(meta) = entry.metadata() else { continue };
        owners.insert(meta.uid());
        if depth > 1 && meta.is_dir() && meta.dev() == top.dev() {
            walk_owners(&entry.path(), depth - 1, budget, owners);
        }
    }
}
