//! Files in and out of an executor's workspace: given in the request
//! (`--put`), written before the command runs, and named in it (`--get`),
//! read back once every process of the command is dead. Paths are relative to
//! the workspace and walked without following links
//! ([`airlock_host::storage::beneath`]); sizes are bounded both ways.

use std::path::Path;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_host::storage::beneath::{self, Found};
use airlock_host::users::Identity;

/// The most files a request puts, or gets.
pub const MAX_FILES: usize = 64;
/// The most bytes put in one request, all files together.
pub const MAX_IN: usize = 64 << 20;
/// The most bytes brought back from one run, all files together.
pub const MAX_OUT: u64 = 64 << 20;

/// A file to put in the workspace before the command runs.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FileIn {
    /// Where, relative to the workspace (`job.py`, `data/in.csv`).
    pub path: String,
    /// Its contents, base64.
    pub content_base64: String,
}

/// A file brought back from the workspace after the command ended.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileOut {
    /// Its path, as asked for.
    pub path: String,
    /// Its contents, base64; absent when it was not there or not brought back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
    /// Its size in bytes (0 when missing).
    pub bytes: u64,
    /// Why it was not brought back (not there, too large, not a regular file
    /// of the command's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

fn invalid(message: String, hint: &str) -> Error {
    Error::new(ErrorCode::InvalidRequest, message, hint)
}

/// Checks a workspace path: relative, plain components.
pub fn check_path(path: &str) -> Result<()> {
    beneath::components(Path::new(path)).map(|_| ()).map_err(|e| {
        invalid(
            format!("the file path {path:?} is not a plain path inside the workspace: {e}"),
            "name files relative to the workspace, such as job.py or out/chart.png",
        )
    })
}

/// Checks what a request puts and gets; returns the decoded files.
pub fn check(put: &[FileIn], get: &[String]) -> Result<Vec<(String, Vec<u8>)>> {
    if put.len() > MAX_FILES || get.len() > MAX_FILES {
        return Err(invalid(format!("a run takes at most {MAX_FILES} files each way"), "send fewer files"));
    }
    let mut decoded = Vec::new();
    let mut total = 0usize;
    for f in put {
        check_path(&f.path)?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(&f.content_base64).map_err(|e| {
            invalid(
                format!("the contents of {:?} are not base64: {e}", f.path),
                "encode files in standard base64",
            )
        })?;
        total += bytes.len();
        if total > MAX_IN {
            return Err(invalid(
                format!("the files put add up to more than {} MB", MAX_IN >> 20),
                "send less, or have the code read it from the database",
            ));
        }
        decoded.push((f.path.clone(), bytes));
    }
    for path in get {
        check_path(path)?;
    }
    Ok(decoded)
}

/// Writes the files into `workspace`, owned by `user`.
pub fn put(workspace: &Path, files: &[(String, Vec<u8>)], user: &Identity) -> Result<()> {
    for (path, bytes) in files {
        beneath::write(workspace, Path::new(path), bytes, (user.uid, user.gid)).map_err(|e| {
            invalid(format!("{path:?} could not be put in the workspace: {e}"), "name another path")
        })?;
    }
    Ok(())
}

/// Reads the files asked for from `workspace`; each must be the command's own
/// (`user`'s) regular file; together at most [`MAX_OUT`] bytes.
pub fn get(workspace: &Path, paths: &[String], user: &Identity) -> Vec<FileOut> {
    let mut left = MAX_OUT;
    paths
        .iter()
        .map(|path| {
            let missing = |why: String, bytes: u64| FileOut {
                path: path.clone(),
                content_base64: None,
                bytes,
                missing: Some(why),
            };
            match beneath::read(workspace, Path::new(path), left, user.uid) {
                Ok(Found::Bytes(b)) => {
                    left -= b.len() as u64;
                    FileOut {
                        path: path.clone(),
                        bytes: b.len() as u64,
                        content_base64: Some(base64::engine::general_purpose::STANDARD.encode(&b)),
                        missing: None,
                    }
                }
                Ok(Found::Missing) => missing("the command left no file there".into(), 0),
                Ok(Found::TooLarge(n)) => missing(
                    format!("{n} bytes, over what is left of the {} MB a run brings back", MAX_OUT >> 20),
                    n,
                ),
                Err(e) => missing(e.to_string(), 0),
            }
        })
        .collect()
}
