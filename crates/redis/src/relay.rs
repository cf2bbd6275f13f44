//! An authenticated Redis session, relayed both ways: commands judged on
//! their way to the server ([`crate::commands`]), replies passed back as they
//! come.
//!
//! A command over the limit is never read by the server. Each command is
//! held back (up to [`HOLD`] bytes) until it is judged: complete and small, or
//! at an argument bigger than that, when its headers so far tell its size.
//! One judged over the limit then is dropped whole, and the server is sent in
//! its place a command of a name no server knows (with a nonce of the
//! session's own), which it refuses in order, after every command before it
//! and before every one after; the relay puts its own error in place of
//! that refusal, and the session goes on. The router relays its Redis port
//! with it, and `exec` the loopback address its code reaches Redis at.
//!
//! A command found over the limit only after part of it has gone on (several
//! arguments, each under [`HOLD`], together over the limit) cannot be taken
//! back: the router breaks it at the server with a bulk header the server
//! must refuse, so the server answers every command before it, then refuses
//! and closes; the router puts its error in place of the server's last words
//! and closes too. The session's state (its database, a transaction,
//! subscriptions) is gone with the server's connection, so the client's is
//! closed rather than quietly given a fresh one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::commands::{Commands, Step, LIMIT};

/// What the router sends the server in place of a command's header over the limit.
const BREAK: &[u8] = b"$-1\r\n";
/// The server's answer to [`BREAK`], the last thing it sends.
const BROKEN: &[u8] = b"-ERR Protocol error: invalid bulk length\r\n";
/// The bytes of a command held back until it is judged, at most.
pub const HOLD: usize = 64 * 1024;
/// How long a client has to finish sending a refused command.
const DRAIN: Duration = Duration::from_secs(60);
/// How long the server has, once a refused command is read, to answer what
/// came before it and close.
const REPLY_WAIT: Duration = Duration::from_secs(5);
/// How long a closing session reads what its client sent after a refused
/// command, so its reply is not lost to a reset.
const LINGER: Duration = Duration::from_secs(1);
const BUFFER: usize = 64 * 1024;

/// What both directions of a session share about its refused commands.
struct Refusals {
    /// The command name sent in place of a refused one: no server knows it,
    /// and no client knows its nonce.
    marker: String,
    /// The sizes of commands refused in place, whose refusal the server has
    /// yet to send, in order.
    in_place: Mutex<VecDeque<u64>>,
    /// How many of those there are (read without the lock on every reply).
    outstanding: AtomicUsize,
    /// The size of the command that broke the session, once one has.
    broken: AtomicU64,
}

impl Refusals {
    fn new() -> Refusals {
        let nonce = airlock_core::secret::hex(&airlock_core::secret::random_bytes::<12>());
        Refusals {
            marker: format!("airlock-refused-{nonce}"),
            in_place: Mutex::new(VecDeque::new()),
            outstanding: AtomicUsize::new(0),
            broken: AtomicU64::new(0),
        }
    }

    /// Whether a stand-in's refusal is still to come.
    fn waiting(&self) -> bool {
        self.outstanding.load(Ordering::SeqCst) != 0
    }

    /// Notes a command refused in place, before its stand-in is sent.
    fn refuse_in_place(&self, size: u64) {
        self.in_place.lock().unwrap_or_else(|p| p.into_inner()).push_back(size);
        self.outstanding.fetch_add(1, Ordering::SeqCst);
    }

    /// The size of the command whose stand-in's refusal has come.
    fn answered_in_place(&self) -> u64 {
        let size = self.in_place.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
        if size.is_some() {
            self.outstanding.fetch_sub(1, Ordering::SeqCst);
        }
        size.unwrap_or(0)
    }
}

