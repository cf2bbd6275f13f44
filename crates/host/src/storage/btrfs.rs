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

/// `struct btrfs_ioctl_ino_lookup_args`: which subvolume (tree) an inode is in.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `struct btrfs_ioctl_fs_info_args`, of which only the filesystem's id is read.
#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    rest: [u8; 1024 - 32],
}

nix::ioctl_write_ptr!(subvol_create, MAGIC, 14, VolArgs);
nix::ioctl_readwrite!(ino_lookup, MAGIC, 18, InoLookupArgs);
nix::ioctl_read!(fs_info, MAGIC, 31, FsInfoArgs);
nix::ioctl_write_ptr!(snap_destroy, MAGIC, 15, VolArgs);
nix::ioctl_readwrite!(quota_ctl, MAGIC, 40, QuotaCtlArgs);
nix::ioctl_read!(qgroup_limit, MAGIC, 43, QgroupLimitArgs);

const QUOTA_ENABLE: u64 = 1;
const QUOTA_ENABLE_SIMPLE: u64 = 4;
const LIMIT_MAX_EXCLUSIVE: u64 = 1 << 1;
/// The inode number of every subvolume's top directory (`BTRFS_FIRST_FREE_OBJECTID`).
pub(super) const SUBVOLUME_TOP_INODE: u64 = 256;

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
/// Directories are opened from their parents without following links, and
/// walked without recursion to [`NESTED_DEPTH`] levels: Airlock makes nested
/// subvolumes (a WAL's) two levels down, and a sandbox's processes cannot
/// make any. A subvolume that still holds one the walk did not reach (moved
/// deeper by its owner) is emptied file by file ([`super::tree::empty_tree`],
/// any depth) and then deleted.
pub fn delete_subvolumes(path: &Path) -> io::Result<bool> {
    let name = path.file_name().ok_or_else(|| io::Error::other("a tree to delete needs a name"))?;
    let parent =
        File::open(path.parent().ok_or_else(|| io::Error::other("a tree to delete needs a parent"))?)?;
    let name = std::ffi::CString::new(name.as_bytes()).map_err(|_| io::Error::other("bad name"))?;
    let top = super::tree::open_dir(&parent, &name)?;
    delete_nested(&top)?;
    if !is_subvolume_top(&top)? {
        return Ok(false);
    }
    match destroy_at(parent.as_fd(), name.as_bytes()) {
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOTEMPTY) => {
            super::tree::empty_tree(&top)?;
            drop(top);
            destroy_at(parent.as_fd(), name.as_bytes())?;
        }
        done => done?,
    }
    Ok(true)
}

/// How deep [`delete_subvolumes`] looks for nested subvolumes.
const NESTED_DEPTH: usize = 16;

