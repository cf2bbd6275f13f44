//! Directory trees cloned by descriptor, never by path: a golden's data
//! directory into a sandbox, a live sandbox's into a branch or a promotion.
//!
//! The source may be a live sandbox's, which code running as its OS user can
//! change at any instant, so every entry is opened relative to its parent's
//! descriptor with `O_NOFOLLOW` and checked ([`super::tree`] has the rules);
//! a tree holds only directories and regular files, anything else fails the
//! whole clone, and nothing outside the tree is read or written through it.
//! Files are reflinked (`FICLONE`) where the volume can, copied otherwise,
//! spread over the cores; top-level directories named so are made Btrfs
//! subvolumes of their own, taken from the stock where one has settled.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, Mode, SFlag};
use nix::unistd::Uid;

use super::tree::{cpath, entries, errno, give, open_dir, refused};
use crate::users::Identity;

nix::ioctl_write_int!(ficlone, 0x94, 9);

/// How file contents reach the new tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contents {
    /// `FICLONE`: the new file shares every extent with the old one.
    Reflink,
    /// Every byte copied.
    Copy,
}

/// What a clone takes, checks and gives.
#[derive(Debug, Clone, Copy)]
pub struct CloneSpec<'a> {
    /// Reflink or copy.
    pub contents: Contents,
    /// Who the new tree belongs to (the caller's user if `None`).
    pub owner: Option<&'a Identity>,
    /// When set, every entry of the source must belong to this uid; anything
    /// else (a file linked in from elsewhere, say) fails the clone.
    pub source_owner: Option<Uid>,
    /// Names skipped wherever they appear (a running server's lock files).
    pub skip: &'a [&'a str],
    /// When not empty, the only top-level entries taken (the rest is left out).
    pub only: &'a [&'a str],
    /// Top-level directories made as Btrfs subvolumes of their own (WAL, kept
    /// out of a sandbox's quota so that a full allowance fails a statement, not
    /// a WAL write).
    pub subvolumes: &'a [&'a str],
    /// What each of those may own ([`super::WAL_LIMIT`]).
    pub subvolume_limit: u64,
    /// Where those subvolumes are taken from before one is made.
    pub stock: Option<&'a super::stock::Stock>,
    /// Directories (paths from the top, such as `base/1`) made empty: their
    /// contents are not taken.
    pub hollow: &'a [&'a str],
    /// Directories (paths from the top, such as `base`) whose files are left
    /// for later ([`clone_tree_deferring`]); the directories themselves are made.
    pub deferred: &'a [&'a str],
    /// Files made under another name wherever they appear: `(name, new name)`.
    pub renamed: &'a [(&'a str, &'a str)],
}

/// One regular file to clone: its parent directories and name.
struct FileJob {
    from: Arc<OwnedFd>,
    to: Arc<OwnedFd>,
    name: CString,
    /// The name it is made under ([`CloneSpec::renamed`]), usually `name`.
    made_as: CString,
    shown: PathBuf,
}

/// The files of a clone left for later ([`CloneSpec::deferred`]): their
/// directories exist, held open, and the files are not made yet.
pub struct Deferred {
    jobs: Vec<FileJob>,
    contents: Contents,
    owner: Option<Identity>,
    source_owner: Option<Uid>,
}

impl Deferred {
    /// Clones the files left for later; returns how many.
    pub fn finish(self) -> io::Result<u64> {
        clone_files(&self.jobs, &CloneSpec::files(self.contents, self.owner.as_ref(), self.source_owner))?;
        Ok(self.jobs.len() as u64)
    }
}

impl<'a> CloneSpec<'a> {
    /// A spec that takes everything as it is: how contents reach the new
    /// tree, who it belongs to, who the source must belong to.
    pub fn files(
        contents: Contents,
        owner: Option<&'a Identity>,
        source_owner: Option<Uid>,
    ) -> CloneSpec<'a> {
        CloneSpec {
            contents,
            owner,
            source_owner,
            skip: &[],
            only: &[],
            subvolumes: &[],
            subvolume_limit: u64::MAX,
            stock: None,
            hollow: &[],
            deferred: &[],
            renamed: &[],
        }
    }
}

/// Clones the tree at `src` into the new directory `dst`; returns the number of
/// files. Fails closed on anything but directories and regular files, and removes
/// what it made of `dst` on any failure.
pub fn clone_tree(src: &Path, dst: &Path, spec: &CloneSpec<'_>) -> io::Result<u64> {
    let (made, later) = clone_tree_deferring(src, dst, spec)?;
    Ok(made + later.finish()?)
}

/// [`clone_tree`], but the files under [`CloneSpec::deferred`] are left for
/// the caller to finish (a fork's server starts meanwhile, since it reads
/// none of them before its first session). A failure here removes what was
/// made; a failure to finish leaves the tree to the caller to remove.
pub fn clone_tree_deferring(src: &Path, dst: &Path, spec: &CloneSpec<'_>) -> io::Result<(u64, Deferred)> {
    std::fs::create_dir(dst)?;
    let result = clone_into(src, dst, spec);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(dst);
    }
    result
}

