//! A stock of empty Btrfs subvolumes, used again instead of deleted.
//!
//! On a volume with quotas, the kernel commits a transaction for every
//! subvolume it drops, to bring quota groups up to date before removing the
//! dropped one's. A cold fork's cycle dropped two (the sandbox's directory and
//! its WAL's), and those commits took about a third of the host's CPU under
//! churn, in the kernel's cleaner thread, which fell further behind the longer
//! the churn went on. A deleted sandbox's subvolumes are instead emptied and
//! put here, and the next fork takes them.
//!
//! What holds:
//! - **Taken once.** A fork takes a subvolume by renaming it out of the stock
//!   (`RENAME_NOREPLACE`): of two forks after the same one, one rename fails
//!   and that fork takes another or makes a new one.
//! - **Empty, and nothing else of its sandbox.** A subvolume is put only after
//!   its sandbox's processes have ended, and only if its top carries no
//!   extended attribute and no inode flag (a no-copy-on-write flag would be
//!   inherited by the next sandbox's files) and no subvolume flag (a
//!   read-only one would fail every fork that took it). It is moved into the
//!   stock (a directory only root enters) under a name no fork takes,
//!   emptied there by one background thread, a tree at a time, whatever its
//!   depth or width ([`super::tree::empty_tree`]), and only then renamed to
//!   be taken. Anything that fails, and it is deleted whole as before.
//! - **Its count settled.** What the last sandbox wrote keeps counting
//!   against a subvolume's quota group until the kernel's next commit. A
//!   subvolume is taken only once its group owns no more than an empty one
//!   does (one tree block of the volume's size), so no sandbox starts with less than its whole allowance, or learns
//!   how much its predecessor wrote. A put asks for a commit, in the
//!   background, at most once a second ([`COMMIT_EVERY`]): under churn one
//!   commit a second in place of one per deleted subvolume.
//! - **Bounded.** At most [`MOST`] of each kind are kept, counted and added
//!   under one lock; more are deleted.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::fcntl::{renameat2, RenameFlags};
use nix::sys::stat::{fstat, Mode};

use super::btrfs::{Qgroup, SUBVOLUME_TOP_INODE};
use super::tree::{names, open_dir, open_dir_path};

/// The name a subvolume has in the stock while it is being emptied.
const EMPTYING: &str = "emptying.";

/// How many subvolumes of each kind the stock keeps.
pub const MOST: usize = 64;

/// How often a put may ask the kernel to commit, so that what was emptied
/// settles.
pub const COMMIT_EVERY: Duration = Duration::from_secs(1);

/// Which subvolume of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A sandbox's directory.
    Sandbox,
    /// Its server's WAL (`pgdata/pg_wal`).
    Wal,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Sandbox => "sandbox.",
            Kind::Wal => "wal.",
        }
    }
}

/// The stock of one volume: a root-only directory at its top.
#[derive(Debug, Clone)]
pub struct Stock {
    dir: PathBuf,
    commits: Arc<Mutex<Commits>>,
    /// Held while a put counts what the stock holds and adds to it.
    puts: Arc<Mutex<()>>,
    /// To the one thread that empties what is set aside, in turn.
    emptier: std::sync::mpsc::Sender<CString>,
    /// What an empty subvolume's quota group owns here: one tree block.
    settled_bytes: u64,
}

/// When the stock last asked for a commit, and whether one is due.
#[derive(Debug, Default)]
struct Commits {
    last: Option<Instant>,
    scheduled: bool,
}

nix::ioctl_read!(start_sync, 0x94, 24, u64);

fn errno(e: nix::errno::Errno) -> io::Error {
    io::Error::from(e)
}

