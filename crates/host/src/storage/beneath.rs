//! Files in a directory a contained user may write (an executor's
//! workspace), read and written by the daemon without following anything that
//! user could have put there: each path is walked a component at a time, every
//! component opened with `O_NOFOLLOW`, so a link planted in place of a
//! directory or a file, even while the walk runs, is refused rather than
//! followed out of the directory.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, mkdirat, Mode, SFlag};
use nix::unistd::{fchown, Gid, Uid};

fn invalid(text: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, text)
}

/// The names of a relative path of plain components (no `..`, no root, no `.`).
pub fn components(relative: &Path) -> io::Result<Vec<&OsStr>> {
    let mut names = Vec::new();
    for c in relative.components() {
        match c {
            Component::Normal(name) => names.push(name),
            _ => return Err(invalid(format!("{} is not a plain relative path", relative.display()))),
        }
    }
    if names.is_empty() {
        return Err(invalid("an empty path".into()));
    }
    Ok(names)
}

fn cname(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| invalid("a path with a NUL byte".into()))
}

/// Opens `root` itself (which the daemon made) and then each directory of
/// `dirs` beneath it, never through a link; with `make`, missing ones are made
/// (0700, owned by that user).
fn walk(root: &Path, dirs: &[&OsStr], make: Option<(Uid, Gid)>) -> io::Result<OwnedFd> {
    let dir_flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    let mut fd = openat(nix::fcntl::AT_FDCWD, root, dir_flags, Mode::empty()).map_err(io::Error::from)?;
    for name in dirs {
        let name = cname(name)?;
        if let Some((uid, gid)) = make {
            match mkdirat(fd.as_fd(), name.as_c_str(), Mode::from_bits_truncate(0o700)) {
                Ok(()) => {
                    let made = openat(fd.as_fd(), name.as_c_str(), dir_flags, Mode::empty())
                        .map_err(io::Error::from)?;
                    fchown(made.as_fd(), Some(uid), Some(gid)).map_err(io::Error::from)?;
                    fd = made;
                    continue;
                }
                Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        fd = openat(fd.as_fd(), name.as_c_str(), dir_flags, Mode::empty()).map_err(|e| match e {
            nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR => {
                invalid(format!("{} is not a directory", name.to_string_lossy()))
            }
            e => e.into(),
        })?;
    }
    Ok(fd)
}

/// Writes `bytes` to `relative` beneath `root` as a new file (what stood at
/// that name goes first), owned by `owner`, mode 0644; missing directories
/// are made.
pub fn write(root: &Path, relative: &Path, bytes: &[u8], owner: (Uid, Gid)) -> io::Result<()> {
    let names = components(relative)?;
    let (file, dirs) = names.split_last().expect("components is never empty");
    let dir = walk(root, dirs, Some(owner))?;
    let name = cname(file)?;
    match nix::unistd::unlinkat(dir.as_fd(), name.as_c_str(), nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(e.into()),
    }
    let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir.as_fd(), name.as_c_str(), flags, Mode::from_bits_truncate(0o644))
        .map_err(io::Error::from)?;
    fchown(fd.as_fd(), Some(owner.0), Some(owner.1)).map_err(io::Error::from)?;
    File::from(fd).write_all(bytes)
}

/// What [`read`] found.
pub enum Found {
    /// The file's bytes.
    Bytes(Vec<u8>),
    /// Nothing at that name.
    Missing,
    /// A file larger than the limit: its size.
    TooLarge(u64),
}

/// Reads the regular file at `relative` beneath `root`, if it is no larger
/// than `max` bytes and belongs to `owner` (a hard link to another user's
/// file is refused); never through a link, never blocking on a FIFO.
pub fn read(root: &Path, relative: &Path, max: u64, owner: Uid) -> io::Result<Found> {
    let names = components(relative)?;
    let (file, dirs) = names.split_last().expect("components is never empty");
    let dir = match walk(root, dirs, None) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Found::Missing),
        Err(e) => return Err(e),
    };
    let name = cname(file)?;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = match openat(dir.as_fd(), name.as_c_str(), flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(Found::Missing),
        Err(nix::errno::Errno::ELOOP) => return Err(invalid(format!("{} is a link", relative.display()))),
        Err(e) => return Err(e.into()),
    };
    let stat = fstat(fd.as_fd()).map_err(io::Error::from)?;
    if SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
        return Err(invalid(format!("{} is not a regular file", relative.display())));
    }
    if stat.st_uid != owner.as_raw() {
        return Err(invalid(format!("{} is not the command's own file", relative.display())));
    }
    if stat.st_size as u64 > max {
        return Ok(Found::TooLarge(stat.st_size as u64));
    }
    let mut bytes = Vec::with_capacity(stat.st_size as usize);
    File::from(fd).take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Ok(Found::TooLarge(bytes.len() as u64));
    }
    Ok(Found::Bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_other_users_files_are_refused_and_plain_files_pass() {
        let root = std::env::temp_dir().join(format!("airlock-beneath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let me = (nix::unistd::getuid(), nix::unistd::getgid());
        write(&root, Path::new("in/data.csv"), b"a,b\n", me).unwrap();
        match read(&root, Path::new("in/data.csv"), 100, me.0).unwrap() {
            Found::Bytes(b) => assert_eq!(b, b"a,b\n"),
            _ => panic!("not read"),
        }
        assert!(matches!(read(&root, Path::new("in/data.csv"), 2, me.0).unwrap(), Found::TooLarge(4)));
        assert!(matches!(read(&root, Path::new("nope/x"), 2, me.0).unwrap(), Found::Missing));
        // A link in place of a directory or of a file is refused both ways.
        std::os::unix::fs::symlink("/etc", root.join("out")).unwrap();
        assert!(read(&root, Path::new("out/passwd"), 1 << 20, nix::unistd::Uid::from_raw(0)).is_err());
        assert!(write(&root, Path::new("out/x"), b"x", me).is_err());
        std::os::unix::fs::symlink("/etc/passwd", root.join("pw")).unwrap();
        assert!(read(&root, Path::new("pw"), 1 << 20, nix::unistd::Uid::from_raw(0)).is_err());
        // Writing over a link replaces the link, never its target.
        write(&root, Path::new("pw"), b"mine", me).unwrap();
        assert!(std::fs::read_to_string("/etc/passwd").unwrap().contains("root"));
        for bad in ["../x", "/etc/passwd", "a/../../x", "", "."] {
            assert!(components(Path::new(bad)).is_err(), "{bad}");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}
