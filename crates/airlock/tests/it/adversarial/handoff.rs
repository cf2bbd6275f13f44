//! The hand-off (`router/handoff.rs`), asked for by someone other than the
//! router: a client of the sandbox's own socket that opens its session with
//! `airlock.handoff=on`, then answers the guard's offer with the wrong things
//! or with nothing. Each ends that session alone, with a clear error; what the
//! guard accepts (a TCP or unix stream connection of the client's own) gives
//! it its own session, as the agent, and nothing more.

use std::io::{IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;

use super::Scene;
use crate::harness::sql;
use crate::wire::{startup_packet, Raw};

/// The unix socket a `socket_dsn` names (`host=DIR`, `port=N`).
fn socket_path(socket_dsn: &str) -> String {
    let query = socket_dsn.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let param = |name: &str| {
        query.split('&').find_map(|kv| kv.strip_prefix(&format!("{name}="))).map(|v| v.replace("%2F", "/"))
    };
    let dir = param("host").expect("socket_dsn names its directory");
    format!("{dir}/.s.PGSQL.{}", param("port").unwrap_or_else(|| "5432".into()))
}

fn message(stream: &mut UnixStream) -> (u8, Vec<u8>) {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).expect("a message from the server");
    let len = i32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len - 4];
    stream.read_exact(&mut body).unwrap();
    (head[0], body)
}

/// Opens a session on the sandbox's socket asking for the hand-off, logs in
/// and reads up to the guard's offer: the stream, and the offer's value.
fn asked_for_a_handoff(s: &Scene) -> (UnixStream, String) {
    asked_for_a_handoff_then(s, &[]).expect("the offer")
}

/// Sent as `extra`: leave once the login is sent (the startup packet, which
/// peer authentication takes as it is, or the last SCRAM message), the
/// server's answer and offer unread, so the close resets the connection under it.
const LEAVE_UNREAD: &[u8] = b"leave";

/// The same, sending `extra` right behind the login (the startup packet, or
/// the last SCRAM message where the server asks for one); the session's error
/// when it ended before an offer ("left" for [`LEAVE_UNREAD`]).
fn asked_for_a_handoff_then(s: &Scene, extra: &[u8]) -> Result<(UnixStream, String), String> {
    let mut stream = UnixStream::connect(socket_path(&s.agent_socket)).expect("the sandbox's socket");
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut packet =
        startup_packet(196608, &[("user", "airlock_agent"), ("database", "app"), ("airlock.handoff", "on")]);
    // This test runs as the daemon's user, which logs in as the agent by peer.
    if extra == LEAVE_UNREAD {
        stream.write_all(&packet).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        return Err("left".into());
    }
    packet.extend_from_slice(extra);
    stream.write_all(&packet).unwrap();
    let mut scram: Option<ScramSha256> = None;
    loop {
        let (tag, body) = message(&mut stream);
        let mut buf = BytesMut::new();
        match (tag, body.get(..4).map(|c| i32::from_be_bytes(c.try_into().unwrap()))) {
            (b'R', Some(10)) => {
                let sc = ScramSha256::new(s.password.as_bytes(), ChannelBinding::unsupported());
                frontend::sasl_initial_response("SCRAM-SHA-256", sc.message(), &mut buf).unwrap();
                scram = Some(sc);
            }
            (b'R', Some(11)) => {
                let sc = scram.as_mut().unwrap();
                sc.update(&body[4..]).unwrap();
                frontend::sasl_response(sc.message(), &mut buf).unwrap();
            }
            (b'R', Some(12)) => scram.as_mut().unwrap().finish(&body[4..]).unwrap(),
            (b'R', Some(0)) => panic!("AuthenticationOk before the offer"),
            (b'S', _) => {
                let mut parts = body.split(|b| *b == 0);
                let (name, value) = (parts.next().unwrap(), parts.next().unwrap());
                assert_eq!(name, b"airlock.handoff", "the first thing after authentication is the offer");
                return Ok((stream, String::from_utf8(value.to_vec()).unwrap()));
            }
            (b'E', _) => return Err(String::from_utf8_lossy(&body).into_owned()),
            other => panic!("unexpected {other:?} before the offer"),
        }
        if !buf.is_empty() {
            stream.write_all(&buf).unwrap();
        }
    }
}

/// Sends `text` with `fds` attached.
fn answer(stream: &UnixStream, text: &[u8], fds: &[RawFd]) {
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    sendmsg::<UnixAddr>(stream.as_raw_fd(), &[IoSlice::new(text)], cmsgs, MsgFlags::empty(), None).unwrap();
}

/// The FATAL error the session ends with, then its close.
fn ended_with(mut stream: UnixStream) -> String {
    let (tag, body) = message(&mut stream);
    assert_eq!(tag, b'E', "{}", String::from_utf8_lossy(&body));
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(stream.read(&mut [0u8; 16]).unwrap_or(0), 0, "the session went on after: {text}");
    text
}

