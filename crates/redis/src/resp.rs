//! The Redis wire protocol (RESP2) as the daemon speaks it to its own servers:
//! commands as arrays of bulk strings, replies read with bounds, so a server
//! the agent controls cannot make the daemon allocate without limit.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest reply element the daemon reads (a bulk string or an array's length).
const MAX_ELEMENT: usize = 16 << 20;
/// How deep nested arrays may go.
const MAX_DEPTH: usize = 8;

/// One reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+OK`.
    Status(String),
    /// `-ERR ...`.
    Error(String),
    /// `:42`.
    Integer(i64),
    /// `$n` bytes, or nil.
    Bulk(Option<Vec<u8>>),
    /// `*n` replies, or nil.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The reply as text, for status, bulk and integer replies.
    pub fn text(&self) -> Option<String> {
        match self {
            Reply::Status(s) => Some(s.clone()),
            Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Reply::Integer(i) => Some(i.to_string()),
            _ => None,
        }
    }
}

/// Encodes a command.
pub fn command<S: AsRef<[u8]>>(args: &[S]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Sends one command and reads its reply.
pub async fn call<S: AsRef<[u8]>>(
    stream: &mut (impl AsyncBufRead + AsyncWrite + Unpin + Send),
    args: &[S],
) -> std::io::Result<Reply> {
    stream.write_all(&command(args)).await?;
    stream.flush().await?;
    read(stream).await
}

/// Reads one reply.
pub async fn read(stream: &mut (impl AsyncBufRead + Unpin + Send)) -> std::io::Result<Reply> {
    read_at(stream, 0).await
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("malformed reply: {what}"))
}

async fn line(stream: &mut (impl AsyncBufRead + Unpin)) -> std::io::Result<String> {
    let mut buf = Vec::new();
    let n = (&mut *stream).take(MAX_ELEMENT as u64).read_until(b'\n', &mut buf).await?;
    if n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    if !buf.ends_with(b"\r\n") {
        return Err(bad("a line without CRLF"));
    }
    buf.truncate(buf.len() - 2);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn read_at<'a, R: AsyncBufRead + Unpin + Send>(
    stream: &'a mut R,
    depth: usize,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Reply>> + Send + 'a>> {
    Box::pin(async move {
        let head = line(stream).await?;
        let (kind, rest) = head.split_at(head.len().min(1));
        let length = |rest: &str| -> std::io::Result<Option<usize>> {
            let n: i64 = rest.parse().map_err(|_| bad("a length"))?;
            match n {
                -1 => Ok(None),
                n if n < 0 || n as usize > MAX_ELEMENT => Err(bad("a length out of bounds")),
                n => Ok(Some(n as usize)),
            }
        };
        match kind {
            "+" => Ok(Reply::Status(rest.to_owned())),
            "-" => Ok(Reply::Error(rest.to_owned())),
            ":" => rest.parse().map(Reply::Integer).map_err(|_| bad("an integer")),
            "$" => match length(rest)? {
                None => Ok(Reply::Bulk(None)),
                Some(n) => {
                    let mut buf = vec![0u8; n + 2];
                    stream.read_exact(&mut buf).await?;
                    if !buf.ends_with(b"\r\n") {
                        return Err(bad("a bulk string without CRLF"));
                    }
                    buf.truncate(n);
                    Ok(Reply::Bulk(Some(buf)))
                }
            },
            "*" => match length(rest)? {
                None => Ok(Reply::Array(None)),
                Some(_) if depth >= MAX_DEPTH => Err(bad("arrays nested too deep")),
                Some(n) => {
                    let mut items = Vec::with_capacity(n.min(1024));
                    for _ in 0..n {
                        items.push(read_at(stream, depth + 1).await?);
                    }
                    Ok(Reply::Array(Some(items)))
                }
            },
            _ => Err(bad("an unknown reply type")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replies_are_read_and_bounded() {
        let mut input: &[u8] = b"*3\r\n+OK\r\n$3\r\nabc\r\n*2\r\n:7\r\n$-1\r\n";
        let reply = read(&mut input).await.unwrap();
        assert_eq!(
            reply,
            Reply::Array(Some(vec![
                Reply::Status("OK".into()),
                Reply::Bulk(Some(b"abc".to_vec())),
                Reply::Array(Some(vec![Reply::Integer(7), Reply::Bulk(None)])),
            ]))
        );
        let mut huge: &[u8] = b"$999999999999\r\n";
        assert!(read(&mut huge).await.is_err());
        let deep = "*1\r\n".repeat(20);
        assert!(read(&mut deep.as_bytes()).await.is_err());
        assert_eq!(command(&["GET", "k"]), b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }
}
