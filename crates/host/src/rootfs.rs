//! What a contained process sees of the host: a root filesystem of its own.
//!
//! A sandbox's server, its `exec` code, its Redis and a build's client tools
//! each run in a mount namespace whose root is an empty tmpfs holding only what
//! was put there: the host's system trees read-only (`/usr` and its links,
//! `/etc`, a server's own binaries), the instance's own directory, private
//! `/tmp`, `/var/tmp`, `/dev/shm` and `/run/lock`, a `/dev` with harmless
//! devices and a `/proc` showing only the user's own processes. The host's root
//! is detached once everything is mounted, so the namespace holds no other
//! mount of the host: no other data root's volume (unmounting one frees it),
//! no host directory anyone may write, and no host unix socket to connect to
//! (a socket is reached through its path; a read-only mount would not stop a
//! `connect`, but a path that is not there does). Nothing is filtered by name:
//! what is not mounted does not exist.
//!
//! A [`View`] is composed in the daemon (every path allocated there) and
//! entered in the child between fork and exec, with async-signal-safe system
//! calls only.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Where the new root is mounted before the process pivots into it: a
/// directory every host has, which the new namespace hides anyway (a data root
/// may not live under it when the daemon is root; see `Engine::new`).
const MOUNT_POINT: &CStr = c"/tmp";
/// Where the host's root is while the view's mounts are made.
const OLD_ROOT: &CStr = c"/.host";
/// [`OLD_ROOT`] seen from before the pivot.
const PUT_OLD: &CStr = c"/tmp/.host";

/// Host system trees a dynamically linked program needs, as links (a merged
/// `/usr` has `/lib -> usr/lib`) or directories.
const SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Directories every host user may write on the host (so something left there
/// would outlive its tenant): each view gets empty private ones instead.
pub const PRIVATE_TMP: &[&str] = &["/tmp", "/var/tmp", "/dev/shm", "/run/lock"];

/// The host's trees every contained process sees (read-only, but a unix
/// socket there could be connected to): `/etc` and the system trees.
pub fn seen_by_every_view() -> Vec<PathBuf> {
    std::iter::once("etc").chain(SYSTEM_DIRS.iter().copied()).map(|name| Path::new("/").join(name)).collect()
}

/// Whether `path` lies where a view has a private directory of its own, so a
/// contained process could not see it.
pub fn under_private_dir(path: &Path) -> Option<&'static str> {
    PRIVATE_TMP.iter().copied().find(|d| path.starts_with(d))
}

/// One thing put into the new root.
#[derive(Clone, Debug)]
enum Step {
    /// A directory (its parents come before it).
    Dir(CString),
    /// An empty file, the mount point of a bound file.
    File(CString),
    /// A symbolic link: target, link.
    Link(CString, CString),
    /// A bind mount of the host's `source` (a path under [`OLD_ROOT`]).
    Bind { source: CString, target: CString, writable: bool },
    /// An empty tmpfs with these options.
    Tmpfs { target: CString, options: CString },
    /// A `/proc` showing only the caller's own processes.
    Proc(CString),
    /// The private `/dev`.
    Dev,
}

/// A root filesystem to enter, composed ahead of the fork.
#[derive(Clone, Debug, Default)]
pub struct View {
    steps: Vec<Step>,
    /// Every directory already made (inside paths), so each is made once.
    made: std::collections::BTreeSet<PathBuf>,
}

impl View {
    /// An empty root with the host's system trees read-only: `/usr` and the
    /// links or directories beside it; with `etc`, all of `/etc` (programs read
    /// their settings, certificates and time zone there), else its loader cache
    /// alone.
    pub fn system(etc: bool) -> std::io::Result<View> {
        let mut view = View::default();
        for name in SYSTEM_DIRS {
            let host = Path::new("/").join(name);
            let Ok(meta) = host.symlink_metadata() else { continue };
            if meta.file_type().is_symlink() {
                view.link(&std::fs::read_link(&host)?, &host)?;
            } else if meta.is_dir() {
                view.bind(&host, &host, false)?;
            }
        }
        if etc {
            view.bind(Path::new("/etc"), Path::new("/etc"), false)?;
        } else if Path::new("/etc/ld.so.cache").is_file() {
            view.bind(Path::new("/etc/ld.so.cache"), Path::new("/etc/ld.so.cache"), false)?;
        }
        Ok(view)
    }

