//! Directory trees walked by descriptor, never by path.
//!
//! Root clones and chowns trees that an unprivileged user can change while it
//! works: a live sandbox's data directory (branch, promote) is its OS user's, and
//! code running as that user can swap any entry for a symbolic link, a FIFO or
//! another directory at any instant. So every step here opens the next entry
//! relative to its parent's descriptor with `O_NOFOLLOW` and then checks what it
//! opened: a tree holds only directories and regular files (a data directory has
//! nothing else), anything else fails the whole operation, and nothing outside
//! the tree can ever be read, written or chowned through it.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{fchown, unlinkat, Uid, UnlinkatFlags};

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

fn refused(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "refusing to clone {}: {what}; a data directory holds only directories and regular files",
            path.display()
        ),
    )
}

fn errno(e: nix::errno::Errno) -> io::Error {
    io::Error::from(e)
}

/// Opens a directory that must not be a symbolic link.
/// Opens the directory `name` in `parent`, never through a symbolic link.
pub(super) fn open_dir<Fd: AsFd>(parent: Fd, name: &CStr) -> io::Result<OwnedFd> {
    openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(errno)
}

/// Opens the directory at the absolute `path` one component at a time, never
/// through a symbolic link (a directory a sandbox's user owns may hold one
/// pointing at another sandbox's).
pub fn open_dir_path(path: &Path) -> io::Result<File> {
    let mut dir = open_dir(nix::fcntl::AT_FDCWD, c"/")?;
    for part in path.strip_prefix("/").map_err(|_| refused(path, "it is not absolute"))?.components() {
        let name = CString::new(part.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        dir = open_dir(dir.as_fd(), &name)?;
    }
    Ok(File::from(dir))
}

/// The directory at `dir`, or with `in_each` each of its subdirectories (one
/// level down), opened one component at a time, never through a link.
fn dirs_in(dir: &Path, in_each: bool) -> io::Result<Vec<OwnedFd>> {
    let top = OwnedFd::from(open_dir_path(dir)?);
    if !in_each {
        return Ok(vec![top]);
    }
    let mut dirs = Vec::new();
    for name in names(&top)? {
        match open_dir(&top, &name) {
            Ok(sub) => dirs.push(sub),
            // Not a directory (or a link): nothing in it.
            Err(e) if matches!(e.raw_os_error(), Some(nix::libc::ENOTDIR | nix::libc::ELOOP)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(dirs)
}

/// Renames `from` to `to` inside the directory at `dir`, or inside each of its
/// subdirectories when `in_each` ([`dirs_in`]); neither name is followed, so
/// nothing outside those directories is touched whoever owns them. How many
/// were renamed (a directory without `from` is skipped).
pub fn rename_in(dir: &Path, from: &CStr, to: &CStr, in_each: bool) -> io::Result<usize> {
    let mut renamed = 0;
    for d in &dirs_in(dir, in_each)? {
        match nix::fcntl::renameat(d, from, d, to) {
            Ok(()) => renamed += 1,
            Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(errno(e)),
        }
    }
    Ok(renamed)
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// The names in a directory, without `.` and `..`.
pub(super) fn names(dir: &OwnedFd) -> io::Result<Vec<CString>> {
    Ok(entries(dir)?.into_iter().map(|(name, _)| name).collect())
}

/// The names in `dir` with the type its listing gives (`None` where the
/// filesystem does not say). A hint only, for skipping work: whatever is
/// opened by it is still opened with the checks its kind needs.
pub(super) fn entries(dir: &OwnedFd) -> io::Result<Vec<(CString, Option<nix::dir::Type>)>> {
    let fresh = open_dir(dir, c".")?;
    let mut listing = nix::dir::Dir::from_fd(fresh).map_err(errno)?;
    let mut out = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(errno)?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            out.push((name.to_owned(), entry.file_type()));
        }
    }
    Ok(out)
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

fn give(fd: BorrowedFd<'_>, owner: Option<&Identity>) -> io::Result<()> {
    match owner {
        Some(o) => fchown(fd, Some(o.uid), Some(o.gid)).map_err(errno),
        None => Ok(()),
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

/// Gives every entry of the tree at `root` to `owner`: links themselves, never
/// their targets, and never a directory reached through a link.
pub fn chown_tree(root: &Path, owner: &Identity) -> io::Result<()> {
    let dir = open_dir(nix::fcntl::AT_FDCWD, &cpath(root)?)?;
    chown_dir(&dir, owner)
}

fn chown_dir(dir: &OwnedFd, owner: &Identity) -> io::Result<()> {
    fchown(dir.as_fd(), Some(owner.uid), Some(owner.gid)).map_err(errno)?;
    for name in names(dir)? {
        let entry = fstatat(dir.as_fd(), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).map_err(errno)?;
        if SFlag::from_bits_truncate(entry.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR {
            chown_dir(&open_dir(dir.as_fd(), &name)?, owner)?;
        } else {
            nix::unistd::fchownat(
                dir.as_fd(),
                name.as_c_str(),
                Some(owner.uid),
                Some(owner.gid),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(errno)?;
        }
    }
    Ok(())
}

/// Makes the tree at `root` readable by every user (directories 0755, files
/// 0644), walked by descriptor; anything but a directory or a regular file is
/// refused. For what a golden shares read-only with its forks' servers.
pub fn readable_by_all(root: &Path) -> io::Result<()> {
    fn open_up(dir: &OwnedFd, shown: &Path) -> io::Result<()> {
        nix::sys::stat::fchmod(dir.as_fd(), Mode::from_bits_truncate(0o755)).map_err(errno)?;
        for name in names(dir)? {
            let path = shown.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
            let entry = fstatat(dir.as_fd(), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).map_err(errno)?;
            match SFlag::from_bits_truncate(entry.st_mode & SFlag::S_IFMT.bits()) {
                SFlag::S_IFDIR => open_up(&open_dir(dir.as_fd(), &name)?, &path)?,
                SFlag::S_IFREG => {
                    let file = openat(
                        dir.as_fd(),
                        name.as_c_str(),
                        // Never waits on something swapped in since the stat.
                        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(errno)?;
                    let mode = fstat(file.as_fd()).map_err(errno)?.st_mode;
                    if SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
                        return Err(refused(&path, "it is not a regular file"));
                    }
                    nix::sys::stat::fchmod(file.as_fd(), Mode::from_bits_truncate(0o644)).map_err(errno)?;
                }
                _ => return Err(refused(&path, "it is not a regular file")),
            }
        }
        Ok(())
    }
    open_up(&open_dir(nix::fcntl::AT_FDCWD, &cpath(root)?)?, root)
}

/// The apparent size of every file in the tree at `root`. Walked by descriptor
/// without recursion, so neither depth (a chain of thousands of directories)
/// nor path length hides anything or exhausts a stack; links are counted as
/// themselves, never followed.
pub fn size(root: &Path) -> u64 {
    sum(root, |st| st.st_size.max(0) as u64)
}

/// The bytes allocated to every file in the tree at `root` (what it takes on
/// disk, delayed allocations included), walked as [`size`] is.
pub fn allocated(root: &Path) -> u64 {
    sum(root, |st| st.st_blocks.max(0) as u64 * 512)
}

fn sum(root: &Path, of: impl Fn(&nix::sys::stat::FileStat) -> u64) -> u64 {
    let Ok(path) = cpath(root) else { return 0 };
    let top = match open_dir(nix::fcntl::AT_FDCWD, &path) {
        Ok(fd) => fd,
        Err(_) => {
            return fstatat(nix::fcntl::AT_FDCWD, path.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map(|st| of(&st))
                .unwrap_or(0)
        }
    };
    let mut total = 0u64;
    // Directories still to list: each holds its parent open only until it is opened.
    let mut pending: Vec<(Arc<OwnedFd>, CString)> = Vec::new();
    let mut next = Some(Arc::new(top));
    loop {
        if let Some(dir) = next.take() {
            for name in names(&dir).unwrap_or_default() {
                let Ok(stat) = fstatat(dir.as_fd(), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                    continue;
                };
                if SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR {
                    pending.push((dir.clone(), name));
                } else {
                    total += of(&stat);
                }
            }
        }
        let Some((parent, name)) = pending.pop() else { return total };
        next = open_dir(parent.as_fd(), &name).ok().map(Arc::new);
    }
}

/// How deep [`empty_tree`] goes before it moves a directory up to the top.
const EMPTY_DEPTH: usize = 64;
/// How many names [`empty_tree`] reads from a directory at a time.
const EMPTY_BATCH: usize = 256;

/// Removes everything in the directory `top`, by descriptor (a link is
/// removed, never followed), without recursion, holding at most
/// [`EMPTY_DEPTH`] descriptors and [`EMPTY_BATCH`] names a level whatever
/// the tree's depth or width: a directory deeper than that is moved up into
/// `top` under a new name and emptied from there. (A sandbox's user can make
/// a tree 30,000 levels deep or a directory of millions of names; a
/// recursion overflowed the daemon's stack on the one, a listing read whole
/// took gigabytes on the other.) An empty Btrfs subvolume inside is removed
/// like a directory.
pub fn empty_tree(top: &OwnedFd) -> io::Result<()> {
    // Each directory being emptied, its name in the one before it, and the
    // names read from it and not yet removed.
    let mut stack: Vec<(OwnedFd, CString, Vec<CString>)> =
        vec![(open_dir(top, c".")?, CString::default(), vec![])];
    let mut moved = 0u64;
    while let Some(level) = stack.len().checked_sub(1) {
        let Some(entry) = stack[level].2.pop() else {
            let batch = first_names(&stack[level].0, EMPTY_BATCH)?;
            if !batch.is_empty() {
                stack[level].2 = batch;
                continue;
            }
            let (_, name, _) = stack.pop().expect("a level");
            if let Some((parent, _, _)) = stack.last() {
                unlinkat(parent, name.as_c_str(), UnlinkatFlags::RemoveDir).map_err(errno)?;
            }
            continue;
        };
        let dir = &stack[level].0;
        let stat = fstatat(dir, entry.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).map_err(errno)?;
        if SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
            unlinkat(dir, entry.as_c_str(), UnlinkatFlags::NoRemoveDir).map_err(errno)?;
            continue;
        }
        if stack.len() < EMPTY_DEPTH {
            let child = open_dir(dir, &entry)?;
            stack.push((child, entry, vec![]));
            continue;
        }
        // Too deep: moved up, found again when the top is listed next.
        loop {
            let up = CString::new(format!(".deep-{moved}")).expect("no NUL");
            moved += 1;
            let flags = nix::fcntl::RenameFlags::RENAME_NOREPLACE;
            match nix::fcntl::renameat2(dir, entry.as_c_str(), &stack[0].0, up.as_c_str(), flags) {
                Err(nix::errno::Errno::EEXIST) => continue,
                done => break done.map_err(errno)?,
            }
        }
    }
    Ok(())
}

/// Up to `most` names in `dir`, without `.` and `..`.
fn first_names(dir: &OwnedFd, most: usize) -> io::Result<Vec<CString>> {
    let mut listing = nix::dir::Dir::from_fd(open_dir(dir, c".")?).map_err(errno)?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let name = entry.map_err(errno)?.file_name().to_owned();
        if name.as_c_str() != c"." && name.as_c_str() != c".." {
            names.push(name);
            if names.len() >= most {
                break;
            }
        }
    }
    Ok(names)
}

/// Removes the tree at `path` (not a link), whatever its depth or width
/// ([`empty_tree`]); Btrfs subvolumes inside are removed when empty.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let parent = path.parent().ok_or_else(|| refused(path, "it has no parent"))?;
    let name = CString::new(path.file_name().ok_or_else(|| refused(path, "it has no name"))?.as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let parent = OwnedFd::from(open_dir_path(parent)?);
    let top = match open_dir(&parent, &name) {
        Err(e) if matches!(e.raw_os_error(), Some(nix::libc::ENOTDIR | nix::libc::ELOOP)) => {
            return unlinkat(&parent, name.as_c_str(), UnlinkatFlags::NoRemoveDir).map_err(errno);
        }
        opened => opened?,
    };
    empty_tree(&top)?;
    unlinkat(&parent, name.as_c_str(), UnlinkatFlags::RemoveDir).map_err(errno)
}

/// Empties a directory the caller reached safely (its parent is root's), removing
/// entries by name relative to it: a link inside is removed, never followed
/// ([`empty_tree`]).
pub fn empty_dir(path: &Path) -> io::Result<()> {
    empty_tree(&open_dir(nix::fcntl::AT_FDCWD, &cpath(path)?)?)
}

/// Opens a file that must be a regular file and not a link, without blocking
/// on a FIFO.
fn open_regular(path: &Path, flags: OFlag, mode: u32) -> io::Result<File> {
    let fd = openat(
        nix::fcntl::AT_FDCWD,
        cpath(path)?.as_c_str(),
        flags | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
    .map_err(errno)?;
    let stat = fstat(fd.as_fd()).map_err(errno)?;
    if SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
        return Err(refused(path, "it is not a regular file"));
    }
    Ok(File::from(fd))
}

/// Opens a regular file for reading, never through a link or a FIFO (a file
/// in a directory a sandbox's user owns).
pub fn open_read(path: &Path) -> io::Result<File> {
    open_regular(path, OFlag::O_RDONLY, 0)
}

/// Reads at most `max` bytes of a regular file (never through a link).
pub fn read_small(path: &Path, max: u64) -> io::Result<String> {
    Ok(String::from_utf8_lossy(&read_small_bytes(path, max)?).into_owned())
}

/// Reads at most `max` bytes of a regular file, never through a link or a FIFO.
pub fn read_small_bytes(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    open_regular(path, OFlag::O_RDONLY, 0)?.take(max).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Reads the last `max` bytes of a regular file (never through a link).
pub fn read_tail(path: &Path, max: u64) -> io::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = open_regular(path, OFlag::O_RDONLY, 0)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(max)))?;
    let mut text = Vec::new();
    file.take(max).read_to_end(&mut text)?;
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// Opens (creating, 0600) a log for appending; refuses a link or anything but a
/// regular file where it should be.
pub fn open_log(path: &Path) -> io::Result<File> {
    let file = open_regular(path, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_APPEND, 0o600)?;
    // The descriptor was opened non-blocking only to be safe against a FIFO.
    nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_APPEND)).map_err(errno)?;
    Ok(file)
}

/// Creates the new file `path` with `contents` (never through a link, never over
/// an existing file), given to `owner`.
pub fn write_new(path: &Path, contents: &[u8], mode: u32, owner: Option<&Identity>) -> io::Result<()> {
    use std::io::Write;
    let mut file = open_regular(path, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL, mode)?;
    file.write_all(contents)?;
    give(file.as_fd(), owner)
}

/// Replaces the file at `path` with `contents` (mode `mode`, the caller's): written
/// to a new file beside it, then renamed over it, so a link in its place is
/// replaced, never followed.
pub fn write_private(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write;
    let staged = path.with_file_name(format!(
        ".{}.{}",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
        airlock_core::secret::hex(&airlock_core::secret::random_bytes::<6>())
    ));
    let result = (|| {
        let mut file = open_regular(&staged, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL, mode)?;
        file.write_all(contents)?;
        nix::sys::stat::fchmod(file.as_fd(), Mode::from_bits_truncate(mode)).map_err(errno)?;
        std::fs::rename(&staged, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&staged);
    }
    result
}

/// Opens a file named in a request: a regular file only. A FIFO or a device
/// would let whoever holds its other end decide what the daemon reads, and
/// when (holding a build open for ever, or writing more once psql runs); it is
/// opened without blocking, then refused.
pub fn open_request_file(path: &Path) -> airlock_core::error::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let unreadable = |why: String| {
        airlock_core::error::Error::new(
            airlock_core::error::ErrorCode::FileUnreadable,
            format!("cannot read {}: {why}", path.display()),
            "give a regular file the daemon's user can read",
        )
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| unreadable(e.to_string()))?;
    let meta = file.metadata().map_err(|e| unreadable(e.to_string()))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    Ok(file)
}

/// Makes a private (0700) scratch directory for temporary files.
pub fn private_dir(path: &Path) -> airlock_core::error::Result<()> {
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let base = std::env::temp_dir().join(format!("airlock-tree-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("src/base/1")).unwrap();
        std::fs::write(base.join("src/base/1/1259"), vec![7u8; 100_000]).unwrap();
        std::fs::write(base.join("src/PG_VERSION"), "15\n").unwrap();
        std::fs::write(base.join("src/postmaster.pid"), "1\n").unwrap();
        base
    }

    fn copying() -> CloneSpec<'static> {
        CloneSpec { skip: &["postmaster.pid"], ..CloneSpec::files(Contents::Copy, None, None) }
    }

    #[test]
    fn renames_in_a_tree_follow_no_link() {
        let base = scratch("rename");
        let (tree, outside) = (base.join("tree"), base.join("outside"));
        for dir in [tree.join("global"), tree.join("base/5"), outside.clone()] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(outside.join("a"), "outside").unwrap();
        std::fs::write(tree.join("base/5/a"), "inside").unwrap();
        // A subdirectory that is a link elsewhere, and a name that is a link.
        std::os::unix::fs::symlink(&outside, tree.join("base/6")).unwrap();
        std::os::unix::fs::symlink(outside.join("a"), tree.join("global/a")).unwrap();
        assert_eq!(rename_in(&tree.join("base"), c"a", c"b", true).unwrap(), 1);
        assert_eq!(std::fs::read_to_string(tree.join("base/5/b")).unwrap(), "inside");
        assert!(outside.join("a").is_file() && !outside.join("b").exists(), "renamed through a link");
        assert_eq!(rename_in(&tree.join("global"), c"a", c"b", false).unwrap(), 1);
        assert!(tree.join("global/b").symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(outside.join("a")).unwrap(), "outside");
        // The directory itself reached through a link is refused.
        std::os::unix::fs::symlink(&outside, base.join("via")).unwrap();
        assert!(rename_in(&base.join("via"), c"a", c"b", false).is_err());
        assert!(outside.join("a").is_file());
        std::fs::remove_dir_all(&base).unwrap();
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

    #[test]
    fn small_reads_and_private_writes_never_follow_links() {
        let base = scratch("io");
        let target = base.join("src/PG_VERSION");
        let link = base.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(read_small(&link, 100).is_err());
        assert!(open_log(&link).is_err());
        nix::unistd::mkfifo(&base.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        assert!(read_small(&base.join("fifo"), 100).is_err(), "a FIFO is refused, not waited on");
        write_private(&link, b"mine", 0o644).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "15\n", "the link's target was written");
        assert_eq!(read_small(&link, 100).unwrap(), "mine");
        assert_eq!(read_tail(&base.join("src/base/1/1259"), 10).unwrap().len(), 10);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn sizes_count_what_deep_trees_and_long_paths_hold() {
        let base = scratch("size");
        let mut deep = base.join("src");
        // Deeper than a recursive walk's stack and longer than PATH_MAX.
        let mut chdir = std::fs::File::open(&deep).unwrap();
        for _ in 0..3000 {
            nix::sys::stat::mkdirat(chdir.as_fd(), "dddddddddd", Mode::from_bits_truncate(0o700)).unwrap();
            let fd = openat(chdir.as_fd(), "dddddddddd", OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty())
                .unwrap();
            chdir = File::from(fd);
        }
        let fd = openat(
            chdir.as_fd(),
            "hidden",
            OFlag::O_WRONLY | OFlag::O_CREAT,
            Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        File::from(fd).set_len(5 << 20).unwrap();
        deep.push("x");
        assert!(size(&base.join("src")) >= (5 << 20) + 100_000);
        std::process::Command::new("rm").arg("-rf").arg(&base).status().unwrap();
    }

    #[test]
    fn emptying_a_directory_removes_links_not_their_targets() {
        let base = scratch("empty");
        let outside = base.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, base.join("src/link")).unwrap();
        empty_dir(&base.join("src")).unwrap();
        assert_eq!(std::fs::read_dir(base.join("src")).unwrap().count(), 0);
        assert!(outside.join("keep").exists());
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Emptying follows no link, leaves what a link points at, removes
    /// whatever kind of entry it meets, and empties a tree far deeper than
    /// the descriptors it holds and a directory far wider than a batch.
    #[test]
    fn emptying_a_tree_follows_no_link_and_holds_on_any_depth_or_width() {
        let base = std::env::temp_dir().join(format!("airlock-empty-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (top, outside) = (base.join("top"), base.join("outside"));
        std::fs::create_dir_all(top.join("a/b")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("kept"), "outside").unwrap();
        std::fs::write(top.join("a/b/file"), "inside").unwrap();
        std::os::unix::fs::symlink(&outside, top.join("link-to-dir")).unwrap();
        std::os::unix::fs::symlink(outside.join("kept"), top.join("a/link-to-file")).unwrap();
        nix::unistd::mkfifo(&top.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        for i in 0..3 * EMPTY_BATCH {
            std::fs::write(top.join("a").join(format!("f{i}")), "").unwrap();
        }
        // 20,000 levels, made by descriptor (a path that long is refused);
        // a recursion of one frame a level overflowed a thread's stack.
        let mut dir = OwnedFd::from(open_dir_path(&top).unwrap());
        for _ in 0..20_000 {
            mkdirat(&dir, c"d", Mode::from_bits_truncate(0o700)).unwrap();
            dir = open_dir(&dir, c"d").unwrap();
        }
        std::fs::write(format!("/proc/self/fd/{}/deepest", dir.as_raw_fd()), "x").unwrap();
        drop(dir);
        let held = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn({
                let top = top.clone();
                move || empty_tree(&OwnedFd::from(open_dir_path(&top).unwrap()))
            })
            .unwrap()
            .join()
            .unwrap();
        held.unwrap();
        assert_eq!(std::fs::read_dir(&top).unwrap().count(), 0);
        assert_eq!(std::fs::read_to_string(outside.join("kept")).unwrap(), "outside");
        remove_tree(&top).unwrap();
        assert!(!top.exists());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