/// How a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Either side closed, or failed.
    Closed,
    /// A command of `size` bytes was refused after part of it had gone on,
    /// and the session closed after saying so.
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
    let refusals = Refusals::new();
    let broken = || refusals.broken.load(Ordering::SeqCst) != 0;
    let mut answered = false;
    {
        let up = commands(&mut client_rd, &mut backend_wr, &refusals);
        let down = replies(&mut backend_rd, &mut client_wr, &refusals);
        tokio::pin!(up, down);
        tokio::select! {
            r = &mut up => match r {
                Ok(()) if broken() => {
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
                if broken() {
                    let _ = tokio::time::timeout(DRAIN, up).await;
                }
            }
        }
    }
    match refusals.broken.load(Ordering::SeqCst) {
        0 => Ended::Closed,
        size => {
            if !answered {
                let _ = client_wr.write_all(refusal(size, true).as_bytes()).await;
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

/// Where the client's stream is, for the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Passed on as it comes.
    Streaming,
    /// A command held back until it is judged.
    Holding,
    /// A refused command, read to its end and dropped; `broke` when part of
    /// it had gone on (the session then ends with it).
    Dropping { broke: bool },
}

/// Client to server: commands passed on as judged. Ends at the client's end
/// of stream, or once a command that broke the session has been read to its end.
async fn commands<R, W>(client: &mut R, backend: &mut W, refusals: &Refusals) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut framer = Commands::new(LIMIT);
    let mut buf = vec![0u8; BUFFER];
    let (mut start, mut end) = (0, 0);
    let mut mode = Mode::Streaming;
    // A held command's bytes from earlier reads; those of this read start at `since`.
    let mut held: Vec<u8> = Vec::new();
    let mut since = 0;
    loop {
        if start == end {
            (start, end) = (0, 0);
        } else if end == buf.len() {
            buf.copy_within(start..end, 0);
            (start, end) = (0, end - start);
        }
        let n = client.read(&mut buf[end..]).await?;
        if n == 0 {
            if mode != (Mode::Dropping { broke: true }) {
                backend.shutdown().await?;
            }
            return Ok(());
        }
        end += n;
        // What passes goes on in one write per read: `from` is where the run
        // of bytes not yet written starts; a held command's are in it, from
        // `since`, until it is judged.
        let mut from = start;
        since = if mode == Mode::Holding { start } else { since };
        while start < end {
            let step = framer.step(&buf[start..end]);
            let k = match step {
                Step::Wait => break,
                Step::Pass(k) | Step::Start(k) | Step::Argument { n: k, .. } | Step::Over { n: k, .. } => k,
            };
            match (mode, step) {
                (Mode::Dropping { .. }, _) => {
                    start += k;
                    from = start;
                }
                (Mode::Streaming, Step::Start(_)) => {
                    mode = Mode::Holding;
                    since = start;
                    start += k;
                }
                (Mode::Holding, Step::Over { size, .. }) => {
                    // Nothing of it has gone on: it is dropped, and the
                    // server refuses a stand-in in its place.
                    if from < since {
                        backend.write_all(&buf[from..since]).await?;
                    }
                    held.clear();
                    refusals.refuse_in_place(size);
                    backend.write_all(&crate::resp::command(&[refusals.marker.as_str()])).await?;
                    mode = Mode::Dropping { broke: false };
                    start += k;
                    from = start;
                }
                (Mode::Streaming, Step::Over { size, .. }) => {
                    if from < start {
                        backend.write_all(&buf[from..start]).await?;
                    }
                    // Set before the server can answer BREAK, so the reply
                    // side holds that answer back.
                    refusals.broken.store(size, Ordering::SeqCst);
                    backend.write_all(BREAK).await?;
                    mode = Mode::Dropping { broke: true };
                    start += k;
                    from = start;
                }
                (Mode::Holding, Step::Argument { bytes, .. }) if bytes > HOLD as u64 => {
                    // A big argument, and the command fits so far: it goes on.
                    if !held.is_empty() {
                        backend.write_all(&held).await?;
                    }
                    held.clear();
                    mode = Mode::Streaming;
                    start += k;
                }
                (Mode::Holding, _) => {
                    start += k;
                    if held.len() + (start - since) > HOLD {
                        if !held.is_empty() {
                            backend.write_all(&held).await?;
                        }
                        held.clear();
                        mode = Mode::Streaming;
                    }
                }
                (Mode::Streaming, _) => start += k,
            }
            if mode == Mode::Holding && !framer.judging() {
                // Past what Redis refuses: it goes on, for the server to say so.
                if !held.is_empty() {
                    backend.write_all(&held).await?;
                }
                held.clear();
                mode = Mode::Streaming;
            }
            if framer.between() {
                match mode {
                    Mode::Holding => {
                        // Judged whole and small: it goes on with the run.
                        if !held.is_empty() {
                            backend.write_all(&held).await?;
                        }
                        held.clear();
                        mode = Mode::Streaming;
                    }
                    Mode::Dropping { broke: false } => {
                        mode = Mode::Streaming;
                        from = start;
                    }
                    Mode::Dropping { broke: true } => {
                        let _ = backend.flush().await;
                        return Ok(());
                    }
                    Mode::Streaming => {}
                }
            }
        }
        if mode == Mode::Holding {
            // The held command's bytes of this read wait for the next.
            if from < since {
                backend.write_all(&buf[from..since]).await?;
            }
            held.extend_from_slice(&buf[since..start]);
            from = start;
        }
        if from < start {
            backend.write_all(&buf[from..start]).await?;
        }
        backend.flush().await?;
    }
}

/// Server to client: replies as they come, with the server's refusal of each
/// stand-in replaced by the router's error, and, once the session is broken,
/// the server's last words too.
async fn replies<R, W>(backend: &mut R, client: &mut W, refusals: &Refusals) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUFFER];
    // Bytes read but not yet passed on: a line that may be a stand-in's refusal.
    let mut pending = Vec::new();
    let marker = refusals.marker.as_bytes();
    loop {
        let n = backend.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        if pending.is_empty() && !refusals.waiting() && refusals.broken.load(Ordering::SeqCst) == 0 {
            client.write_all(&buf[..n]).await?;
            client.flush().await?;
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        // Each stand-in's refusal is one error line naming the marker.
        while let Some(at) = find(&pending, marker) {
            let Some(line_end) = find(&pending[at..], b"\r\n").map(|e| at + e + 2) else { break };
            let line_start = pending[..at].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            let size = refusals.answered_in_place();
            client.write_all(&pending[..line_start]).await?;
            client.write_all(refusal(size, false).as_bytes()).await?;
            pending.drain(..line_end);
        }
        // Pass on all but what could still become such a line, or the
        // broken session's last words: an unfinished last line that starts
        // with `-` (every reply ends its line, so it ends soon).
        let keep_from = if refusals.broken.load(Ordering::SeqCst) != 0 {
            pending.len().saturating_sub(BROKEN.len())
        } else {
            let last_line = pending.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            if pending.get(last_line) == Some(&b'-') || (last_line == pending.len()) {
                last_line
            } else {
                pending.len()
            }
        };
        client.write_all(&pending[..keep_from]).await?;
        pending.drain(..keep_from);
        client.flush().await?;
    }
    let size = refusals.broken.load(Ordering::SeqCst);
    if size != 0 {
        if pending != BROKEN {
            client.write_all(&pending).await?;
        }
        client.write_all(refusal(size, true).as_bytes()).await?;
    } else {
        client.write_all(&pending).await?;
    }
    client.flush().await?;
    client.shutdown().await
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The error a client gets for a command of `size` bytes, saying whether the
/// connection is closed with it.
pub fn refusal(size: u64, closed: bool) -> String {
    let mb = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    format!(
        "-ERR command too large: {:.1} MB, over the {:.0} MB a sandbox's Redis takes in one command \
         (arguments and all); keep large values in PostgreSQL or files, or send them in parts \
         (APPEND, SETRANGE).{}\r\n",
        mb(size),
        mb(LIMIT),
        if closed { " The connection is closed." } else { "" }
    )
}
