//! Admin work inside an instance, over its private socket with peer authentication.

use crate::cell::Cell;
use crate::instance::admin_config;
use airlock_core::dsn::{ADMIN_ROLE, AGENT_ROLE};
use airlock_core::error::{Error, Result};
use airlock_core::layout::InstanceDir;
use airlock_core::records::access::Access;

/// How long an admin session may take to open.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a server just started, or kept across a daemon restart, has to
/// answer a query.
pub const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Checks that the instance in `dir` answers a query (on a fresh admin session)
/// within `within`; a server that started but refuses or stalls every session
/// fails here, with its log's tail.
pub async fn answers(dir: &InstanceDir, postmaster: i32, within: std::time::Duration) -> Result<()> {
    let probe = async {
        Admin::connect(dir, airlock_core::dsn::DATABASE, postmaster).await?.execute("SELECT 1").await
    };
    let failed = |why: String| {
        Error::postgres_with_log(
            format!("the server of {} does not answer: {why}", dir.root.display()),
            &airlock_host::contain::log_tail(&dir.log()),
        )
    };
    match tokio::time::timeout(within, probe).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(failed(e.message)),
        Err(_) => Err(failed(format!("no answer within {within:?}"))),
    }
}

/// An open admin session on one instance.
pub struct Admin {
    client: tokio_postgres::Client,
}

