//! The server side of SCRAM-SHA-256 and SCRAM-SHA-256-PLUS (RFC 5802, 7677 and
//! 5929's `tls-server-end-point` binding), as PostgreSQL speaks it: the router
//! authenticates each client itself, against the verifier the daemon minted for
//! the sandbox, before any server is woken or connected to.
//!
//! Checking a proof costs two HMACs and a hash; the PBKDF2 work is the client's.
//! Nothing a client sends is logged, and a refusal never says which part failed.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::protocol::{self, ErrorResponse, PacketError};
use airlock_core::dsn::AGENT_ROLE;
use airlock_postgres::scram::{hmac, Verifier};

const PLAIN: &str = "SCRAM-SHA-256";
const PLUS: &str = "SCRAM-SHA-256-PLUS";
/// The only channel binding type PostgreSQL defines.
const END_POINT: &str = "tls-server-end-point";

const SASL: i32 = 10;
const SASL_CONTINUE: i32 = 11;
const SASL_FINAL: i32 = 12;
const OK: i32 = 0;

/// How an authentication ended, when the client kept to the protocol.
pub enum Outcome {
    /// The proof was right; the SASL exchange is complete, and
    /// `AuthenticationOk` is the caller's to send ([`authentication_ok`]), or
    /// the server's that its client is handed to.
    Authenticated {
        /// Whether the exchange was bound to the TLS channel (SCRAM-SHA-256-PLUS).
        channel_bound: bool,
    },
    /// The proof, the mechanism or the binding was wrong; the error is for the client.
    Refused(ErrorResponse),
}

/// Runs one SCRAM exchange with `client`. `binding` is the TLS connection's
/// `tls-server-end-point` data (None on plaintext), which also decides whether
/// SCRAM-SHA-256-PLUS is offered.
pub async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut S,
    verifier: &Verifier,
    binding: Option<&[u8]>,
) -> Result<Outcome, PacketError> {
    let mut offer = Vec::new();
    if binding.is_some() {
        push_cstr(&mut offer, PLUS);
    }
    push_cstr(&mut offer, PLAIN);
    offer.push(0);
    send(client, &[auth(SASL, &offer)]).await?;

    let initial = protocol::read_client_auth(client).await?;
    let (mechanism, first) = initial_response(initial.body())?;
    let first = match client_first(&mechanism, first, binding) {
        Ok(first) => first,
        Err(refusal) => return Ok(Outcome::Refused(refusal)),
    };
    let nonce = format!("{}{}", first.nonce, STANDARD.encode(airlock_core::secret::random_bytes::<18>()));
    let server_first = format!("r={nonce},s={},i={}", STANDARD.encode(&verifier.salt), verifier.iterations);
    send(client, &[auth(SASL_CONTINUE, server_first.as_bytes())]).await?;

    let response = protocol::read_client_auth(client).await?;
    let last =
        std::str::from_utf8(response.body()).map_err(|_| malformed("the final message is not UTF-8"))?;
    let (without_proof, proof) = last.rsplit_once(",p=").ok_or_else(|| malformed("no proof"))?;
    let mut fields = without_proof.split(',');
    let channel =
        fields.next().and_then(|f| f.strip_prefix("c=")).ok_or_else(|| malformed("no channel binding"))?;
    let echoed = fields.next().and_then(|f| f.strip_prefix("r=")).ok_or_else(|| malformed("no nonce"))?;
    let mut expected_channel = first.gs2_header.as_bytes().to_vec();
    if first.bound {
        expected_channel.extend_from_slice(binding.unwrap_or_default());
    }
    if STANDARD.decode(channel).ok().as_deref() != Some(expected_channel.as_slice()) {
        return Ok(Outcome::Refused(ErrorResponse::fatal(
            "28000",
            "SCRAM channel binding check failed",
            "connect to the router directly, not through something that ends TLS on the way",
        )));
    }
    if echoed != nonce {
        return Err(malformed("the nonce does not match"));
    }
    let proof: [u8; 32] = STANDARD
        .decode(proof)
        .ok()
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| malformed("the proof is not 32 bytes of base64"))?;

    let auth_message = format!("{},{server_first},{without_proof}", first.bare);
    let signature = hmac(&verifier.stored_key, auth_message.as_bytes());
    let mut client_key = proof;
    for (k, s) in client_key.iter_mut().zip(signature) {
        *k ^= s;
    }
    let stored: [u8; 32] = Sha256::digest(client_key).into();
    if !same(&stored, &verifier.stored_key) {
        return Ok(Outcome::Refused(ErrorResponse::fatal(
            "28P01",
            format!("password authentication failed for user \"{AGENT_ROLE}\""),
            "use the DSN `airlock fork` printed (or `airlock dsn ID`); the password is the sandbox's own",
        )));
    }
    let server_signature = hmac(&verifier.server_key, auth_message.as_bytes());
    let last = format!("v={}", STANDARD.encode(server_signature));
    send(client, &[auth(SASL_FINAL, last.as_bytes())]).await?;
    Ok(Outcome::Authenticated { channel_bound: first.bound })
}

