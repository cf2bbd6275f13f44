//! Targets: live PostgreSQL databases Airlock may mint grants on.
//!
//! A target is registered with an admin DSN, which the daemon keeps (in the
//! service's store, readable by its user alone) and never gives back: every
//! answer carries it redacted. Registering checks, over that DSN and with
//! libpq's `sslmode` meanings, what grants will need (making roles, a schema
//! of the grant's own for row-scoped views), and records the server's version
//! and what a grant cannot take away there.

use serde::{Deserialize, Serialize};

use airlock_core::clock::Timestamp;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{EventKind, NewEvent};
use airlock_postgres::cell::Cell;

use super::Live;

/// A registered target, as every answer shows it (never with its DSN's secret).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Target {
    /// Its name.
    pub name: String,
    /// When it was registered.
    pub added_at: Timestamp,
    /// What registering found.
    pub checks: Checks,
}

/// Body of `POST /v1/targets`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AddTarget {
    /// The target's name.
    pub name: String,
    /// Its admin DSN (a `postgresql://` URL or key=value string, with libpq's
    /// `sslmode` meanings); kept by the daemon alone and never given back.
    pub dsn: String,
}

/// What registering a target found on its server.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Checks {
    /// The DSN with its password and other secrets taken out.
    pub dsn: String,
    /// The role the DSN logs in as.
    pub user: String,
    /// The database it reaches.
    pub database: String,
    /// `server_version`, as the server says it.
    pub server_version: String,
    /// `server_version_num`.
    pub server_version_num: i32,
    /// Whether that role is a superuser (it need not be: `CREATEROLE` and
    /// `CREATE` on the database are enough).
    pub superuser: bool,
    /// Whether the connection is encrypted.
    pub tls: bool,
    /// What a grant on this target cannot take away, each with how to close
    /// it on the target.
    pub cannot_take_away: Vec<String>,
}

/// How long a target has to accept a connection and log the role in.
const CONNECT_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) fn not_found(name: &str) -> Error {
    Error::new(
        ErrorCode::TargetNotFound,
        format!("no live target named {name:?}"),
        "`airlock target ls` lists them; `airlock target add NAME --from-url -` registers one",
    )
}

fn refused(message: String, hint: &str) -> Error {
    Error::new(ErrorCode::TargetRefused, message, hint)
}

impl Live {
    /// Registers a target after checking its DSN can do what grants need.
    pub async fn add_target(&self, name: &str, dsn: &str) -> Result<Target> {
        airlock_core::validate::name("target", name)?;
        let dsn = dsn.trim();
        if dsn.is_empty() {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                "no DSN was given for the target",
                "pipe the admin DSN on standard input: `airlock target add NAME --from-url - <<< \"$DSN\"`",
            ));
        }
        if self.store().target(name)?.is_some() {
            return Err(exists(name));
        }
        let checks = check(dsn).await?;
        let target = Target { name: name.to_owned(), added_at: Timestamp::now(), checks };
        if !self.store().add_target(&target, dsn)? {
            return Err(exists(name));
        }
        self.engine.store().record_or_log(NewEvent {
            kind: EventKind::TargetAdded,
            detail: serde_json::json!({"target": name, "checks": target.checks}),
            ..Default::default()
        });
        Ok(target)
    }

    /// Every target.
    pub fn targets(&self) -> Result<Vec<Target>> {
        self.store().targets()
    }

    /// One target.
    pub fn target(&self, name: &str) -> Result<Target> {
        self.store().target(name)?.ok_or_else(|| not_found(name))
    }

    /// Ends the target's grants, then forgets it and its DSN: a grant left
    /// behind could never be ended on its target again.
    pub async fn remove_target(&self, name: &str) -> Result<Target> {
        let target = self.target(name)?;
        let grants: Vec<_> = self.store().grants_of_target(name)?;
        for grant in grants {
            self.end(&grant, "target_removed").await.map_err(|e| {
                Error::new(
                    ErrorCode::TargetRefused,
                    format!("target {name} is kept: its grant {} could not be ended: {}", grant.id, e.message),
                    "make the target reachable and remove it again; its grants' roles expire on it at their VALID UNTIL",
                )
            })?;
        }
        if !self.store().remove_target(name)? {
            return Err(not_found(name));
        }
        self.engine.store().record_or_log(NewEvent {
            kind: EventKind::TargetRemoved,
            detail: serde_json::json!({"target": name}),
            ..Default::default()
        });
        Ok(target)
    }
}

