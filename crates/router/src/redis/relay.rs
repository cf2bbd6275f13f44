//! An authenticated Redis session, relayed both ways: commands judged on
//! their way to the server ([`super::commands`]), replies passed back as they
//! come.
//!
//! A command over the limit is never read by the server. The router breaks
//! the command at the server with a bulk header it must refuse, so the server
//! answers every command before it, then refuses and closes; the router reads
//! the rest of the client's command, puts its own error in place of the
//! server's refusal and closes too. The session's state (its database, a
//! transaction, subscriptions) is gone with the server's connection, so the
//! client's is closed rather than quietly given a fresh one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::commands::{Commands, Step, LIMIT};

/// What the router sends the server in place of a command's header over the limit.
const BREAK: &[u8] = b"$-1\r\n";
/// The server's answer to [`BREAK`], the last thing it sends.
const BROKEN: &[u8] = b"-ERR Protocol error: invalid bulk length\r\n";
/// How long a client has to finish sending a refused command.
const DRAIN: Duration = Duration::from_secs(60);
/// How long the server has, once a refused command is read, to answer what
/// came before it and close.
const REPLY_WAIT: Duration = Duration::from_secs(5);
/// How long a closing session reads what its client sent after a refused
/// command, so its reply is not lost to a reset.
const LINGER: Duration = Duration::from_secs(1);
const BUFFER: usize = 64 * 1024;

/// How a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Either side closed, or failed.
    Closed,
    /// A command of `size` bytes was refused, and the session closed after saying so.
    Refused { size: u64 },
}

/// Relays until either side is done.
pub async fn relay<C, B>(client: C, backend: B) -> Ended
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_rd, mut client_wr) = tokio::io::split(client);
    let (mut backend_rd, mut backend_wr) = tokio::io::split(backend);
    let refused = AtomicU64::new(0);
    let is_refused = || refused.load(Ordering::SeqCst) != 0;
    let mut answered = false;
    {
        let up = commands(&mut client_rd, &mut backend_wr, &refused);
        let down = replies(&mut backend_rd, &mut client_wr, &refused);
        tokio::pin!(up, down);
        tokio::select! {
            r = &mut up => match r {
                Ok(()) if is_refused() => {
                    // The server answers what came before, refuses BREAK and
                    // closes, unless it is held (a client blocked in BLPOP,
                    // an inline line it is still waiting for): then the
                    // router stops waiting, and closes it.
                    answered = tokio::time::timeout(REPLY_WAIT, &mut down).await.is_ok();
                }
                Ok(()) => {
                    let _ = down.await;
                }
                Err(_) => {}
            },
            _ = &mut down => {
                answered = true;
                // The server is gone. Unless a refused command is still being
                // read, so is the session.
                if is_refused() {
                    let _ = tokio::time::timeout(DRAIN, up).await;
                }
            }
        }
    }
    match refused.load(Ordering::SeqCst) {
        0 => Ended::Closed,
        size => {
            if !answered {
                let _ = client_wr.write_all(refusal(size).as_bytes()).await;
                let _ = client_wr.flush().await;
                let _ = client_wr.shutdown().await;
            }
            let mut rest = [0u8; 4096];
            let _ = tokio::time::timeout(LINGER, async {
                while matches!(client_rd.read(&mut rest).await, Ok(n) if n > 0) {}
            })
            .await;
            Ended::Refused { size }
        }
    }
}

/// Client to server: commands passed on as judged. Ends at the client's end
/// of stream, or once a refused command has been read to its end.
async fn commands<R, W>(client: &mut R, backend: &mut W, refused: &AtomicU64) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut framer = Commands::new(LIMIT);
    let mut buf = vec![0u8; BUFFER];
    let (mut start, mut end) = (0, 0);
    let mut dropping = false;
    loop {
        if start == end {
            (start, end) = (0, 0);
        } else if end == buf.len() {
            buf.copy_within(start..end, 0);
            (start, end) = (0, end - start);
        }
        let n = client.read(&mut buf[end..]).await?;
        if n == 0 {
            if !dropping {
                backend.shutdown().await?;
            }
            return Ok(());
        }
        end += n;
        // What passes goes on in one write per read: `from` is where the
        // run of passed bytes not yet written starts.
        let mut from = start;
        while start < end {
            match framer.step(&buf[start..end]) {
                Step::Wait => break,
                Step::Pass(k) => {
                    start += k;
                    if dropping {
                        from = start;
                    }
                }
                Step::Over { n: k, size } => {
                    backend.write_all(&buf[from..start]).await?;
                    // Set before the server can answer BREAK, so the reply
                    // side holds that answer back.
                    refused.store(size, Ordering::SeqCst);
                    backend.write_all(BREAK).await?;
                    dropping = true;
                    start += k;
                    from = start;
                }
            }
            if dropping && framer.between() {
                let _ = backend.flush().await;
                return Ok(());
            }
        }
        backend.write_all(&buf[from..start]).await?;
        backend.flush().await?;
    }
}

/// Server to client: replies as they come. Once a command has been refused,
/// the server's last words are its answer to [`BREAK`], which are replaced
/// with the router's own error.
async fn replies<R, W>(backend: &mut R, client: &mut W, refused: &AtomicU64) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUFFER];
    let mut tail = Vec::new();
    loop {
        let n = backend.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        if refused.load(Ordering::SeqCst) == 0 {
            client.write_all(&buf[..n]).await?;
        } else {
            tail.extend_from_slice(&buf[..n]);
            let keep = tail.len().saturating_sub(BROKEN.len());
            client.write_all(&tail[..keep]).await?;
            tail.drain(..keep);
        }
        client.flush().await?;
    }
    let size = refused.load(Ordering::SeqCst);
    if size != 0 {
        if tail != BROKEN {
            client.write_all(&tail).await?;
        }
        client.write_all(refusal(size).as_bytes()).await?;
    }
    client.flush().await?;
    client.shutdown().await
}

/// The error a client gets for a command of `size` bytes.
pub fn refusal(size: u64) -> String {
    let mb = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    format!(
        "-ERR command too large: {:.1} MB, over the {:.0} MB a sandbox's Redis takes in one command \
         (arguments and all); keep large values in PostgreSQL or files, or send them in parts \
         (APPEND, SETRANGE). The connection is closed.\r\n",
        mb(size),
        mb(LIMIT)
    )
}
