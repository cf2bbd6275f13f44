//! etcd's v3 API through its JSON gateway (`/v3/kv/...`, `/v3/lease/...`),
//! which every etcd since 3.4 serves on its client port.
//!
//! The few calls a node makes (a lease, its renewal, puts, ranges, one
//! compare-and-put) do not need a gRPC stack: each is one small JSON request
//! on a connection of its own, tried on each member in turn, so a member down
//! or without a leader is passed over.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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
    /// TLS to every member (`https://` members), or none (`http://`).
    tls: Option<tokio_rustls::TlsConnector>,
}

impl Etcd {
    /// A client of the members in `urls` (`http://HOST:PORT`, or
    /// `https://HOST:PORT` with `tls`; comma-separated).
    pub fn new(urls: &str, timeout: Duration, tls: Option<Arc<rustls::ClientConfig>>) -> Result<Etcd> {
        let mut members = Vec::new();
        let mut schemes = std::collections::BTreeSet::new();
        for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            let Some((scheme, rest)) = url.split_once("://").filter(|(s, _)| matches!(*s, "http" | "https"))
            else {
                return Err(Error::new(
                    ErrorCode::InvalidArguments,
                    format!("--cluster {url:?} is not an http:// or https:// etcd client URL"),
                    "give etcd's client URLs, such as https://10.0.0.1:2379,https://10.0.0.2:2379",
                ));
            };
            schemes.insert(scheme);
            let host = rest.trim_end_matches('/');
            if airlock_core::validate::host_of(host).is_none() {
                return Err(Error::new(
                    ErrorCode::InvalidArguments,
                    format!("--cluster {url:?} is not HOST:PORT"),
                    "give etcd's client URLs, such as https://10.0.0.1:2379",
                ));
            }
            members.push(host.to_owned());
        }
        if members.is_empty() {
            return Err(Error::new(
                ErrorCode::InvalidArguments,
                "--cluster names no etcd member",
                "give etcd's client URLs, such as https://10.0.0.1:2379",
            ));
        }
        if schemes.len() > 1 {
            return Err(Error::new(
                ErrorCode::InvalidArguments,
                "--cluster mixes http:// and https:// members",
                "reach every member the same way: https:// (with --etcd-ca) for all",
            ));
        }
        let tls = match (schemes.contains("https"), tls) {
            (true, Some(config)) => Some(tokio_rustls::TlsConnector::from(config)),
            (true, None) => {
                return Err(Error::new(
                    ErrorCode::InvalidArguments,
                    "--cluster names https:// members, and no CA to check them against was given",
                    "pass --etcd-ca with the CA that signed etcd's certificates (and --etcd-cert, --etcd-key when etcd asks for client certificates)",
                ))
            }
            (false, _) => None,
        };
        Ok(Etcd { members, preferred: AtomicUsize::new(0), timeout, tls })
    }

    /// An `exchange` on a fresh connection to `member`, over TLS when the members are `https://`.
    async fn on(&self, member: &str, ask: Ask<'_>) -> std::result::Result<crate::http::Answer, String> {
        let connect = tokio::time::timeout(self.timeout, tokio::net::TcpStream::connect(member)).await;
        let stream = match connect {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("{member}: {e}")),
            Err(_) => return Err(format!("{member}: no connection within {:?}", self.timeout)),
        };
        let _ = stream.set_nodelay(true);
        let whom = format!("etcd member {member}");
        let Some(tls) = &self.tls else {
            return exchange(stream, ask, self.timeout, &whom).await.map_err(|e| e.message);
        };
        let host = airlock_core::validate::host_of(member).unwrap_or(member).to_owned();
        let name = rustls::pki_types::ServerName::try_from(host).map_err(|e| format!("{member}: {e}"))?;
        let stream = match tokio::time::timeout(self.timeout, tls.connect(name, stream)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("{member}: TLS: {e}")),
            Err(_) => return Err(format!("{member}: no TLS handshake within {:?}", self.timeout)),
        };
        exchange(stream, ask, self.timeout, &whom).await.map_err(|e| e.message)
    }

    /// One call, on the member that answered last and then on each other.
    async fn call(&self, path: &str, body: Value) -> Result<Value> {
        let first = self.preferred.load(Ordering::Relaxed);
        let mut last = None;
        for i in 0..self.members.len() {
            let at = (first + i) % self.members.len();
            let member = &self.members[at];
            let ask = Ask {
                method: "POST",
                path,
                content_type: Some("application/json"),
                body: body.to_string().into(),
            };
            match self.on(member, ask).await {
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
                Err(e) => last = Some(e),
            }
        }
        Err(Error::new(
            ErrorCode::ClusterUnavailable,
            format!("no etcd member answered ({})", last.unwrap_or_default()),
            if self.tls.is_some() {
                "check that etcd runs and that this node reaches it (--cluster), that --etcd-ca signed etcd's certificate, and that etcd takes this node's --etcd-cert"
            } else {
                "check that etcd runs and that this node reaches it (--cluster)"
            },
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
