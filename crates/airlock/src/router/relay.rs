//! Passing an established plaintext session's bytes both ways.
//!
//! Each direction gets its own small OS thread doing blocking reads and writes:
//! a byte from one side wakes the thread that forwards it directly, with no trip
//! through the async runtime's scheduler, which measured several times faster for
//! the small request-response messages of OLTP traffic. TLS sessions stay on the
//! runtime (rustls works on the async stream).

use std::io::{Read, Write};
use std::net::Shutdown;

use tokio::net::{TcpStream, UnixStream};

/// Stack size of a relay thread: it only ever holds one buffer.
const STACK: usize = 64 * 1024;
/// The copy buffer of each direction.
const BUFFER: usize = 16 * 1024;

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

/// Relays a plaintext client and its sandbox's server until both directions end.
pub async fn plain(client: TcpStream, server: UnixStream) -> std::io::Result<()> {
    let client = client.into_std()?;
    let server = server.into_std()?;
    client.set_nonblocking(false)?;
    server.set_nonblocking(false)?;
    let (client_r, server_w) = (client.try_clone()?, server.try_clone()?);
    let (up_done, up) = tokio::sync::oneshot::channel::<()>();
    let (down_done, down) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new().name("relay-up".into()).stack_size(STACK).spawn(move || {
        // The client hung up: the server sees end of input and ends the session.
        pump(&client_r, &server_w, || {
            let _ = server_w.shutdown(Shutdown::Write);
        });
        let _ = up_done.send(());
    })?;
    std::thread::Builder::new().name("relay-down".into()).stack_size(STACK).spawn(move || {
        // The server went (session ended, sandbox deleted): close the client fully,
        // which also ends the other direction's read.
        pump(&server, &client, || {
            let _ = client.shutdown(Shutdown::Both);
        });
        let _ = down_done.send(());
    })?;
    let _ = up.await;
    let _ = down.await;
    Ok(())
}
