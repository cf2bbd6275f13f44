//! Where clients reach a sandbox: the front door's address, and the
//! connection strings and URLs built from it. The router listens there; the
//! lifecycle hands out credentials in these forms, so the address is recorded
//! here once the router is up, and nothing below it needs the router itself.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Whether clients may, must or cannot use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TlsMode {
    /// TLS offered, plaintext accepted.
    Optional,
    /// Plaintext refused (cancel requests excepted: they carry no credential).
    Required,
    /// No TLS; every client talks plaintext.
    Off,
}

/// Where clients reach the router; what DSNs are built from.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Address {
    /// The host name or address in DSNs.
    pub host: String,
    /// The port it listens on.
    pub port: u16,
    /// Whether TLS is offered.
    pub tls: TlsMode,
    /// The CA file clients pass as `sslrootcert` (for a generated certificate).
    #[schema(value_type = Option<String>)]
    pub ca: Option<PathBuf>,
    /// The Redis front door's port, when it listens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_port: Option<u16>,
    /// The relay port's, in a cluster: where other nodes' routers pass on
    /// clients of this node's sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_port: Option<u16>,
    /// The directory of the router's unix socket (`.s.PGSQL.<port>`), when
    /// it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub socket_dir: Option<PathBuf>,
}

/// Where the router listens, once it does: set when it starts, and again
/// when a router started in its place listens otherwise (a port picked
/// afresh, a unix socket it could not have), so no credential is handed out
/// in a form that no longer reaches it.
#[derive(Debug, Default)]
pub struct RouterAddress(std::sync::RwLock<Option<Address>>);

impl RouterAddress {
    /// The router's address, if it listens.
    pub fn get(&self) -> Option<Address> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records where the router listens now.
    pub fn set(&self, address: Address) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(address);
    }
}

impl Address {
    /// A sandbox's DSN through the router.
    pub fn dsn(&self, sandbox: &str, password: &str) -> String {
        self.dsn_as(airlock_core::dsn::AGENT_ROLE, sandbox, password)
    }

    /// A DSN through the router for `user` on `database` (a grant's id is both).
    pub fn dsn_as(&self, user: &str, database: &str, password: &str) -> String {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        let mut url = format!("postgresql://{user}:{password}@{host}:{}/{database}", self.port);
        match (self.tls, &self.ca) {
            (TlsMode::Off, _) => url.push_str("?sslmode=disable"),
            (_, Some(ca)) => {
                url.push_str(&format!("?sslmode=verify-full&sslrootcert={}", percent_encode_path(ca)))
            }
            (_, None) => url.push_str("?sslmode=require"),
        }
        url
    }

    /// A sandbox's DSN on the router's unix socket, when it has one.
    pub fn router_socket_dsn(&self, sandbox: &str, password: &str) -> Option<String> {
        let dir = self.socket_dir.as_deref()?;
        Some(format!(
            "postgresql://{}:{password}@/{sandbox}?host={}&port={}",
            airlock_core::dsn::AGENT_ROLE,
            percent_encode_path(dir),
            self.port
        ))
    }

    /// A sandbox's Redis URL through the router: `rediss://` when TLS is on
    /// (verified against [`Address::ca`]), the sandbox id as the user.
    pub fn redis_url(&self, sandbox: &str, password: &str) -> Option<String> {
        let port = self.redis_port?;
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        let scheme = if self.tls == TlsMode::Off { "redis" } else { "rediss" };
        Some(format!("{scheme}://{sandbox}:{password}@{host}:{port}"))
    }
}

/// A path as a URI query value: libpq decodes `%XX` (and nothing else, not `+`).
fn percent_encode_path(path: &std::path::Path) -> String {
    let mut out = String::new();
    for &b in path.as_os_str().as_encoded_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
