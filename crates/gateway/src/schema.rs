//! `describe_schema`: a sandbox's catalog, of its own database or of another
//! it holds, as compact text a model reads well. What the catalog reads
//! share with `changes_since_fork` ([`super::changes`]) is here too.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use airlock_core::dsn::DATABASE;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::Sandbox;
use airlock_postgres::admin::Admin;
use airlock_postgres::catalog::{self, Catalog, RowCount};

/// A sandbox's schema: its catalog, its tables' rows, and the text rendering.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Schema {
    /// Every object, or the one table asked for.
    pub catalog: Catalog,
    /// Rows per table (counted where quick, else estimated).
    pub rows: BTreeMap<String, RowCount>,
    /// The compact text a model reads.
    pub text: String,
    /// The task's Redis key space, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<airlock_redis::keyspace::KeySpace>,
    /// The database described.
    #[serde(default)]
    pub database: String,
    /// Every database in the sandbox (its own and those its agent created).
    #[serde(default)]
    pub databases: Vec<String>,
}

/// The key space of a sandbox's Redis, when it has one.
pub(crate) async fn redis_keyspace(
    engine: &Engine,
    sb: &Sandbox,
) -> Result<Option<airlock_redis::keyspace::KeySpace>> {
    let dir = engine.layout.sandbox_instance(&sb.id);
    if !airlock_redis::server::configured(&dir) {
        return Ok(None);
    }
    let mut admin = airlock_redis::server::Admin::connect(&dir).await?;
    Ok(Some(airlock_redis::keyspace::read(&mut admin).await?))
}

/// Counting stops at this per table and in all; estimates stand in after.
pub(crate) const COUNT_PER_TABLE: Duration = Duration::from_secs(2);
pub(crate) const COUNT_BUDGET: Duration = Duration::from_secs(10);

/// How long a catalog read waits for a lock the agent's own sessions hold
/// (an open transaction's `ALTER TABLE`, say) before the tool says so.
const LOCK_WAIT_MS: u32 = 3000;

/// An admin session on one of a sandbox's databases, waiting at most
/// [`LOCK_WAIT_MS`] for a lock.
pub(crate) async fn admin(engine: &Engine, sb: &Sandbox, database: &str) -> Result<Admin> {
    let admin = Admin::connect(&engine.layout.sandbox_instance(&sb.id), database, sb.pid.unwrap_or_default())
        .await
        .map_err(|e| {
            tracing::warn!(sandbox = %sb.id, error = %e, "catalog session refused");
            airlock_lifecycle::sandbox::session::unanswered(sb)
        })?;
    admin.execute(&format!("SET lock_timeout = {LOCK_WAIT_MS}")).await?;
    Ok(admin)
}

/// A catalog read that waited out [`LOCK_WAIT_MS`] on the agent's own lock
/// is the agent's to release, not a failure of the tool.
pub(crate) fn locked(e: Error) -> Error {
    if !e.message.contains("lock timeout") {
        return e;
    }
    Error::new(
        ErrorCode::InvalidRequest,
        "the sandbox's own session holds a lock on what the schema read needs (an open transaction that \
         changed a table, say)",
        "commit or roll back that transaction, then ask again",
    )
}

/// Describes a sandbox's schema, or one table of it, in its own database or
/// in `database`.
pub async fn describe(
    engine: &Engine,
    key: &str,
    table: Option<&str>,
    database: Option<&str>,
) -> Result<Schema> {
    let (sb, _busy) = super::running(engine, key).await?;
    if !engine.layout.generation_has_postgres(&sb.golden, sb.generation) {
        if table.is_some() || database.is_some() {
            return Err(super::no_postgres(&sb));
        }
        let redis = redis_keyspace(engine, &sb).await?;
        let text = redis.as_ref().map(|r| r.text()).unwrap_or_default();
        return Ok(Schema {
            catalog: Catalog::default(),
            rows: BTreeMap::new(),
            text,
            redis,
            database: String::new(),
            databases: Vec::new(),
        });
    }
    let own = admin(engine, &sb, DATABASE).await?;
    let databases = catalog::databases(own.client()).await?;
    let database = database.unwrap_or(DATABASE);
    let admin = match database {
        DATABASE => own,
        other if databases.iter().any(|d| d == other) => {
            drop(own);
            admin(engine, &sb, other).await?
        }
        other => {
            return Err(Error::new(
                ErrorCode::InvalidArguments,
                format!("no database named {other:?} in this sandbox"),
                format!("its databases are: {}", listed(&databases)),
            ))
        }
    };
    let mut catalog = catalog::read(admin.client()).await.map_err(locked)?;
    drop(admin);
    // Kept for comparisons; a digest tells a model nothing.
    catalog.objects = None;
    if let Some(wanted) = table {
        let Some(found) = catalog::describe::find(&catalog, wanted) else {
            let known: Vec<&str> = catalog.tables.keys().map(|t| catalog::short_name(t)).collect();
            return Err(Error::new(
                ErrorCode::InvalidArguments,
                format!("no table or view named {wanted:?}"),
                format!(
                    "the tables are: {}",
                    if known.is_empty() { "(none)".into() } else { known.join(", ") }
                ),
            ));
        };
        catalog.tables.retain(|k, _| *k == found);
        catalog.views.retain(|k, _| *k == found);
        catalog.functions.clear();
        catalog.sequences.clear();
        catalog.types.clear();
        catalog.extensions.clear();
    }
    let dir = engine.layout.sandbox_instance(&sb.id);
    let rows = catalog::count_rows(
        &dir,
        sb.pid.unwrap_or_default(),
        database,
        &catalog,
        COUNT_PER_TABLE,
        COUNT_BUDGET,
    )
    .await;
    let mut text = catalog::describe::render(&catalog, &rows, table).unwrap_or_default();
    if table.is_none() && databases.len() > 1 {
        let others: Vec<&str> = databases.iter().map(String::as_str).filter(|d| *d != database).collect();
        let named = listed(&others);
        text = format!(
            "{}\n\nThis is database {database}. The sandbox also holds: {named}. Give `database` to describe one.\n",
            text.trim_end(),
        );
    }
    let redis = match (table, database) {
        (None, DATABASE) => redis_keyspace(engine, &sb).await?,
        _ => None,
    };
    if let Some(space) = &redis {
        text = format!("{}\n\n{}\n", text.trim_end(), space.text());
    }
    Ok(Schema { catalog, rows, text, redis, database: database.to_owned(), databases })
}

/// Names, comma-separated, the first 50 of them.
fn listed<S: AsRef<str>>(names: &[S]) -> String {
    let shown: Vec<&str> = names.iter().take(50).map(AsRef::as_ref).collect();
    match names.len() {
        n if n > 50 => format!("{} and {} more", shown.join(", "), n - 50),
        _ => shown.join(", "),
    }
}
