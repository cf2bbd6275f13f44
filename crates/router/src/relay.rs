//! Passing an established session's bytes both ways.
//!
//! Each direction gets its own small OS thread doing blocking reads and writes:
//! a byte from one side wakes the thread that forwards it directly, with no trip
//! through the async runtime's scheduler, which measured about twice as fast for
//! the small request-response messages of OLTP traffic. A TLS session's two
//! threads share its rustls connection under a mutex, held only to decrypt or
//! encrypt, never while waiting for the network.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::{Arc, Mutex};

use rustls::ServerConnection;
use tokio::net::{TcpStream, UnixStream};

use super::client::Plain;

/// Stack size of a relay thread: it only ever holds one buffer.
const STACK: usize = 64 * 1024;
/// The copy buffer of each direction: large results move in fewer wakeups.
const BUFFER: usize = 64 * 1024;

/// Copies `from` to `to` until `from` ends, then tells `to` nothing more comes.
fn pump(mut from: impl Read, mut to: impl Write, close: impl FnOnce()) {
    let mut buf = vec![0u8; BUFFER];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    close();
}

/// A client's (or another node's) socket as the relay's threads use it:
/// blocking, TCP or unix.
enum Socket {
    Tcp(std::net::TcpStream),
    Local(std::os::unix::net::UnixStream),
}

impl Socket {
    fn try_clone(&self) -> std::io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Local(s) => Socket::Local(s.try_clone()?),
        })
    }

    fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        match self {
            Socket::Tcp(s) => s.shutdown(how),
            Socket::Local(s) => s.shutdown(how),
        }
    }
}

impl Read for &Socket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match *self {
            Socket::Tcp(s) => (&mut &*s).read(buf),
            Socket::Local(s) => (&mut &*s).read(buf),
        }
    }
}

impl Write for &Socket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match *self {
            Socket::Tcp(s) => (&mut &*s).write(buf),
            Socket::Local(s) => (&mut &*s).write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Plain {
    /// The same socket, blocking, for the relay's threads.
    fn blocking(self) -> std::io::Result<Socket> {
        Ok(match self {
            Plain::Tcp(s) => {
                let s = s.into_std()?;
                s.set_nonblocking(false)?;
                Socket::Tcp(s)
            }
            Plain::Local(s) => {
                let s = s.into_std()?;
                s.set_nonblocking(false)?;
                Socket::Local(s)
            }
        })
    }
}

/// Blocking copies of both ends of a session.
fn blocking(client: Plain, server: UnixStream) -> std::io::Result<(Socket, std::os::unix::net::UnixStream)> {
    let server = server.into_std()?;
    server.set_nonblocking(false)?;
    Ok((client.blocking()?, server))
}

/// Runs the two directions on their own threads and waits for both to end;
/// `client_gone` runs as soon as the client-to-server direction has (the server
/// may still be busy, and the other direction waiting on it).
async fn both_ways(
    up: impl FnOnce() + Send + 'static,
    down: impl FnOnce() + Send + 'static,
    client_gone: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let (up_done, up_ended) = tokio::sync::oneshot::channel::<()>();
    let (down_done, down_ended) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new().name("relay-up".into()).stack_size(STACK).spawn(move || {
        up();
        let _ = up_done.send(());
    })?;
    std::thread::Builder::new().name("relay-down".into()).stack_size(STACK).spawn(move || {
        down();
        let _ = down_done.send(());
    })?;
    let _ = up_ended.await;
    client_gone.await;
    let _ = down_ended.await;
    Ok(())
}

/// Relays a plaintext client and its sandbox's server until both directions end.
pub async fn plain(
    client: Plain,
    server: UnixStream,
    client_gone: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let (client, server) = blocking(client, server)?;
    let (client_r, server_w) = (client.try_clone()?, server.try_clone()?);
    both_ways(
        // The client hung up: the server sees end of input and ends the session.
        move || pump(&client_r, &server_w, || drop(server_w.shutdown(Shutdown::Write))),
        // The server went (session ended, sandbox deleted): close the client fully,
        // which also ends the other direction's read.
        move || pump(&server, &client, || drop(client.shutdown(Shutdown::Both))),
        client_gone,
    )
    .await
}

/// Relays a TLS client (its handshake and authentication done) and its sandbox's
/// server until both directions end.
pub async fn tls(
    session: tokio_rustls::server::TlsStream<TcpStream>,
    server: UnixStream,
    client_gone: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let (tcp, conn) = session.into_inner();
    let (client, server) = blocking(Plain::Tcp(tcp), server)?;
    let conn = Arc::new(Mutex::new(rustls::Connection::Server(conn)));
    let (client_r, server_w, conn_r) = (client.try_clone()?, server.try_clone()?, conn.clone());
    both_ways(
        move || {
            let _ = open_records(&conn_r, &client_r, &server_w);
            let _ = server_w.shutdown(Shutdown::Write);
        },
        move || {
            let sealing = Sealing { conn: &conn, socket: &client };
            let _ = pump_sealed(&server, &sealing);
            let _ = client.shutdown(Shutdown::Both);
        },
        client_gone,
    )
    .await
}

/// A client of another node's sandbox, as the entry router hands it over once
/// the owner has accepted it: plaintext or TLS.
pub enum Entering {
    /// A plaintext client.
    Plain(Plain),
    /// A TLS client: its socket and its rustls session.
    Tls(TcpStream, ServerConnection),
}

/// Relays a client of another node's sandbox and the stream to that node's
/// router (mutual TLS) until both directions end: the entry router's half of
/// a relayed session, on the same threads as a local one.
pub async fn between(
    client: Entering,
    owner: tokio_rustls::client::TlsStream<TcpStream>,
    client_gone: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let (owner_tcp, owner_conn) = owner.into_inner();
    let owner_tcp = Plain::Tcp(owner_tcp).blocking()?;
    let owner_conn = Arc::new(Mutex::new(rustls::Connection::Client(owner_conn)));
    let (owner_r, owner_conn_r) = (owner_tcp.try_clone()?, owner_conn.clone());
    // The owner's side ends (its session over): say so to it, and close the client.
    let (client_tcp, client_conn) = match client {
        Entering::Plain(plain) => (plain.blocking()?, None),
        Entering::Tls(tcp, conn) => {
            (Plain::Tcp(tcp).blocking()?, Some(Arc::new(Mutex::new(rustls::Connection::Server(conn)))))
        }
    };
    let (client_r, client_conn_r) = (client_tcp.try_clone()?, client_conn.clone());
    both_ways(
        move || {
            let to_owner = Sealing { conn: &owner_conn, socket: &owner_tcp };
            let _ = match &client_conn_r {
                Some(conn) => open_records(conn, &client_r, &to_owner),
                None => pump_plain(&client_r, &to_owner),
            };
            to_owner.close();
            let _ = owner_tcp.shutdown(Shutdown::Write);
        },
        move || {
            let _ = match &client_conn {
                Some(conn) => {
                    let to_client = Sealing { conn, socket: &client_tcp };
                    let relayed = open_records(&owner_conn_r, &owner_r, &to_client);
                    to_client.close();
                    relayed
                }
                None => open_records(&owner_conn_r, &owner_r, &client_tcp),
            };
            let _ = client_tcp.shutdown(Shutdown::Both);
        },
        client_gone,
    )
    .await
}

fn lock(conn: &Mutex<rustls::Connection>) -> std::sync::MutexGuard<'_, rustls::Connection> {
    conn.lock().unwrap_or_else(|p| p.into_inner())
}

