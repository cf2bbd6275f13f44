//! The loopback door `exec` code reaches its sandbox's Redis through
//! ([`airlock_redis::loopback`]): opened in the sandbox's network namespace
//! while at least one `exec` of the sandbox runs, closed with the last.

use std::collections::HashMap;
use std::sync::Mutex;

/// Open doors by sandbox: the relaying task and how many runs hold it.
#[derive(Default)]
pub struct Doors(Mutex<HashMap<String, (tokio::task::JoinHandle<()>, usize)>>);

/// A run's hold on its sandbox's door; the door closes with the last hold.
pub struct Held<'a> {
    doors: &'a Doors,
    sandbox: String,
}

impl Doors {
    /// Holds the door of `sandbox` open, opening it (listening at
    /// `127.0.0.1:6379` in `network`, relaying to `socket`) if no run holds it.
    /// None when it cannot be opened (a server of an older version listens
    /// there itself: its code reaches the server directly, as before).
    pub fn hold<'a>(
        &'a self,
        sandbox: &str,
        network: &airlock_host::contain::Network,
        socket: std::path::PathBuf,
    ) -> Option<Held<'a>> {
        let mut doors = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, holders)) = doors.get_mut(sandbox) {
            *holders += 1;
        } else {
            let at = std::net::SocketAddr::from(([127, 0, 0, 1], airlock_redis::server::EXEC_PORT));
            let listener = match network.listen(at).and_then(tokio::net::TcpListener::from_std) {
                Ok(l) => l,
                Err(e) => {
                    tracing::debug!(sandbox, error = %e, "the Redis loopback door could not be opened");
                    return None;
                }
            };
            let task = tokio::spawn(airlock_redis::loopback::serve(listener, socket));
            doors.insert(sandbox.to_owned(), (task, 1));
        }
        Some(Held { doors: self, sandbox: sandbox.to_owned() })
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut doors = self.doors.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((task, holders)) = doors.get_mut(&self.sandbox) {
            *holders -= 1;
            if *holders == 0 {
                task.abort();
                doors.remove(&self.sandbox);
            }
        }
    }
}
