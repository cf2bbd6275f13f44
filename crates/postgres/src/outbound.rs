//! A raw connection to a PostgreSQL server outside Airlock, ready for a
//! startup message: TCP, then TLS as the DSN's `sslmode` says, negotiated as
//! libpq does (an SSLRequest first). The TLS tunnel for client tools and the
//! router's routes to live targets both open theirs here.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::target::TlsEndpoint;

/// PostgreSQL's SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
/// How long the server has to accept the TCP connection.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// A connection to the server, plaintext or TLS.
pub enum Outbound {
    /// Plaintext (`sslmode=disable`, or `prefer` with a server without TLS).
    Plain(TcpStream),
    /// TLS.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

fn error(kind: std::io::ErrorKind, text: &str) -> std::io::Error {
    std::io::Error::new(kind, text.to_owned())
}

/// Connects to `host`:`port`, in plaintext when `endpoint` is None (the DSN
/// asks for none), else with TLS when the server agrees, and in plaintext
/// only if the DSN's `sslmode` (`prefer`) allows it.
pub async fn connect(host: &str, port: u16, endpoint: Option<&TlsEndpoint>) -> std::io::Result<Outbound> {
    let connect = TcpStream::connect((host, port));
    let mut server = tokio::time::timeout(CONNECT_WITHIN, connect)
        .await
        .map_err(|_| error(std::io::ErrorKind::TimedOut, "connecting to the server timed out"))??;
    server.set_nodelay(true)?;
    let Some(endpoint) = endpoint else { return Ok(Outbound::Plain(server)) };
    server.write_all(&SSL_REQUEST).await?;
    let mut answer = [0u8; 1];
    server.read_exact(&mut answer).await?;
    match answer[0] {
        b'S' => {
            let name = rustls::pki_types::ServerName::try_from(endpoint.host.clone())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let tls = tokio_rustls::TlsConnector::from(endpoint.config.clone()).connect(name, server).await?;
            Ok(Outbound::Tls(Box::new(tls)))
        }
        b'N' if endpoint.plaintext_allowed => Ok(Outbound::Plain(server)),
        _ => Err(error(
            std::io::ErrorKind::ConnectionRefused,
            "the server does not accept TLS, and the DSN's sslmode requires it",
        )),
    }
}

impl AsyncRead for Outbound {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Outbound::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Outbound::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Outbound {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Outbound::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Outbound::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Outbound::Plain(s) => Pin::new(s).poll_flush(cx),
            Outbound::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Outbound::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Outbound::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
