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
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, Mode, SFlag};
use nix::unistd::{fchown, unlinkat, UnlinkatFlags};

use crate::users::Identity;

pub(super) fn refused(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "refusing to clone {}: {what}; a data directory holds only directories and regular files",
            path.display()
        ),
    )
}

pub(super) fn errno(e: nix::errno::Errno) -> io::Error {
    io::Error::from(e)
}

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

pub(super) fn cpath(path: &Path) -> io::Result<CString> {
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

pub(super) fn give(fd: BorrowedFd<'_>, owner: Option<&Identity>) -> io::Result<()> {
    match owner {
        Some(o) => fchown(fd, Some(o.uid), Some(o.gid)).map_err(errno),
        None => Ok(()),
    }
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
pub(super) mod tests {
    use super::*;
    use nix::sys::stat::mkdirat;
    use std::os::fd::AsRawFd;
    use std::path::PathBuf;

    pub(in crate::storage) fn scratch(name: &str) -> PathBuf {
        let base = std::env::temp_dir().join(format!("airlock-tree-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("src/base/1")).unwrap();
        std::fs::write(base.join("src/base/1/1259"), vec![7u8; 100_000]).unwrap();
        std::fs::write(base.join("src/PG_VERSION"), "15\n").unwrap();
        std::fs::write(base.join("src/postmaster.pid"), "1\n").unwrap();
        base
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
