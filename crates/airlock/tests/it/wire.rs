//! A raw PostgreSQL wire-protocol client for attacks no driver would send:
//! hand-built startup packets, fast-path function calls, dropped connections.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::BytesMut;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;

/// An error the server (or the router) sent: SQLSTATE and message.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub code: String,
    pub message: String,
}

/// One session over plain TCP.
pub struct Raw {
    stream: TcpStream,
    /// The BackendKeyData body (pid, then the secret key), if one came.
    pub backend_key: Option<Vec<u8>>,
    /// The NegotiateProtocolVersion body, if one came.
    pub negotiated: Option<Vec<u8>>,
    /// The ParameterStatus names the session start reported.
    pub reported: Vec<String>,
}

/// A startup packet from parameter pairs, in order, exactly as given (duplicates included).
pub fn startup_packet(version: i32, params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = version.to_be_bytes().to_vec();
    for (k, v) in params {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut out = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

impl Raw {
    /// Sends `packet` to the router at `addr` and authenticates with `password`
    /// (SCRAM) if asked to; the session once the server is ready, or its refusal.
    pub fn connect(addr: &str, packet: &[u8], password: &str) -> Result<Raw, Refusal> {
        let mut stream = TcpStream::connect(addr).expect("router reachable");
        stream.write_all(packet).unwrap();
        Raw::login(stream, password)
    }

    /// Answers the server on `stream`, whose startup packet has been sent,
    /// until it is ready (or refuses).
    pub fn login(stream: TcpStream, password: &str) -> Result<Raw, Refusal> {
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut raw = Raw { stream, backend_key: None, negotiated: None, reported: Vec::new() };
        let mut scram: Option<ScramSha256> = None;
        loop {
            let (tag, body) = raw.message().map_err(|e| Refusal { code: "io".into(), message: e })?;
            match tag {
                b'R' => {
                    let code = i32::from_be_bytes(body[..4].try_into().unwrap());
                    let mut buf = BytesMut::new();
                    match code {
                        0 => {}
                        10 => {
                            let s = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
                            frontend::sasl_initial_response("SCRAM-SHA-256", s.message(), &mut buf).unwrap();
                            scram = Some(s);
                        }
                        11 => {
                            let s = scram.as_mut().unwrap();
                            s.update(&body[4..]).unwrap();
                            frontend::sasl_response(s.message(), &mut buf).unwrap();
                        }
                        12 => scram.as_mut().unwrap().finish(&body[4..]).unwrap(),
                        other => panic!("unexpected authentication request {other}"),
                    }
                    if !buf.is_empty() {
                        raw.stream.write_all(&buf).unwrap();
                    }
                }
                b'E' => return Err(refusal(&body)),
                b'K' => raw.backend_key = Some(body),
                b'v' => raw.negotiated = Some(body),
                b'S' => raw.reported.push(
                    String::from_utf8_lossy(body.split(|b| *b == 0).next().unwrap_or_default()).into_owned(),
                ),
                b'Z' => return Ok(raw),
                _ => {}
            }
        }
    }

    /// Sends a CancelRequest for this session to `addr`, with its key as the
    /// BackendKeyData gave it or with `secret` in its place.
    pub fn cancel(&self, addr: &str, secret: Option<&[u8]>) {
        let key = self.backend_key.as_ref().expect("the session has a backend key");
        let secret = secret.unwrap_or(&key[4..]);
        let mut packet = ((12 + secret.len()) as i32).to_be_bytes().to_vec();
        packet.extend_from_slice(&80877102i32.to_be_bytes());
        packet.extend_from_slice(&key[..4]);
        packet.extend_from_slice(secret);
        let mut tcp = TcpStream::connect(addr).expect("router reachable");
        tcp.write_all(&packet).unwrap();
        // The router closes the connection once it has passed the request on.
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = tcp.read(&mut [0u8; 1]);
    }

    fn message(&mut self) -> Result<(u8, Vec<u8>), String> {
        let mut head = [0u8; 5];
        self.stream.read_exact(&mut head).map_err(|e| e.to_string())?;
        let len = i32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        self.stream.read_exact(&mut body).map_err(|e| e.to_string())?;
        Ok((head[0], body))
    }

    /// Runs a simple query; rows as text, or the first error.
    pub fn query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, Refusal> {
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf).unwrap();
        self.stream.write_all(&buf).unwrap();
        self.results()
    }

    /// Runs `sql` by the extended protocol (Parse, Bind, Execute, Sync), as
    /// drivers run statements with parameters; rows as text, or the first error.
    pub fn extended(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, Refusal> {
        let mut buf = BytesMut::new();
        frontend::parse("", sql, [], &mut buf).unwrap();
        frontend::bind(
            "",
            "",
            [],
            std::iter::empty::<&str>(),
            |_, _| Ok(postgres_protocol::IsNull::No),
            [],
            &mut buf,
        )
        .map_err(|_| ())
        .unwrap();
        frontend::execute("", 0, &mut buf).unwrap();
        frontend::sync(&mut buf);
        self.stream.write_all(&buf).unwrap();
        self.results()
    }

    /// Calls function `oid` by the fast-path protocol with text arguments.
    pub fn function_call(&mut self, oid: u32, args: &[&str]) -> Result<Vec<Vec<Option<String>>>, Refusal> {
        let mut body = oid.to_be_bytes().to_vec();
        body.extend_from_slice(&1i16.to_be_bytes());
        body.extend_from_slice(&0i16.to_be_bytes());
        body.extend_from_slice(&(args.len() as i16).to_be_bytes());
        for a in args {
            body.extend_from_slice(&(a.len() as i32).to_be_bytes());
            body.extend_from_slice(a.as_bytes());
        }
        body.extend_from_slice(&0i16.to_be_bytes());
        let mut msg = vec![b'F'];
        msg.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        msg.extend_from_slice(&body);
        self.stream.write_all(&msg).unwrap();
        self.results()
    }

    /// Reads the answer to what was sent: rows as text, or the first error.
    pub fn results(&mut self) -> Result<Vec<Vec<Option<String>>>, Refusal> {
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let (tag, body) = self.message().map_err(|e| Refusal { code: "io".into(), message: e })?;
            match tag {
                b'D' => {
                    let n = i16::from_be_bytes(body[..2].try_into().unwrap()) as usize;
                    let mut at = 2;
                    let mut row = Vec::with_capacity(n);
                    for _ in 0..n {
                        let len = i32::from_be_bytes(body[at..at + 4].try_into().unwrap());
                        at += 4;
                        if len < 0 {
                            row.push(None);
                        } else {
                            row.push(Some(
                                String::from_utf8_lossy(&body[at..at + len as usize]).into_owned(),
                            ));
                            at += len as usize;
                        }
                    }
                    rows.push(row);
                }
                b'V' => {
                    let len = i32::from_be_bytes(body[..4].try_into().unwrap());
                    let value =
                        (len >= 0).then(|| String::from_utf8_lossy(&body[4..4 + len as usize]).into_owned());
                    rows.push(vec![value]);
                }
                b'E' => error = Some(refusal(&body)),
                b'Z' => return error.map_or(Ok(rows), Err),
                _ => {}
            }
        }
    }

    /// Drops the connection without a goodbye.
    pub fn drop_now(self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Sends a query and returns at once, without reading its answer.
    pub fn send(&mut self, sql: &str) {
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf).unwrap();
        self.stream.write_all(&buf).unwrap();
    }
}

fn refusal(body: &[u8]) -> Refusal {
    let mut r = Refusal { code: String::new(), message: String::new() };
    for field in body.split(|b| *b == 0).filter(|f| !f.is_empty()) {
        let value = String::from_utf8_lossy(&field[1..]).into_owned();
        match field[0] {
            b'C' => r.code = value,
            b'M' => r.message = value,
            _ => {}
        }
    }
    r
}