impl Stock {
    /// The stock of the Btrfs volume at `volume` (made if missing, root's only).
    pub fn open(volume: &Path) -> io::Result<Stock> {
        let dir = volume.join(".stock");
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let held = open_dir_path(&dir)?;
        nix::sys::stat::fchmod(held.as_fd(), Mode::from_bits_truncate(0o700)).map_err(errno)?;
        nix::unistd::fchown(held.as_fd(), Some(0.into()), Some(0.into())).map_err(errno)?;
        let (emptier, queue) = std::sync::mpsc::channel::<CString>();
        let settled_bytes = node_size(&dir).unwrap_or(16 << 10);
        let stock =
            Stock { dir, commits: Default::default(), puts: Default::default(), emptier, settled_bytes };
        let worker = stock.clone();
        std::thread::Builder::new().name("airlock-stock".into()).spawn(move || {
            while let Ok(aside) = queue.recv() {
                worker.finish(&aside);
            }
        })?;
        // Left half-emptied by a daemon that stopped: finished first.
        let left: Vec<CString> = names(&OwnedFd::from(held))?
            .into_iter()
            .filter(|n| n.to_bytes().starts_with(EMPTYING.as_bytes()))
            .collect();
        stock.finish_later(left);
        Ok(stock)
    }

    /// The names of the stock's subvolumes of `kind`, oldest first.
    fn listing(&self, held: &OwnedFd, kind: Kind) -> io::Result<Vec<CString>> {
        let mut found: Vec<CString> =
            names(held)?.into_iter().filter(|n| n.to_bytes().starts_with(kind.prefix().as_bytes())).collect();
        found.sort();
        Ok(found)
    }

    /// Takes a settled subvolume of `kind`, from a random place in the
    /// stock, and makes it `name` in `parent`;
    /// false when the stock has none (the caller makes a new one). Fails with
    /// `AlreadyExists` when `name` does.
    pub fn take(&self, kind: Kind, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
        let held = OwnedFd::from(open_dir_path(&self.dir)?);
        let mut unsettled = false;
        // From a point no sandbox can foresee: which earlier sandbox's
        // subvolume a fork takes is not for a sandbox to aim at (a subvolume
        // keeps its inode counter, a few bits two sandboxes could pass).
        let mut listing = self.listing(&held, kind)?;
        let start = match listing.len() {
            0 => 0,
            n => {
                (std::hash::BuildHasher::hash_one(
                    &std::collections::hash_map::RandomState::new(),
                    Instant::now(),
                ) % n as u64) as usize
            }
        };
        listing.rotate_left(start);
        for entry in listing {
            let path = self.dir.join(std::ffi::OsStr::from_bytes(entry.as_bytes()));
            if !Qgroup::of(&path).and_then(|q| q.usage()).is_ok_and(|u| u.charged() <= self.settled_bytes) {
                unsettled = true;
                continue;
            }
            match renameat2(&held, entry.as_c_str(), parent, name, RenameFlags::RENAME_NOREPLACE) {
                Ok(()) => return Ok(true),
                // Another fork took it first.
                Err(nix::errno::Errno::ENOENT) => continue,
                Err(e) => return Err(errno(e)),
            }
        }
        if unsettled {
            self.commit_soon(&held);
        }
        Ok(false)
    }

    /// Moves the subvolume `name` in `parent` into the stock to be emptied
    /// ([`Stock::finish`]); returns its name there. Fails, leaving it where
    /// it is, when it is not a subvolume's top, carries an attribute or a
    /// flag, or the stock holds enough of `kind`.
    fn set_aside(
        &self,
        held: &OwnedFd,
        kind: Kind,
        parent: BorrowedFd<'_>,
        name: &CStr,
    ) -> io::Result<CString> {
        let _counting = self.puts.lock().unwrap_or_else(|p| p.into_inner());
        let emptying = format!("{EMPTYING}{}", kind.prefix());
        let holds = names(held)?
            .iter()
            .filter(|n| {
                n.to_bytes().starts_with(kind.prefix().as_bytes())
                    || n.to_bytes().starts_with(emptying.as_bytes())
            })
            .count();
        if holds >= MOST {
            return Err(io::Error::other("the stock holds enough"));
        }
        let top = open_dir(parent, name)?;
        if fstat(top.as_fd()).map_err(errno)?.st_ino != SUBVOLUME_TOP_INODE {
            return Err(io::Error::other("not the top of a subvolume"));
        }
        if !plain(&top)? {
            return Err(io::Error::other("its top carries an extended attribute or an inode flag"));
        }
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let aside = CString::new(format!("{emptying}{:020}", stamp.as_nanos()))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        renameat2(parent, name, held, aside.as_c_str(), RenameFlags::RENAME_NOREPLACE).map_err(errno)?;
        Ok(aside)
    }

