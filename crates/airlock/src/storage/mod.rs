//! Copy-on-write cloning of data directories.
//!
//! The [`Cloner`] probes the volume once at start: if the filesystem takes
//! `FICLONE` (XFS with reflink=1, Btrfs), each file is cloned as a reflink, which
//! costs the same whatever the file's size; otherwise every byte is copied, and
//! every fork says so in a warning.

pub mod volume;

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::users::Identity;

nix::ioctl_write_int!(ficlone, 0x94, 9);

/// How files are cloned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// One `FICLONE` per file: shared extents, constant time per file.
    Reflink,
    /// A full copy of every byte (slow; time grows with data size).
    Copy,
}

/// The warning attached to every fork made on the copy fallback.
pub const COPY_WARNING: &str = "the data root is not on a copy-on-write filesystem, so this fork copied every byte of the golden; run `airlock storage init` as root (or put AIRLOCK_HOME on XFS or Btrfs) for millisecond forks";

/// Clones directory trees with the best method the volume supports.
#[derive(Debug, Clone)]
pub struct Cloner {
    backend: Backend,
    filesystem: String,
}

/// Files that belong to a running server and must not be cloned.
const SKIP: &[&str] = &["postmaster.pid", "postmaster.opts"];

impl Cloner {
    /// Probes `volume` by cloning a small file inside it.
    pub fn probe(volume: &Path) -> std::io::Result<Cloner> {
        let src = volume.join(".probe-src");
        let dst = volume.join(".probe-dst");
        let _ = fs::remove_file(&src);
        let _ = fs::remove_file(&dst);
        fs::write(&src, b"airlock reflink probe")?;
        let cloned = reflink(&src, &dst).is_ok();
        let _ = fs::remove_file(&src);
        let _ = fs::remove_file(&dst);
        Ok(Cloner {
            backend: if cloned { Backend::Reflink } else { Backend::Copy },
            filesystem: filesystem_name(volume),
        })
    }

    /// A cloner that always copies (for tests of the fallback).
    pub fn copying(volume: &Path) -> Cloner {
        Cloner { backend: Backend::Copy, filesystem: filesystem_name(volume) }
    }

    /// The method in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The volume's filesystem type, such as `xfs` or `ext4`.
    pub fn filesystem(&self) -> &str {
        &self.filesystem
    }

    /// Clones the tree at `src` to the new path `dst`, giving every entry to `owner`;
    /// returns the number of files. On failure, whatever was made of `dst` is removed.
    pub fn clone_tree(&self, src: &Path, dst: &Path, owner: Option<&Identity>) -> std::io::Result<u64> {
        fs::create_dir(dst)?;
        let result = self.clone_into(src, dst, owner);
        if result.is_err() {
            let _ = fs::remove_dir_all(dst);
        }
        result
    }

    fn clone_into(&self, src: &Path, dst: &Path, owner: Option<&Identity>) -> std::io::Result<u64> {
        // Directories first (in order, so parents exist), then the files, which
        // dominate the time: creating an inode costs more than the reflink itself,
        // so they are spread over the cores.
        let mut files = Vec::new();
        make_dirs(src, dst, owner, &mut files)?;
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
        let chunk = files.len().div_ceil(workers).max(1);
        std::thread::scope(|scope| {
            let handles: Vec<_> = files
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        part.iter().try_for_each(|(from, to)| self.clone_file(from, to, owner))
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| h.join().expect("clone worker panicked"))
        })?;
        Ok(files.len() as u64)
    }

    fn clone_file(&self, from: &Path, to: &Path, owner: Option<&Identity>) -> std::io::Result<()> {
        match self.backend {
            Backend::Reflink => reflink(from, to)?,
            Backend::Copy => copy(from, to)?,
        }
        if let Some(o) = owner {
            o.own(to)?;
        }
        Ok(())
    }
}

