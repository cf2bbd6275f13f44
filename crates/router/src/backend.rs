//! A server session the router opens as the agent role, on the sandbox's private
//! socket: logged in by peer, as the sandbox's own OS user (or, on a server
//! started before that, with the password the daemon holds, SCRAM as a client),
//! ready for queries, with what its client must be told (ParameterStatus,
//! BackendKeyData) kept so it can be replayed to a client authenticated by the
//! router, then or later.

use bytes::BytesMut;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::protocol::{self, PacketError};

const SCRAM_SHA_256: &str = "SCRAM-SHA-256";

/// An established server session and what its client must be told: on a
/// sandbox's socket, or (for a route) over TCP to a server outside.
pub struct Backend<S = UnixStream> {
    /// The connection to the server, ready for a query.
    pub stream: S,
    /// ParameterStatus values, in the order the server reported them.
    params: Vec<(String, String)>,
    /// The backend's pid and cancel key.
    pub key: Option<protocol::BackendKey>,
    /// The handshake the in-server guard reported (`airlock.handshake`): what
    /// lets the router, and no one else, say how the client connected. Never
    /// passed on to the client.
    handshake: Option<String>,
    /// Whether the server offered to take the client (`airlock.handoff`, asked
    /// for in the startup message): it waits for the client's socket, and has
    /// sent nothing else.
    pub offered: bool,
}

/// The setting the guard reports a session's handshake in.
const HANDSHAKE: &str = "airlock.handshake";
/// The setting the guard offers to take the client in, and the startup
/// parameter that asks it to.
pub const HANDOFF: &str = "airlock.handoff";

/// Why a login did not give a session.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// The server refused, with this `ErrorResponse` for the client.
    #[error("the server refused the session ({sqlstate})")]
    Refused {
        /// The SQLSTATE.
        sqlstate: String,
        /// The whole message, to pass on.
        message: Vec<u8>,
    },
    /// The server could not start a process for the session (the sandbox is
    /// at its process limit, say): its text.
    #[error("the server could not start a session: {0}")]
    CouldNotStart(String),
    /// The connection failed or the server broke the protocol.
    #[error("{0}")]
    Broken(#[from] PacketError),
}

impl From<std::io::Error> for LoginError {
    fn from(e: std::io::Error) -> Self {
        LoginError::Broken(PacketError::Io(e))
    }
}

fn protocol_error(why: &str) -> LoginError {
    LoginError::Broken(PacketError::Invalid(why.to_owned()))
}

