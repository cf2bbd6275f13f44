//! What a golden's Redis part is made from, and what its manifest records of it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where a golden's Redis part comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RedisSource {
    /// A file of Redis commands, one per line, as `redis-cli` reads them.
    Seed {
        /// The file (an absolute path).
        #[schema(value_type = String)]
        path: PathBuf,
    },
    /// An RDB file, as `SAVE` or `redis-cli --rdb` writes one.
    Rdb {
        /// The file (an absolute path).
        #[schema(value_type = String)]
        path: PathBuf,
    },
    /// A promoted sandbox's Redis, saved at the promotion.
    Promoted {
        /// The sandbox.
        sandbox: String,
    },
    /// A live Redis, snapshotted the way a replica takes one (`SYNC`): its
    /// data is read, never changed. `redis://[user:password@]host[:port]`, or
    /// `rediss://` with `?cacert=FILE` to verify its certificate; shown with
    /// the password removed.
    Url {
        /// The server's URL.
        url: String,
    },
}

impl RedisSource {
    /// The file it names, if it names one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            RedisSource::Seed { path } | RedisSource::Rdb { path } => Some(path),
            RedisSource::Url { .. } | RedisSource::Promoted { .. } => None,
        }
    }

    /// The same source with any password removed, fit for manifests and output.
    pub fn redacted(&self) -> RedisSource {
        match self {
            RedisSource::Url { url } => RedisSource::Url { url: redact(url) },
            other => other.clone(),
        }
    }
}

/// A Redis URL with its password replaced by `***` (nothing touched when it has none).
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let (before_query, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let Some((auth, address)) = before_query.rsplit_once('@') else { return url.to_owned() };
    let auth = match auth.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_owned(),
    };
    let mut out = format!("{scheme}://{auth}@{address}");
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// A generation's Redis part, as its manifest records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RedisPart {
    /// Where it came from.
    pub source: RedisSource,
    /// Keys, over every database.
    pub keys: u64,
    /// Memory the data set takes once loaded (`used_memory`), in bytes.
    pub memory_bytes: u64,
    /// The RDB file's size, in bytes.
    pub rdb_bytes: u64,
    /// For a masked golden: each Redis rule and how many values it masked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked: Vec<String>,
}