fn exists(name: &str) -> Error {
    Error::new(
        ErrorCode::TargetExists,
        format!("a live target named {name:?} is registered already"),
        "pick another name, or `airlock target rm` the old one first",
    )
}

/// A session on the target as its admin role, within [`CONNECT_WITHIN`],
/// whose names resolve in `pg_catalog` alone: a grantee may create functions
/// and operators where `PUBLIC` may create (schema `public` before
/// PostgreSQL 15), and none of them may stand in for one the daemon's queries
/// call as the admin role (an operator `*(numeric, integer)` in `public`
/// would, on the default search path).
pub(crate) async fn admin(dsn: &str) -> Result<tokio_postgres::Client> {
    let hint = "check the DSN, that the server is up and reachable, and its sslmode";
    let client = connect(dsn, hint).await?;
    client
        .batch_execute("SET search_path = pg_catalog, pg_temp")
        .await
        .map_err(|e| refused(format!("the target refused a setting: {e}"), hint))?;
    Ok(client)
}

async fn connect(dsn: &str, hint: &str) -> Result<tokio_postgres::Client> {
    tokio::time::timeout(CONNECT_WITHIN, airlock_postgres::target::connect_to(dsn, "target"))
        .await
        .map_err(|_| {
            refused(
                format!(
                    "the target {} did not answer within {CONNECT_WITHIN:?}",
                    airlock_core::dsn::redact(dsn)
                ),
                hint,
            )
        })?
        .map_err(|e| refused(e.message, hint))
}

/// Connects with `dsn` and checks what grants need.
async fn check(dsn: &str) -> Result<Checks> {
    let client = admin(dsn).await?;
    let row = client
        .query_one(
            "SELECT current_user::text, current_database()::text, r.rolsuper, r.rolcreaterole,
                    pg_catalog.has_database_privilege(current_database(), 'CREATE'),
                    pg_catalog.current_setting('server_version'),
                    pg_catalog.current_setting('server_version_num')::int4,
                    coalesce((SELECT ssl FROM pg_catalog.pg_stat_ssl WHERE pid = pg_catalog.pg_backend_pid()), false),
                    pg_catalog.has_database_privilege('public', current_database(), 'TEMPORARY'),
                    CASE WHEN pg_catalog.to_regnamespace('public') IS NOT NULL
                         THEN pg_catalog.has_schema_privilege('public', 'public', 'CREATE') ELSE false END
               FROM pg_catalog.pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await
        .map_err(|e| refused(format!("the target's server could not be read: {e}"), "check the DSN's role"))?;
    let (user, database): (String, String) = (row.cell(0)?, row.cell(1)?);
    let (superuser, createrole, create): (bool, bool, bool) = (row.cell(2)?, row.cell(3)?, row.cell(4)?);
    let mut missing = Vec::new();
    if !superuser && !createrole {
        missing.push(format!("ALTER ROLE {user} CREATEROLE"));
    }
    if !superuser && !create {
        missing.push(format!("GRANT CREATE ON DATABASE {database} TO {user}"));
    }
    if !missing.is_empty() {
        return Err(refused(
            format!(
                "the target's role {user} cannot do what grants need: make roles, and a schema of each grant's own \
                 in database {database}"
            ),
            &format!("as a superuser on the target: {}; then add it again", missing.join("; ")),
        ));
    }
    let (server_version, version_num): (String, i32) = (row.cell(5)?, row.cell(6)?);
    if version_num < 130000 {
        return Err(refused(
            format!("the target runs PostgreSQL {server_version}, older than 13"),
            "grants need PostgreSQL 13 or newer",
        ));
    }
    let mut cannot_take_away = Vec::new();
    if row.cell::<bool>(8)? {
        cannot_take_away.push(format!(
            "every role may create temporary tables in database {database} (PUBLIC has TEMPORARY), so a grant's \
             role can too; close it with REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC"
        ));
    }
    if row.cell::<bool>(9)? {
        cannot_take_away.push(
            "every role may create objects in schema public (PUBLIC has CREATE, as before PostgreSQL 15), so a \
             grant's role can too; close it with REVOKE CREATE ON SCHEMA public FROM PUBLIC"
                .to_owned(),
        );
    }
    Ok(Checks {
        dsn: airlock_core::dsn::redact(dsn),
        user,
        database,
        server_version,
        server_version_num: version_num,
        superuser,
        tls: row.cell(7)?,
        cannot_take_away,
    })
}
