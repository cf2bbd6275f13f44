//! The few pieces of the PostgreSQL wire protocol the router needs: reading a
//! client's first packet, building the startup message the server gets, framing
//! server messages during authentication, and writing an `ErrorResponse` of its own.
//!
//! A client's startup message is never forwarded. It is parsed strictly — a
//! parameter given twice, one that names who or what the session is
//! ([`NEVER_ACCEPTED`]), or one too long is refused (08P01) — and the server
//! gets a message the router builds itself: `user` is always the agent role,
//! `database` always the sandbox's, then the settings on the allow-list
//! ([`ALLOWED_SETTINGS`]). Any other setting is not put in the startup message
//! at all: the router SETs it as the agent once the session is open, so it is
//! exactly what the agent could SET itself, and what the agent may not SET is
//! refused by the server, by name. So no reading of the client's bytes that
//! differs from PostgreSQL's (a repeated `user`, a role hidden in `options`)
//! can reach the server.
//!
//! Everything read from a client is bounded: a startup packet by
//! [`MAX_STARTUP_PACKET`] (PostgreSQL's own limit), an authentication message by
//! [`MAX_AUTH_MESSAGE`]. Message bodies are passed on, never logged.

use tokio::io::{AsyncRead, AsyncReadExt};

/// PostgreSQL's own limit on a startup packet's length.
pub const MAX_STARTUP_PACKET: usize = 10_000;
/// The longest password or SASL message accepted from a client.
pub const MAX_AUTH_MESSAGE: usize = 64 * 1024;
/// The longest message accepted from a server before the session is established.
pub const MAX_SERVER_STARTUP_MESSAGE: usize = 1 << 20;

/// Protocol 3.0, the version every sandbox's server speaks.
pub const PROTOCOL_3_0: i32 = 3 << 16;
/// Protocol 3.2 (PostgreSQL 18): cancel keys of up to 256 bytes. The router
/// speaks it with a client when the sandbox's server does.
pub const PROTOCOL_3_2: i32 = (3 << 16) | 2;
/// The longest cancel key protocol 3.2 allows.
pub const MAX_CANCEL_KEY: usize = 256;
const SSL_REQUEST: i32 = 80877103;
const GSSENC_REQUEST: i32 = 80877104;
const CANCEL_REQUEST: i32 = 80877102;

/// A client's first packet.
#[derive(Debug, PartialEq, Eq)]
pub enum FirstPacket {
    /// Asks to switch to TLS.
    SslRequest,
    /// Asks for GSSAPI encryption (always declined).
    GssEncRequest,
    /// Cancels a query running on the backend with this key.
    Cancel(BackendKey),
    /// A protocol 3 startup message, checked: who connects to what, and the
    /// session settings it asks for.
    Startup(Startup),
}

/// Settings a client may give in its startup message (or in its `options`),
/// lower-cased: what drivers send, all of them changeable with `SET` anyway.
pub const ALLOWED_SETTINGS: &[&str] = &[
    "application_name",
    "client_encoding",
    "datestyle",
    "timezone",
    "intervalstyle",
    "extra_float_digits",
    "search_path",
    "bytea_output",
    "standard_conforming_strings",
    "client_min_messages",
    "lc_monetary",
    "lc_numeric",
    "lc_time",
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "default_transaction_isolation",
    "default_transaction_read_only",
    "default_transaction_deferrable",
];

/// Parameters never accepted in a startup message, even to be SET later: who
/// the session is, which database, a replication connection, and libraries a
/// backend would load at its start.
pub const NEVER_ACCEPTED: &[&str] = &[
    "role",
    "session_authorization",
    "replication",
    "local_preload_libraries",
    "session_preload_libraries",
    "shared_preload_libraries",
];

/// Whether a setting not on the allow-list may be passed on as a `SET` after
/// login: a plain setting name (letters, digits, `_`, and `.` for a custom
/// one), not one of [`NEVER_ACCEPTED`].
fn settable_later(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
        && !NEVER_ACCEPTED.contains(&name)
        && !name.starts_with("_pq_")
}

/// The longest parameter name accepted (PostgreSQL's identifier limit).
pub const MAX_PARAM_NAME: usize = 63;
/// The longest parameter value accepted.
pub const MAX_PARAM_VALUE: usize = 1024;

