//! `run_redis`: one command on the task's own Redis, sent as the agent's ACL
//! user (the sandbox's rules apply, exactly as for any client), its reply
//! capped like `run_sql`'s result: at most 200 elements and about 64 KB kept,
//! the rest counted.

use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_lifecycle::engine::Engine;
use airlock_redis::resp;

/// Elements kept from a reply.
pub const ELEMENT_CAP: usize = 200;
/// Bytes of values kept from a reply.
pub const BYTE_CAP: usize = 64 * 1024;
/// The longest a command may run before the tool gives up on it.
const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// What one command returned.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RedisResult {
    /// The reply as JSON: strings, integers, null, arrays; an error reply is `error`.
    pub reply: Value,
    /// Redis's error reply (`NOPERM ...`, `WRONGTYPE ...`), if it was one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Elements and bytes left out past the caps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Commands whose arguments are never recorded (they carry credentials).
const SECRET_ARGUMENTS: &[&str] = &["AUTH", "HELLO", "ACL", "MIGRATE", "CONFIG"];

/// The command as an event keeps it: a credential-bearing command by its name only.
pub fn for_event(command: &[String]) -> String {
    let name = command.first().map(|c| c.to_ascii_uppercase()).unwrap_or_default();
    if SECRET_ARGUMENTS.contains(&name.as_str()) {
        return format!("{name} …");
    }
    command.join(" ")
}

/// Runs `command` on sandbox `key`'s Redis as its agent (waking it first).
pub async fn run(engine: &Engine, key: &str, command: &[String]) -> Result<RedisResult> {
    if command.is_empty() {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            "run_redis needs a command",
            "call run_redis with {\"command\": [\"GET\", \"key\"]}",
        ));
    }
    let (sb, _busy) = super::running(engine, key).await?;
    let dir = engine.layout.sandbox_instance(&sb.id);
    if !airlock_redis::server::configured(&dir) {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            "this task has no Redis",
            "use run_sql: this task's golden has a PostgreSQL database only",
        ));
    }
    let password = sb.dsn.as_deref().and_then(airlock_core::dsn::password).unwrap_or_default();
    let timeout = match sb.access.limits.statement_timeout_ms {
        0 => DEFAULT_TIMEOUT_MS,
        ms => ms,
    };
    let exchange = async {
        let stream = airlock_redis::server::connect(&dir).await.map_err(Unreadable::Server)?;
        let mut stream = tokio::io::BufStream::new(stream);
        match resp::call(&mut stream, &["AUTH", &sb.id, &password]).await.map_err(Unreadable::Server)? {
            resp::Reply::Status(_) => {}
            other => {
                return Err(Unreadable::Server(std::io::Error::other(format!(
                    "the task's Redis refused its credential: {other:?}"
                ))))
            }
        }
        stream.write_all(&resp::command(command)).await.map_err(Unreadable::Server)?;
        stream.flush().await.map_err(Unreadable::Server)?;
        let mut kept = Kept::default();
        // Whatever the reply is (the agent's own server shapes it), reading
        // it is the tool's answer, never a server error.
        let reply = match read(&mut stream, &mut kept, 0).await {
            Ok(reply) => reply,
            Err(e) => json!({"error": format!("the reply could not be read: {e}")}),
        };
        Ok::<_, Unreadable>((reply, kept))
    };
    let (reply, kept) = tokio::time::timeout(std::time::Duration::from_millis(timeout), exchange)
        .await
        .map_err(|_| {
            Error::new(
                ErrorCode::InvalidRequest,
                format!("the command did not finish within {timeout} ms"),
                "ask for less at a time (SCAN instead of KEYS, ranges instead of whole lists)",
            )
        })?
        .map_err(|Unreadable::Server(e)| {
            Error::new(ErrorCode::RedisFailed, format!("talking to the task's Redis: {e}"), "try again")
        })?;
    let error = reply.get("error").and_then(Value::as_str).map(str::to_owned);
    let note = (kept.elements_left > 0 || kept.bytes_left > 0).then(|| {
        format!(
            "{} more elements and {} more bytes were left out (the first {ELEMENT_CAP} elements and about {BYTE_CAP} bytes are kept)",
            kept.elements_left, kept.bytes_left
        )
    });
    Ok(RedisResult { reply, error, note })
}

/// Reaching the task's Redis failed (as opposed to reading what it answered).
enum Unreadable {
    Server(std::io::Error),
}

/// How much of a reply has been kept, and how much left out.
#[derive(Default)]
struct Kept {
    elements: usize,
    bytes: usize,
    elements_left: u64,
    bytes_left: u64,
}

