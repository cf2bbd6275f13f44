//! A golden's Redis part: one RDB file per generation (`redis/dump.rdb` beside
//! `pgdata/`), built from a file of Redis commands or taken from an RDB file,
//! loaded by a contained `redis-server` of the build's own that checks it and
//! says what it holds.

use std::path::Path;

use crate::resp::Reply;
use crate::server::{self, Admin, Settings};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::InstanceDir;
use airlock_core::records::redis::{redact, RedisPart, RedisSource};
use airlock_host::users::Identity;

/// A Redis URL's parts.
struct Live {
    tls: bool,
    host: String,
    port: u16,
    user: Option<String>,
    password: Option<String>,
    cacert: Option<String>,
}

fn parse_url(url: &str) -> Result<Live> {
    let invalid = || {
        Error::new(
            ErrorCode::InvalidRequest,
            format!("{} is not a Redis URL", redact(url)),
            "give redis://[user:password@]host[:port], or rediss://... for TLS (?cacert=FILE to verify it)",
        )
    };
    let (tls, rest) = match url.split_once("://") {
        Some(("redis", rest)) => (false, rest),
        Some(("rediss", rest)) => (true, rest),
        _ => return Err(invalid()),
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let rest = rest.trim_end_matches('/').split('/').next().unwrap_or_default();
    let (auth, address) = match rest.rsplit_once('@') {
        Some((auth, address)) => (Some(auth), address),
        None => (None, rest),
    };
    let decode =
        |s: &str| form_urlencoded::parse(format!("x={s}").as_bytes()).next().map(|(_, v)| v.into_owned());
    let (user, password) = match auth.map(|a| a.split_once(':').unwrap_or(("", a))) {
        Some((user, password)) => {
            (Some(decode(user).unwrap_or_default()).filter(|u| !u.is_empty()), decode(password))
        }
        None => (None, None),
    };
    let (host, port) = match address.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || address.starts_with('[') => {
            (host.trim_matches(['[', ']']).to_owned(), port.parse().map_err(|_| invalid())?)
        }
        _ => (address.trim_matches(['[', ']']).to_owned(), 6379),
    };
    if host.is_empty() || host.starts_with('-') {
        return Err(invalid());
    }
    let cacert =
        form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "cacert").map(|(_, v)| v.into_owned());
    Ok(Live { tls, host, port, user, password, cacert })
}