/// Plaintext written into a TLS session: encrypted, its records sent on its
/// socket (written once the lock is let go).
struct Sealing<'a> {
    conn: &'a Mutex<rustls::Connection>,
    socket: &'a Socket,
}

impl Sealing<'_> {
    /// Says nothing more comes (close_notify).
    fn close(&self) {
        let records = {
            let mut c = lock(self.conn);
            c.send_close_notify();
            take_records(&mut c)
        };
        if let Ok(records) = records {
            let _ = (&mut &*self.socket).write_all(&records);
        }
    }
}

impl Write for &Sealing<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let records = {
            let mut c = lock(self.conn);
            c.writer().write_all(buf)?;
            take_records(&mut c)?
        };
        (&mut &*self.socket).write_all(&records)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Plaintext from `from` sealed into `to` until `from` ends, then a close_notify.
fn pump_sealed(mut from: impl Read, to: &Sealing<'_>) -> std::io::Result<()> {
    let copied = pump_plain(&mut from, to);
    to.close();
    copied
}

/// Copies plaintext from `from` to `to` until `from` ends.
fn pump_plain(mut from: impl Read, mut to: impl Write) -> std::io::Result<()> {
    let mut buf = vec![0u8; BUFFER];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
    }
}

/// A TLS session's plaintext, passed on to `out`: read its records from
/// `tcp`, decrypt, pass the plaintext on. Ends at the peer's end of stream or
/// close_notify.
fn open_records(
    conn: &Mutex<rustls::Connection>,
    mut tcp: &Socket,
    mut out: impl Write,
) -> std::io::Result<()> {
    let mut records = vec![0u8; BUFFER];
    // Plaintext rustls already holds (read before the hand-over) goes first.
    let (plain, closed) = take_plaintext(&mut lock(conn))?;
    out.write_all(&plain)?;
    if closed {
        return Ok(());
    }
    loop {
        let n = tcp.read(&mut records)?;
        if n == 0 {
            return Ok(());
        }
        // rustls takes records only as far as its buffers allow: feed, decrypt and
        // drain until all of them are in.
        let mut pending = &records[..n];
        while !pending.is_empty() {
            let (plain, closed, answer) = {
                let mut c = lock(conn);
                c.read_tls(&mut pending)?;
                c.process_new_packets().map_err(std::io::Error::other)?;
                let (plain, closed) = take_plaintext(&mut c)?;
                // Alerts or key updates may need an answer.
                (plain, closed, take_records(&mut c)?)
            };
            tcp.write_all(&answer)?;
            out.write_all(&plain)?;
            if closed {
                return Ok(());
            }
        }
    }
}

/// The plaintext rustls has decrypted, and whether the peer sent close_notify.
fn take_plaintext(c: &mut rustls::Connection) -> std::io::Result<(Vec<u8>, bool)> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.reader().read(&mut buf) {
            Ok(0) => return Ok((out, true)),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok((out, false)),
            Err(e) => return Err(e),
        }
    }
}

/// The TLS records rustls has ready to send. Written to the network only after
/// the lock is released: a thread blocked on a full socket while holding it could
/// stall the other direction, and with it a client that is itself blocked writing.
fn take_records(c: &mut rustls::Connection) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut out)?;
    }
    Ok(out)
}
