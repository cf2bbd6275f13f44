//! Masking a golden's Redis part as it is built: the string values, or the
//! named hash fields, of keys matching a rule's pattern are replaced in the
//! build's own redis-server before it saves, so the RDB it writes holds
//! masked values only. Then every key name, hash field and value of every
//! type is searched for the source values replaced, whole or inside: one
//! left is a leak, and the build fails.
//!
//! What a value becomes is decided above the engines ([`ValueMask`]), with
//! the golden's key; this module only walks the keys.

use std::collections::HashSet;

use crate::resp::Reply;
use crate::server::Admin;
use airlock_core::error::{Error, ErrorCode, Result};

/// What a Redis part's masking is asked to do.
pub trait ValueMask: Send + Sync {
    /// Each rule's key pattern (as `SCAN MATCH` takes it) and hash fields
    /// (none: the key's string value).
    fn rules(&self) -> Vec<(String, Vec<String>)>;
    /// What rule `rule` makes of `value`.
    fn mask(&self, rule: usize, value: &str) -> Masked;
    /// Rule `rule` as the report names it (`user:* [email]: email`).
    fn describe(&self, rule: usize) -> String;
}

/// What becomes of one value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Masked {
    /// Replaced by this.
    Replace(String),
    /// Removed (the key, or the hash field).
    Remove,
    /// Kept: nothing in it to hide.
    Keep,
}

/// Masks the server's data; returns a line per rule for the report.
pub async fn apply(admin: &mut Admin, masking: &dyn ValueMask) -> Result<Vec<String>> {
    let databases = databases(admin).await?;
    let rules = masking.rules();
    let mut counts = vec![(0u64, 0u64); rules.len()];
    let mut replaced: HashSet<Vec<u8>> = HashSet::new();
    for db in &databases {
        admin.call(&["SELECT", &db.to_string()]).await?;
        for (i, (pattern, fields)) in rules.iter().enumerate() {
            for key in scan(admin, Some(pattern)).await? {
                let kind = admin.call(&[b"TYPE".as_slice(), &key]).await?.text().unwrap_or_default();
                match (kind.as_str(), fields.is_empty()) {
                    ("string", true) => {
                        let Reply::Bulk(Some(value)) = admin.call(&[b"GET".as_slice(), &key]).await? else {
                            continue;
                        };
                        let text = String::from_utf8_lossy(&value).into_owned();
                        let reply = match masking.mask(i, &text) {
                            Masked::Replace(m) => {
                                admin.call(&[b"SET".as_slice(), &key, m.as_bytes(), b"KEEPTTL"]).await?
                            }
                            Masked::Remove => admin.call(&[b"DEL".as_slice(), &key]).await?,
                            Masked::Keep => continue,
                        };
                        refused(reply)?;
                        replaced.insert(value);
                        counts[i].0 += 1;
                    }
                    ("hash", false) => {
                        for field in fields {
                            let got = admin.call(&[b"HGET".as_slice(), &key, field.as_bytes()]).await?;
                            let Reply::Bulk(Some(value)) = got else { continue };
                            let text = String::from_utf8_lossy(&value).into_owned();
                            let reply = match masking.mask(i, &text) {
                                Masked::Replace(m) => {
                                    admin
                                        .call(&[b"HSET".as_slice(), &key, field.as_bytes(), m.as_bytes()])
                                        .await?
                                }
                                Masked::Remove => {
                                    admin.call(&[b"HDEL".as_slice(), &key, field.as_bytes()]).await?
                                }
                                Masked::Keep => continue,
                            };
                            refused(reply)?;
                            replaced.insert(value);
                            counts[i].0 += 1;
                        }
                    }
                    _ => counts[i].1 += 1,
                }
            }
        }
    }
    // The check: no key name, field or value of any type holds a value
    // masking replaced, whole or inside, whatever its case.
    let needles: Vec<String> = replaced
        .iter()
        .map(|v| String::from_utf8_lossy(v).to_lowercase())
        .filter(|v| {
            v.chars().count() >= 8
                || v.chars().count() >= 6 && v.contains(['@', ' '])
                || v.chars().count() >= 6 && v.contains(|c: char| c.is_ascii_digit())
        })
        .collect();
    let mut leaks = 0u64;
    if !needles.is_empty() {
        let finder = aho_corasick::AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(&needles)
            .map_err(|e| Error::internal(format!("building the Redis leak search failed: {e}")))?;
        let holds = |bytes: &[u8]| {
            let text = String::from_utf8_lossy(bytes);
            match text.is_ascii() {
                true => finder.is_match(text.as_ref()),
                false => finder.is_match(&text.to_lowercase()),
            }
        };
        for db in &databases {
            admin.call(&["SELECT", &db.to_string()]).await?;
            for key in scan(admin, None).await? {
                let kind = admin.call(&[b"TYPE".as_slice(), &key]).await?.text().unwrap_or_default();
                let read: Option<Vec<&[u8]>> = match kind.as_str() {
                    "string" => Some(vec![b"GET".as_slice()]),
                    "hash" => Some(vec![b"HGETALL".as_slice()]),
                    "list" => Some(vec![b"LRANGE".as_slice(), b"0", b"-1"]),
                    "set" => Some(vec![b"SMEMBERS".as_slice()]),
                    "zset" => Some(vec![b"ZRANGE".as_slice(), b"0", b"-1"]),
                    "stream" => Some(vec![b"XRANGE".as_slice(), b"-", b"+"]),
                    _ => None,
                };
                let mut values = vec![key.clone()];
                if let Some(mut args) = read {
                    args.insert(1, &key);
                    flatten(admin.call(&args).await?, &mut values);
                }
                if values.iter().any(|v| holds(v)) {
                    leaks += 1;
                }
            }
        }
    }
    admin.call(&["SELECT", "0"]).await?;
    if leaks > 0 {
        return Err(Error::new(
            ErrorCode::MaskLeak,
            format!("the leak check found {leaks} keys of the Redis part holding a source value masking replaced (in their name, a field or a value)"),
            "mask those keys too (a [[redis]] rule whose pattern reaches them, or leave them out of the source); nothing was built",
        ));
    }
    Ok(counts
        .iter()
        .enumerate()
        .map(|(i, (masked, other))| {
            let mut line = format!("{}: {masked} values masked", masking.describe(i));
            if *other > 0 {
                line.push_str(&format!(", {other} keys of another type left as they are"));
            }
            line
        })
        .collect())
}

