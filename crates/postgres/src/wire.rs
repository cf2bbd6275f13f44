//! A small simple-query client for running agent SQL, built on `postgres-protocol`.
//!
//! tokio-postgres hides what the SQL tool must report: a simple query's command
//! tags ("INSERT 0 3"), its columns' type ids, and every field of an error
//! (hint, position). So the tool speaks the protocol itself, over the sandbox's
//! private socket, as the agent role, and hands each message to a [`Sink`] as it
//! arrives: nothing is collected here, so a caller can keep the first rows and
//! count the rest without ever holding a whole result.

use std::path::Path;

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The longest row message kept; a longer one is skipped unread and reported as such.
pub const MAX_ROW_MESSAGE: usize = 8 << 20;
/// The longest message of any other kind accepted from the server.
const MAX_OTHER_MESSAGE: usize = 1 << 20;

/// Why a session could not be opened or a query could not finish.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The socket failed or closed.
    #[error("connection to the sandbox failed: {0}")]
    Io(#[from] std::io::Error),
    /// The server refused the session or sent something this client does not expect.
    #[error("{0}")]
    Protocol(String),
    /// The server sent an error while the session was being opened.
    #[error("{}: {}", .0.sqlstate, .0.message)]
    Refused(Box<DbError>),
    /// The server could not start a process for the session (at its process
    /// limit): its text.
    #[error("the server could not start a session: {0}")]
    CouldNotStart(String),
}

/// Whether a server's first answer to a startup packet, beginning with `tag`
/// and what would be a length word, is the error a postmaster that cannot
/// fork a backend sends in the old protocol's form: `E` and a NUL-terminated
/// text with no length word. Told apart as libpq does: no error message of the
/// protocol is shorter than 8 bytes or longer than 30000.
pub fn is_old_protocol_error(tag: u8, len: i32) -> bool {
    tag == b'E' && !(8..=30000).contains(&len)
}

/// The longest old-protocol error text read.
pub const MAX_OLD_ERROR: usize = 1000;

/// How long a session a server could not start is tried again for: 40 tries,
/// 50 ms apart (the room a sandbox's forking code holds is given back as its
/// processes end, or when `exec` kills them).
pub const UNSTARTED_RETRY: (u32, std::time::Duration) = (40, std::time::Duration::from_millis(50));

/// Every field of a PostgreSQL `ErrorResponse` worth showing a user.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq, utoipa::ToSchema)]
pub struct DbError {
    /// The five-character SQLSTATE.
    pub sqlstate: String,
    /// The primary message.
    pub message: String,
    /// More about the error.
    #[serde(default)]
    pub detail: Option<String>,
    /// What to do about it.
    #[serde(default)]
    pub hint: Option<String>,
    /// The 1-based character position in the query text where the error was found.
    #[serde(default)]
    pub position: Option<u32>,
    /// The call stack (PL/pgSQL) or the internal query context.
    #[serde(default)]
    pub context: Option<String>,
}

/// One column of a result set.
#[derive(Debug, Clone)]
pub struct Field {
    /// The column's name.
    pub name: String,
    /// Its type's OID.
    pub type_oid: u32,
    /// Its type modifier (such as a varchar's length), -1 when none.
    pub type_modifier: i32,
}

/// Receives a query's messages in order.
pub trait Sink {
    /// A result set begins.
    fn columns(&mut self, fields: Vec<Field>);
    /// One row; `None` for SQL NULL. `Err(len)` when the row message was longer
    /// than [`MAX_ROW_MESSAGE`] and was skipped.
    fn row(&mut self, values: Result<Vec<Option<&[u8]>>, usize>);
    /// A statement finished with this command tag.
    fn complete(&mut self, tag: &str);
    /// The server refused a statement; the rest of the query string is not run.
    fn error(&mut self, error: DbError);
}

/// A connection a session runs on: an instance's socket, or a TCP (and TLS)
/// connection to a server outside ([`crate::outbound`]).
pub trait Duplex: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Duplex for T {}

