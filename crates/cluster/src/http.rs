//! One HTTP/1.1 exchange on a stream the caller opened: etcd's JSON gateway
//! over TCP, and the node-to-node link over mutual TLS.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use airlock_core::error::{Error, ErrorCode, Result};

/// What came back.
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// Its `content-type`, if it said one.
    pub content_type: Option<String>,
    /// The whole body.
    pub body: Bytes,
}

/// A request to send.
pub struct Ask<'a> {
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The path and query.
    pub path: &'a str,
    /// The body's `content-type`, when it has one.
    pub content_type: Option<&'a str>,
    /// The body (empty for none).
    pub body: Bytes,
}

/// The error for `whom` not answering: `e` says how.
pub fn silent(whom: &str, e: &dyn std::fmt::Display) -> Error {
    Error::new(
        ErrorCode::ClusterUnavailable,
        format!("{whom} did not answer: {e}"),
        "check that it runs and that this node reaches it",
    )
}

/// The error for `whom` not answering within `limit`.
pub fn late(whom: &str, limit: Duration) -> Error {
    Error::new(
        ErrorCode::ClusterUnavailable,
        format!("{whom} did not answer within {:.1}s", limit.as_secs_f64()),
        "check that it runs and that this node reaches it",
    )
}

/// Sends `ask` on `io`; the answer, its body still to be read. The
/// connection is driven until the body has been read (or dropped).
async fn send<S>(io: S, ask: Ask<'_>, whom: &str) -> Result<hyper::Response<hyper::body::Incoming>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| silent(whom, &chain(&e)))?;
    let driving = tokio::spawn(connection);
    match sender.send_request(request(ask, whom)?).await {
        Ok(response) => Ok(response),
        Err(e) => {
            // The connection's own error says why, when it has one (a TLS
            // alert from a server that refused this node's certificate, say);
            // the request's says only that it was cut short.
            let why = match tokio::time::timeout(Duration::from_millis(200), driving).await {
                Ok(Ok(Err(broken))) => chain(&broken),
                _ => chain(&e),
            };
            Err(silent(whom, &why))
        }
    }
}

/// An error and every error beneath it, as one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut under = e.source();
    while let Some(cause) = under {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        under = cause.source();
    }
    text
}

/// Sends `ask` on `io`; the answer's status and its body, to be read as it
/// comes (a golden's files). Its head must come within `limit`.
pub async fn open<S>(io: S, ask: Ask<'_>, limit: Duration, whom: &str) -> Result<(u16, hyper::body::Incoming)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let response =
        tokio::time::timeout(limit, send(io, ask, whom)).await.map_err(|_| late(whom, limit))??;
    Ok((response.status().as_u16(), response.into_body()))
}

/// The HTTP request `ask` makes.
pub fn request(ask: Ask<'_>, whom: &str) -> Result<hyper::Request<Full<Bytes>>> {
    let mut request = hyper::Request::builder().method(ask.method).uri(ask.path).header("host", "airlock");
    if let Some(kind) = ask.content_type {
        request = request.header("content-type", kind);
    }
    request
        .body(Full::new(ask.body))
        .map_err(|e| Error::internal(format!("a request to {whom} could not be made: {e}")))
}

/// Reads a whole answer.
pub async fn collect(response: hyper::Response<hyper::body::Incoming>, whom: &str) -> Result<Answer> {
    let status = response.status().as_u16();
    let content_type =
        response.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = response.into_body().collect().await.map_err(|e| silent(whom, &e))?;
    Ok(Answer { status, content_type, body: body.to_bytes() })
}

/// Sends `ask` on `io` and reads the whole answer, all within `limit`.
pub async fn exchange<S>(io: S, ask: Ask<'_>, limit: Duration, whom: &str) -> Result<Answer>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let work = async { collect(send(io, ask, whom).await?, whom).await };
    tokio::time::timeout(limit, work).await.unwrap_or_else(|_| Err(late(whom, limit)))
}
