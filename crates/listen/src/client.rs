//! The CLI's side of the REST API: one HTTP/1.1 request per call over the
//! daemon's unix socket (or TCP with a bearer token), starting a local daemon
//! when none answers.

use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::prepare_home;
use airlock_core::layout::Layout;

/// How long a self-started daemon may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the daemon is.
#[derive(Debug, Clone)]
pub enum Target {
    /// The local daemon of a data root, over its unix socket; started on demand.
    Local(Layout),
    /// A daemon on TCP (`http://host:port`) with a bearer token.
    Remote {
        /// `host:port`.
        addr: String,
        /// The bearer token.
        token: String,
    },
}

/// The body of a request that sends none ([`Client::call`]).
pub const NO_BODY: Option<&()> = None;

/// A client of one daemon.
#[derive(Debug, Clone)]
pub struct Client {
    target: Target,
    /// Whether to start a local daemon when none answers.
    start: bool,
    /// The door its requests say they came through (`x-airlock-door`), when
    /// not the API's own.
    door: Option<airlock_core::events::Door>,
}

enum Stream {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

fn unreachable(message: String) -> Error {
    Error::new(
        ErrorCode::DaemonUnreachable,
        message,
        "check AIRLOCK_HOME / AIRLOCK_URL, and the daemon log ($AIRLOCK_HOME/daemon.log)",
    )
}

/// The header a client names its door in (see [`Client::through`]).
pub const DOOR_HEADER: &str = "x-airlock-door";

impl Client {
    /// A client for `target`.
    pub fn new(target: Target) -> Client {
        Client { target, start: true, door: None }
    }

    /// This client, its requests marked as coming through `door` (only
    /// `mcp_stdio` is honoured; the daemon takes any other as the API).
    pub fn through(mut self, door: airlock_core::events::Door) -> Client {
        self.door = Some(door);
        self
    }

    /// A client of a local daemon that never starts one (the router's: a daemon
    /// that is not there is restarting, or stopped on purpose).
    pub fn without_starting(layout: Layout) -> Client {
        Client { target: Target::Local(layout), start: false, door: None }
    }

    async fn connect(&self) -> std::io::Result<Stream> {
        match &self.target {
            Target::Local(layout) => {
                Ok(Stream::Unix(tokio::net::UnixStream::connect(layout.api_socket()).await?))
            }
            Target::Remote { addr, .. } => Ok(Stream::Tcp(tokio::net::TcpStream::connect(addr).await?)),
        }
    }

    /// Connects, starting the local daemon first if none answers.
    async fn connect_or_start(&self) -> Result<Stream> {
        match self.connect().await {
            Ok(s) => Ok(s),
            Err(e) => {
                let (Target::Local(layout), true) = (&self.target, self.start) else {
                    return Err(unreachable(format!("cannot reach the daemon: {e}")));
                };
                let mut child = start_daemon(layout)?;
                let deadline = Instant::now() + START_TIMEOUT;
                loop {
                    match self.connect().await {
                        Ok(s) => return Ok(s),
                        Err(_) if Instant::now() < deadline => {}
                        Err(e) => {
                            return Err(unreachable(format!(
                                "started a daemon, but it did not answer in time: {e}"
                            )))
                        }
                    }
                    let exited = child.try_wait().ok().flatten();
                    // A daemon that exited because another one holds the lock lost a
                    // race with another client: keep waiting for the winner.
                    if let Some(status) = exited.filter(|_| !lock_is_held(layout)) {
                        let log = std::fs::read_to_string(layout.daemon_log()).unwrap_or_default();
                        let tail: Vec<&str> = log.lines().rev().take(3).collect();
                        return Err(unreachable(format!(
                            "the daemon exited ({status}) at start: {}",
                            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// Sends a request and decodes the JSON answer, or the API's error.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T> {
        let bytes = self
            .call_raw(method, path, body.map(|b| serde_json::to_vec(b).expect("request serializes")))
            .await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::internal(format!("the daemon's answer did not parse: {e}")))
    }

    /// Sends a request and returns the body of a successful answer.
    pub async fn call_raw(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<Bytes> {
        let stream = self.connect_or_start().await?;
        let (mut sender, conn) = match stream {
            Stream::Unix(s) => {
                let (tx, c) =
                    hyper::client::conn::http1::handshake(TokioIo::new(s)).await.map_err(http_error)?;
                (tx, tokio::spawn(async move { c.await.map_err(|e| e.to_string()) }))
            }
            Stream::Tcp(s) => {
                let (tx, c) =
                    hyper::client::conn::http1::handshake(TokioIo::new(s)).await.map_err(http_error)?;
                (tx, tokio::spawn(async move { c.await.map_err(|e| e.to_string()) }))
            }
        };
        let mut req = Request::builder().method(method).uri(path).header("host", "airlock");
        if let Target::Remote { token, .. } = &self.target {
            req = req.header("authorization", format!("Bearer {token}"));
        }
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        if let Some(door) = self.door {
            req = req.header(DOOR_HEADER, door.as_str());
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(http_error)?;
        let resp = sender.send_request(req).await.map_err(cut_short)?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.map_err(cut_short)?.to_bytes();
        drop(sender);
        let _ = conn.await;
        if status.is_success() {
            return Ok(bytes);
        }
        Err(serde_json::from_slice::<Error>(&bytes).unwrap_or_else(|_| {
            Error::internal(format!("the daemon answered {status}: {}", String::from_utf8_lossy(&bytes)))
        }))
    }
}

/// Percent-encodes a path segment or query value of an API URL.
pub fn encode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A request the daemon took and never answered: it stopped (crashed, or was
/// stopped) while working on it.
fn cut_short(e: hyper::Error) -> Error {
    Error::new(
        ErrorCode::DaemonUnreachable,
        format!("the daemon stopped before it answered ({e}); what it was doing may be half done"),
        "when it starts again (the next command starts it) it completes or undoes that work: \
         check the result with `airlock ls` and `airlock events`, then try again",
    )
}

fn http_error(e: impl std::fmt::Display) -> Error {
    unreachable(format!("talking to the daemon failed: {e}"))
}

/// Whether some daemon holds the data root's lock.
fn lock_is_held(layout: &Layout) -> bool {
    let Ok(file) = std::fs::OpenOptions::new().write(true).open(layout.daemon_lock()) else { return false };
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err()
}

/// Starts `airlock serve` for a data root in the background, detached from this
/// terminal, logging to `daemon.log`.
fn start_daemon(layout: &Layout) -> Result<std::process::Child> {
    prepare_home(layout.home())?;
    let log = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(layout.daemon_log())?;
    let exe: PathBuf = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve")
        .env("AIRLOCK_HOME", layout.home())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our session.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    cmd.spawn().map_err(|e| unreachable(format!("could not start a daemon: {e}")))
}