/// Recreates the directories (and symlinks) of `src` under the existing `dst`,
/// collecting the regular files to clone.
fn make_dirs(
    src: &Path,
    dst: &Path,
    owner: Option<&Identity>,
    files: &mut Vec<(std::path::PathBuf, std::path::PathBuf)>,
) -> std::io::Result<()> {
    let meta = fs::metadata(src)?;
    fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    if let Some(o) = owner {
        o.own(dst)?;
    }
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let name = entry.file_name();
        if SKIP.iter().any(|s| name == *s) {
            continue;
        }
        let (from, to) = (entry.path(), dst.join(&name));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            fs::create_dir(&to)?;
            make_dirs(&from, &to, owner, files)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&from)?, &to)?;
            if let Some(o) = owner {
                o.own(&to)?;
            }
        } else {
            files.push((from, to));
        }
    }
    Ok(())
}

fn create_like(src: &File, to: &Path) -> std::io::Result<File> {
    let mode = src.metadata()?.mode() & 0o7777;
    OpenOptions::new().write(true).create_new(true).mode(mode).open(to)
}

/// Clones one file with `FICLONE`; the new file shares all extents with the old.
fn reflink(from: &Path, to: &Path) -> std::io::Result<()> {
    let src = File::open(from)?;
    let dst = create_like(&src, to)?;
    // SAFETY: both descriptors are open for the duration of the call.
    let result = unsafe { ficlone(dst.as_raw_fd(), src.as_raw_fd() as _) };
    if let Err(errno) = result {
        drop(dst);
        let _ = fs::remove_file(to);
        return Err(std::io::Error::from(errno));
    }
    Ok(())
}

/// Copies one file byte for byte.
fn copy(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut src = File::open(from)?;
    let mut dst = create_like(&src, to)?;
    std::io::copy(&mut src, &mut dst)?;
    Ok(())
}

/// The filesystem type of `path`, by its superblock magic.
pub fn filesystem_name(path: &Path) -> String {
    use nix::sys::statfs::*;
    let Ok(st) = statfs(path) else { return "unknown".into() };
    let t = st.filesystem_type();
    let name = if t == XFS_SUPER_MAGIC {
        "xfs"
    } else if t == BTRFS_SUPER_MAGIC {
        "btrfs"
    } else if t == EXT4_SUPER_MAGIC {
        "ext4"
    } else if t == TMPFS_MAGIC {
        "tmpfs"
    } else if t == OVERLAYFS_SUPER_MAGIC {
        "overlayfs"
    } else {
        return format!("0x{:x}", t.0);
    };
    name.into()
}

/// Bytes on disk of a tree (apparent sizes of its files).
pub fn tree_size(root: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(root) else { return 0 };
    if !meta.is_dir() {
        return meta.len();
    }
    fs::read_dir(root).into_iter().flatten().flatten().map(|e| tree_size(&e.path())).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_fallback_clones_a_tree_and_skips_pid_files() {
        let base = std::env::temp_dir().join(format!("airlock-clone-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(base.join("src/base/1")).unwrap();
        fs::write(base.join("src/base/1/1259"), vec![7u8; 100_000]).unwrap();
        fs::write(base.join("src/PG_VERSION"), "15\n").unwrap();
        fs::write(base.join("src/postmaster.pid"), "1\n").unwrap();
        let cloner = Cloner::copying(&base);
        let n = cloner.clone_tree(&base.join("src"), &base.join("dst"), None).unwrap();
        assert_eq!(n, 2);
        assert_eq!(fs::read(base.join("dst/base/1/1259")).unwrap(), vec![7u8; 100_000]);
        assert!(!base.join("dst/postmaster.pid").exists());
        // Writing to the clone leaves the source alone.
        fs::write(base.join("dst/PG_VERSION"), "changed").unwrap();
        assert_eq!(fs::read_to_string(base.join("src/PG_VERSION")).unwrap(), "15\n");
        // A clone onto an existing path fails and leaves what was there.
        assert!(cloner.clone_tree(&base.join("src"), &base.join("dst"), None).is_err());
        assert_eq!(fs::read_to_string(base.join("dst/PG_VERSION")).unwrap(), "changed");
        fs::remove_dir_all(&base).unwrap();
    }
}