/// A backend's process id and secret key, as BackendKeyData carries them and a
/// CancelRequest repeats them: 4 bytes of key in protocol 3.0, up to
/// [`MAX_CANCEL_KEY`] in 3.2.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BackendKey {
    /// The backend's process id.
    pub pid: i32,
    /// The backend's secret key.
    pub secret: Vec<u8>,
}

impl BackendKey {
    /// The key from a BackendKeyData body or a CancelRequest's tail: a pid,
    /// then 4 to [`MAX_CANCEL_KEY`] bytes of secret.
    pub fn read(bytes: &[u8]) -> Option<BackendKey> {
        let (pid, secret) = bytes.split_first_chunk::<4>()?;
        (4..=MAX_CANCEL_KEY)
            .contains(&secret.len())
            .then(|| BackendKey { pid: i32::from_be_bytes(*pid), secret: secret.to_vec() })
    }

    /// The BackendKeyData message that tells a client this key.
    pub fn message(&self) -> Vec<u8> {
        let mut out = vec![b'K'];
        out.extend_from_slice(&((8 + self.secret.len()) as i32).to_be_bytes());
        out.extend_from_slice(&self.pid.to_be_bytes());
        out.extend_from_slice(&self.secret);
        out
    }

    /// The CancelRequest packet for this key.
    pub fn cancel_request(&self) -> Vec<u8> {
        let mut out = ((12 + self.secret.len()) as i32).to_be_bytes().to_vec();
        out.extend_from_slice(&CANCEL_REQUEST.to_be_bytes());
        out.extend_from_slice(&self.pid.to_be_bytes());
        out.extend_from_slice(&self.secret);
        out
    }
}

/// A client's startup message as the router accepted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Startup {
    /// The protocol version (3.x): as the client asked, until the router
    /// settles the one the session speaks ([`Startup::settle_version`]).
    pub version: i32,
    /// The role asked for.
    pub user: String,
    /// The sandbox asked for (the `database` parameter, or the user's name if absent).
    pub database: String,
    /// Allowed settings, in the order given, names lower-cased.
    pub settings: Vec<(String, String)>,
    /// Other settings, SET as the agent once the session is open (the server
    /// refuses those the agent may not set), names lower-cased.
    pub later: Vec<(String, String)>,
    /// Protocol options (`_pq_.*`) asked for: none is recognised, so each is
    /// listed back in NegotiateProtocolVersion, as PostgreSQL does, and the
    /// session goes on without it.
    pub protocol_options: Vec<String>,
}

impl Startup {
    /// Settles the version the session speaks, given the newest the sandbox's
    /// server speaks: 3.2 when both ask for it, else 3.0. Returns the
    /// NegotiateProtocolVersion to send the client first, if it asked for
    /// something else (a newer minor, or protocol options, none of which is
    /// recognised), as PostgreSQL sends it.
    pub fn settle_version(&mut self, server_newest: i32) -> Option<Vec<u8>> {
        let asked = self.version;
        self.version =
            if asked >= PROTOCOL_3_2 && server_newest >= PROTOCOL_3_2 { PROTOCOL_3_2 } else { PROTOCOL_3_0 };
        (asked != self.version || !self.protocol_options.is_empty())
            .then(|| negotiate_protocol_version(self.version, &self.protocol_options))
    }

    /// The startup message as the client sent it, in substance: its version
    /// as asked, user, database, every setting, and its protocol options (by
    /// name: none is recognised, so their values never mattered). What an
    /// entry router passes on to the owner's, which reads it as its own
    /// client's.
    pub fn encode(&self) -> Vec<u8> {
        let settings = self.settings.iter().chain(&self.later).map(|(k, v)| (k.as_str(), v.as_str()));
        let options = self.protocol_options.iter().map(|o| (o.as_str(), ""));
        startup_message(self.version, (&self.user, &self.database), settings.chain(options))
    }

    /// The message the sandbox's server gets: the settled version, `user` the
    /// role given (which the router has checked is the agent's), `database`
    /// `database`, then the allowed settings. Protocol options never reach it.
    pub fn encode_for(&self, user: &str, database: &str) -> Vec<u8> {
        self.encode_with(user, database, &[])
    }

    /// [`Startup::encode_for`], with Airlock's own `extra` parameters after the
    /// client's settings (the router's, never a client's).
    pub fn encode_with(&self, user: &str, database: &str, extra: &[(&str, &str)]) -> Vec<u8> {
        let settings = self.settings.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        startup_message(self.version, (user, database), settings.chain(extra.iter().copied()))
    }
}

