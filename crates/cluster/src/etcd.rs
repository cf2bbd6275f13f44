//! etcd's v3 API through its JSON gateway (`/v3/kv/...`, `/v3/lease/...`),
//! which every etcd since 3.4 serves on its client port.
//!
//! The few calls a node makes (a lease, its renewal, puts, ranges, one
//! compare-and-put) do not need a gRPC stack: each is one small JSON request
//! on a connection of its own, tried on each member in turn, so a member down
//! or without a leader is passed over.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::http::{exchange, Ask};
use airlock_core::error::{Error, ErrorCode, Result};

/// A client of one etcd cluster.
pub struct Etcd {
    /// `host:port` of each member given.
    members: Vec<String>,
    /// The member that answered last, tried first.
    preferred: AtomicUsize,
    /// How long one call may take on one member.
    timeout: Duration,
}

impl Etcd {
    /// A client of the members in `urls` (`http://HOST:PORT`, comma-separated).
    pub fn new(urls: &str, timeout: Duration) -> Result<Etcd> {
        let mut members = Vec::new();
        for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            let Some(rest) = url.strip_prefix("http://") else {
                return Err(Error::new(
                    ErrorCode::InvalidArguments,
                    format!("--cluster {url:?} is not an http:// etcd client URL"),
                    "give etcd's client URLs, such as http://10.0.0.1:2379,http://10.0.0.2:2379 (etcd over TLS is not supported yet: reach it over a private network)",
                ));
            };
            let host = rest.trim_end_matches('/');
            if host.is_empty() || host.contains('/') {
                return Err(Error::new(
                    ErrorCode::InvalidArguments,
                    format!("--cluster {url:?} is not HOST:PORT"),
                    "give etcd's client URLs, such as http://10.0.0.1:2379",
                ));
            }
            members.push(host.to_owned());
        }
        if members.is_empty() {
            return Err(Error::new(
                ErrorCode::InvalidArguments,
                "--cluster names no etcd member",
                "give etcd's client URLs, such as http://10.0.0.1:2379",
            ));
        }
        Ok(Etcd { members, preferred: AtomicUsize::new(0), timeout })
    }

    /// One call, on the member that answered last and then on each other.
    async fn call(&self, path: &str, body: Value) -> Result<Value> {
        let first = self.preferred.load(Ordering::Relaxed);
        let mut last = None;
        for i in 0..self.members.len() {
            let at = (first + i) % self.members.len();
            let member = &self.members[at];
            let connect = tokio::time::timeout(self.timeout, tokio::net::TcpStream::connect(member)).await;
            let stream = match connect {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    last = Some(format!("{member}: {e}"));
                    continue;
                }
                Err(_) => {
                    last = Some(format!("{member}: no connection within {:?}", self.timeout));
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let ask = Ask {
                method: "POST",
                path,
                content_type: Some("application/json"),
                body: body.to_string().into(),
            };
            match exchange(stream, ask, self.timeout, &format!("etcd member {member}")).await {
                Ok(answer) if answer.status == 200 => {
                    self.preferred.store(at, Ordering::Relaxed);
                    return serde_json::from_slice(&answer.body)
                        .map_err(|e| Error::internal(format!("etcd answered what is not JSON: {e}")));
                }
                Ok(answer) => {
                    last = Some(format!(
                        "{member}: {} {}",
                        answer.status,
                        String::from_utf8_lossy(&answer.body).trim()
                    ))
                }
                Err(e) => last = Some(e.message),
            }
        }
        Err(Error::new(
            ErrorCode::ClusterUnavailable,
            format!("no etcd member answered ({})", last.unwrap_or_default()),
            "check that etcd runs and that this node reaches it (--cluster)",
        ))
    }

    /// A new lease that lives `ttl` unless renewed; its id.
    pub async fn grant(&self, ttl: Duration) -> Result<i64> {
        let answer = self.call("/v3/lease/grant", json!({ "TTL": ttl.as_secs().max(1) })).await?;
        int(&answer["ID"])
            .filter(|id| *id != 0)
            .ok_or_else(|| Error::internal(format!("etcd granted no lease: {answer}")))
    }

    /// Renews a lease; the seconds it now has left, 0 when it has expired.
    pub async fn keep_alive(&self, lease: i64) -> Result<i64> {
        let answer = self.call("/v3/lease/keepalive", json!({ "ID": lease.to_string() })).await?;
        Ok(int(&answer["result"]["TTL"]).unwrap_or(0))
    }

    /// Sets `key`, bound to `lease` when given (it goes when the lease does).
    pub async fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> Result<()> {
        let mut put = json!({ "key": B64.encode(key), "value": B64.encode(value) });
        if let Some(lease) = lease {
            put["lease"] = lease.to_string().into();
        }
        self.call("/v3/kv/put", put).await.map(drop)
    }

    /// Sets `key` only if it does not exist (bound to `lease` when given);
    /// whether it was set.
    pub async fn put_if_absent(&self, key: &str, value: &[u8], lease: Option<i64>) -> Result<bool> {
        let k = B64.encode(key);
        let mut put = json!({ "key": k, "value": B64.encode(value) });
        if let Some(lease) = lease {
            put["lease"] = lease.to_string().into();
        }
        let txn = json!({
            "compare": [{ "key": k, "target": "CREATE", "create_revision": "0", "result": "EQUAL" }],
            "success": [{ "request_put": put }],
        });
        Ok(self.call("/v3/kv/txn", txn).await?["succeeded"].as_bool().unwrap_or(false))
    }

    /// The value of `key`, if it is set.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let answer = self.call("/v3/kv/range", json!({ "key": B64.encode(key) })).await?;
        Ok(pairs(&answer).into_iter().next().map(|(_, v)| v))
    }

    /// Every key under `prefix`, with its value, in key order.
    pub async fn under(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let answer = self
            .call(
                "/v3/kv/range",
                json!({ "key": B64.encode(prefix), "range_end": B64.encode(range_end(prefix)) }),
            )
            .await?;
        Ok(pairs(&answer))
    }

    /// Removes `key` (nothing when it is not set).
    pub async fn delete(&self, key: &str) -> Result<()> {
        self.call("/v3/kv/deleterange", json!({ "key": B64.encode(key) })).await.map(drop)
    }
}

/// The first key past every key that starts with `prefix`.
fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The gateway writes 64-bit integers as strings.
fn int(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_str()?.parse().ok())
}

/// The key-value pairs of a range answer.
fn pairs(answer: &Value) -> Vec<(String, Vec<u8>)> {
    let Some(kvs) = answer["kvs"].as_array() else { return Vec::new() };
    kvs.iter()
        .filter_map(|kv| {
            let key = B64.decode(kv["key"].as_str()?).ok()?;
            let value = B64.decode(kv["value"].as_str().unwrap_or("")).ok()?;
            Some((String::from_utf8(key).ok()?, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prefix_range_ends_past_every_key_under_it() {
        assert_eq!(super::range_end("/a/"), b"/a0".to_vec());
        assert_eq!(super::range_end("a\u{7f}"), b"a\x80".to_vec());
    }
}