    /// What a sandbox's processes need besides: a `/proc` of their own, a
    /// private `/dev` and the private temporary directories.
    pub fn with_private_dirs(mut self) -> std::io::Result<View> {
        self.proc(Path::new("/proc"))?;
        self.dev()?;
        for dir in PRIVATE_TMP {
            self.dir(Path::new(dir))?;
            self.steps.push(Step::Tmpfs {
                target: c_path(Path::new(dir))?,
                options: c"mode=1777,size=256m".into(),
            });
        }
        Ok(self)
    }

    /// Mounts the host's `host` (a directory or a file) at `inside`, read-only
    /// unless `writable`; nothing of a mount below `host` comes along.
    pub fn bind(&mut self, host: &Path, inside: &Path, writable: bool) -> std::io::Result<&mut View> {
        let meta = std::fs::metadata(host)?;
        match meta.is_dir() {
            true => self.dir(inside)?,
            false => {
                self.dir(inside.parent().unwrap_or(Path::new("/")))?;
                self.steps.push(Step::File(c_path(inside)?));
            }
        }
        let source = Path::new(std::ffi::OsStr::from_bytes(OLD_ROOT.to_bytes())).join(relative(host));
        self.steps.push(Step::Bind { source: c_path(&source)?, target: c_path(inside)?, writable });
        Ok(self)
    }

    /// A symbolic link at `link` pointing to `target`.
    pub fn link(&mut self, target: &Path, link: &Path) -> std::io::Result<&mut View> {
        self.dir(link.parent().unwrap_or(Path::new("/")))?;
        self.steps.push(Step::Link(c_path(target)?, c_path(link)?));
        Ok(self)
    }

    /// A `/proc` (showing only the user's own processes) at `inside`.
    pub fn proc(&mut self, inside: &Path) -> std::io::Result<&mut View> {
        self.dir(inside)?;
        self.steps.push(Step::Proc(c_path(inside)?));
        Ok(self)
    }

    /// The private `/dev` ([`private_dev`]).
    pub fn dev(&mut self) -> std::io::Result<&mut View> {
        self.dir(Path::new("/dev"))?;
        self.steps.push(Step::Dev);
        Ok(self)
    }

    /// `inside` and its parents, as directories of the new root.
    fn dir(&mut self, inside: &Path) -> std::io::Result<()> {
        let mut path = PathBuf::from("/");
        for part in relative(inside).components() {
            path.push(part);
            if self.made.insert(path.clone()) {
                self.steps.push(Step::Dir(c_path(&path)?));
            }
        }
        Ok(())
    }

    /// In the child, in a new mount namespace, before exec: the new root
    /// mounted and pivoted into, every step made, the host's root detached and
    /// the new root made read-only. Only async-signal-safe system calls.
    pub fn enter(&self) -> std::io::Result<()> {
        use nix::mount::{mount, umount2, MntFlags, MsFlags};
        let none: Option<&CStr> = None;
        // Nothing mounted here propagates back to the host.
        mount(none, c"/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)?;
        let plain = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        mount(Some(c"tmpfs"), MOUNT_POINT, Some(c"tmpfs"), plain, Some(c"mode=0755,size=1m"))?;
        nix::unistd::chdir(MOUNT_POINT)?;
        // The host's root goes to OLD_ROOT, where the bind mounts take their
        // sources from, and is detached once they are made.
        nix::unistd::mkdir(PUT_OLD, nix::sys::stat::Mode::from_bits_truncate(0o700))?;
        pivot_root(c".", PUT_OLD)?;
        nix::unistd::chdir(c"/")?;
        for step in &self.steps {
            self.apply(step)?;
        }
        umount2(OLD_ROOT, MntFlags::MNT_DETACH)?;
        nix::unistd::unlinkat(nix::fcntl::AT_FDCWD, OLD_ROOT, nix::unistd::UnlinkatFlags::RemoveDir)?;
        mount(none, c"/", none, MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | plain, none)?;
        Ok(())
    }

    fn apply(&self, step: &Step) -> std::io::Result<()> {
        use nix::mount::{mount, MsFlags};
        use nix::sys::stat::Mode;
        let none: Option<&CStr> = None;
        let plain = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        match step {
            Step::Dir(path) => match nix::unistd::mkdir(path.as_c_str(), Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            },
            Step::File(path) => {
                let fd = nix::fcntl::open(
                    path.as_c_str(),
                    nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o644),
                )?;
                drop(fd);
            }
            Step::Link(target, link) => {
                nix::unistd::symlinkat(target.as_c_str(), nix::fcntl::AT_FDCWD, link.as_c_str())?
            }
            Step::Bind { source, target, writable } => {
                mount(Some(source.as_c_str()), target.as_c_str(), none, MsFlags::MS_BIND, none)?;
                let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | plain;
                if !writable {
                    flags |= MsFlags::MS_RDONLY;
                }
                mount(none, target.as_c_str(), none, flags, none)?;
            }
            Step::Tmpfs { target, options } => {
                mount(Some(c"tmpfs"), target.as_c_str(), Some(c"tmpfs"), plain, Some(options.as_c_str()))?
            }
            Step::Proc(target) => mount(
                Some(c"proc"),
                target.as_c_str(),
                Some(c"proc"),
                plain | MsFlags::MS_NOEXEC,
                Some(c"hidepid=2"),
            )?,
            Step::Dev => private_dev()?,
        }
        Ok(())
    }
}

