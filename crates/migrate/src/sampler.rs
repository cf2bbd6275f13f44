//! The lock sampler: what a statement outside a transaction (`CREATE INDEX
//! CONCURRENTLY`, `VACUUM`) or a command candidate locks is seen only while it
//! runs, by polling `pg_locks`.
//!
//! The sampler runs on a thread of its own, with a runtime and an admin
//! session of its own. On the daemon's runtime it was held up by whatever
//! else blocked its workers (another candidate's fork cloning files in place,
//! say): a statement could start and end on the server between two samples
//! taken a whole index build apart, and its lock went unreported.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use super::probe::Lock;
use airlock_core::dsn::DATABASE;
use airlock_core::error::{Error, Result};
use airlock_core::layout::InstanceDir;
use airlock_postgres::admin::Admin;
use airlock_postgres::cell::Cell;

/// How often `pg_locks` is read.
pub const POLL: Duration = Duration::from_millis(5);
/// How long a sampler has to connect and take its first sample.
const READY_WITHIN: Duration = Duration::from_secs(15);

/// Locks seen, each with when it was first and last seen.
pub type Seen = BTreeMap<Lock, (Instant, Instant)>;

/// The server a sampler watches: its instance directory and postmaster.
#[derive(Debug, Clone)]
pub struct Watched {
    /// The instance's files (its socket).
    pub dir: InstanceDir,
    /// Its postmaster's pid.
    pub postmaster: i32,
}

/// A sampler running on its own thread.
pub struct Sampler {
    stop: Arc<Notify>,
    done: oneshot::Receiver<Seen>,
}

impl Sampler {
    /// Starts sampling the relation locks granted to `pid` (to every session
    /// but the sampler's own when `pid` is 0); returns once the first sample
    /// has been taken, so nothing the caller starts next goes unseen.
    pub async fn start(watched: &Watched, pid: i32) -> Result<Sampler> {
        let stop = Arc::new(Notify::new());
        let (ready_tx, ready) = oneshot::channel::<Result<()>>();
        let (done_tx, done) = oneshot::channel();
        let (watched, stopping) = (watched.clone(), stop.clone());
        std::thread::Builder::new()
            .name("lock-sampler".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::internal(format!("a lock sampler's runtime: {e}"))));
                        return;
                    }
                };
                runtime.block_on(async move {
                    match Admin::connect(&watched.dir, DATABASE, watched.postmaster).await {
                        Ok(admin) => {
                            let _ = done_tx.send(poll(&admin, pid, &stopping, Some(ready_tx)).await);
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })
            .map_err(|e| Error::internal(format!("starting a lock sampler: {e}")))?;
        // From here the sampler stops when dropped, on every way out.
        let sampler = Sampler { stop, done };
        match tokio::time::timeout(READY_WITHIN, ready).await {
            Ok(Ok(Ok(()))) => Ok(sampler),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(Error::internal("the lock sampler ended before its first sample")),
            Err(_) => {
                Err(Error::internal(format!("the lock sampler took no sample within {READY_WITHIN:?}")))
            }
        }
    }

    /// Stops sampling: the locks seen.
    pub async fn finish(mut self) -> Seen {
        self.stop.notify_one();
        (&mut self.done).await.unwrap_or_default()
    }
}

impl Drop for Sampler {
    /// A sampler given up (its test cancelled mid-statement, say) stops too:
    /// its thread and session end at its next sample.
    fn drop(&mut self) {
        self.stop.notify_one();
    }
}

/// Polls until `stop` is notified, saying so on `ready` after the first sample.
async fn poll(
    admin: &Admin,
    pid: i32,
    stop: &Notify,
    mut ready: Option<oneshot::Sender<Result<()>>>,
) -> Seen {
    let mut seen = Seen::new();
    let sql = "SELECT relation::int8, mode FROM pg_catalog.pg_locks
               WHERE locktype = 'relation' AND granted AND pid <> pg_catalog.pg_backend_pid()
                 AND ($1 = 0 OR pid = $1)";
    loop {
        // A poll stuck on a server that stopped answering ends with the sampler.
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&pid];
        let polled = tokio::select! {
            polled = admin.client().query(sql, &params) => polled,
            _ = stop.notified() => return seen,
        };
        if let Err(e) = &polled {
            tracing::warn!(error = %e, "polling a migration candidate's locks failed");
        }
        if let Ok(rows) = polled {
            let now = Instant::now();
            for row in rows {
                let (Ok(relid), Ok(mode)) = (row.cell(0), row.cell(1)) else { continue };
                seen.entry(Lock { relid, mode }).and_modify(|e| e.1 = now).or_insert((now, now));
            }
        }
        if let Some(ready) = ready.take() {
            let _ = ready.send(Ok(()));
        }
        tokio::select! {
            _ = stop.notified() => return seen,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}
