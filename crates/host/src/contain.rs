//! Containment of a server or of agent code: the process, before it runs its
//! program, joins its cgroups, gets namespaces (new ones with a root of its own,
//! or a running server's), a cap on open files, an unprivileged user and the
//! system-call filter. Every engine starts its servers through this.

use std::path::Path;

use crate::rootfs::View;
use crate::users::Identity;

/// The namespaces of a running server that `exec` joins: network, System V IPC
/// and mounts (open `/proc/<pid>/ns/*` files).
pub struct Namespaces {
    /// `/proc/<pid>/ns/net`.
    pub net: std::fs::File,
    /// `/proc/<pid>/ns/ipc`.
    pub ipc: std::fs::File,
    /// `/proc/<pid>/ns/mnt`.
    pub mnt: std::fs::File,
}

impl Namespaces {
    /// The namespaces of process `pid`.
    pub fn of(pid: i32) -> std::io::Result<Namespaces> {
        let open = |kind: &str| std::fs::File::open(format!("/proc/{pid}/ns/{kind}"));
        Ok(Namespaces { net: open("net")?, ipc: open("ipc")?, mnt: open("mnt")? })
    }
}

/// A sandbox's own network namespace, with only loopback up, which its
/// servers share: `exec` code, which joins it, reaches each of them on
/// 127.0.0.1, and nothing else.
pub struct Network(std::fs::File);

