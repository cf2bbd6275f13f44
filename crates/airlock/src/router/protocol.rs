//! The few pieces of the PostgreSQL wire protocol the router needs: reading a
//! client's first packet, rewriting a startup message, framing server messages
//! during authentication, and writing an `ErrorResponse` of its own.
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
const MAX_SERVER_STARTUP_MESSAGE: usize = 1 << 20;

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
    /// Cancels a query running on the backend with this pid and secret key.
    Cancel {
        /// The backend's process id.
        pid: i32,
        /// The backend's secret key.
        key: i32,
    },
    /// A protocol 3 startup message.
    Startup(Startup),
}

/// A startup message: the protocol version and the parameters in their order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Startup {
    /// The protocol version (3.x).
    pub version: i32,
    /// Parameter names and values as the client sent them.
    pub params: Vec<(String, String)>,
}

impl Startup {
    /// A parameter's value.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The database asked for; PostgreSQL's default is the user name.
    pub fn database(&self) -> Option<&str> {
        self.param("database").filter(|d| !d.is_empty()).or_else(|| self.param("user"))
    }

    /// The message to send to a server, with `database` replaced.
    pub fn encode_with_database(&self, database: &str) -> Vec<u8> {
        let mut body = self.version.to_be_bytes().to_vec();
        let mut wrote_database = false;
        for (k, v) in &self.params {
            let v = if k == "database" {
                wrote_database = true;
                database
            } else {
                v
            };
            push_cstr(&mut body, k);
            push_cstr(&mut body, v);
        }
        if !wrote_database {
            push_cstr(&mut body, "database");
            push_cstr(&mut body, database);
        }
        body.push(0);
        let mut out = ((body.len() + 4) as i32).to_be_bytes().to_vec();
        out.extend_from_slice(&body);
        out
    }
}

/// Why a client's packet was refused.
#[derive(Debug, thiserror::Error)]
pub enum PacketError {
    /// The connection failed or closed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not a valid packet.
    #[error("invalid startup packet: {0}")]
    Invalid(&'static str),
    /// A protocol version the router does not speak.
    #[error("unsupported frontend protocol {0}.{1}: the router speaks 3.x")]
    Unsupported(i32, i32),
}

/// Reads one first packet, at most [`MAX_STARTUP_PACKET`] bytes. Reads exactly
/// its length, so nothing a client sends after an `SSLRequest` is buffered in
/// plaintext.
pub async fn read_first_packet<R: AsyncRead + Unpin>(r: &mut R) -> Result<FirstPacket, PacketError> {
    let len = r.read_i32().await?;
    if len < 8 || len as usize > MAX_STARTUP_PACKET {
        return Err(PacketError::Invalid("length out of range"));
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
        CANCEL_REQUEST if body.len() == 12 => Ok(FirstPacket::Cancel {
            pid: i32::from_be_bytes(body[4..8].try_into().expect("sized")),
            key: i32::from_be_bytes(body[8..12].try_into().expect("sized")),
        }),
        SSL_REQUEST | GSSENC_REQUEST | CANCEL_REQUEST => {
            Err(PacketError::Invalid("wrong length for its code"))
        }
        version if version >> 16 == 3 => {
            Ok(FirstPacket::Startup(Startup { version, params: params(&body[4..])? }))
        }
        version => Err(PacketError::Unsupported(version >> 16, version & 0xffff)),
    }
}

fn params(mut rest: &[u8]) -> Result<Vec<(String, String)>, PacketError> {
    let mut out = Vec::new();
    loop {
        let key = cstr(&mut rest)?;
        if key.is_empty() {
            break;
        }
        let value = cstr(&mut rest)?;
        out.push((key, value));
    }
    if !rest.is_empty() {
        return Err(PacketError::Invalid("bytes after the terminator"));
    }
    Ok(out)
}

fn cstr(rest: &mut &[u8]) -> Result<String, PacketError> {
    let end = rest.iter().position(|&b| b == 0).ok_or(PacketError::Invalid("unterminated string"))?;
    let s = std::str::from_utf8(&rest[..end]).map_err(|_| PacketError::Invalid("not UTF-8"))?.to_owned();
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
    pub fn backend_key(&self) -> Option<(i32, i32)> {
        (self.tag == b'K' && self.body().len() == 8).then(|| {
            let b = self.body();
            (
                i32::from_be_bytes(b[..4].try_into().expect("sized")),
                i32::from_be_bytes(b[4..].try_into().expect("sized")),
            )
        })
    }
}

/// Reads one message of at most `max` bytes.
async fn read_message<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> Result<Message, PacketError> {
    let tag = r.read_u8().await?;
    let len = r.read_i32().await?;
    if len < 4 || len as usize > max {
        return Err(PacketError::Invalid("message length out of range"));
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
        return Err(PacketError::Invalid("expected an authentication message"));
    }
    Ok(m)
}

/// Reads a server's message before the session is established.
pub async fn read_server_message<R: AsyncRead + Unpin>(r: &mut R) -> Result<Message, PacketError> {
    read_message(r, MAX_SERVER_STARTUP_MESSAGE).await
}

/// Authentication requests that the client answers with a `p` message
/// (cleartext, MD5, SASL start, SASL continue).
pub fn expects_client_answer(auth_code: i32) -> bool {
    matches!(auth_code, 3 | 5 | 10 | 11)
}

/// An `ErrorResponse` the router sends itself.
#[derive(Debug, Clone)]
pub struct ErrorResponse {
    /// `FATAL` for refused connections.
    pub severity: &'static str,
    /// The SQLSTATE.
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
    /// How to fix it.
    pub hint: Option<String>,
}

impl ErrorResponse {
    /// A `FATAL` error with a hint.
    pub fn fatal(code: &'static str, message: impl Into<String>, hint: impl Into<String>) -> Self {
        ErrorResponse { severity: "FATAL", code, message: message.into(), hint: Some(hint.into()) }
    }