/// A startup message: `version`, then `user` and `database`, then `params`.
fn startup_message<'a>(
    version: i32,
    (user, database): (&'a str, &'a str),
    params: impl Iterator<Item = (&'a str, &'a str)>,
) -> Vec<u8> {
    let mut body = version.to_be_bytes().to_vec();
    for (k, v) in [("user", user), ("database", database)].into_iter().chain(params) {
        push_cstr(&mut body, k);
        push_cstr(&mut body, v);
    }
    body.push(0);
    let mut out = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// Why a client's packet was refused.
#[derive(Debug, thiserror::Error)]
pub enum PacketError {
    /// The connection failed or closed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not a valid packet, or ask for something the router refuses.
    #[error("invalid startup packet: {0}")]
    Invalid(String),
    /// A protocol version the router does not speak.
    #[error("unsupported frontend protocol {0}.{1}: the router speaks 3.x")]
    Unsupported(i32, i32),
}

impl PacketError {
    fn invalid(why: &str) -> PacketError {
        PacketError::Invalid(why.to_owned())
    }
}

/// Reads one first packet, at most [`MAX_STARTUP_PACKET`] bytes. Reads exactly
/// its length, so nothing a client sends after an `SSLRequest` is buffered in
/// plaintext.
pub async fn read_first_packet<R: AsyncRead + Unpin>(r: &mut R) -> Result<FirstPacket, PacketError> {
    let len = r.read_i32().await?;
    if len < 8 || len as usize > MAX_STARTUP_PACKET {
        return Err(PacketError::invalid("length out of range"));
    }
    let mut body = vec![0u8; len as usize - 4];
    r.read_exact(&mut body).await?;
    parse_first_packet(&body)
}

fn parse_first_packet(body: &[u8]) -> Result<FirstPacket, PacketError> {
    let code = i32::from_be_bytes(body[..4].try_into().expect("length checked"));
    match code {
        SSL_REQUEST if body.len() == 4 => Ok(FirstPacket::SslRequest),
        GSSENC_REQUEST if body.len() == 4 => Ok(FirstPacket::GssEncRequest),
        CANCEL_REQUEST => BackendKey::read(&body[4..])
            .map(FirstPacket::Cancel)
            .ok_or(PacketError::invalid("wrong length for its code")),
        SSL_REQUEST | GSSENC_REQUEST => Err(PacketError::invalid("wrong length for its code")),
        version if version >> 16 == 3 => Ok(FirstPacket::Startup(startup(version, &body[4..])?)),
        version => Err(PacketError::Unsupported(version >> 16, version & 0xffff)),
    }
}

/// Checks a startup message's parameters: each at most once, each allowed, none
/// too long; `options` may carry only `-c name=value` (or `--name=value`) for
/// allowed settings, which become settings of their own.
fn startup(version: i32, mut rest: &[u8]) -> Result<Startup, PacketError> {
    let mut seen: Vec<String> = Vec::new();
    let (mut user, mut database) = (None, None);
    let mut settings = Vec::new();
    let mut later = Vec::new();
    let mut protocol_options = Vec::new();
    loop {
        let key = cstr(&mut rest)?;
        if key.is_empty() {
            break;
        }
        let value = cstr(&mut rest)?;
        let name = key.to_ascii_lowercase();
        if name.len() > MAX_PARAM_NAME || value.len() > MAX_PARAM_VALUE {
            return Err(PacketError::Invalid(format!("parameter \"{}\" is too long", shown(&key))));
        }
        if seen.contains(&name) {
            return Err(PacketError::Invalid(format!("parameter \"{}\" is given twice", shown(&key))));
        }
        seen.push(name.clone());
        match name.as_str() {
            // A protocol option, as the server matches it (case and all);
            // never passed on to the sandbox's server.
            _ if key.starts_with("_pq_.") => protocol_options.push(key),
            "user" => user = Some(value),
            "database" => database = Some(value),
            "options" => {
                for (name, value) in options(&value)? {
                    match ALLOWED_SETTINGS.contains(&name.as_str()) {
                        true => settings.push((name, value)),
                        false => later.push((name, value)),
                    }
                }
            }
            "replication" if matches!(value.to_ascii_lowercase().as_str(), "false" | "off" | "no" | "0") => {}
            _ if ALLOWED_SETTINGS.contains(&name.as_str()) => settings.push((name, value)),
            _ if settable_later(&name) => later.push((name, value)),
            _ => return Err(PacketError::Invalid(format!("parameter \"{}\" is not accepted", shown(&key)))),
        }
    }
    if !rest.is_empty() {
        return Err(PacketError::invalid("bytes after the terminator"));
    }
    let mut names: Vec<&str> = settings.iter().chain(&later).map(|(k, _)| k.as_str()).collect();
    names.sort();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(PacketError::invalid("a setting is given twice (as a parameter and in options)"));
    }
    let user = user.filter(|u| !u.is_empty()).ok_or_else(|| PacketError::invalid("no user given"))?;
    let database = database.filter(|d| !d.is_empty()).unwrap_or_else(|| user.clone());
    Ok(Startup { version, user, database, settings, later, protocol_options })
}

