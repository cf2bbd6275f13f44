//! Reaching an instance's private socket as the sandbox's own OS user.
//!
//! Peer authentication maps the daemon's OS identity to the admin role, so a
//! connection the daemon opens with that identity could become a superuser
//! session if anything in it asked for the admin role. Connections made on an
//! agent's behalf (the router's, `run_sql`'s, cancel requests) are therefore
//! opened with the sandbox's identity instead: the calling thread takes the
//! sandbox's uid as its effective uid for the one `connect` call (the kernel
//! records the peer's credentials then), and takes root's back at once. Peer
//! authentication sees the sandbox's uid, which no map names, so such a
//! connection can never be an admin session, whatever it sends.
//!
//! Without root there is one identity for everything, and this is a plain connect.
//!
//! Every connection the daemon makes to an instance also checks who is
//! listening: the kernel reports the process that created the listening socket,
//! and it must be the postmaster the daemon started. A socket put in the
//! server's place (by anything that could write its directory) is refused
//! before a byte is sent.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
use tokio::net::UnixStream;

use airlock_host::users::Identity;

/// Connects to the instance socket at `path` as `user` (when the daemon is
/// root; the daemon's own identity when `None`), and checks that the process
/// listening is `postmaster`.
pub async fn connect_instance(
    path: &Path,
    user: Option<&Identity>,
    postmaster: i32,
) -> io::Result<UnixStream> {
    let stream = match user {
        Some(user) => connect_as(path, user).await?,
        None => UnixStream::connect(path).await?,
    };
    let listener = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(io::Error::from)?
        .pid();
    if listener != postmaster {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is served by process {listener}, not by the instance's server ({postmaster})",
                path.display()
            ),
        ));
    }
    Ok(stream)
}

/// Connects to the unix socket at `path` as `user` (when the daemon is root).
pub async fn connect_as(path: &Path, user: &Identity) -> io::Result<UnixStream> {
    if !nix::unistd::geteuid().is_root() || user.is_root() {
        return UnixStream::connect(path).await;
    }
    let addr = UnixAddr::new(path).map_err(io::Error::from)?;
    // A full listen queue answers EAGAIN to a non-blocking connect; a server that
    // busy is given a few moments, as a blocking connect would.
    for attempt in 0..50 {
        let fd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(io::Error::from)?;
        match connect_with_euid(&fd, &addr, user.uid.as_raw(), user.gid.as_raw()) {
            Ok(()) => {
                let std = std::os::unix::net::UnixStream::from(fd);
                return UnixStream::from_std(std);
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::EAGAIN) && attempt < 49 => {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns on its last attempt")
}

/// Calls `connect` with this thread's effective uid and gid set to `uid` and
/// `gid` (a socket may admit its group), restoring root's before returning.
/// Only this thread's credentials change (the raw system calls, not libc's
/// process-wide wrappers), and nothing else runs on it meanwhile.
fn connect_with_euid(fd: &OwnedFd, addr: &UnixAddr, uid: u32, gid: u32) -> io::Result<()> {
    const KEEP: nix::libc::c_long = -1;
    // SAFETY: setresgid on the calling thread only, while it is still root;
    // the real and saved gids stay 0.
    let set = unsafe { nix::libc::syscall(nix::libc::SYS_setresgid, KEEP, gid as nix::libc::c_long, KEEP) };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setresuid on the calling thread only; the real and saved uids stay 0,
    // so root can be taken back.
    let set = unsafe { nix::libc::syscall(nix::libc::SYS_setresuid, KEEP, uid as nix::libc::c_long, KEEP) };
    if set != 0 {
        let err = io::Error::last_os_error();
        // SAFETY: as above.
        unsafe { nix::libc::syscall(nix::libc::SYS_setresgid, KEEP, 0 as nix::libc::c_long, KEEP) };
        return Err(err);
    }
    let connected = connect(fd.as_raw_fd(), addr).map_err(io::Error::from);
    // SAFETY: as above; the saved uid is 0.
    let mut back =
        unsafe { nix::libc::syscall(nix::libc::SYS_setresuid, KEEP, 0 as nix::libc::c_long, KEEP) };
    if back == 0 {
        // SAFETY: as above, root again.
        back = unsafe { nix::libc::syscall(nix::libc::SYS_setresgid, KEEP, 0 as nix::libc::c_long, KEEP) };
    }
    if back != 0 {
        // A daemon thread left without root would fail in ways nobody could explain.
        eprintln!("airlock: could not take back root after connecting as uid {uid}; aborting");
        std::process::abort();
    }
    connected
}