impl Admin {
    /// Connects as the admin role to `database` of the instance in `dir` whose
    /// postmaster is `postmaster` (any other process listening there is refused),
    /// giving up after [`CONNECT_TIMEOUT`].
    pub async fn connect(dir: &InstanceDir, database: &str, postmaster: i32) -> Result<Admin> {
        let failed =
            |e: String| Error::postgres(format!("admin connection to {} failed: {e}", dir.root.display()));
        let attempt = || async {
            let connecting = async {
                let stream = crate::socket::connect_instance(&dir.socket(), None, postmaster)
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                admin_config(dir, database)
                    .connect_raw(stream, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| failed(describe(&e)))
            };
            tokio::time::timeout(CONNECT_TIMEOUT, connecting)
                .await
                .map_err(|_| failed(format!("no answer within {CONNECT_TIMEOUT:?}")))?
        };
        let mut connected = attempt().await;
        // Every slot taken (the admin's reserved ones too, by clients that never
        // finish authenticating): those go, and the admin tries again, a few
        // times, racing whoever keeps reconnecting.
        for _ in 0..5 {
            match &connected {
                Err(e) if e.message.contains("too many clients") => {}
                _ => break,
            }
            let ended = crate::instance::end_unauthenticated(postmaster);
            tracing::warn!(dir = %dir.root.display(), ended, "every connection slot was taken; ended the backends still authenticating");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            connected = attempt().await;
        }
        let (client, connection) = connected?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Admin { client })
    }

    /// Connects as the owner role (never a superuser) to `database` of a
    /// golden being built, as `os_user` (the build's loader user, whom its
    /// access files map to the owner role; the daemon's own identity without
    /// root), with the admin's pinned settings. For work that runs the
    /// agent's code (a promoted sandbox's index expressions), so that code
    /// never runs in a superuser's session, whatever PostgreSQL's
    /// security-restricted operation would allow it.
    pub async fn connect_owner(
        dir: &InstanceDir,
        database: &str,
        postmaster: i32,
        os_user: Option<&airlock_host::users::Identity>,
    ) -> Result<Admin> {
        let failed =
            |e: String| Error::postgres(format!("owner connection to {} failed: {e}", dir.root.display()));
        let connecting = async {
            let stream = crate::socket::connect_instance(&dir.socket(), os_user, postmaster)
                .await
                .map_err(|e| failed(e.to_string()))?;
            let mut config = admin_config(dir, database);
            config.user(airlock_core::dsn::OWNER_ROLE).options(crate::instance::OWNER_SESSION_OPTIONS);
            config.connect_raw(stream, tokio_postgres::NoTls).await.map_err(|e| failed(describe(&e)))
        };
        let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| failed(format!("no answer within {CONNECT_TIMEOUT:?}")))??;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Admin { client })
    }

    /// The session itself, for queries with typed rows.
    pub fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    /// Runs statements that return nothing.
    pub async fn execute(&self, sql: &str) -> Result<()> {
        self.client.batch_execute(sql).await.map_err(|e| Error::postgres(describe(&e)))
    }

    /// Runs a query returning one text value.
    pub async fn value(&self, sql: &str) -> Result<String> {
        let row = self.client.query_one(sql, &[]).await.map_err(|e| Error::postgres(describe(&e)))?;
        row.cell::<String>(0)
    }

    /// Makes the agent role for `access` in place of the one the server
    /// holds, if any (a golden's, made for the default access; a pool
    /// member's), then ends every client session of any role but the new
    /// agent's and the admin's: one opened as the old role before the new one
    /// was committed (the parked session of a pool member, say) keeps none of
    /// its access. The role logs in by peer: no password is sent or kept.
    pub async fn make_agent(&self, access: &Access) -> Result<()> {
        self.execute(&format!("DROP ROLE IF EXISTS {AGENT_ROLE}; {}", access.create_role_sql())).await?;
        self.execute(&format!(
            "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
              WHERE backend_type = 'client backend' AND pid <> pg_catalog.pg_backend_pid()
                AND usesysid <> ALL (SELECT oid FROM pg_catalog.pg_roles
                                     WHERE rolname IN ('{AGENT_ROLE}', '{ADMIN_ROLE}'))"
        ))
        .await
    }

    /// Ends the agent's sessions, each told `why` (the in-server guard reads
    /// the reason the server writes for each backend, and says it instead of
    /// "terminating connection due to administrator command"), and waits up to
    /// `within` for them to be gone. How many there were.
    pub async fn end_agent_sessions(&self, why: Ending, within: std::time::Duration) -> Result<usize> {
        let failed = |e: tokio_postgres::Error| Error::postgres(describe(&e));
        let rows = self
            .client
            .query(
                "SELECT pid FROM pg_catalog.pg_stat_activity
                  WHERE usename = $1 AND backend_type = 'client backend'",
                &[&AGENT_ROLE],
            )
            .await
            .map_err(failed)?;
        let pids: Vec<i32> = rows.iter().map(|r| r.cell(0)).collect::<Result<_>>()?;
        if pids.is_empty() {
            return Ok(0);
        }
        // Written by the server, as the sandbox's own OS user, into its data
        // directory (as the server sees it): nothing here is written with the
        // daemon's privileges.
        let data = self.value("SELECT pg_catalog.current_setting('data_directory')").await?;
        let mut sql = String::new();
        for pid in &pids {
            let file = format!("{data}/airlock_ending.{pid}").replace('\'', "''");
            sql.push_str(&format!(
                "COPY (SELECT '{}') TO '{file}'; SELECT pg_catalog.pg_terminate_backend({pid});",
                why.reason()
            ));
        }
        self.execute(&sql).await?;
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            let left = self
                .client
                .query_one("SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE pid = ANY($1)", &[&pids])
                .await
                .map_err(failed)?;
            if left.cell::<i64>(0)? == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        Ok(pids.len())
    }

    /// Sets the agent's password back to the daemon's, for a server started
    /// before the agent logged in by peer (whose access rules still ask the
    /// router, the gateway and `exec` for it).
    pub async fn restore_agent_password(&self, password: &str) -> Result<()> {
        let verifier = crate::scram::verifier(password, crate::scram::AGENT_ITERATIONS);
        self.execute(&format!("ALTER ROLE {AGENT_ROLE} LOGIN PASSWORD '{verifier}' VALID UNTIL 'infinity'"))
            .await
    }
}

/// Why the daemon ends the agent's sessions; the in-server guard tells each
/// client (it knows these reasons and no others).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The sandbox is being reset to its golden's data.
    Reset,
    /// The sandbox is being suspended.
    Suspend,
}

impl Ending {
    fn reason(self) -> &'static str {
        match self {
            Ending::Reset => "reset",
            Ending::Suspend => "suspend",
        }
    }
}

/// PostgreSQL's own message for an error, with its detail.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(d) => format!("{}: {} ({d})", db.code().code(), db.message()),
            None => format!("{}: {}", db.code().code(), db.message()),
        },
        None => e.to_string(),
    }
}
