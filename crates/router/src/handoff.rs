//! Handing a client's own connection to its server session, so that a
//! plaintext session's bytes pass through no proxy at all.
//!
//! The router authenticates the client itself, then opens a session for it as
//! the agent role with `airlock.handoff=on` in the startup message. Once that
//! session has authenticated, and before it says anything more, the in-server
//! guard offers to take the client: a ParameterStatus `airlock.handoff` with
//! the backend's cancel key ([`super::backend`] reads it). The router answers
//! with one message on the session's unix connection: the client's socket
//! (`SCM_RIGHTS`; TCP, or unix for a client of the router's own socket) and
//! what `airlock.connection` is to say. From then on the backend speaks to
//! the client directly, starting with `AuthenticationOk`.
//!
//! The router keeps what it needs to keep its guarantees: the unix connection,
//! never read or written again, which the server closes when the session ends
//! (the session's end, for the sandbox's open connections and activity); a copy
//! of the client's socket, to cut the session at the sandbox's expiry and to
//! see the client hang up ([`hung_up`]: its query is cancelled then, as the
//! relay does); and the backend's key, so the client's cancel requests still
//! reach it.
//!
//! Only a plaintext client on the router's own port or socket is handed off:
//! TLS ends in the router, a cluster's relayed client arrives over the relay's
//! TLS, and settings the router must SET as the agent need the router in the
//! session first.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::UnixStream;

/// Longest `airlock.connection` text the guard takes with the socket.
const TEXT_MAX: usize = 1023;

/// Gives `client`'s socket to the server session on `server`, which offered to
/// take it, with `connection` for its `airlock.connection`.
pub(super) async fn hand(
    server: &UnixStream,
    client: BorrowedFd<'_>,
    connection: &str,
) -> std::io::Result<()> {
    if connection.len() > TEXT_MAX || connection.contains('\0') {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "connection text too long"));
    }
    let fds = [client.as_raw_fd()];
    let sent = loop {
        server.writable().await?;
        let tried = server.try_io(Interest::WRITABLE, || {
            let data = [IoSlice::new(connection.as_bytes())];
            let rights = [ControlMessage::ScmRights(&fds)];
            sendmsg::<UnixAddr>(server.as_raw_fd(), &data, &rights, MsgFlags::MSG_NOSIGNAL, None)
                .map_err(std::io::Error::from)
        });
        match tried {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            other => break other?,
        }
    };
    if sent != connection.len() {
        return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "the hand-off was sent in part"));
    }
    Ok(())
}

/// Longest of what a server may say on the router's connection after the
/// hand-off is kept (an `ErrorResponse` saying why it did not take the client).
const SAID_MAX: usize = 8192;

/// Resolves when the handed-off session has ended: its server closed the
/// connection the client was handed over. Returns what the server wrote there
/// first, if anything: once it has taken the client it never writes there, so
/// anything is its refusal of the hand-off.
pub(super) async fn ended(server: &UnixStream) -> Vec<u8> {
    let mut said = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        if server.readable().await.is_err() {
            return said;
        }
        match server.try_read(&mut buf) {
            Ok(0) => return said,
            Ok(n) => {
                let room = SAID_MAX.saturating_sub(said.len());
                said.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return said,
        }
    }
}

/// Resolves when the client of a handed-off session hangs up (or its
/// connection fails), never waking for what it sends: the socket is watched
/// through an epoll of its own that asks only for a hang-up, and the kernel
/// wakes that epoll, which the runtime watches, for nothing else.
pub(super) async fn hung_up(client: BorrowedFd<'_>) -> std::io::Result<()> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    let hang_up = EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR;
    epoll.add(client, EpollEvent::new(hang_up, 0))?;
    // SAFETY: the epoll's descriptor is owned by the `AsyncFd` and neither
    // replaced nor closed while it is registered.
    let watched = unsafe { AsyncFd::register_with_interest(epoll.0, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)?;
    let _ready = watched.readable().await?;
    Ok(())
}