#[test]
fn a_handoff_asked_for_by_anyone_else_gives_nothing_more_than_their_own_session() {
    let s = Scene::new();
    // The offer is the backend's cancel key: no handshake, nothing else.
    let (stream, offer) = asked_for_a_handoff(&s);
    let (pid, key) = offer.split_once(':').expect("PID:KEY");
    assert!(
        pid.parse::<i32>().is_ok() && key.len() == 8 && key.chars().all(|c| c.is_ascii_hexdigit()),
        "{offer}"
    );
    drop(stream);

    // Anything but one stream connection ends the session, saying why.
    let (r, w) = nix::unistd::pipe().unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    let (datagram, _) = UnixDatagram::pair().unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let wrong: [(&str, &[u8], Vec<RawFd>, &str); 5] = [
        ("text alone", b"via=me", vec![], "not one socket and its text"),
        ("a pipe", b"via=me", vec![r.as_raw_fd()], "not a stream socket"),
        ("a unix datagram socket", b"via=me", vec![datagram.as_raw_fd()], "not a stream socket"),
        ("a UDP socket", b"via=me", vec![udp.as_raw_fd()], "not a stream socket"),
        ("two sockets", b"via=me", vec![a.as_raw_fd(), b.as_raw_fd()], "not one socket and its text"),
    ];
    for (what, text, fds, said) in wrong {
        let (stream, _) = asked_for_a_handoff(&s);
        answer(&stream, text, &fds);
        let error = ended_with(stream);
        assert!(error.contains("hand-off of its client failed") && error.contains(said), "{what}: {error}");
    }
    drop((r, w));
    // A NUL in the text, and silence.
    let (tcp_a, _tcp_b) = loopback_pair();
    let (stream, _) = asked_for_a_handoff(&s);
    answer(&stream, b"via=\0me", &[tcp_a.as_raw_fd()]);
    assert!(ended_with(stream).contains("holds a NUL"));
    let (stream, _) = asked_for_a_handoff(&s);
    let waited = Instant::now();
    assert!(ended_with(stream).contains("no answer to the offer"));
    assert!(waited.elapsed() < Duration::from_secs(10), "{:?}", waited.elapsed());

    // Bytes sent ahead of the offer are not lost in a buffer: the session ends.
    let pipelined = b"Q\0\0\0\rSELECT 1;\0";
    match asked_for_a_handoff_then(&s, pipelined) {
        Err(error) => assert!(error.contains("spoke before the offer"), "{error}"),
        Ok((stream, _)) => {
            let error = ended_with(stream);
            assert!(error.contains("hand-off of its client failed"), "{error}");
        }
    }

    // A client that goes before the offer is read (its connection reset under
    // the waiting backend) ends that session alone: the server does not crash.
    let started = sql(&s.agent, "SELECT pg_postmaster_start_time()");
    for _ in 0..5 {
        let left = asked_for_a_handoff_then(&s, LEAVE_UNREAD);
        assert_eq!(left.err().as_deref(), Some("left"));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sql(&s.agent, "SELECT pg_postmaster_start_time()"), started, "the server restarted");

    // A TCP connection of one's own: the session goes on over it, as the
    // agent, saying what it was told but through no router.
    let (mine, theirs) = loopback_pair();
    let (stream, _) = asked_for_a_handoff(&s);
    answer(&stream, b"via=router client=10.9.8.7:1 tls=TLSv1.3", &[mine.as_raw_fd()]);
    drop(mine);
    let mut session = Raw::login(theirs, "").expect("the session over the handed-in connection");
    let who = session
        .query("SELECT current_user, session_user, current_setting('is_superuser'), current_setting('airlock.handoff')")
        .unwrap();
    assert_eq!(who[0], ["airlock_agent", "airlock_agent", "off", "on"].map(|v| Some(v.to_owned())).to_vec());
    for attempt in ["SET ROLE airlock_admin", "SET SESSION AUTHORIZATION airlock_admin"] {
        assert!(session.query(attempt).is_err(), "{attempt}");
    }
    drop(session);
    drop(stream);
    // A unix connection of one's own (as the router hands in a client of its
    // own socket): the same, as the agent.
    let (mine, mut theirs) = UnixStream::pair().unwrap();
    let (stream, _) = asked_for_a_handoff(&s);
    answer(&stream, b"via=router client=local:uid=0", &[mine.as_raw_fd()]);
    drop(mine);
    theirs.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    assert_eq!(
        message(&mut theirs),
        (b'R', vec![0, 0, 0, 0]),
        "AuthenticationOk on the handed-in connection"
    );
    while message(&mut theirs).0 != b'Z' {}
    let query = b"SELECT current_user || ' ' || current_setting('is_superuser')\0";
    theirs.write_all(&[b'Q']).unwrap();
    theirs.write_all(&(query.len() as i32 + 4).to_be_bytes()).unwrap();
    theirs.write_all(query).unwrap();
    let row = loop {
        match message(&mut theirs) {
            (b'D', body) => break String::from_utf8_lossy(&body[6..]).into_owned(),
            (b'E', body) => panic!("{}", String::from_utf8_lossy(&body)),
            _ => {}
        }
    };
    assert_eq!(row, "airlock_agent off");
    drop((theirs, stream));
    // Through all of it, the sandbox served everyone else.
    assert_eq!(sql(&s.agent, "SELECT count(*) FROM orders"), "1000");
    s.untouched();
}

/// A connected pair of loopback TCP sockets.
fn loopback_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    (a, b)
}