/// The settings in an `options` value: `-c name=value` and `--name=value`, with
/// backslash escapes as PostgreSQL reads them; any other switch, and a
/// setting never accepted, is refused.
fn options(text: &str) -> Result<Vec<(String, String)>, PacketError> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.extend(chars.next()),
            c if c.is_ascii_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    let mut out = Vec::new();
    let mut words = words.into_iter();
    while let Some(w) = words.next() {
        let pair = match w.as_str() {
            "-c" => words.next().ok_or_else(|| PacketError::invalid("options ends after -c"))?,
            _ => match w.strip_prefix("--").or_else(|| w.strip_prefix("-c")) {
                Some(rest) if !rest.is_empty() => rest.to_owned(),
                _ => return Err(PacketError::Invalid(format!("option \"{}\" is not accepted", shown(&w)))),
            },
        };
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| PacketError::Invalid(format!("option \"{}\" has no value", shown(&pair))))?;
        let name = name.replace('-', "_").to_ascii_lowercase();
        if !ALLOWED_SETTINGS.contains(&name.as_str()) && !settable_later(&name) {
            return Err(PacketError::Invalid(format!("setting \"{}\" is not accepted", shown(&name))));
        }
        out.push((name, value.to_owned()));
    }
    Ok(out)
}

/// At most 64 characters of something a client sent, for an error message.
pub fn shown(s: &str) -> String {
    s.chars().take(64).collect()
}

fn cstr(rest: &mut &[u8]) -> Result<String, PacketError> {
    let end = rest.iter().position(|&b| b == 0).ok_or(PacketError::invalid("unterminated string"))?;
    let s = std::str::from_utf8(&rest[..end]).map_err(|_| PacketError::invalid("not UTF-8"))?.to_owned();
    *rest = &rest[end + 1..];
    Ok(s)
}

fn push_cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// One framed message: its type byte and its whole encoding (type, length, body).
#[derive(Debug)]
pub struct Message {
    /// The type byte (`R`, `K`, `Z`, `E`, `p`, ...).
    pub tag: u8,
    /// The bytes to pass on unchanged.
    pub bytes: Vec<u8>,
}

impl Message {
    /// The body after the type and length.
    pub fn body(&self) -> &[u8] {
        &self.bytes[5..]
    }

    /// For an `R` message, which authentication step it is.
    pub fn auth_code(&self) -> Option<i32> {
        (self.tag == b'R' && self.body().len() >= 4)
            .then(|| i32::from_be_bytes(self.body()[..4].try_into().expect("sized")))
    }

    /// For a `K` message, the backend's pid and secret key.
    pub fn backend_key(&self) -> Option<BackendKey> {
        (self.tag == b'K').then(|| BackendKey::read(self.body())).flatten()
    }
}

/// Reads one message of at most `max` bytes.
async fn read_message<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> Result<Message, PacketError> {
    let tag = r.read_u8().await?;
    let len = r.read_i32().await?;
    read_body(r, tag, len, max).await
}

/// Reads the rest of a message whose tag and length were read.
async fn read_body<R: AsyncRead + Unpin>(
    r: &mut R,
    tag: u8,
    len: i32,
    max: usize,
) -> Result<Message, PacketError> {
    if len < 4 || len as usize > max {
        return Err(PacketError::invalid("message length out of range"));
    }
    let mut bytes = Vec::with_capacity(len as usize + 1);
    bytes.push(tag);
    bytes.extend_from_slice(&len.to_be_bytes());
    bytes.resize(len as usize + 1, 0);
    r.read_exact(&mut bytes[5..]).await?;
    Ok(Message { tag, bytes })
}