/// Reads a blob of `n` bytes and its CRLF, keeping what fits in the caps.
async fn read_blob<R: AsyncBufRead + Unpin + Send>(
    stream: &mut R,
    kept: &mut Kept,
    n: i64,
) -> std::io::Result<String> {
    let n = u64::try_from(n)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed reply: a length"))?;
    let room = (BYTE_CAP.saturating_sub(kept.bytes) as u64).min(n);
    let mut value = vec![0; room as usize];
    stream.read_exact(&mut value).await?;
    kept.bytes += value.len();
    let left = n - room + 2;
    tokio::io::copy(&mut (&mut *stream).take(left), &mut tokio::io::sink()).await?;
    kept.bytes_left += n - room;
    Ok(String::from_utf8_lossy(&value).into_owned())
}

/// Reads one reply, keeping what fits in the caps and counting the rest; the
/// whole reply is read, so the connection stays in step.
fn read<'a, R: AsyncBufRead + Unpin + Send>(
    stream: &'a mut R,
    kept: &'a mut Kept,
    depth: usize,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Value>> + Send + 'a>> {
    Box::pin(async move {
        let bad = |what: &str| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("malformed reply: {what}"))
        };
        let mut head = Vec::new();
        (&mut *stream).take(64 * 1024).read_until(b'\n', &mut head).await?;
        if !head.ends_with(b"\r\n") {
            return Err(bad("a line without CRLF"));
        }
        let head = String::from_utf8_lossy(&head[..head.len() - 2]).into_owned();
        // The first character whole (a lossy line can start with a
        // replacement character, three bytes long).
        let (kind, rest) = head.split_at(head.chars().next().map_or(0, char::len_utf8));
        let length = || rest.parse::<i64>().map_err(|_| bad("a length"));
        // RESP2, and RESP3 after `HELLO 3`: a map as an array of its keys and
        // values, a set or a push as an array, a double, boolean or big number
        // as JSON's own, a verbatim string as its text, attributes dropped.
        match kind {
            "+" => Ok(json!(rest)),
            "-" => Ok(json!({"error": rest})),
            ":" => Ok(json!(rest.parse::<i64>().map_err(|_| bad("an integer"))?)),
            "_" => Ok(Value::Null),
            "#" => Ok(json!(rest == "t")),
            "," => Ok(rest
                .parse::<f64>()
                .ok()
                .and_then(|f| serde_json::Number::from_f64(f))
                .map_or(json!(rest), Value::Number)),
            "(" => Ok(json!(rest)),
            "!" | "=" => {
                let text = read_blob(stream, kept, length()?).await?;
                let text = if kind == "=" { text.get(4..).unwrap_or_default().to_owned() } else { text };
                Ok(if kind == "!" { json!({"error": text}) } else { json!(text) })
            }
            "|" => {
                // Attributes come before the reply they describe.
                for _ in 0..length()?.max(0).saturating_mul(2) {
                    read(stream, &mut Kept::default(), depth + 1).await?;
                }
                read(stream, kept, depth).await
            }
            "$" => {
                let n = length()?;
                if n < 0 {
                    return Ok(Value::Null);
                }
                let mut left = n as u64 + 2;
                let mut value = Vec::new();
                let room = BYTE_CAP.saturating_sub(kept.bytes).min(n as usize);
                if kept.elements < ELEMENT_CAP && room > 0 {
                    value.resize(room, 0);
                    stream.read_exact(&mut value).await?;
                    left -= room as u64;
                }
                kept.bytes += value.len();
                // The rest of the value, and its CRLF, read and dropped.
                let dropped = tokio::io::copy(&mut (&mut *stream).take(left), &mut tokio::io::sink()).await?;
                if dropped != left {
                    return Err(bad("a value cut short"));
                }
                kept.bytes_left += left.saturating_sub(2);
                Ok(json!(String::from_utf8_lossy(&value)))
            }
            "*" | "~" | ">" | "%" => {
                let n = if kind == "%" { length()?.saturating_mul(2) } else { length()? };
                if n < 0 {
                    return Ok(Value::Null);
                }
                if depth >= 8 {
                    return Err(bad("arrays nested too deep"));
                }
                let mut items = Vec::new();
                for _ in 0..n {
                    let item = read(stream, kept, depth + 1).await?;
                    if kept.elements < ELEMENT_CAP {
                        kept.elements += 1;
                        items.push(item);
                    } else {
                        kept.elements_left += 1;
                    }
                }
                Ok(Value::Array(items))
            }
            _ => Err(bad("an unknown reply type")),
        }
    })
}