fn clone_into(src: &Path, dst: &Path, spec: &CloneSpec<'_>) -> io::Result<(u64, Deferred)> {
    let from = open_dir(nix::fcntl::AT_FDCWD, &cpath(src)?)?;
    let to = open_dir(nix::fcntl::AT_FDCWD, &cpath(dst)?)?;
    // Directories first, in order so parents exist; then the files, which take
    // most of the time (creating an inode costs more than the reflink itself),
    // spread over the cores.
    let (mut files, mut later) = (Vec::new(), Vec::new());
    let found = Found { now: &mut files, later: &mut later };
    make_dirs(Arc::new(from), Arc::new(to), (src.to_path_buf(), Path::new("")), spec, (true, false), found)?;
    clone_files(&files, spec)?;
    let later = Deferred {
        jobs: later,
        contents: spec.contents,
        owner: spec.owner.cloned(),
        source_owner: spec.source_owner,
    };
    Ok((files.len() as u64, later))
}

/// Clones `files`, spread over the cores.
fn clone_files(files: &[FileJob], spec: &CloneSpec<'_>) -> io::Result<()> {
    if files.is_empty() {
        return Ok(());
    }
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
    let chunk = files.len().div_ceil(workers).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = files
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().try_for_each(|job| clone_file(job, spec))))
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("clone worker panicked"))
    })
}

/// Where [`make_dirs`] puts the files it finds: cloned now, or left for later.
struct Found<'f> {
    now: &'f mut Vec<FileJob>,
    later: &'f mut Vec<FileJob>,
}

fn check_owner(stat: &nix::sys::stat::FileStat, spec: &CloneSpec<'_>, shown: &Path) -> io::Result<()> {
    match spec.source_owner {
        Some(uid) if stat.st_uid != uid.as_raw() => Err(refused(shown, "it belongs to another user")),
        _ => Ok(()),
    }
}

fn make_dirs(
    from: Arc<OwnedFd>,
    to: Arc<OwnedFd>,
    (shown, relative): (PathBuf, &Path),
    spec: &CloneSpec<'_>,
    (top, deferring): (bool, bool),
    found: Found<'_>,
) -> io::Result<()> {
    let deferring = deferring || spec.deferred.iter().any(|d| Path::new(d) == relative);
    let stat = fstat(from.as_fd()).map_err(errno)?;
    check_owner(&stat, spec, &shown)?;
    nix::sys::stat::fchmod(to.as_fd(), Mode::from_bits_truncate(stat.st_mode & 0o7777)).map_err(errno)?;
    give(to.as_fd(), spec.owner)?;
    if spec.hollow.iter().any(|h| Path::new(h) == relative) {
        return Ok(());
    }
    for (name, listed) in entries(&from)? {
        if spec.skip.iter().any(|s| s.as_bytes() == name.as_bytes())
            || (top && !spec.only.is_empty() && !spec.only.iter().any(|s| s.as_bytes() == name.as_bytes()))
        {
            continue;
        }
        let path = shown.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
        // A file the listing calls regular is not looked at here: its clone
        // opens it without following a link and refuses all but a regular file.
        let kind = match listed {
            Some(nix::dir::Type::File) => SFlag::S_IFREG,
            _ => {
                let entry =
                    fstatat(from.as_fd(), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).map_err(errno)?;
                SFlag::from_bits_truncate(entry.st_mode & SFlag::S_IFMT.bits())
            }
        };
        match kind {
            SFlag::S_IFDIR => {
                let subvolume = top && spec.subvolumes.iter().any(|s| s.as_bytes() == name.as_bytes());
                if subvolume {
                    let taken = spec.stock.is_some_and(|stock| {
                        stock.take(super::stock::Kind::Wal, to.as_fd(), &name).unwrap_or_else(|e| {
                            tracing::debug!(error = %e, "no WAL subvolume was taken from the stock");
                            false
                        })
                    });
                    if !taken {
                        super::btrfs::create_subvolume_at(to.as_fd(), name.as_bytes())?;
                    }
                } else {
                    mkdirat(to.as_fd(), name.as_c_str(), Mode::from_bits_truncate(0o700)).map_err(errno)?;
                }
                let child_from = open_dir(from.as_fd(), &name)
                    .map_err(|_| refused(&path, "it changed while being read"))?;
                let child_to = open_dir(to.as_fd(), &name)?;
                if subvolume {
                    super::btrfs::limit_at(child_to.as_fd(), spec.subvolume_limit)?;
                }
                let child = relative.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
                let found = Found { now: &mut *found.now, later: &mut *found.later };
                make_dirs(
                    Arc::new(child_from),
                    Arc::new(child_to),
                    (path, &child),
                    spec,
                    (false, deferring),
                    found,
                )?;
            }
            SFlag::S_IFREG => {
                let made_as = match spec.renamed.iter().find(|(old, _)| old.as_bytes() == name.as_bytes()) {
                    Some((_, new)) => {
                        CString::new(*new).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
                    }
                    None => name.clone(),
                };
                let job = FileJob { from: from.clone(), to: to.clone(), name, made_as, shown: path };
                match deferring {
                    true => found.later.push(job),
                    false => found.now.push(job),
                }
            }
            SFlag::S_IFLNK => return Err(refused(&path, "it is a symbolic link")),
            _ => return Err(refused(&path, "it is not a regular file")),
        }
    }
    Ok(())
}