    /// The message bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        for (field, value) in [(b'S', self.severity), (b'V', self.severity), (b'C', self.code)] {
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

    #[tokio::test]
    async fn reads_startup_and_rewrites_the_database() {
        let mut body = 196608i32.to_be_bytes().to_vec();
        body.extend_from_slice(b"user\0bob\0database\0sb-1\0application_name\0psql\0\0");
        let FirstPacket::Startup(s) = read(&packet(&body)).await.unwrap() else { panic!() };
        assert_eq!(s.database(), Some("sb-1"));
        let rewritten = s.encode_with_database("app");
        let FirstPacket::Startup(again) = read(&rewritten).await.unwrap() else { panic!() };
        assert_eq!(again.database(), Some("app"));
        assert_eq!(again.param("user"), Some("bob"));
        assert_eq!(again.param("application_name"), Some("psql"));
    }

    #[tokio::test]
    async fn the_database_defaults_to_the_user() {
        let mut body = 196608i32.to_be_bytes().to_vec();
        body.extend_from_slice(b"user\0sb-2\0\0");
        let FirstPacket::Startup(s) = read(&packet(&body)).await.unwrap() else { panic!() };
        assert_eq!(s.database(), Some("sb-2"));
        assert!(s.encode_with_database("app").windows(13).any(|w| w == b"database\0app\0"));
    }

    #[tokio::test]
    async fn reads_ssl_and_cancel_requests() {
        assert_eq!(read(&packet(&SSL_REQUEST.to_be_bytes())).await.unwrap(), FirstPacket::SslRequest);
        let mut body = CANCEL_REQUEST.to_be_bytes().to_vec();
        body.extend_from_slice(&7i32.to_be_bytes());
        body.extend_from_slice(&9i32.to_be_bytes());
        assert_eq!(read(&packet(&body)).await.unwrap(), FirstPacket::Cancel { pid: 7, key: 9 });
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
}