    /// Empties a subvolume set aside and makes it one to take; deletes it
    /// whole if it cannot be emptied.
    fn finish(&self, aside: &CStr) {
        let emptied = open_dir_path(&self.dir).map(OwnedFd::from).and_then(|held| {
            super::tree::empty_tree(&open_dir(&held, aside)?)?;
            let ready = &aside.to_bytes()[EMPTYING.len()..];
            let ready = CString::new(ready).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            renameat2(&held, aside, &held, ready.as_c_str(), RenameFlags::RENAME_NOREPLACE).map_err(errno)?;
            self.commit_soon(&held);
            Ok(())
        });
        if let Err(e) = emptied {
            let path = self.dir.join(std::ffi::OsStr::from_bytes(aside.to_bytes()));
            tracing::debug!(subvolume = %path.display(), error = %e, "a subvolume set aside was not emptied; deleting it");
            if let Err(e) = super::btrfs::delete_subvolumes(&path) {
                tracing::warn!(subvolume = %path.display(), error = %e, "a subvolume set aside could not be deleted");
            }
        }
    }

    /// Puts a deleted sandbox's directory `path`, and its WAL's subvolume,
    /// in the stock: both are moved there at once and emptied in the
    /// background, so the deletion waits for neither. On failure whatever is
    /// left at `path` is the caller's to delete.
    pub fn put_sandbox(&self, path: &Path) -> io::Result<()> {
        let held = OwnedFd::from(open_dir_path(&self.dir)?);
        let (parent, name) = parent_and_name(path)?;
        let mut aside = Vec::new();
        let moved = (|| {
            aside.extend(self.set_aside_wal(&held, &path.join("pgdata"))?);
            aside.push(self.set_aside(&held, Kind::Sandbox, parent.as_fd(), &name)?);
            Ok(())
        })();
        self.finish_later(aside);
        moved
    }

    /// Puts the WAL subvolume of the data directory `pgdata` (being removed
    /// for a reset) in the stock, emptied in the background; the rest of
    /// `pgdata` is the caller's to remove.
    pub fn put_wal(&self, pgdata: &Path) -> io::Result<()> {
        let held = OwnedFd::from(open_dir_path(&self.dir)?);
        let aside = self.set_aside_wal(&held, pgdata)?;
        self.finish_later(aside.into_iter().collect());
        Ok(())
    }

    /// Sets aside `pgdata/pg_wal` if it is a subvolume's top (never through
    /// a link its server user put there).
    fn set_aside_wal(&self, held: &OwnedFd, pgdata: &Path) -> io::Result<Option<CString>> {
        let pgdata = match open_dir_path(pgdata) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let wal = open_dir(pgdata.as_fd(), c"pg_wal");
        if !wal.is_ok_and(|w| fstat(w.as_fd()).is_ok_and(|s| s.st_ino == SUBVOLUME_TOP_INODE)) {
            return Ok(None);
        }
        self.set_aside(held, Kind::Wal, pgdata.as_fd(), c"pg_wal").map(Some)
    }

    /// Empties what was set aside, in a thread of its own.
    fn finish_later(&self, aside: Vec<CString>) {
        for a in aside {
            // The emptier lives as long as the process.
            let _ = self.emptier.send(a);
        }
    }