impl Network {
    /// A new one (root only), made on a thread of its own that ends once the
    /// namespace is held here.
    pub fn new() -> std::io::Result<Network> {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
            loopback_up()?;
            std::fs::File::open("/proc/thread-self/ns/net")
        })
        .join()
        .map_err(|_| std::io::Error::other("making a network namespace panicked"))?
        .map(Network)
    }

    /// The one process `pid` is in.
    pub fn of(pid: i32) -> std::io::Result<Network> {
        std::fs::File::open(format!("/proc/{pid}/ns/net")).map(Network)
    }

    /// Another handle on the same namespace.
    pub fn try_clone(&self) -> std::io::Result<Network> {
        self.0.try_clone().map(Network)
    }

    /// A TCP socket listening at `addr` inside this namespace (made on a
    /// thread that joins it, so the socket belongs to it), for the daemon to
    /// accept on from outside: the one address code inside can reach.
    pub fn listen(&self, addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpListener> {
        let net = self.0.try_clone()?;
        std::thread::spawn(move || {
            use std::os::fd::AsFd;
            nix::sched::setns(net.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
            let listener = std::net::TcpListener::bind(addr)?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
        .join()
        .map_err(|_| std::io::Error::other("listening in a network namespace panicked"))?
    }
}

/// How a contained process gets its namespaces: new ones with a root of its
/// own, or a running server's, entered in a working directory.
#[derive(Clone)]
pub enum Enter<'a> {
    /// New System V IPC and mount namespaces, the mounts of `View`, and the
    /// sandbox's network namespace if given, else a new one (only loopback up).
    New(&'a View, Option<&'a Network>),
    /// A running server's namespaces, entered in this directory.
    Join(&'a Namespaces, &'a std::ffi::CStr),
    /// As `New`, in the given network namespace, entered in this directory of
    /// the view (an executor's workspace).
    NewIn(&'a View, &'a Network, &'a std::ffi::CStr),
}

/// In the child, before exec: join the cgroups whose `cgroup.procs` files are
/// given; then either new namespaces (network with only loopback up, System V
/// IPC, and mounts with a root of its own: [`crate::rootfs`]) or a running
/// server's, entered in its working directory; then a cap on open files, the
/// unprivileged user, and last the system-call filter. All but those two need
/// root, so they come last. Only async-signal-safe system calls, and no
/// allocation.
pub fn contain(who: Who, cgroups: &[std::ffi::CString], enter: Enter<'_>) -> std::io::Result<()> {
    contain_at_gate(who, cgroups, None, enter)
}

/// [`contain`] behind a [`crate::gate::Gate`], when given its pass: waiting
/// once in its cgroups (the slow part of joining them done while the daemon
/// finishes what the process needs), or with the gate's descriptor handed
/// to its program, which waits in itself (its loading done meanwhile too).
pub fn contain_at_gate(
    who: Who,
    cgroups: &[std::ffi::CString],
    waiting: Option<crate::gate::Waiting>,
    enter: Enter<'_>,
) -> std::io::Result<()> {
    use crate::gate::Waiting;
    use nix::sched::CloneFlags;
    airlock_core::descriptors::close_on_exec_from_3()?;
    crate::cgroup::join(cgroups)?;
    if let Some(Waiting::BeforeExec(pass)) = waiting {
        pass.wait()?;
    }
    match enter {
        Enter::New(view, network) => {
            match network {
                Some(Network(net)) => {
                    use std::os::fd::AsFd;
                    nix::sched::setns(net.as_fd(), CloneFlags::CLONE_NEWNET)?;
                    nix::sched::unshare(CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWNS)?;
                }
                None => {
                    nix::sched::unshare(
                        CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWNS,
                    )?;
                    loopback_up()?;
                }
            }
            view.enter()?;
        }
        Enter::NewIn(view, Network(net), workdir) => {
            use std::os::fd::AsFd;
            nix::sched::setns(net.as_fd(), CloneFlags::CLONE_NEWNET)?;
            nix::sched::unshare(CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWNS)?;
            view.enter()?;
            nix::unistd::chdir(workdir)?;
        }
        Enter::Join(ns, workdir) => {
            use std::os::fd::AsFd;
            nix::sched::setns(ns.net.as_fd(), CloneFlags::CLONE_NEWNET)?;
            nix::sched::setns(ns.ipc.as_fd(), CloneFlags::CLONE_NEWIPC)?;
            nix::sched::setns(ns.mnt.as_fd(), CloneFlags::CLONE_NEWNS)?;
            // Entering a mount namespace moves the working directory to its root.
            nix::unistd::chdir(workdir)?;
        }
    }
    // Open files count against the host's table, shared by every tenant. (Never
    // above the daemon's own hard limit: raising it needs CAP_SYS_RESOURCE.)
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let open_files = OPEN_FILES.min(getrlimit(Resource::RLIMIT_NOFILE)?.1);
    setrlimit(Resource::RLIMIT_NOFILE, open_files, open_files)?;
    become_user(&who)?;
    // Last, since the gate's descriptor may take the place of one used above.
    if let Some(Waiting::InProgram(pass)) = waiting {
        pass.hand_over()?;
    }
    crate::seccomp::confine(who.filter)
}

/// Takes `who`'s groups and ids by raw system calls, for this process alone:
/// glibc's wrappers set them on every thread of the process they take
/// themselves to be in, and for a child sharing the daemon's memory
/// ([`crate::spawn`]) would walk the daemon's thread list, mark its threads
/// and take its thread-list lock.
pub(crate) fn become_user(who: &Who) -> std::io::Result<()> {
    use nix::libc;
    let groups = who.group.map(|g| [g.as_raw()]);
    let (count, list) = match &groups {
        Some(one) => (1usize, one.as_ptr()),
        None => (0usize, std::ptr::null()),
    };
    let done = |rc: libc::c_long| match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    };
    // SAFETY: raw set*id calls with a valid group list of `count` entries,
    // each made only once the one before it succeeded.
    unsafe {
        done(libc::syscall(libc::SYS_setgroups, count, list))?;
        done(libc::syscall(libc::SYS_setgid, who.gid.as_raw()))?;
        done(libc::syscall(libc::SYS_setuid, who.uid.as_raw()))?;
        // Not dumpable, whatever `fs.suid_dumpable` says, so no process of
        // `who`'s can trace this one before it runs its program: a child that
        // shares the daemon's memory ([`crate::spawn`]) shares that flag too.
        done(libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) as libc::c_long)?;
    }
    Ok(())
}

/// Who a contained process becomes: a user, its group, at most one
/// supplementary group (the server's socket group), and the system calls it is
/// refused ([`crate::seccomp`]).
#[derive(Clone, Copy)]
pub struct Who {
    /// The user id.
    pub uid: nix::unistd::Uid,
    /// The primary group id.
    pub gid: nix::unistd::Gid,
    /// A supplementary group.
    pub group: Option<nix::unistd::Gid>,
    filter: &'static [nix::libc::sock_filter],
}

impl Who {
    /// `user`, with `group` besides its own.
    pub fn of(user: &Identity, group: Option<nix::unistd::Gid>) -> Who {
        Who { uid: user.uid, gid: user.gid, group, filter: crate::seccomp::program() }
    }
}

/// Open files each sandbox process may hold (PostgreSQL's own default
/// `max_files_per_process` is 1000).
const OPEN_FILES: u64 = 1024;

/// Brings up `lo` in a fresh network namespace (two ioctls on a throwaway socket;
/// async-signal-safe). Code inside may then talk to itself on 127.0.0.1, and to
/// nothing else.
fn loopback_up() -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: plain system calls on a socket owned here and a zeroed ifreq naming "lo".
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        req.ifr_name[0] = b'l' as libc::c_char;
        req.ifr_name[1] = b'o' as libc::c_char;
        let mut rc = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req);
        if rc == 0 {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            rc = libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        }
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if rc != 0 {
            return Err(err);
        }
    }
    Ok(())
}

/// The last few lines of an instance log, for error messages.
pub fn log_tail(log: &Path) -> String {
    let text = crate::storage::tree::read_tail(log, 16 << 10).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let mut tail: Vec<&str> = lines[lines.len().saturating_sub(5)..].to_vec();
    // A shutdown after a PANIC logs several lines more: the cause goes first.
    if let Some(cause) = lines.iter().rev().find(|l| l.contains("PANIC:")) {
        if !tail.contains(cause) {
            tail.insert(0, cause);
        }
    }
    format!("{} (log: {})", tail.join(" | "), log.display())
}