/// The parts of a client-first-message the rest of the exchange needs.
struct ClientFirst<'a> {
    /// `n,,`, `y,,` or `p=tls-server-end-point,,`, as the final message must echo it.
    gs2_header: &'a str,
    /// Whether the client bound the channel.
    bound: bool,
    /// client-first-message-bare, part of the signed message.
    bare: &'a str,
    /// The client's nonce.
    nonce: &'a str,
}

/// Splits a SASLInitialResponse into the mechanism and its data.
fn initial_response(body: &[u8]) -> Result<(String, &[u8]), PacketError> {
    let end = body.iter().position(|&b| b == 0).ok_or_else(|| malformed("no mechanism"))?;
    let mechanism = String::from_utf8_lossy(&body[..end]).into_owned();
    let rest = &body[end + 1..];
    let len = rest.get(..4).ok_or_else(|| malformed("no length"))?;
    let len = i32::from_be_bytes(len.try_into().expect("sized"));
    let data = &rest[4..];
    if len < 0 || len as usize != data.len() {
        return Err(malformed("the length does not match"));
    }
    Ok((mechanism, data))
}

/// Checks the mechanism and the client-first-message against what was offered.
fn client_first<'a>(
    mechanism: &str,
    data: &'a [u8],
    binding: Option<&[u8]>,
) -> Result<ClientFirst<'a>, ErrorResponse> {
    let bad = |why: &str| {
        ErrorResponse::fatal(
            "08P01",
            format!("malformed SCRAM message: {why}"),
            "connect with a PostgreSQL client library",
        )
    };
    let text = std::str::from_utf8(data).map_err(|_| bad("not UTF-8"))?;
    let (flag, rest) = text.split_once(',').ok_or_else(|| bad("no channel binding flag"))?;
    let (authzid, bare) = rest.split_once(',').ok_or_else(|| bad("no authorization identity"))?;
    if !authzid.is_empty() {
        return Err(bad("an authorization identity is not supported"));
    }
    let gs2_header = &text[..flag.len() + authzid.len() + 2];
    let bound = match (flag, mechanism, binding) {
        ("n", PLAIN, _) => false,
        // The client could bind but believes the server cannot: a downgrade if
        // this is TLS, since PLUS was offered.
        ("y", PLAIN, None) => false,
        ("y", PLAIN, Some(_)) => {
            return Err(ErrorResponse::fatal(
                "28000",
                "SCRAM channel binding negotiation error",
                "the client was offered SCRAM-SHA-256-PLUS but did not choose it: something between it and the router removed it",
            ))
        }
        (f, PLUS, Some(_)) if f.strip_prefix("p=") == Some(END_POINT) => true,
        (f, PLUS, Some(_)) if f.starts_with("p=") => {
            return Err(ErrorResponse::fatal(
                "28000",
                format!("unsupported SCRAM channel binding type \"{}\"", protocol::shown(&f[2..])),
                format!("use {END_POINT}"),
            ))
        }
        (_, PLAIN | PLUS, _) => return Err(bad("the channel binding flag does not match the mechanism")),
        _ => {
            return Err(ErrorResponse::fatal(
                "28000",
                "client selected an invalid SASL authentication mechanism",
                format!("the router offers {PLAIN} (and {PLUS} over TLS)"),
            ))
        }
    };
    let mut fields = bare.split(',');
    if fields.next().and_then(|f| f.strip_prefix("n=")).is_none() {
        return Err(bad("no user name attribute"));
    }
    let nonce = fields.next().and_then(|f| f.strip_prefix("r=")).ok_or_else(|| bad("no nonce"))?;
    if nonce.is_empty() || !nonce.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
        return Err(bad("the nonce is not printable"));
    }
    if fields.any(|f| f.starts_with("m=")) {
        return Err(bad("mandatory extensions are not supported"));
    }
    Ok(ClientFirst { gs2_header, bound, bare, nonce })
}

/// Compares two keys in time that does not depend on where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn malformed(why: &str) -> PacketError {
    PacketError::Invalid(format!("malformed SCRAM message: {why}"))
}

/// The `AuthenticationOk` message that ends a client's authentication.
pub fn authentication_ok() -> Vec<u8> {
    auth(OK, &[])
}

/// An `R` (authentication request) message.
fn auth(code: i32, data: &[u8]) -> Vec<u8> {
    let mut out = vec![b'R'];
    out.extend_from_slice(&((8 + data.len()) as i32).to_be_bytes());
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(data);
    out
}