    /// Takes a settled sandbox directory from the stock and makes it `path`,
    /// as a new subvolume would be (root's, mode 0755); false when there is none.
    pub fn take_sandbox(&self, path: &Path) -> io::Result<bool> {
        let (parent, name) = parent_and_name(path)?;
        if !self.take(Kind::Sandbox, parent.as_fd(), &name)? {
            return Ok(false);
        }
        let top = open_dir(parent.as_fd(), &name)?;
        nix::unistd::fchown(top.as_fd(), Some(0.into()), Some(0.into())).map_err(errno)?;
        nix::sys::stat::fchmod(top.as_fd(), Mode::from_bits_truncate(0o755)).map_err(errno)?;
        Ok(true)
    }

    /// Asks the kernel to commit its transaction in the background, at most
    /// once per [`COMMIT_EVERY`]: at once, or from a thread at the end of the
    /// current period, so what was emptied meanwhile settles within it too.
    fn commit_soon(&self, held: &OwnedFd) {
        let mut commits = self.commits.lock().unwrap_or_else(|p| p.into_inner());
        if commits.scheduled {
            return;
        }
        let wait = commits.last.map_or(Duration::ZERO, |t| COMMIT_EVERY.saturating_sub(t.elapsed()));
        if wait.is_zero() {
            commits.last = Some(Instant::now());
            start_commit(held.as_fd());
            return;
        }
        commits.scheduled = true;
        let (shared, dir) = (self.commits.clone(), self.dir.clone());
        std::thread::spawn(move || {
            std::thread::sleep(wait);
            let mut commits = shared.lock().unwrap_or_else(|p| p.into_inner());
            (commits.scheduled, commits.last) = (false, Some(Instant::now()));
            if let Ok(held) = open_dir_path(&dir) {
                start_commit(held.as_fd());
            }
        });
    }
}

/// Starts a commit of the volume's current transaction, not waiting for it.
fn start_commit(dir: BorrowedFd<'_>) {
    let mut transaction = 0u64;
    // SAFETY: BTRFS_IOC_START_SYNC writes one u64, which lives for the call.
    if let Err(e) = unsafe { start_sync(dir.as_raw_fd(), &mut transaction) } {
        tracing::debug!(error = %e, "the stock could not ask for a commit");
    }
}

/// `path`'s parent, held, and its last component.
fn parent_and_name(path: &Path) -> io::Result<(std::fs::File, CString)> {
    let parent = path.parent().ok_or_else(|| io::Error::other("a subvolume needs a parent"))?;
    let name = path.file_name().ok_or_else(|| io::Error::other("a subvolume needs a name"))?;
    let name = CString::new(name.as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    Ok((open_dir_path(parent)?, name))
}

/// Whether a subvolume's top carries no extended attribute, no inode flag
/// and no subvolume flag (read-only: the next fork could write nothing).
fn plain(dir: &OwnedFd) -> io::Result<bool> {
    // SAFETY: a size query: no buffer is written.
    let listed = unsafe { nix::libc::flistxattr(dir.as_raw_fd(), std::ptr::null_mut(), 0) };
    if listed < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut flags: nix::libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS writes at most a long, which lives for the call.
    if unsafe { nix::libc::ioctl(dir.as_raw_fd(), FS_IOC_GETFLAGS, &mut flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut subvolume_flags = 0u64;
    // SAFETY: BTRFS_IOC_SUBVOL_GETFLAGS writes one u64, which lives for the call.
    unsafe { subvol_getflags(dir.as_raw_fd(), &mut subvolume_flags) }.map_err(errno)?;
    Ok(listed == 0 && flags == 0 && subvolume_flags == 0)
}

nix::ioctl_read!(subvol_getflags, 0x94, 25, u64);

/// The volume's metadata block size: what an empty subvolume's quota group
/// owns (its one tree block).
fn node_size(stock: &Path) -> Option<u64> {
    let group = Qgroup::of(stock.parent()?).ok()?;
    let text = std::fs::read_to_string(group.filesystem_dir().join("nodesize")).ok()?;
    text.trim().parse().ok()
}

/// `FS_IOC_GETFLAGS`: `_IOR('f', 1, long)`.
const FS_IOC_GETFLAGS: nix::libc::Ioctl =
    nix::request_code_read!(b'f', 1, std::mem::size_of::<nix::libc::c_long>());