/// Reads a client's authentication answer (a password or SASL message).
pub async fn read_client_auth<R: AsyncRead + Unpin>(r: &mut R) -> Result<Message, PacketError> {
    let m = read_message(r, MAX_AUTH_MESSAGE).await?;
    if m.tag != b'p' {
        return Err(PacketError::invalid("expected an authentication message"));
    }
    Ok(m)
}

/// Reads a server's message before the session is established.
pub async fn read_server_message<R: AsyncRead + Unpin>(r: &mut R) -> Result<Message, PacketError> {
    read_message(r, MAX_SERVER_STARTUP_MESSAGE).await
}

/// A server's first answer to a startup packet.
#[derive(Debug)]
pub enum FirstAnswer {
    /// A message of the protocol.
    Message(Message),
    /// The text of the error a postmaster sends, in the old protocol's form,
    /// when it cannot start a process for the session (it could not fork).
    CouldNotStart(String),
}

/// Reads a server's first answer. A postmaster that cannot fork a backend
/// answers `E` and a NUL-terminated text with no length word: an `E` whose
/// length could not be an error message's is read that way, as libpq does.
pub async fn read_first_server_answer<R: AsyncRead + Unpin>(r: &mut R) -> Result<FirstAnswer, PacketError> {
    let tag = r.read_u8().await?;
    let len = r.read_i32().await?;
    if !airlock_postgres::wire::is_old_protocol_error(tag, len) {
        return read_body(r, tag, len, MAX_SERVER_STARTUP_MESSAGE).await.map(FirstAnswer::Message);
    }
    let mut text = len.to_be_bytes().to_vec();
    while !text.contains(&0) && text.len() < airlock_postgres::wire::MAX_OLD_ERROR {
        match r.read_u8().await {
            Ok(byte) => text.push(byte),
            Err(_) => break,
        }
    }
    let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
    Ok(FirstAnswer::CouldNotStart(String::from_utf8_lossy(&text[..end]).trim_end().to_owned()))
}

/// Authentication requests that the client answers with a `p` message
/// (cleartext, MD5, SASL start, SASL continue).
pub fn expects_client_answer(auth_code: i32) -> bool {
    matches!(auth_code, 3 | 5 | 10 | 11)
}

