//! A summary of a Redis key space for a model: keys per database, and the
//! kinds of keys by prefix and type, sampled with `SCAN` (never `KEYS`, which
//! would hold the server for as long as it takes).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::resp::Reply;
use crate::server::Admin;
use airlock_core::error::Result;

/// Keys sampled per database at most.
const SAMPLE: usize = 2000;
/// Prefix groups listed at most.
const GROUPS: usize = 30;

/// What a Redis holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KeySpace {
    /// Keys per database number (only databases with keys).
    pub databases: BTreeMap<u32, u64>,
    /// Key groups seen in the sample: prefix (up to the first `:`), type, count.
    pub groups: Vec<KeyGroup>,
    /// Keys sampled to find the groups.
    pub sampled: u64,
}

/// One group of keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KeyGroup {
    /// The database number.
    pub db: u32,
    /// `cart:*`, or the key itself when it has no `:`.
    pub pattern: String,
    /// `string`, `hash`, `list`, `set`, `zset` or `stream`.
    pub kind: String,
    /// Keys of the sample in the group.
    pub count: u64,
}

/// Reads the key space of the server `admin` is connected to.
pub async fn read(admin: &mut Admin) -> Result<KeySpace> {
    let info = admin.call(&["INFO", "keyspace"]).await?.text().unwrap_or_default();
    let mut space = KeySpace::default();
    for line in info.lines() {
        let Some((db, rest)) = line.strip_prefix("db").and_then(|l| l.split_once(':')) else { continue };
        let keys = rest.split(',').find_map(|kv| kv.strip_prefix("keys=")).and_then(|k| k.parse().ok());
        if let (Ok(db), Some(keys)) = (db.parse::<u32>(), keys) {
            space.databases.insert(db, keys);
        }
    }
    let mut groups: BTreeMap<(u32, String, String), u64> = BTreeMap::new();
    let databases: Vec<u32> = space.databases.keys().copied().collect();
    for db in databases {
        admin.call(&["SELECT", &db.to_string()]).await?;
        let mut cursor = "0".to_owned();
        let mut seen = 0;
        loop {
            let reply = admin.call(&["SCAN", &cursor, "COUNT", "500"]).await?;
            let Reply::Array(Some(parts)) = reply else { break };
            let (Some(next), Some(Reply::Array(Some(keys)))) =
                (parts.first().and_then(Reply::text), parts.get(1))
            else {
                break;
            };
            for key in keys.iter().filter_map(Reply::text).take(SAMPLE - seen) {
                let kind = admin.call(&["TYPE", &key]).await?.text().unwrap_or_default();
                let pattern = match key.split_once(':') {
                    Some((prefix, _)) => format!("{prefix}:*"),
                    None => key.clone(),
                };
                *groups.entry((db, pattern, kind)).or_default() += 1;
                seen += 1;
            }
            cursor = next;
            if cursor == "0" || seen >= SAMPLE {
                break;
            }
        }
        space.sampled += seen as u64;
    }
    admin.call(&["SELECT", "0"]).await?;
    let mut groups: Vec<KeyGroup> = groups
        .into_iter()
        .map(|((db, pattern, kind), count)| KeyGroup { db, pattern, kind, count })
        .collect();
    groups.sort_by(|a, b| b.count.cmp(&a.count).then(a.pattern.cmp(&b.pattern)));
    groups.truncate(GROUPS);
    space.groups = groups;
    Ok(space)
}

impl KeySpace {
    /// Keys over every database.
    pub fn keys(&self) -> u64 {
        self.databases.values().sum()
    }

    /// The summary as lines a model reads.
    pub fn text(&self) -> String {
        let mut out = vec![format!(
            "Redis: {} keys ({})",
            self.keys(),
            self.databases.iter().map(|(db, n)| format!("db{db} {n}")).collect::<Vec<_>>().join(", ")
        )];
        if !self.groups.is_empty() {
            out.push(format!("  key groups in a sample of {} keys:", self.sampled));
            for g in &self.groups {
                out.push(format!("    db{} {} ({}): {}", g.db, g.pattern, g.kind, g.count));
            }
        }
        out.join("\n")
    }
}