/// An open session as one role on one instance.
pub struct Session {
    stream: Box<dyn Duplex>,
    read: BytesMut,
    backend_key: Option<(i32, i32)>,
}

impl Session {
    /// Opens a session on a connected stream (an instance socket, say), authenticating with
    /// SCRAM-SHA-256 (see [`crate::socket::connect_instance`] for the socket).
    pub async fn connect(
        stream: impl Duplex + 'static,
        user: &str,
        password: &str,
        database: &str,
    ) -> Result<Session, WireError> {
        let mut session =
            Session { stream: Box::new(stream), read: BytesMut::with_capacity(16 << 10), backend_key: None };
        let mut buf = BytesMut::new();
        let params = [
            ("user", user),
            ("database", database),
            ("application_name", "airlock-sql"),
            ("client_encoding", "UTF8"),
        ];
        frontend::startup_message(params.iter().copied(), &mut buf)?;
        // A postmaster that cannot fork answers before it reads the startup
        // packet, and closes: the write may fail where its answer is there to read.
        let written = session.stream.write_all(&buf).await;
        let answered = session.fill(5).await;
        if answered.is_ok() {
            let len =
                i32::from_be_bytes([session.read[1], session.read[2], session.read[3], session.read[4]]);
            if is_old_protocol_error(session.read[0], len) {
                return Err(WireError::CouldNotStart(session.old_protocol_error().await));
            }
        }
        written?;
        answered?;
        let mut scram: Option<ScramSha256> = None;
        loop {
            match session.next_message(MAX_OTHER_MESSAGE).await? {
                Incoming::Message(Message::AuthenticationOk) => {}
                Incoming::Message(Message::AuthenticationSasl(body)) => {
                    let mut mechanisms = body.mechanisms();
                    let mut offered = false;
                    while let Some(m) = mechanisms.next()? {
                        offered |= m == SCRAM_SHA_256;
                    }
                    if !offered {
                        return Err(WireError::Protocol("the server does not offer SCRAM-SHA-256".into()));
                    }
                    let s = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
                    buf.clear();
                    frontend::sasl_initial_response(SCRAM_SHA_256, s.message(), &mut buf)?;
                    session.stream.write_all(&buf).await?;
                    scram = Some(s);
                }
                Incoming::Message(Message::AuthenticationSaslContinue(body)) => {
                    let s = scram.as_mut().ok_or_else(|| WireError::Protocol("SASL out of order".into()))?;
                    s.update(body.data())?;
                    buf.clear();
                    frontend::sasl_response(s.message(), &mut buf)?;
                    session.stream.write_all(&buf).await?;
                }
                Incoming::Message(Message::AuthenticationSaslFinal(body)) => {
                    let s = scram.as_mut().ok_or_else(|| WireError::Protocol("SASL out of order".into()))?;
                    s.finish(body.data())?;
                }
                Incoming::Message(Message::BackendKeyData(body)) => {
                    session.backend_key = Some((body.process_id(), body.secret_key()));
                }
                Incoming::Message(Message::ParameterStatus(_))
                | Incoming::Message(Message::NoticeResponse(_)) => {}
                Incoming::Message(Message::ReadyForQuery(_)) => return Ok(session),
                Incoming::Message(Message::ErrorResponse(body)) => {
                    return Err(WireError::Refused(Box::new(db_error(body.fields())?)))
                }
                Incoming::Message(_) | Incoming::Columns(_) | Incoming::SkippedRow(_) => {
                    return Err(WireError::Protocol("unexpected message while connecting".into()))
                }
            }
        }
    }

    /// The server process id and cancel key, for a cancel request.
    pub fn backend_key(&self) -> Option<(i32, i32)> {
        self.backend_key
    }