fn clone_file(job: &FileJob, spec: &CloneSpec<'_>) -> io::Result<()> {
    // O_NONBLOCK: a FIFO swapped in since the listing must not hang the open.
    let src = openat(
        job.from.as_fd(),
        job.name.as_c_str(),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|_| refused(&job.shown, "it changed while being read"))?;
    let stat = fstat(src.as_fd()).map_err(errno)?;
    if SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
        return Err(refused(&job.shown, "it is not a regular file"));
    }
    check_owner(&stat, spec, &job.shown)?;
    let dst = openat(
        job.to.as_fd(),
        job.made_as.as_c_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(stat.st_mode & 0o7777),
    )
    .map_err(errno)?;
    match spec.contents {
        // An empty file (a sixth of a data directory's) has nothing to share.
        Contents::Reflink if stat.st_size == 0 => {}
        // SAFETY: both descriptors are open for the duration of the call.
        Contents::Reflink => {
            unsafe { ficlone(dst.as_raw_fd(), src.as_raw_fd() as _) }.map(|_| ()).map_err(errno)?
        }
        Contents::Copy => {
            let (mut src, mut dst) = (File::from(src), File::from(dst.try_clone()?));
            io::copy(&mut src, &mut dst)?;
        }
    }
    give(dst.as_fd(), spec.owner)
}

/// Clones one file at `from` to the new path `to` (both trusted paths, such as a
/// probe file the daemon just wrote).
pub fn reflink_file(from: &Path, to: &Path) -> io::Result<()> {
    let src = File::open(from)?;
    let dst = std::fs::OpenOptions::new().write(true).create_new(true).open(to)?;
    // SAFETY: both descriptors are open for the duration of the call.
    if let Err(e) = unsafe { ficlone(dst.as_raw_fd(), src.as_raw_fd() as _) } {
        drop(dst);
        let _ = std::fs::remove_file(to);
        return Err(errno(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::tree::tests::scratch;

    fn copying() -> CloneSpec<'static> {
        CloneSpec { skip: &["postmaster.pid"], ..CloneSpec::files(Contents::Copy, None, None) }
    }

    #[test]
    fn copies_a_tree_and_skips_what_it_is_told() {
        let base = scratch("copy");
        assert_eq!(clone_tree(&base.join("src"), &base.join("dst"), &copying()).unwrap(), 2);
        assert_eq!(std::fs::read(base.join("dst/base/1/1259")).unwrap(), vec![7u8; 100_000]);
        assert!(!base.join("dst/postmaster.pid").exists());
        std::fs::write(base.join("dst/PG_VERSION"), "changed").unwrap();
        assert_eq!(std::fs::read_to_string(base.join("src/PG_VERSION")).unwrap(), "15\n");
        // Onto an existing path: refused, and what was there stays.
        assert!(clone_tree(&base.join("src"), &base.join("dst"), &copying()).is_err());
        assert_eq!(std::fs::read_to_string(base.join("dst/PG_VERSION")).unwrap(), "changed");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn links_fifos_and_foreign_files_fail_the_clone_and_leave_nothing() {
        let secret = std::env::temp_dir().join(format!("airlock-tree-secret-{}", std::process::id()));
        std::fs::write(&secret, "host secret").unwrap();
        for (case, plant) in [
            (
                "file-link",
                Box::new(|src: &Path| std::os::unix::fs::symlink(&secret, src.join("base/1/2600")).unwrap())
                    as Box<dyn Fn(&Path)>,
            ),
            (
                "dir-link",
                Box::new(|src: &Path| std::os::unix::fs::symlink("/etc", src.join("pg_wal")).unwrap()),
            ),
            (
                "root-link",
                Box::new(|src: &Path| {
                    std::fs::remove_dir_all(src).unwrap();
                    std::os::unix::fs::symlink("/etc", src).unwrap()
                }),
            ),
            (
                "fifo",
                Box::new(|src: &Path| {
                    nix::unistd::mkfifo(&src.join("base/fifo"), Mode::from_bits_truncate(0o600)).unwrap()
                }),
            ),
        ] {
            let base = scratch(case);
            plant(&base.join("src"));
            let err = clone_tree(&base.join("src"), &base.join("dst"), &copying()).unwrap_err();
            assert!(
                err.to_string().contains("refusing to clone") || err.raw_os_error().is_some(),
                "{case}: {err}"
            );
            assert!(!base.join("dst").exists(), "{case}: a half-made clone was left");
            std::fs::remove_dir_all(&base).unwrap();
        }
        // A file owned by someone else than the expected owner is refused too.
        let base = scratch("owner");
        let spec = CloneSpec { source_owner: Some(Uid::from_raw(4_000_000_001)), ..copying() };
        assert!(clone_tree(&base.join("src"), &base.join("dst"), &spec).is_err());
        std::fs::remove_dir_all(&base).unwrap();
        std::fs::remove_file(&secret).unwrap();
    }
}