/// Sends `startup` on `stream` and, if the server asks, answers its SCRAM
/// challenge with `password`, until it is ready for queries.
pub async fn login<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    startup: &[u8],
    password: &str,
) -> Result<Backend<S>, LoginError> {
    let mut server = BufReader::new(stream);
    // A postmaster that cannot fork answers before it reads the startup
    // packet, and closes: the write may fail where its answer is there to read.
    if let Err(e) = server.get_mut().write_all(startup).await {
        return Err(match protocol::read_first_server_answer(&mut server).await {
            Ok(protocol::FirstAnswer::CouldNotStart(text)) => LoginError::CouldNotStart(text),
            _ => e.into(),
        });
    }
    let mut scram: Option<ScramSha256> = None;
    let (mut params, mut key, mut handshake) = (Vec::new(), None, None);
    let mut buf = BytesMut::new();
    let mut first = true;
    // Whether the server proved it knows the password (SCRAM's last message),
    // where it asked for one (a server started before the agent logged in by
    // peer). By peer, the server is known by the socket's listener, checked to
    // be the sandbox's postmaster before this, and it offers the hand-off only
    // once it has authenticated the session.
    let mut server_proved = false;
    loop {
        let m = match first {
            true => match protocol::read_first_server_answer(&mut server).await? {
                protocol::FirstAnswer::Message(m) => m,
                protocol::FirstAnswer::CouldNotStart(text) => return Err(LoginError::CouldNotStart(text)),
            },
            false => protocol::read_server_message(&mut server).await?,
        };
        first = false;
        match (m.tag, m.auth_code()) {
            (b'R', Some(0)) if scram.is_some() && !server_proved => {
                return Err(protocol_error("the server ended SCRAM without proving it knows the password"))
            }
            (b'R', Some(0)) => {}
            (b'R', Some(10)) => {
                let offered = m.body()[4..].split(|&b| b == 0).any(|mech| mech == SCRAM_SHA_256.as_bytes());
                if !offered {
                    return Err(protocol_error("the server does not offer SCRAM-SHA-256"));
                }
                let s = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
                buf.clear();
                frontend::sasl_initial_response(SCRAM_SHA_256, s.message(), &mut buf)?;
                server.get_mut().write_all(&buf).await?;
                scram = Some(s);
            }
            (b'R', Some(11)) => {
                let s = scram.as_mut().ok_or_else(|| protocol_error("SASL out of order"))?;
                s.update(&m.body()[4..])?;
                buf.clear();
                frontend::sasl_response(s.message(), &mut buf)?;
                server.get_mut().write_all(&buf).await?;
            }
            (b'R', Some(12)) => {
                let s = scram.as_mut().ok_or_else(|| protocol_error("SASL out of order"))?;
                s.finish(&m.body()[4..])?;
                server_proved = true;
            }
            (b'R', _) => return Err(protocol_error(
                "the server asked for an authentication other than peer or SCRAM-SHA-256 (its pg_hba.conf method)",
            )),
            (b'S', _) => match parameter(m.body()) {
                Some((name, value)) if name == HANDSHAKE => handshake = Some(value),
                Some((name, value)) if name == HANDOFF && (scram.is_none() || server_proved) => {
                    let key = offer(&value)
                        .ok_or_else(|| protocol_error("the server's hand-off offer did not parse"))?;
                    if !server.buffer().is_empty() {
                        return Err(protocol_error("the server spoke after its hand-off offer"));
                    }
                    let stream = server.into_inner();
                    return Ok(Backend { stream, params, key: Some(key), handshake, offered: true });
                }
                Some(p) => set(&mut params, p),
                None => {}
            },
            (b'K', _) => key = m.backend_key(),
            (b'Z', _) => {
                if !server.buffer().is_empty() {
                    return Err(protocol_error("the server spoke out of turn"));
                }
                return Ok(Backend { stream: server.into_inner(), params, key, handshake, offered: false });
            }
            (b'E', _) => {
                let sqlstate = field(m.body(), b'C').unwrap_or_default();
                return Err(LoginError::Refused { sqlstate, message: m.bytes });
            }
            // Notices.
            _ => {}
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Backend<S> {
    /// Applies settings to a session, in order, with `set_config`, which reads
    /// a value as a startup packet does (a list such as `search_path` stays a
    /// list): those equal to what the session was opened with are skipped.
    /// Names and values go as parameters of one prepared statement, never into
    /// SQL text, so no client encoding (one that can swallow a quote's escape,
    /// say) can make a value read as SQL. Fails if the server refuses one; the
    /// session is then not to be used.
    pub async fn apply(
        &mut self,
        settings: &[(String, String)],
        opened_with: &[(&str, &str)],
    ) -> Result<(), LoginError> {
        let wanted: Vec<&(String, String)> = settings
            .iter()
            .filter(|(name, value)| !opened_with.iter().any(|(n, v)| n == name && v == value))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let mut buf = BytesMut::new();
        frontend::parse("", "SELECT pg_catalog.set_config($1, $2, false)", [], &mut buf)?;
        for (name, value) in wanted {
            let text = |v: &String, out: &mut BytesMut| {
                out.extend_from_slice(v.as_bytes());
                Ok(postgres_protocol::IsNull::No)
            };
            frontend::bind("", "", [0i16], [name, value], text, [0i16], &mut buf)
                .map_err(|_| protocol_error("a setting could not be encoded"))?;
            frontend::execute("", 0, &mut buf)?;
        }
        frontend::sync(&mut buf);
        self.stream.write_all(&buf).await?;
        let mut failed = None;
        loop {
            let m = protocol::read_server_message(&mut self.stream).await?;
            match m.tag {
                b'S' => {
                    if let Some(p) = parameter(m.body()).filter(|(name, _)| name != HANDSHAKE) {
                        set(&mut self.params, p);
                    }
                }
                b'E' => failed = Some(m.bytes),
                b'Z' => {
                    return match failed {
                        None if m.body() == b"I" => Ok(()),
                        None => Err(protocol_error("the session is not idle after its settings")),
                        Some(message) => {
                            let sqlstate = field(&message[5..], b'C').unwrap_or_else(|| "22023".into());
                            Err(LoginError::Refused { sqlstate, message })
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// The setting that tells the session how its client connected (`what`),
    /// signed with the session's handshake, which it uses up; None when the
    /// server's guard gave none.
    pub fn connection_setting(&mut self, what: &str) -> Option<(String, String)> {
        let handshake = self.handshake.take()?;
        Some(("airlock.connection".to_owned(), format!("{handshake}:{what}")))
    }

    /// What the client gets after `AuthenticationOk`: every ParameterStatus, the
    /// BackendKeyData, and ReadyForQuery (idle).
    pub fn replay(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in &self.params {
            let len = 4 + name.len() + 1 + value.len() + 1;
            out.push(b'S');
            out.extend_from_slice(&(len as i32).to_be_bytes());
            for s in [name, value] {
                out.extend_from_slice(s.as_bytes());
                out.push(0);
            }
        }
        if let Some(key) = &self.key {
            out.extend_from_slice(&key.message());
        }
        out.extend_from_slice(&[b'Z', 0, 0, 0, 5, b'I']);
        out
    }
}

impl Backend<UnixStream> {
    /// Whether the server has closed the session or said something unasked (a
    /// session parked for later must be silent).
    pub fn is_gone(&self) -> bool {
        let mut probe = [0u8; 1];
        !matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

/// The backend's cancel key from the guard's hand-off offer, "PID:KEY" (the
/// key in hex).
fn offer(value: &str) -> Option<protocol::BackendKey> {
    let (pid, hex) = value.split_once(':')?;
    let pid = pid.parse().ok()?;
    if hex.len() % 2 != 0 || !hex.is_ascii() {
        return None;
    }
    let secret: Option<Vec<u8>> =
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok()).collect();
    let mut body = i32::to_be_bytes(pid).to_vec();
    body.extend(secret?);
    protocol::BackendKey::read(&body)
}

/// A ParameterStatus body's name and value.
fn parameter(body: &[u8]) -> Option<(String, String)> {
    let mut parts = body.split(|&b| b == 0);
    let name = String::from_utf8(parts.next()?.to_vec()).ok()?;
    let value = String::from_utf8(parts.next()?.to_vec()).ok()?;
    Some((name, value))
}

fn set(params: &mut Vec<(String, String)>, (name, value): (String, String)) {
    match params.iter_mut().find(|(n, _)| *n == name) {
        Some(p) => p.1 = value,
        None => params.push((name, value)),
    }
}

/// One field of an ErrorResponse body.
pub fn field(body: &[u8], code: u8) -> Option<String> {
    body.split(|&b| b == 0)
        .find(|f| f.first() == Some(&code))
        .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::offer;

    #[test]
    fn an_offer_is_a_pid_and_a_key_of_4_to_256_bytes_in_hex_and_nothing_else() {
        let key = offer("4242:0a0b0c0d").expect("a 3.0 key");
        assert_eq!((key.pid, key.secret.as_slice()), (4242, &[10u8, 11, 12, 13][..]));
        let long = format!("7:{}", "ab".repeat(32));
        assert_eq!(offer(&long).expect("a 3.2 key").secret.len(), 32);
        for wrong in [
            "",
            "4242",
            "4242:",
            "x:0a0b0c0d",
            "4242:0a0b0c",
            "4242:0a0b0c0",
            "4242:0a0b0c0g",
            "4242:0a0b0c0d:handshake",
            "4242:é0b0c0d",
        ] {
            assert!(offer(wrong).is_none(), "{wrong:?} was taken");
        }
        // Protocol 3.2 allows keys up to 256 bytes (PostgreSQL 18 makes 32).
        assert!(offer(&format!("7:{}", "ab".repeat(256))).is_some());
        assert!(offer(&format!("7:{}", "ab".repeat(257))).is_none(), "a key longer than 256 bytes");
    }
}
