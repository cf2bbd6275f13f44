//! Who a client is, as far as its connection tells: an address on the
//! router's TCP port, or a local process on its unix socket (the kernel's
//! word for its user and process). Audit records and a cluster's relay header
//! carry it as text.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// Where a client connected from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Peer {
    /// A TCP client, by its address.
    Tcp(SocketAddr),
    /// A client on the router's unix socket: its user and process, as the
    /// kernel gave them when it connected.
    Local {
        /// The connecting process's user id.
        uid: u32,
        /// The connecting process's id, when the kernel told it.
        pid: Option<i32>,
    },
}

impl Peer {
    /// The client's IP address, for sharing connection slots out by address;
    /// None for a local client (local clients share one share).
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Peer::Tcp(addr) => Some(addr.ip()),
            Peer::Local { .. } => None,
        }
    }

    /// The peer of a cancel request passed on to another node: no client's.
    pub fn none() -> Peer {
        Peer::Tcp(SocketAddr::from(([0, 0, 0, 0], 0)))
    }
}

impl From<SocketAddr> for Peer {
    fn from(addr: SocketAddr) -> Peer {
        Peer::Tcp(addr)
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Tcp(addr) => write!(f, "{addr}"),
            Peer::Local { uid, pid: Some(pid) } => write!(f, "local:uid={uid},pid={pid}"),
            Peer::Local { uid, pid: None } => write!(f, "local:uid={uid}"),
        }
    }
}

impl From<Peer> for String {
    fn from(peer: Peer) -> String {
        peer.to_string()
    }
}

impl TryFrom<String> for Peer {
    type Error = String;

    fn try_from(text: String) -> Result<Peer, String> {
        text.parse()
    }
}

impl std::str::FromStr for Peer {
    type Err = String;

    fn from_str(text: &str) -> Result<Peer, String> {
        let Some(local) = text.strip_prefix("local:") else {
            return text.parse().map(Peer::Tcp).map_err(|e| format!("{text:?} is not a client address: {e}"));
        };
        let (mut uid, mut pid) = (None, None);
        for part in local.split(',') {
            match part.split_once('=') {
                Some(("uid", n)) => uid = n.parse().ok(),
                Some(("pid", n)) => {
                    pid = Some(n.parse().map_err(|_| format!("{text:?}: pid is not a number"))?)
                }
                _ => return Err(format!("{text:?} is not a local client")),
            }
        }
        Ok(Peer::Local { uid: uid.ok_or_else(|| format!("{text:?} names no uid"))?, pid })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_reads_back_as_it_was_written() {
        for peer in [
            Peer::Tcp("127.0.0.1:5555".parse().unwrap()),
            Peer::Tcp("[::1]:7432".parse().unwrap()),
            Peer::Local { uid: 1000, pid: Some(42) },
            Peer::Local { uid: 0, pid: None },
        ] {
            let text = serde_json::to_string(&peer).unwrap();
            assert_eq!(serde_json::from_str::<Peer>(&text).unwrap(), peer, "{text}");
        }
        assert_eq!(Peer::Local { uid: 1000, pid: Some(42) }.to_string(), "local:uid=1000,pid=42");
        for bad in ["\"local:pid=1\"", "\"local:uid=x\"", "\"nowhere\"", "\"local:uid=1,who=2\""] {
            assert!(serde_json::from_str::<Peer>(bad).is_err(), "{bad}");
        }
    }
}