    /// Runs a query string (one or more statements) with the simple protocol,
    /// passing each result message to `sink` as it arrives. Returns the session's
    /// transaction status after it: `I` idle, `T` in a transaction block, `E` in
    /// a failed one.
    pub async fn simple_query(&mut self, sql: &str, sink: &mut (dyn Sink + Send)) -> Result<u8, WireError> {
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf)?;
        self.stream.write_all(&buf).await?;
        self.results(sink).await
    }

    /// Reads the results of the query in progress up to its end (after a cancel
    /// request, say), passing them to `sink`; returns the transaction status.
    pub async fn results(&mut self, sink: &mut (dyn Sink + Send)) -> Result<u8, WireError> {
        let mut buf = BytesMut::new();
        loop {
            match self.next_message(MAX_ROW_MESSAGE).await? {
                Incoming::SkippedRow(len) => sink.row(Err(len)),
                Incoming::Columns(fields) => sink.columns(fields),
                Incoming::Message(message) => match message {
                    Message::DataRow(body) => {
                        let buffer = body.buffer();
                        let values: Vec<Option<&[u8]>> =
                            body.ranges().map(|r| Ok(r.map(|r| &buffer[r]))).collect()?;
                        sink.row(Ok(values));
                    }
                    Message::CommandComplete(body) => sink.complete(body.tag()?),
                    Message::EmptyQueryResponse => {}
                    Message::ErrorResponse(body) => sink.error(db_error(body.fields())?),
                    Message::CopyInResponse(_) => {
                        buf.clear();
                        frontend::copy_fail(
                            "COPY FROM STDIN is not available here: send the rows as INSERT statements",
                            &mut buf,
                        )?;
                        self.stream.write_all(&buf).await?;
                    }
                    Message::ReadyForQuery(body) => return Ok(body.status()),
                    // COPY TO STDOUT data, notices and notifications are not results.
                    _ => {}
                },
            }
        }
    }

    /// Ends the session politely.
    pub async fn close(mut self) {
        let mut buf = BytesMut::new();
        frontend::terminate(&mut buf);
        let _ = self.stream.write_all(&buf).await;
    }

    async fn next_message(&mut self, max: usize) -> Result<Incoming, WireError> {
        self.fill(5).await?;
        let tag = self.read[0];
        let len = u32::from_be_bytes([self.read[1], self.read[2], self.read[3], self.read[4]]) as usize;
        if len < 4 {
            return Err(WireError::Protocol("malformed message from the server".into()));
        }
        if len + 1 > max {
            if tag != b'D' {
                return Err(WireError::Protocol(format!("a {len}-byte message from the server is too long")));
            }
            self.skip(len + 1).await?;
            return Ok(Incoming::SkippedRow(len + 1));
        }
        self.fill(len + 1).await?;
        if tag == b'T' {
            let message = self.read.split_to(len + 1);
            return Ok(Incoming::Columns(columns(&message[5..])?));
        }
        let message = Message::parse(&mut self.read)?
            .ok_or_else(|| WireError::Protocol("incomplete message from the server".into()))?;
        Ok(Incoming::Message(message))
    }

    /// The text of an old-protocol error (after its `E`), read up to its NUL,
    /// the end of the stream or `MAX_OLD_ERROR` bytes.
    async fn old_protocol_error(&mut self) -> String {
        while !self.read[1..].contains(&0) && self.read.len() <= MAX_OLD_ERROR {
            match self.stream.read_buf(&mut self.read).await {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        let text = &self.read[1..self.read.len().min(MAX_OLD_ERROR + 1)];
        let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
        String::from_utf8_lossy(&text[..end]).trim_end().to_owned()
    }

    /// Reads until at least `n` bytes are buffered.
    async fn fill(&mut self, n: usize) -> Result<(), WireError> {
        while self.read.len() < n {
            self.read.reserve(n - self.read.len());
            if self.stream.read_buf(&mut self.read).await? == 0 {
                return Err(WireError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
        Ok(())
    }

    /// Drops `n` bytes from the stream, reading at most a buffer at a time.
    async fn skip(&mut self, mut n: usize) -> Result<(), WireError> {
        loop {
            let have = self.read.len().min(n);
            let _ = self.read.split_to(have);
            n -= have;
            if n == 0 {
                return Ok(());
            }
            self.read.reserve(64 << 10);
            if self.stream.read_buf(&mut self.read).await? == 0 {
                return Err(WireError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }
}

/// Asks the server whose socket is `socket` to cancel the query running in the
/// session `key`, connecting as `user`.
pub async fn cancel(socket: &Path, user: &airlock_host::users::Identity, key: (i32, i32)) {
    if let Ok(mut stream) = crate::socket::connect_as(socket, user).await {
        let mut buf = BytesMut::new();
        frontend::cancel_request(key.0, key.1, &mut buf);
        let _ = stream.write_all(&buf).await;
    }
}

enum Incoming {
    Message(Message),
    /// A row description, read here: a column's name is in the session's
    /// client encoding, which the agent's own `SET client_encoding` may make
    /// other than UTF-8 (it is shown lossily then, never refused).
    Columns(Vec<Field>),
    SkippedRow(usize),
}

/// The fields of a `RowDescription` message's body (after its length).
fn columns(mut body: &[u8]) -> Result<Vec<Field>, WireError> {
    let malformed = || WireError::Protocol("a malformed row description from the server".into());
    let take = |n: usize, body: &mut &[u8]| -> Result<Vec<u8>, WireError> {
        let (head, rest) = body.split_at_checked(n).ok_or_else(malformed)?;
        *body = rest;
        Ok(head.to_vec())
    };
    let count = u16::from_be_bytes(take(2, &mut body)?.try_into().map_err(|_| malformed())?);
    let mut fields = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let end = body.iter().position(|b| *b == 0).ok_or_else(malformed)?;
        let name = String::from_utf8_lossy(&body[..end]).into_owned();
        body = &body[end + 1..];
        // Table OID (4), column number (2), type OID (4), type size (2),
        // type modifier (4), format (2).
        let rest = take(18, &mut body)?;
        let type_oid = u32::from_be_bytes(rest[6..10].try_into().map_err(|_| malformed())?);
        let type_modifier = i32::from_be_bytes(rest[12..16].try_into().map_err(|_| malformed())?);
        fields.push(Field { name, type_oid, type_modifier });
    }
    if !body.is_empty() {
        return Err(malformed());
    }
    Ok(fields)
}

fn db_error(mut fields: postgres_protocol::message::backend::ErrorFields<'_>) -> Result<DbError, WireError> {
    let mut e = DbError::default();
    while let Some(f) = fields.next()? {
        let value = String::from_utf8_lossy(f.value_bytes()).into_owned();
        match f.type_() {
            b'C' => e.sqlstate = value,
            b'M' => e.message = value,
            b'D' => e.detail = Some(value),
            b'H' => e.hint = Some(value),
            b'P' => e.position = value.parse().ok(),
            b'W' => e.context = Some(value),
            _ => {}
        }
    }
    Ok(e)
}

/// A [`Sink`] that keeps every row as text, the tags and the error: for small
/// results of the daemon's own queries.
#[derive(Debug, Default)]
pub struct TextRows {
    /// Rows of every result set, in order.
    pub rows: Vec<Vec<Option<String>>>,
    /// Command tags, in order.
    pub tags: Vec<String>,
    /// The error, if a statement failed.
    pub error: Option<DbError>,
}

impl Sink for TextRows {
    fn columns(&mut self, _fields: Vec<Field>) {}

    fn row(&mut self, values: Result<Vec<Option<&[u8]>>, usize>) {
        if let Ok(values) = values {
            self.rows
                .push(values.iter().map(|v| v.map(|b| String::from_utf8_lossy(b).into_owned())).collect());
        }
    }

    fn complete(&mut self, tag: &str) {
        self.tags.push(tag.to_owned());
    }

    fn error(&mut self, error: DbError) {
        self.error = Some(error);
    }
}

impl TextRows {
    /// The first column of the first row.
    pub fn value(&self) -> Option<&str> {
        self.rows.first().and_then(|r| r.first()).and_then(|v| v.as_deref())
    }
}