/// Deletes the subvolumes below `top` to [`NESTED_DEPTH`] levels, deepest
/// first, reading each directory as a stream (a directory of millions of
/// names costs no memory).
fn delete_nested(top: &std::os::fd::OwnedFd) -> io::Result<()> {
    let listing = |dir: &std::os::fd::OwnedFd| -> io::Result<nix::dir::OwningIter> {
        Ok(nix::dir::Dir::from_fd(super::tree::open_dir(dir, c".")?).map_err(errno)?.into_iter())
    };
    // Each directory walked, its name in the one before it, and its listing.
    let mut stack = vec![(super::tree::open_dir(top, c".")?, std::ffi::CString::default(), listing(top)?)];
    loop {
        let depth = stack.len();
        let Some((dir, _, entries)) = stack.last_mut() else { break };
        let next = entries.next().transpose().map_err(errno)?;
        let Some(entry) = next else {
            let (child, name, _) = stack.pop().expect("a level");
            if let Some((parent, _, _)) = stack.last() {
                if is_subvolume_top(&child)? {
                    drop(child);
                    destroy_at(parent.as_fd(), name.as_bytes()).inspect_err(|e| {
                        tracing::debug!(subvolume = ?name, error = %e, "a nested subvolume was not deleted");
                    })?;
                }
            }
            continue;
        };
        let name = entry.file_name();
        // Only a directory can be (or hold) a subvolume.
        let listed = entry.file_type();
        if name == c"." || name == c".." || listed.is_some_and(|t| t != nix::dir::Type::Directory) {
            continue;
        }
        if depth > NESTED_DEPTH {
            continue;
        }
        let Ok(child) = super::tree::open_dir(&*dir, name) else { continue };
        let inside = listing(&child)?;
        stack.push((child, name.to_owned(), inside));
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
///
/// The limit is set through the filesystem's top-level subvolume, never the
/// subvolume itself: Btrfs refuses a change made through a subvolume that is
/// over its limit (its count runs behind its writes, so one can be, for a
/// moment), and that refusal would keep even the limit's removal, and so the
/// sandbox's deletion, from happening.
pub fn limit(path: &Path, bytes: u64) -> io::Result<()> {
    // Never through a link: root must limit the subvolume named, not one a
    // sandbox's user pointed its path at.
    let dir = super::tree::open_dir_path(path)?;
    if nix::sys::stat::fstat(dir.as_fd()).map_err(errno)?.st_ino != SUBVOLUME_TOP_INODE {
        return Err(io::Error::other("not the top of a subvolume"));
    }
    let id = tree_of(dir.as_fd())?;
    // The nearest directory above it in the top-level subvolume.
    let mut above = path.parent();
    while let Some(candidate) = above {
        let holder = super::tree::open_dir_path(candidate)?;
        if tree_of(holder.as_fd())? == TOP_LEVEL_TREE {
            return limit_qgroup(holder.as_fd(), id, bytes);
        }
        above = candidate.parent();
    }
    Err(io::Error::other(format!("{} is not below Btrfs's top-level subvolume", path.display())))
}

/// The id of the subvolume (tree) `dir` is in.
fn tree_of(dir: BorrowedFd<'_>) -> io::Result<u64> {
    let mut lookup = InoLookupArgs { treeid: 0, objectid: SUBVOLUME_TOP_INODE, name: [0; 4080] };
    // SAFETY: a properly laid out btrfs_ioctl_ino_lookup_args that lives for the call.
    unsafe { ino_lookup(dir.as_raw_fd(), &mut lookup) }.map_err(errno)?;
    Ok(lookup.treeid)
}

/// Btrfs's top-level subvolume (`BTRFS_FS_TREE_OBJECTID`).
const TOP_LEVEL_TREE: u64 = 5;

/// Sets quota group `qgroup`'s limit through the descriptor `through`.
fn limit_qgroup(through: BorrowedFd<'_>, qgroup: u64, bytes: u64) -> io::Result<()> {
    let mut args = QgroupLimitArgs {
        qgroup_id: qgroup,
        limit: QgroupLimit {
            flags: LIMIT_MAX_EXCLUSIVE,
            max_referenced: 0,
            max_exclusive: bytes,
            reserved_referenced: 0,
            reserved_exclusive: 0,
        },
    };
    // SAFETY: as above, for btrfs_ioctl_qgroup_limit_args.
    unsafe { qgroup_limit(through.as_raw_fd(), &mut args) }.map(|_| ()).map_err(errno)
}

/// Limits what the subvolume `dir` (a descriptor of its top directory) may
/// own to `bytes`.
pub fn limit_at(dir: BorrowedFd<'_>, bytes: u64) -> io::Result<()> {
    // The ioctl limits the subvolume the descriptor is in: anything but a
    // subvolume's top would limit the one holding it.
    if nix::sys::stat::fstat(dir).map_err(errno)?.st_ino != SUBVOLUME_TOP_INODE {
        return Err(io::Error::other("not the top of a subvolume"));
    }
    // 0: the subvolume the descriptor is in (just made, so under any limit).
    limit_qgroup(dir, 0, bytes)
}

/// One subvolume's quota group as the kernel counts it now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes it owns, written out.
    pub exclusive: u64,
    /// Bytes reserved for writes in flight (buffered data not yet written
    /// out, metadata): they count against its limit at once, and take the
    /// volume's space when written.
    pub reserved: u64,
    /// Of those, data not yet written out.
    pub reserved_data: u64,
    /// Its limit on what it may own (`u64::MAX`: none).
    pub limit: u64,
}

impl Usage {
    /// What counts against its limit: owned and reserved.
    pub fn charged(&self) -> u64 {
        self.exclusive.saturating_add(self.reserved)
    }

    /// How much more it may write before the kernel refuses.
    pub fn headroom(&self) -> u64 {
        self.limit.saturating_sub(self.charged())
    }
}

/// Where the kernel shows one filesystem's quota groups, and which one a
/// subvolume's is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qgroup {
    dir: std::path::PathBuf,
}

impl Qgroup {
    /// The quota group of the subvolume at `path`.
    pub fn of(path: &Path) -> io::Result<Qgroup> {
        let dir = super::tree::open_dir_path(path)?;
        if nix::sys::stat::fstat(dir.as_fd()).map_err(errno)?.st_ino != SUBVOLUME_TOP_INODE {
            return Err(io::Error::other(format!("{} is not the top of a subvolume", path.display())));
        }
        let tree = tree_of(dir.as_fd())?;
        let mut info = FsInfoArgs { max_id: 0, num_devices: 0, fsid: [0; 16], rest: [0; 1024 - 32] };
        // SAFETY: as above, for btrfs_ioctl_fs_info_args.
        unsafe { fs_info(dir.as_raw_fd(), &mut info) }.map_err(errno)?;
        let hex = airlock_core::secret::hex(&info.fsid);
        let uuid = format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]);
        Ok(Qgroup { dir: Path::new("/sys/fs/btrfs").join(uuid).join("qgroups").join(format!("0_{tree}")) })
    }

    /// Where the kernel shows its filesystem (`/sys/fs/btrfs/<uuid>`).
    pub fn filesystem_dir(&self) -> &Path {
        self.dir.parent().and_then(Path::parent).unwrap_or(&self.dir)
    }

    /// What it holds and may hold, now.
    pub fn usage(&self) -> io::Result<Usage> {
        let read = |name: &str| -> io::Result<u64> {
            let text = std::fs::read_to_string(self.dir.join(name))?;
            text.trim()
                .parse()
                .map_err(|_| io::Error::other(format!("{name} of {} is not a number", self.dir.display())))
        };
        let reserved_data = read("rsv_data")?;
        let reserved = reserved_data
            .saturating_add(read("rsv_meta_pertrans")?)
            .saturating_add(read("rsv_meta_prealloc")?);
        let limited = read("limit_flags")? & LIMIT_MAX_EXCLUSIVE != 0;
        let limit = if limited { read("max_exclusive")? } else { u64::MAX };
        Ok(Usage { exclusive: read("exclusive")?, reserved, reserved_data, limit })
    }
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
