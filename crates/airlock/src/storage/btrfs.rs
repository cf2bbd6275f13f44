//! Btrfs subvolumes and quota groups: a hard disk quota per sandbox.
//!
//! On a Btrfs volume with quotas enabled (`storage init --fs btrfs` turns on
//! simple quotas, which charge each extent to the subvolume that wrote it), every
//! sandbox's directory is a subvolume of its own with a limit on the bytes it may
//! own. Files cloned from the golden share the golden's extents and cost the
//! sandbox nothing; whatever it writes beyond its limit fails with EDQUOT (`disk
//! quota exceeded`) in that sandbox only. Only root makes subvolumes here, with
//! the kernel's ioctls (no `btrfs` process on the fork path).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const MAGIC: u8 = 0x94;

/// `struct btrfs_ioctl_vol_args`: an fd and a name.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; 4088],
}

/// `struct btrfs_ioctl_quota_ctl_args`.
#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

/// `struct btrfs_qgroup_limit`.
#[repr(C)]
struct QgroupLimit {
    flags: u64,
    max_referenced: u64,
    max_exclusive: u64,
    reserved_referenced: u64,
    reserved_exclusive: u64,
}

/// `struct btrfs_ioctl_qgroup_limit_args`.
#[repr(C)]
struct QgroupLimitArgs {
    qgroup_id: u64,
    limit: QgroupLimit,
}

nix::ioctl_write_ptr!(subvol_create, MAGIC, 14, VolArgs);
nix::ioctl_write_ptr!(snap_destroy, MAGIC, 15, VolArgs);
nix::ioctl_readwrite!(quota_ctl, MAGIC, 40, QuotaCtlArgs);
nix::ioctl_read!(qgroup_limit, MAGIC, 43, QgroupLimitArgs);

const QUOTA_ENABLE: u64 = 1;
const QUOTA_ENABLE_SIMPLE: u64 = 4;
const LIMIT_MAX_EXCLUSIVE: u64 = 1 << 1;
/// The inode number of every subvolume's top directory (`BTRFS_FIRST_FREE_OBJECTID`).
const SUBVOLUME_TOP_INODE: u64 = 256;

fn errno(e: nix::errno::Errno) -> io::Error {
    io::Error::from(e)
}

/// Makes the new subvolume `path` (its parent must exist and be on Btrfs).
pub fn create_subvolume(path: &Path) -> io::Result<()> {
    let parent = File::open(path.parent().ok_or_else(|| io::Error::other("a subvolume needs a parent"))?)?;
    let name = path.file_name().ok_or_else(|| io::Error::other("a subvolume needs a name"))?.as_bytes();
    create_subvolume_at(parent.as_fd(), name)
}

/// Makes the new subvolume `name` in the directory `parent`.
pub fn create_subvolume_at(parent: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let args = vol_args(name)?;
    // SAFETY: the argument is a properly laid out btrfs_ioctl_vol_args that lives
    // for the whole call.
    unsafe { subvol_create(parent.as_raw_fd(), &args) }.map(|_| ()).map_err(errno)
}

/// Deletes every subvolume in the tree at `path`, deepest first, and `path`
/// itself if it is one; true when `path` is gone. One ioctl per subvolume: no
/// file is unlinked one by one, so nothing is charged to the subvolume's own
/// quota group (at its limit, Btrfs refuses even the metadata a file-by-file
/// removal needs, and releases its reservations only at a later commit).
/// Directories are opened from their parents without following links.
pub fn delete_subvolumes(path: &Path) -> io::Result<bool> {
    let name = path.file_name().ok_or_else(|| io::Error::other("a tree to delete needs a name"))?;
    let parent =
        File::open(path.parent().ok_or_else(|| io::Error::other("a tree to delete needs a parent"))?)?;
    let name = std::ffi::CString::new(name.as_bytes()).map_err(|_| io::Error::other("bad name"))?;
    let top = super::tree::open_dir(&parent, &name)?;
    delete_nested(&top)?;
    if is_subvolume_top(&top)? {
        drop(top);
        destroy_at(parent.as_fd(), name.as_bytes())?;
        return Ok(true);
    }
    Ok(false)
}

fn delete_nested(dir: &std::os::fd::OwnedFd) -> io::Result<()> {
    for name in super::tree::names(dir)? {
        let Ok(child) = super::tree::open_dir(dir, &name) else { continue };
        delete_nested(&child)?;
        if is_subvolume_top(&child)? {
            drop(child);
            destroy_at(dir.as_fd(), name.as_bytes())?;
        }
    }
    Ok(())
}

fn is_subvolume_top(dir: &std::os::fd::OwnedFd) -> io::Result<bool> {
    Ok(nix::sys::stat::fstat(dir.as_fd()).map_err(errno)?.st_ino == SUBVOLUME_TOP_INODE)
}

/// Deletes the subvolume `name` in the directory `parent`.
fn destroy_at(parent: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let args = vol_args(name)?;
    // SAFETY: as for subvol_create.
    unsafe { snap_destroy(parent.as_raw_fd(), &args) }.map(|_| ()).map_err(errno)
}

fn vol_args(name: &[u8]) -> io::Result<VolArgs> {
    if name.len() >= 4088 || name.contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad subvolume name"));
    }
    let mut args = VolArgs { fd: 0, name: [0; 4088] };
    args.name[..name.len()].copy_from_slice(name);
    Ok(args)
}

/// Limits what the subvolume at `path` may own to `bytes` (`u64::MAX`: no limit).
pub fn limit(path: &Path, bytes: u64) -> io::Result<()> {
    let dir = File::open(path)?;
    let mut args = QgroupLimitArgs {
        // 0: the subvolume the descriptor is in.
        qgroup_id: 0,
        limit: QgroupLimit {
            flags: LIMIT_MAX_EXCLUSIVE,
            max_referenced: 0,
            max_exclusive: bytes,
            reserved_referenced: 0,
            reserved_exclusive: 0,
        },
    };
    // SAFETY: as above, for btrfs_ioctl_qgroup_limit_args.
    unsafe { qgroup_limit(dir.as_raw_fd(), &mut args) }.map(|_| ()).map_err(errno)
}

/// Turns quotas on for the filesystem at `mount`: simple quotas where the kernel
/// has them (6.7 and later: no accounting walk at each commit), full quota groups
/// otherwise. Returns which.
pub fn enable_quotas(mount: &Path) -> io::Result<&'static str> {
    let dir = File::open(mount)?;
    for (cmd, mode) in [(QUOTA_ENABLE_SIMPLE, "simple"), (QUOTA_ENABLE, "qgroup")] {
        let mut args = QuotaCtlArgs { cmd, status: 0 };
        // SAFETY: as above, for btrfs_ioctl_quota_ctl_args.
        if unsafe { quota_ctl(dir.as_raw_fd(), &mut args) }.is_ok() {
            return Ok(mode);
        }
    }
    Err(io::Error::other("the kernel refused to enable Btrfs quotas"))
}

/// Whether a subvolume with a quota limit can be made under `volume` (Btrfs with
/// quotas on): makes one, limits it, removes it.
pub fn quotas_work(volume: &Path) -> bool {
    let probe = volume.join(".probe-subvolume");
    let _ = std::fs::remove_dir_all(&probe);
    let works = create_subvolume(&probe).is_ok() && limit(&probe, 64 << 20).is_ok();
    let _ = std::fs::remove_dir_all(&probe);
    works
}
