//! A client's stream as the router holds it once TLS is settled: plaintext
//! or TLS, read and written alike by every step of a session.

use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

/// A client stream, plaintext or TLS.
pub(crate) enum Client {
    Plain(Plain),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// A plaintext client's connection: on the router's TCP port, or on its unix
/// socket (where TLS is never offered, as PostgreSQL offers none on its own).
pub(crate) enum Plain {
    Tcp(TcpStream),
    Local(UnixStream),
}

/// Forwards each of `AsyncRead`'s and `AsyncWrite`'s calls to the stream inside.
macro_rules! each {
    ($self:expr, $s:ident => $call:expr) => {
        match $self {
            Client::Plain(Plain::Tcp($s)) => $call,
            Client::Plain(Plain::Local($s)) => $call,
            Client::Tls($s) => $call,
        }
    };
}

impl AsyncRead for Client {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        each!(self.get_mut(), s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Client {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        each!(self.get_mut(), s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        each!(self.get_mut(), s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        each!(self.get_mut(), s => Pin::new(s).poll_shutdown(cx))
    }
}

impl AsFd for Plain {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Plain::Tcp(s) => s.as_fd(),
            Plain::Local(s) => s.as_fd(),
        }
    }
}

impl Client {
    /// The client's socket, under TLS or not.
    pub(crate) fn socket(&self) -> BorrowedFd<'_> {
        match self {
            Client::Plain(plain) => plain.as_fd(),
            Client::Tls(tls) => tls.get_ref().0.as_fd(),
        }
    }
}