/// `pivot_root(2)`, which libc has no wrapper for.
fn pivot_root(new_root: &CStr, put_old: &CStr) -> std::io::Result<()> {
    // SAFETY: two NUL-terminated paths that outlive the call.
    let rc = unsafe { nix::libc::syscall(nix::libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The device nodes a sandbox gets (name, major, minor); nothing else of the
/// host's `/dev` is there.
const DEVICES: &[(&CStr, u64, u64)] = &[
    (c"/dev/null", 1, 3),
    (c"/dev/zero", 1, 5),
    (c"/dev/full", 1, 7),
    (c"/dev/random", 1, 8),
    (c"/dev/urandom", 1, 9),
    (c"/dev/tty", 5, 0),
];

/// Pseudo-terminals one sandbox may hold: the host's are a table shared by
/// every user, and a login needs one.
const PTYS: &CStr = c"newinstance,ptmxmode=0666,mode=0620,max=8";

/// A `/dev` with only the harmless devices ([`DEVICES`]), an instance of the
/// pseudo-terminal filesystem of its own capped at a few terminals (the kernel
/// also keeps `kernel.pty.reserve` of the host's for the host alone), and
/// mount points for `/dev/shm` and `/dev/mqueue`, where a private POSIX
/// message queue filesystem is mounted when the kernel has one.
fn private_dev() -> std::io::Result<()> {
    use nix::mount::{mount, MsFlags};
    use nix::sys::stat::{mknod, Mode, SFlag};
    // Device nodes work on this tmpfs (no `nodev`); only root could make more.
    mount(
        Some(c"tmpfs"),
        c"/dev",
        Some(c"tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(c"mode=0755,size=64k"),
    )?;
    let umask = nix::sys::stat::umask(Mode::empty());
    let made = (|| -> nix::Result<()> {
        let everyone = Mode::from_bits_truncate(0o666);
        for (path, major, minor) in DEVICES {
            mknod(*path, SFlag::S_IFCHR, everyone, nix::sys::stat::makedev(*major, *minor))?;
        }
        for dir in [c"/dev/pts", c"/dev/shm", c"/dev/mqueue"] {
            nix::unistd::mkdir(dir, Mode::from_bits_truncate(0o755))?;
        }
        for (target, link) in [
            (c"pts/ptmx", c"/dev/ptmx"),
            (c"/proc/self/fd", c"/dev/fd"),
            (c"/proc/self/fd/0", c"/dev/stdin"),
            (c"/proc/self/fd/1", c"/dev/stdout"),
            (c"/proc/self/fd/2", c"/dev/stderr"),
        ] {
            nix::unistd::symlinkat(target, nix::fcntl::AT_FDCWD, link)?;
        }
        Ok(())
    })();
    nix::sys::stat::umask(umask);
    made?;
    let plain = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    mount(Some(c"devpts"), c"/dev/pts", Some(c"devpts"), plain, Some(PTYS))?;
    // A kernel without POSIX message queues leaves the directory empty.
    let none: Option<&CStr> = None;
    let _ = mount(Some(c"mqueue"), c"/dev/mqueue", Some(c"mqueue"), plain | MsFlags::MS_NODEV, none);
    Ok(())
}

/// `path` without its leading `/`.
fn relative(path: &Path) -> &Path {
    path.strip_prefix("/").unwrap_or(path)
}

fn c_path(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other(format!("{} holds a NUL byte", path.display())))
}