async fn send<S: AsyncWrite + Unpin>(client: &mut S, messages: &[Vec<u8>]) -> std::io::Result<()> {
    client.write_all(&messages.concat()).await?;
    client.flush().await
}

fn push_cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
    use tokio::io::AsyncReadExt;

    /// Plays postgres-protocol's SCRAM client against the router's server side
    /// over an in-memory pipe.
    async fn exchange(
        password: &str,
        stored: &str,
        binding: Option<Vec<u8>>,
        client_binding: ChannelBinding,
        binds: bool,
    ) -> Result<Outcome, PacketError> {
        let verifier = Verifier::parse(stored).unwrap();
        let (mut server_end, mut client_end) = tokio::io::duplex(64 * 1024);
        let password = password.to_owned();
        let client = tokio::spawn(async move {
            let read_auth = async |c: &mut tokio::io::DuplexStream| -> Option<(i32, Vec<u8>)> {
                let tag = c.read_u8().await.ok()?;
                let len = c.read_i32().await.ok()?;
                let mut body = vec![0; len as usize - 4];
                c.read_exact(&mut body).await.ok()?;
                (tag == b'R').then(|| (i32::from_be_bytes(body[..4].try_into().unwrap()), body[4..].to_vec()))
            };
            let (code, offered) = read_auth(&mut client_end).await?;
            assert_eq!(code, SASL);
            let plus = String::from_utf8_lossy(&offered).contains(PLUS);
            let mechanism = if binds && plus { PLUS } else { PLAIN };
            let mut scram = ScramSha256::new(password.as_bytes(), client_binding);
            let mut buf = bytes::BytesMut::new();
            postgres_protocol::message::frontend::sasl_initial_response(mechanism, scram.message(), &mut buf)
                .unwrap();
            client_end.write_all(&buf).await.ok()?;
            let (code, server_first) = read_auth(&mut client_end).await?;
            assert_eq!(code, SASL_CONTINUE);
            scram.update(&server_first).unwrap();
            buf.clear();
            postgres_protocol::message::frontend::sasl_response(scram.message(), &mut buf).unwrap();
            client_end.write_all(&buf).await.ok()?;
            let (code, last) = read_auth(&mut client_end).await?;
            if code != SASL_FINAL {
                return None;
            }
            scram.finish(&last).ok()?;
            Some(())
        });
        let outcome = authenticate(&mut server_end, &verifier, binding.as_deref()).await;
        drop(server_end);
        let _ = client.await;
        outcome
    }

    #[tokio::test]
    async fn the_right_password_passes_with_and_without_channel_binding() {
        let v = airlock_postgres::scram::verifier("s3cret", 4096);
        let plain = exchange("s3cret", &v, None, ChannelBinding::unsupported(), false).await.unwrap();
        assert!(matches!(plain, Outcome::Authenticated { channel_bound: false }));
        let hash = vec![7u8; 32];
        let bound =
            exchange("s3cret", &v, Some(hash.clone()), ChannelBinding::tls_server_end_point(hash), true)
                .await
                .unwrap();
        assert!(matches!(bound, Outcome::Authenticated { channel_bound: true }));
    }

    #[tokio::test]
    async fn a_wrong_password_a_wrong_binding_and_a_downgrade_are_refused() {
        let v = airlock_postgres::scram::verifier("s3cret", 16);
        let wrong = exchange("guess", &v, None, ChannelBinding::unsupported(), false).await.unwrap();
        assert!(matches!(wrong, Outcome::Refused(e) if e.code == "28P01"));
        let other = exchange(
            "s3cret",
            &v,
            Some(vec![1; 32]),
            ChannelBinding::tls_server_end_point(vec![2; 32]),
            true,
        )
        .await
        .unwrap();
        assert!(matches!(other, Outcome::Refused(e) if e.code == "28000"));
        // The client can bind but was told (by someone in between) the server cannot.
        let downgraded =
            exchange("s3cret", &v, Some(vec![1; 32]), ChannelBinding::unrequested(), false).await.unwrap();
        assert!(matches!(downgraded, Outcome::Refused(e) if e.code == "28000"));
    }

    #[test]
    fn client_first_messages_are_checked() {
        assert!(client_first(PLAIN, b"n,,n=,r=abc", None).is_ok());
        assert!(client_first(PLAIN, b"n,a=admin,n=,r=abc", None).is_err());
        assert!(client_first(PLAIN, b"n,,n=,r=abc,m=ext", None).is_err());
        assert!(client_first(PLUS, b"p=tls-unique,,n=,r=abc", Some(b"x")).is_err());
        assert!(client_first(PLUS, b"p=tls-server-end-point,,n=,r=abc", None).is_err());
        assert!(client_first("MD5", b"n,,n=,r=abc", None).is_err());
        assert!(client_first(PLAIN, b"n,,n=,r=a\x01b", None).is_err());
    }
}
