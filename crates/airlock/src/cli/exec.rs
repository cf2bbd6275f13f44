//! `airlock exec`: a command in a sandbox's boundary, or in a disposable
//! executor attached to a grant, with files in (`--put`) and out (`--get`).

use base64::Engine as _;
use hyper::Method;

use super::output;
use super::Cli;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_lifecycle::executor::files::FileIn;
use airlock_lifecycle::sandbox::{ExecRequest, ExecResult};
use airlock_listen::client::encode;

/// `LOCAL[:PATH]` or `PATH[:LOCAL]`: the first part, and the second or the
/// first's file name.
fn pair(spec: &str) -> (String, String) {
    match spec.split_once(':') {
        Some((a, b)) if !b.is_empty() => (a.to_owned(), b.to_owned()),
        _ => {
            let name = std::path::Path::new(spec).file_name().map(|n| n.to_string_lossy().into_owned());
            (spec.to_owned(), name.unwrap_or_else(|| spec.to_owned()))
        }
    }
}

pub(super) async fn run(
    cli: &Cli,
    id: Option<&str>,
    grant: Option<&str>,
    timeout: &str,
    put: &[String],
    get: &[String],
    command: &[String],
) -> Result<i32> {
    let timeout = humantime::parse_duration(timeout).map_err(|e| {
        Error::new(
            ErrorCode::InvalidRequest,
            format!("invalid timeout {timeout:?}: {e}"),
            "give a duration such as 30s or 5m",
        )
    })?;
    let mut files = Vec::new();
    for spec in put {
        let (local, path) = pair(spec);
        let bytes = std::fs::read(&local).map_err(|e| {
            Error::new(ErrorCode::FileUnreadable, format!("cannot read {local}: {e}"), "check the --put path")
        })?;
        files.push(FileIn { path, content_base64: base64::engine::general_purpose::STANDARD.encode(bytes) });
    }
    // Where each file brought back goes, by its path inside.
    let wanted: Vec<(String, String)> = get.iter().map(|spec| pair(spec)).collect();
    let req = ExecRequest {
        argv: command.to_vec(),
        timeout_seconds: Some(timeout.as_secs().max(1)),
        files,
        get: wanted.iter().map(|(inside, _)| inside.clone()).collect(),
        ..Default::default()
    };
    let path = match (id, grant) {
        (_, Some(g)) => format!("/v1/grants/{}/exec", encode(g)),
        (Some(id), None) => format!("/v1/sandboxes/{}/exec", encode(id)),
        (None, None) => unreachable!("clap requires one"),
    };
    let result: ExecResult = cli.client()?.call(Method::POST, &path, Some(&req)).await?;
    let mut missing = Vec::new();
    for (file, (_, local)) in result.files.iter().zip(&wanted) {
        match &file.content_base64 {
            Some(text) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| Error::internal(format!("a file came back garbled: {e}")))?;
                std::fs::write(local, bytes).map_err(|e| {
                    Error::new(
                        ErrorCode::FileUnreadable,
                        format!("cannot write {local}: {e}"),
                        "check the --get path",
                    )
                })?;
            }
            None => missing.push(format!(
                "airlock: {} was not brought back: {}",
                file.path,
                file.missing.as_deref().unwrap_or("not there")
            )),
        }
    }
    if cli.json {
        output::print(true, &result, String::new);
    } else {
        use std::io::Write;
        output::write_stdout(result.stdout.as_bytes());
        let _ = std::io::stderr().write_all(result.stderr.as_bytes());
        for line in &missing {
            eprintln!("{line}");
        }
        if result.timed_out {
            eprintln!("airlock: the command was killed after {}", humantime::format_duration(timeout));
        }
    }
    // Like `timeout(1)`: 124 when the time ran out, 137 when a signal ended it.
    Ok(if result.timed_out { 124 } else { result.exit_code.unwrap_or(137) })
}