/// Every bulk string in a reply, however nested (a stream's entries).
fn flatten(reply: Reply, out: &mut Vec<Vec<u8>>) {
    match reply {
        Reply::Bulk(Some(b)) => out.push(b),
        Reply::Array(Some(items)) => items.into_iter().for_each(|r| flatten(r, out)),
        Reply::Status(s) | Reply::Error(s) => out.push(s.into_bytes()),
        _ => {}
    }
}

fn refused(reply: Reply) -> Result<()> {
    match reply {
        Reply::Error(e) => Err(Error::internal(format!("redis-server refused a masked value: {e}"))),
        _ => Ok(()),
    }
}

/// The databases that hold keys.
async fn databases(admin: &mut Admin) -> Result<Vec<u32>> {
    let info = admin.call(&["INFO", "keyspace"]).await?.text().unwrap_or_default();
    Ok(info
        .lines()
        .filter_map(|l| {
            l.strip_prefix("db").and_then(|r| r.split_once(':')).and_then(|(n, _)| n.parse().ok())
        })
        .collect())
}

/// Every key of the selected database (matching `pattern`, if given).
async fn scan(admin: &mut Admin, pattern: Option<&str>) -> Result<Vec<Vec<u8>>> {
    let mut keys = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let mut args = vec!["SCAN".to_owned(), cursor.clone(), "COUNT".into(), "1000".into()];
        if let Some(p) = pattern {
            args.extend(["MATCH".into(), p.to_owned()]);
        }
        let Reply::Array(Some(mut parts)) = admin.call(&args).await? else {
            return Err(Error::internal("redis-server answered SCAN with something else"));
        };
        if parts.len() != 2 {
            return Err(Error::internal("redis-server answered SCAN with something else"));
        }
        if let Reply::Array(Some(found)) = parts.pop().expect("two parts") {
            keys.extend(found.into_iter().filter_map(|r| match r {
                Reply::Bulk(Some(k)) => Some(k),
                _ => None,
            }));
        }
        cursor = match parts.pop() {
            Some(Reply::Bulk(Some(c))) => String::from_utf8_lossy(&c).into_owned(),
            _ => return Err(Error::internal("redis-server answered SCAN without a cursor")),
        };
        if cursor == "0" {
            break;
        }
    }
    keys.sort();
    keys.dedup();
    Ok(keys)
}