/// Takes an RDB snapshot of the live Redis at `url` into `into` with
/// `redis-cli --rdb` (the password in its environment, never on a command
/// line), within ten minutes.
async fn snapshot(url: &str, into: &Path) -> Result<()> {
    let live = parse_url(url)?;
    let mut cmd = tokio::process::Command::new("redis-cli");
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(["-h", &live.host, "-p", &live.port.to_string(), "--no-auth-warning"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if live.tls {
        cmd.arg("--tls");
    }
    if let Some(ca) = &live.cacert {
        cmd.arg("--cacert").arg(ca);
    }
    if let Some(user) = &live.user {
        cmd.args(["--user", user]);
    }
    if let Some(password) = &live.password {
        cmd.env("REDISCLI_AUTH", password);
    }
    cmd.arg("--rdb").arg(into);
    let failed = |why: String| {
        Error::new(
            ErrorCode::SourceFailed,
            format!("could not snapshot {}: {}", redact(url), why.trim()),
            "check the URL, its user and password, and that the user may run SYNC (replicas need it)",
        )
    };
    let out = tokio::time::timeout(std::time::Duration::from_secs(600), cmd.output())
        .await
        .map_err(|_| failed("no snapshot within 10 minutes".into()))?
        .map_err(|e| failed(format!("redis-cli: {e}")))?;
    if !out.status.success() || !into.is_file() {
        let said =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let said = match &live.password {
            Some(p) if !p.is_empty() => said.replace(p.as_str(), "***"),
            _ => said,
        };
        return Err(failed(said));
    }
    Ok(())
}

/// The name the build's loader authenticates as (the agent's rules apply).
const LOADER: &str = "loader";
/// Commands sent before their replies are read.
const BATCH: usize = 512;
/// How long a batch's replies may take (a blocking command never answers).
const BATCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Builds the Redis part of the generation being made in `dir` from `source`,
/// with a server running as `user` in `cgroups`, at most `max_memory` bytes
/// (a sandbox's Redis ceiling: no fork could hold more). A promotion passes
/// the sandbox's saved RDB file, opened (`promoted`).
pub async fn build(
    dir: &InstanceDir,
    source: &RedisSource,
    promoted: Option<std::fs::File>,
    (user, cgroups): (&Identity, &[std::ffi::CString]),
    max_memory: u64,
    masking: Option<&dyn crate::masking::ValueMask>,
) -> Result<RedisPart> {
    if let Some(path) = source.path().filter(|p| !p.is_absolute()) {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("{} is not an absolute path", path.display()),
            "give the Redis seed or RDB file as an absolute path",
        ));
    }
    let opened = match promoted {
        Some(file) => Some(file),
        None => source.path().map(airlock_host::storage::tree::open_request_file).transpose()?,
    };
    let data = dir.redis_dir();
    airlock_host::storage::tree::private_dir(&data)?;
    match (source, &opened) {
        (RedisSource::Rdb { .. } | RedisSource::Promoted { .. }, Some(opened)) => {
            let mut from = opened.try_clone()?;
            let mut to = std::fs::File::create(data.join("dump.rdb"))?;
            std::io::copy(&mut from, &mut to).map_err(|e| Error::io("copying the RDB file", &e))?;
        }
        (RedisSource::Url { url }, _) => snapshot(url, &data.join("dump.rdb")).await?,
        _ => {}
    }
    if data.join("dump.rdb").exists() {
        user.own(&data.join("dump.rdb"))?;
    }
    user.own(&data)?;
    // The build's PostgreSQL is stopped and its socket directory gone: the
    // build's Redis gets one of its own.
    airlock_host::storage::tree::private_dir(&dir.socket_dir())?;
    user.own(&dir.socket_dir())?;
    let (admin_password, loader_password) =
        (airlock_core::secret::password(), airlock_core::secret::password());
    let settings = Settings {
        max_memory,
        admin_password: &admin_password,
        user: Some((LOADER, &loader_password)),
        read_only: false,
    };
    server::write_config(dir, &settings)?;
    let built = async {
        let pid = server::start(dir, (user, None), cgroups, None).await.map_err(|e| match source {
            RedisSource::Rdb { path } => Error::new(
                ErrorCode::SeedFailed,
                format!("redis-server could not load {}: {}", path.display(), e.message),
                "give an RDB file written by this Redis version or an older one",
            ),
            RedisSource::Url { url } => Error::new(
                ErrorCode::SourceFailed,
                format!("redis-server could not load the snapshot of {}: {}", redact(url), e.message),
                "the source may run a newer Redis than this host's",
            ),
            _ => e,
        })?;
        let result = async {
            if let (RedisSource::Seed { path }, Some(opened)) = (source, opened) {
                load_commands(dir, path, opened, &loader_password).await?;
            }
            let mut admin = Admin::connect(dir).await?;
            // Masked before the save below writes the only RDB the generation keeps.
            let masked = match masking {
                Some(m) => crate::masking::apply(&mut admin, m).await?,
                None => Vec::new(),
            };
            let (keys, memory_bytes) = admin.describe().await?;
            // A data set past a fork's ceiling would refuse every fork's first write.
            if memory_bytes > max_memory {
                return Err(Error::new(
                    ErrorCode::SeedFailed,
                    format!(
                        "the Redis part takes {memory_bytes} bytes once loaded, more than a sandbox's Redis may hold ({max_memory})"
                    ),
                    "load less, or give sandboxes more memory (`airlock serve --memory-limit`)",
                ));
            }
            admin.save().await?;
            Ok::<_, Error>((keys, memory_bytes, masked))
        }
        .await;
        server::kill(pid).await;
        result
    }
    .await;
    for leftover in [dir.redis_conf(), dir.redis_admin(), dir.redis_log()] {
        let _ = std::fs::remove_file(leftover);
    }
    let _ = std::fs::remove_dir_all(dir.socket_dir());
    let (keys, memory_bytes, masked) = built?;
    let rdb_bytes = std::fs::metadata(data.join("dump.rdb")).map(|m| m.len()).unwrap_or(0);
    Ok(RedisPart { source: source.redacted(), keys, memory_bytes, rdb_bytes, masked })
}