/// A `NegotiateProtocolVersion` as PostgreSQL sends it: the version the
/// session will speak, whole (libpq reads the field as a version number, and
/// takes a bare minor of 0 for a downgrade to 2.x), then every protocol option
/// asked for, none being recognised.
fn negotiate_protocol_version(speaks: i32, options: &[String]) -> Vec<u8> {
    let mut body = speaks.to_be_bytes().to_vec();
    body.extend_from_slice(&(options.len() as i32).to_be_bytes());
    for option in options {
        push_cstr(&mut body, option);
    }
    let mut out = vec![b'v'];
    out.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// An `ErrorResponse` the router sends itself.
#[derive(Debug, Clone)]
pub struct ErrorResponse {
    /// `FATAL` for refused connections.
    pub severity: &'static str,
    /// The SQLSTATE.
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// How to fix it.
    pub hint: Option<String>,
}

impl ErrorResponse {
    /// A `FATAL` error with a hint.
    pub fn fatal(code: &'static str, message: impl Into<String>, hint: impl Into<String>) -> Self {
        ErrorResponse {
            severity: "FATAL",
            code: code.to_owned(),
            message: message.into(),
            hint: Some(hint.into()),
        }
    }

    /// The message bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        for (field, value) in [(b'S', self.severity), (b'V', self.severity), (b'C', self.code.as_str())] {
            body.push(field);
            push_cstr(&mut body, value);
        }
        body.push(b'M');
        push_cstr(&mut body, &self.message);
        if let Some(hint) = &self.hint {
            body.push(b'H');
            push_cstr(&mut body, hint);
        }
        body.push(0);
        let mut out = vec![b'E'];
        out.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(body: &[u8]) -> Vec<u8> {
        let mut p = ((body.len() + 4) as i32).to_be_bytes().to_vec();
        p.extend_from_slice(body);
        p
    }

    async fn read(bytes: &[u8]) -> Result<FirstPacket, PacketError> {
        read_first_packet(&mut &bytes[..]).await
    }

    fn startup_of(params: &[u8]) -> Vec<u8> {
        let mut body = 196608i32.to_be_bytes().to_vec();
        body.extend_from_slice(params);
        packet(&body)
    }

    /// What an entry router passes on reads, at the owner's router, as the
    /// startup the client sent.
    #[tokio::test]
    async fn a_startup_passed_on_reads_as_the_one_sent() {
        let mut body = ((3i32 << 16) | 2).to_be_bytes().to_vec();
        body.extend_from_slice(
            b"user\0sb-ab12cd34ef\0database\0orders_test\0application_name\0pytest\0\
              options\0-c search_path=app\0work_mem\08MB\0_pq_.x\0y\0\0",
        );
        let FirstPacket::Startup(sent) = read(&packet(&body)).await.unwrap() else { panic!() };
        assert!(!sent.later.is_empty() && !sent.settings.is_empty(), "{sent:?}");
        let FirstPacket::Startup(passed) = read(&sent.encode()).await.unwrap() else { panic!() };
        assert_eq!(passed, sent);
    }

    /// What PostgreSQL answers a client asking for 3.2 and for protocol
    /// options it does not know: the version it speaks, as a whole version
    /// number, and the options listed; the options never reach the server.
    #[tokio::test]
    async fn a_newer_minor_and_protocol_options_are_negotiated_down_as_postgresql_does() {
        let mut body = ((3i32 << 16) | 2).to_be_bytes().to_vec();
        body.extend_from_slice(
            b"user\0airlock_agent\0_pq_.test_option\0x\0_pq_.Other\0y\0database\0sb-1\0\0",
        );
        let FirstPacket::Startup(mut s) = read(&packet(&body)).await.unwrap() else { panic!() };
        assert_eq!(s.protocol_options, ["_pq_.test_option", "_pq_.Other"]);
        let v = s.settle_version(PROTOCOL_3_0).expect("negotiated");
        let mut want = vec![b'v'];
        want.extend_from_slice(&(4 + 4 + 4 + 17 + 11i32).to_be_bytes());
        want.extend_from_slice(&196608i32.to_be_bytes());
        want.extend_from_slice(&2i32.to_be_bytes());
        want.extend_from_slice(b"_pq_.test_option\0_pq_.Other\0");
        assert_eq!(v, want);
        let forwarded = s.encode_for("airlock_agent", "app");
        assert!(!forwarded.windows(5).any(|w| w == b"_pq_."), "a protocol option reached the server");
        assert_eq!(forwarded[4..8], PROTOCOL_3_0.to_be_bytes(), "the server is asked for 3.0");
        // 3.0 with no option: nothing to negotiate, whatever the server speaks.
        for server in [PROTOCOL_3_0, PROTOCOL_3_2] {
            let FirstPacket::Startup(mut plain) =
                read(&startup_of(b"user\0airlock_agent\0\0")).await.unwrap()
            else {
                panic!()
            };
            assert!(plain.settle_version(server).is_none());
            assert_eq!(plain.version, PROTOCOL_3_0);
        }
        // 3.0 with an option: 3.0 and the option.
        let FirstPacket::Startup(mut opt) =
            read(&startup_of(b"user\0airlock_agent\0_pq_.x\0\0\0")).await.unwrap()
        else {
            panic!()
        };
        assert_eq!(opt.settle_version(PROTOCOL_3_2).unwrap()[5..9], 196608i32.to_be_bytes());
    }

    /// 3.2 is spoken end to end when the sandbox's server speaks it (nothing
    /// to negotiate, and the server is asked for 3.2); a newer minor than 3.2
    /// is negotiated down to it.
    #[tokio::test]
    async fn protocol_3_2_is_spoken_when_the_server_speaks_it() {
        let mut body = PROTOCOL_3_2.to_be_bytes().to_vec();
        body.extend_from_slice(b"user\0airlock_agent\0\0");
        let FirstPacket::Startup(mut s) = read(&packet(&body)).await.unwrap() else { panic!() };
        assert!(s.settle_version(PROTOCOL_3_2).is_none());
        assert_eq!(s.encode_for("airlock_agent", "app")[4..8], PROTOCOL_3_2.to_be_bytes());
        let mut body = ((3i32 << 16) | 9).to_be_bytes().to_vec();
        body.extend_from_slice(b"user\0airlock_agent\0\0");
        let FirstPacket::Startup(mut s) = read(&packet(&body)).await.unwrap() else { panic!() };
        assert_eq!(s.settle_version(PROTOCOL_3_2).unwrap(), [b'v', 0, 0, 0, 12, 0, 3, 0, 2, 0, 0, 0, 0]);
    }

    #[tokio::test]
    async fn builds_the_servers_startup_from_what_it_accepted() {
        let p = startup_of(b"user\0airlock_agent\0database\0sb-1\0application_name\0psql\0options\0-c search_path=x --lock-timeout=5s\0\0");
        let FirstPacket::Startup(s) = read(&p).await.unwrap() else { panic!() };
        assert_eq!((s.user.as_str(), s.database.as_str()), ("airlock_agent", "sb-1"));
        let built = s.encode_for("airlock_agent", "app");
        let FirstPacket::Startup(again) = read(&built).await.unwrap() else { panic!() };
        assert_eq!(again.database, "app");
        assert_eq!(
            again.settings,
            [("application_name", "psql"), ("search_path", "x"), ("lock_timeout", "5s")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        assert!(!built.windows(7).any(|w| w == b"options"), "options are never forwarded as such");
    }

    /// A setting off the allow-list is not put in the server's startup
    /// message: it is kept to be SET as the agent once the session is open.
    #[tokio::test]
    async fn other_settings_are_kept_to_be_set_later_never_sent_at_startup() {
        let p = startup_of(
            b"user\0airlock_agent\0log_statement\0all\0options\0-c work_mem=64MB -c my.flag=1\0\0",
        );
        let FirstPacket::Startup(s) = read(&p).await.unwrap() else { panic!() };
        assert!(s.settings.is_empty(), "{:?}", s.settings);
        assert_eq!(
            s.later,
            [("log_statement", "all"), ("work_mem", "64MB"), ("my.flag", "1")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        let built = s.encode_for("airlock_agent", "app");
        for name in [&b"log_statement"[..], b"work_mem", b"my.flag"] {
            assert!(!built.windows(name.len()).any(|w| w == name), "{:?} reached the startup message", name);
        }
    }

    #[tokio::test]
    async fn the_database_defaults_to_the_user() {
        let FirstPacket::Startup(s) = read(&startup_of(b"user\0sb-2\0\0")).await.unwrap() else { panic!() };
        assert_eq!(s.database, "sb-2");
    }

    #[tokio::test]
    async fn refuses_what_postgresql_could_read_differently() {
        for params in [
            &b"user\0airlock_agent\0user\0airlock_admin\0database\0sb-1\0\0"[..],
            b"user\0airlock_agent\0database\0sb-1\0database\0sb-2\0\0",
            b"user\0airlock_agent\0USER\0airlock_admin\0\0",
            b"user\0airlock_agent\0application_name\0a\0Application_Name\0b\0\0",
            b"user\0airlock_agent\0search_path\0a\0options\0-c search_path=b\0\0",
            b"user\0airlock_agent\0options\0-c role=airlock_admin\0\0",
            b"user\0airlock_agent\0options\0-c session_authorization=airlock_admin\0\0",
            b"user\0airlock_agent\0options\0-d 5\0\0",
            b"user\0airlock_agent\0options\0-c\0\0",
            b"user\0airlock_agent\0role\0airlock_admin\0\0",
            b"user\0airlock_agent\0session_authorization\0airlock_admin\0\0",
            b"user\0airlock_agent\0replication\0database\0\0",
            b"user\0airlock_agent\0options\0-c local_preload_libraries=evil\0\0",
            b"user\0airlock_agent\0session_preload_libraries\0evil\0\0",
            b"user\0airlock_agent\0work-mem\0x\0\0",
            b"user\0airlock_agent\0work_mem\0x\0options\0-c work_mem=y\0\0",
            b"database\0sb-1\0\0",
        ] {
            let refused = read(&startup_of(params)).await;
            assert!(
                matches!(refused, Err(PacketError::Invalid(_))),
                "{:?} was accepted",
                String::from_utf8_lossy(params)
            );
        }
        let long = format!("user\0airlock_agent\0application_name\0{}\0\0", "x".repeat(MAX_PARAM_VALUE + 1));
        assert!(read(&startup_of(long.as_bytes())).await.is_err());
        let accepted =
            read(&startup_of(b"user\0airlock_agent\0replication\0false\0DateStyle\0ISO\0\0")).await;
        assert!(matches!(accepted, Ok(FirstPacket::Startup(_))), "{accepted:?}");
    }

    #[tokio::test]
    async fn reads_ssl_and_cancel_requests() {
        assert_eq!(read(&packet(&SSL_REQUEST.to_be_bytes())).await.unwrap(), FirstPacket::SslRequest);
        let mut body = CANCEL_REQUEST.to_be_bytes().to_vec();
        body.extend_from_slice(&7i32.to_be_bytes());
        body.extend_from_slice(&9i32.to_be_bytes());
        let short = BackendKey { pid: 7, secret: 9i32.to_be_bytes().to_vec() };
        assert_eq!(read(&packet(&body)).await.unwrap(), FirstPacket::Cancel(short.clone()));
        assert_eq!(short.cancel_request(), packet(&body));
        // Protocol 3.2's longer keys, up to 256 bytes; none shorter than 4 or longer.
        let long = BackendKey { pid: 7, secret: (0..32).collect() };
        assert_eq!(read(&long.cancel_request()).await.unwrap(), FirstPacket::Cancel(long.clone()));
        let longest = BackendKey { pid: 7, secret: vec![1; MAX_CANCEL_KEY] };
        assert!(read(&longest.cancel_request()).await.is_ok());
        for bad in [vec![1; 3], vec![1; MAX_CANCEL_KEY + 1]] {
            let key = BackendKey { pid: 7, secret: bad };
            assert!(matches!(read(&key.cancel_request()).await, Err(PacketError::Invalid(_))));
        }
        // BackendKeyData carries the same.
        let m = long.message();
        let message = Message { tag: m[0], bytes: m };
        assert_eq!(message.backend_key(), Some(long));
    }

    #[tokio::test]
    async fn refuses_malformed_packets() {
        assert!(matches!(read(&[0, 0, 0, 3]).await, Err(PacketError::Invalid(_))));
        assert!(matches!(read(&[0x7f, 0, 0, 0]).await, Err(PacketError::Invalid(_))));
        assert!(matches!(read(&packet(&[0, 2, 0, 0])).await, Err(PacketError::Unsupported(2, 0))));
        let mut body = 196608i32.to_be_bytes().to_vec();
        body.extend_from_slice(b"user\0bob");
        assert!(matches!(read(&packet(&body)).await, Err(PacketError::Invalid(_))));
        body.extend_from_slice(b"\0\0extra");
        assert!(matches!(read(&packet(&body)).await, Err(PacketError::Invalid(_))));
        assert!(matches!(read(&[0, 0, 0, 9, 1]).await, Err(PacketError::Io(_))));
    }

    #[test]
    fn encodes_an_error_response() {
        let e = ErrorResponse::fatal("3D000", "no such sandbox", "fork one").encode();
        assert_eq!(e[0], b'E');
        assert_eq!(i32::from_be_bytes(e[1..5].try_into().unwrap()) as usize, e.len() - 1);
        assert!(e.windows(6).any(|w| w == b"C3D000"));
        assert!(e.ends_with(b"Hfork one\0\0"));
    }

    #[tokio::test]
    async fn a_postmasters_old_protocol_fork_failure_is_read_as_its_text() {
        let sent = b"Ecould not fork new process for connection: Resource temporarily unavailable\n\0";
        match read_first_server_answer(&mut &sent[..]).await.unwrap() {
            FirstAnswer::CouldNotStart(text) => {
                assert_eq!(
                    text,
                    "could not fork new process for connection: Resource temporarily unavailable"
                )
            }
            other => panic!("read as {other:?}"),
        }
        // A short text whose NUL falls in the length word, and one that never ends.
        assert!(matches!(
            read_first_server_answer(&mut &b"Eab\0\0"[..]).await.unwrap(),
            FirstAnswer::CouldNotStart(t) if t == "ab"
        ));
        let endless = [b'E'].into_iter().chain(std::iter::repeat_n(b'x', 5000)).collect::<Vec<u8>>();
        assert!(matches!(
            read_first_server_answer(&mut &endless[..]).await.unwrap(),
            FirstAnswer::CouldNotStart(t) if t.len() == airlock_postgres::wire::MAX_OLD_ERROR
        ));
        // A real ErrorResponse stays a message.
        let mut error = vec![b'E'];
        error.extend_from_slice(&packet(b"SFATAL\0C53300\0Mtoo many\0\0"));
        assert!(matches!(
            read_first_server_answer(&mut &error[..]).await.unwrap(),
            FirstAnswer::Message(m) if m.tag == b'E'
        ));
    }
}