/// Sends the commands of `file` (opened as `opened`) as the loader, in
/// batches; the first error fails the build, naming the file and line.
async fn load_commands(dir: &InstanceDir, path: &Path, opened: std::fs::File, password: &str) -> Result<()> {
    use tokio::io::AsyncBufReadExt;
    let failed = |line: usize, why: String| {
        Error::new(
            ErrorCode::SeedFailed,
            format!("{}:{line}: {why}", path.display()),
            format!("fix {} and run the command again; nothing was kept", path.display()),
        )
    };
    let stream = server::connect(dir).await?;
    let mut stream = tokio::io::BufStream::new(stream);
    match crate::resp::call(&mut stream, &["AUTH", LOADER, password]).await? {
        Reply::Status(_) => {}
        other => return Err(Error::internal(format!("redis-server refused the loader: {other:?}"))),
    }
    let mut lines = tokio::io::BufReader::new(tokio::fs::File::from_std(opened)).lines();
    let mut number = 0;
    let mut pending: Vec<usize> = Vec::new();
    loop {
        let line = lines.next_line().await.map_err(|e| failed(number + 1, e.to_string()))?;
        let done = line.is_none();
        if let Some(line) = line {
            number += 1;
            let args = split_args(&line).map_err(|why| failed(number, why))?;
            if !args.is_empty() {
                use tokio::io::AsyncWriteExt;
                stream.write_all(&crate::resp::command(&args)).await?;
                pending.push(number);
            }
        }
        if pending.len() >= BATCH || (done && !pending.is_empty()) {
            use tokio::io::AsyncWriteExt;
            stream.flush().await?;
            for line in pending.drain(..) {
                let reply =
                    tokio::time::timeout(BATCH_TIMEOUT, crate::resp::read(&mut stream)).await.map_err(
                        |_| failed(line, format!("no reply within {BATCH_TIMEOUT:?} (a blocking command?)")),
                    )?;
                if let Reply::Error(e) = reply? {
                    return Err(failed(line, e));
                }
            }
        }
        if done {
            return Ok(());
        }
    }
}

/// Splits a line into arguments as `redis-cli` does: words separated by
/// spaces, `"double quoted"` with `\n`, `\r`, `\t`, `\"`, `\\` and `\xHH`
/// escapes, `'single quoted'` with `\'`. A blank line or one starting with
/// `#` has none.
pub fn split_args(line: &str) -> std::result::Result<Vec<Vec<u8>>, String> {
    let mut args = Vec::new();
    let bytes = line.trim_end_matches('\r').as_bytes();
    let mut i = 0;
    if line.trim_start().starts_with('#') {
        return Ok(args);
    }
    while i < bytes.len() {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == bytes.len() {
            break;
        }
        let mut arg = Vec::new();
        match bytes[i] {
            b'"' => {
                i += 1;
                loop {
                    let Some(&c) = bytes.get(i) else { return Err("unbalanced quotes".into()) };
                    i += 1;
                    match c {
                        b'"' => break,
                        b'\\' => {
                            let Some(&e) = bytes.get(i) else { return Err("unbalanced quotes".into()) };
                            i += 1;
                            match e {
                                b'n' => arg.push(b'\n'),
                                b'r' => arg.push(b'\r'),
                                b't' => arg.push(b'\t'),
                                b'b' => arg.push(8),
                                b'a' => arg.push(7),
                                b'x' => {
                                    let hex = bytes.get(i..i + 2).and_then(|h| std::str::from_utf8(h).ok());
                                    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                                        Some(b) => {
                                            arg.push(b);
                                            i += 2;
                                        }
                                        None => arg.push(b'x'),
                                    }
                                }
                                other => arg.push(other),
                            }
                        }
                        other => arg.push(other),
                    }
                }
            }
            b'\'' => {
                i += 1;
                loop {
                    let Some(&c) = bytes.get(i) else { return Err("unbalanced quotes".into()) };
                    i += 1;
                    match c {
                        b'\'' => break,
                        b'\\' if bytes.get(i) == Some(&b'\'') => {
                            arg.push(b'\'');
                            i += 1;
                        }
                        other => arg.push(other),
                    }
                }
            }
            _ => {
                while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
                    arg.push(bytes[i]);
                    i += 1;
                }
                args.push(arg);
                continue;
            }
        }
        if i < bytes.len() && !bytes[i].is_ascii_whitespace() {
            return Err("a closing quote must be followed by a space".into());
        }
        args.push(arg);
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::split_args;

    #[test]
    fn lines_split_as_redis_cli_splits_them() {
        let s = |l: &str| {
            split_args(l).unwrap().into_iter().map(|a| String::from_utf8(a).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(s("SET k v"), ["SET", "k", "v"]);
        assert_eq!(
            s(r#"HSET "cart:1" item "two words\n" 'it\'s'"#),
            ["HSET", "cart:1", "item", "two words\n", "it's"]
        );
        assert_eq!(s(r#"SET k "\x41\x42""#), ["SET", "k", "AB"]);
        assert!(s("   ").is_empty());
        assert!(s("# a comment").is_empty());
        assert!(split_args(r#"SET k "open"#).is_err());
        assert!(split_args(r#"SET k "a"b"#).is_err());
    }
}
