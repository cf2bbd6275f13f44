//! `describe_schema` and `changes_since_fork`: a sandbox's catalog, alone or
//! compared with the golden it was forked from.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use airlock_core::dsn::DATABASE;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::Sandbox;
use airlock_postgres::admin::Admin;
use airlock_postgres::catalog::{self, diff::Change, Catalog, RowCount, Snapshot};

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
}

/// What changed in a sandbox since it was forked (or last reset).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Changes {
    /// The golden and generation compared with.
    pub golden: String,
    /// See [`Changes::golden`].
    pub generation: i64,
    /// Objects added, dropped or changed.
    pub schema_changes: Vec<Change>,
    /// Tables whose rows changed.
    pub row_changes: Vec<RowChange>,
    /// What the comparison could not see, when something.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caveats: Vec<String>,
    /// Keys in the task's Redis then and now, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisChange>,
    /// The sandbox has no PostgreSQL (its golden is Redis-only): only its
    /// Redis is compared.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_postgres: bool,
}

/// A Redis key count then and now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RedisChange {
    /// Keys in the golden's Redis part.
    pub golden_keys: u64,
    /// Keys now, per database.
    pub now: airlock_redis::keyspace::KeySpace,
}

/// The key space of a sandbox's Redis, when it has one.
async fn redis_keyspace(engine: &Engine, sb: &Sandbox) -> Result<Option<airlock_redis::keyspace::KeySpace>> {
    let dir = engine.layout.sandbox_instance(&sb.id);
    if !airlock_redis::server::configured(&dir) {
        return Ok(None);
    }
    let mut admin = airlock_redis::server::Admin::connect(&dir).await?;
    Ok(Some(airlock_redis::keyspace::read(&mut admin).await?))
}

/// Said when the server's counters of inserted, updated and deleted rows were lost.
const COUNTERS_LOST: &str =
    "the server restarted after a crash and lost its counts of inserted, updated and \
     deleted rows: those below count from the restart, and a table whose rows were changed before it \
     without changing their number shows as unchanged";

/// Said when the golden's record predates the comparison of every catalog entry.
const OLD_RECORD: &str =
    "the golden's record predates the comparison of rules, policies, grants and options, \
     so changes to those are not shown: refresh the golden (`airlock golden refresh`) to compare them";

/// One table's rows then and now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RowChange {
    /// `schema.name`.
    pub table: String,
    /// Rows in the golden; absent for a table the sandbox added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub golden_rows: Option<i64>,
    /// Rows now; absent for a table the sandbox dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<i64>,
    /// Whether `rows` was counted (true) or estimated.
    pub exact: bool,
    /// Rows inserted, updated and deleted since the fork by transactions that
    /// committed, from the server's statistics (TRUNCATE is not counted there).
    pub inserted: i64,
    /// See [`RowChange::inserted`].
    pub updated: i64,
    /// See [`RowChange::inserted`].
    pub deleted: i64,
    /// Its storage was rewritten since the fork (ALTER COLUMN TYPE ... USING,
    /// VACUUM FULL, CLUSTER, TRUNCATE): rows may differ even where no count does.
    #[serde(default)]
    pub rewritten: bool,
}

/// Counting stops at this per table and in all; estimates stand in after.
const COUNT_PER_TABLE: Duration = Duration::from_secs(2);
const COUNT_BUDGET: Duration = Duration::from_secs(10);

/// How long a catalog read waits for a lock the agent's own sessions hold
/// (an open transaction's `ALTER TABLE`, say) before the tool says so.
const LOCK_WAIT_MS: u32 = 3000;

async fn admin(engine: &Engine, sb: &Sandbox) -> Result<Admin> {
    let admin = Admin::connect(&engine.layout.sandbox_instance(&sb.id), DATABASE, sb.pid.unwrap_or_default())
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
fn locked(e: Error) -> Error {
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

/// Describes a sandbox's schema, or one table of it.
pub async fn describe(engine: &Engine, key: &str, table: Option<&str>) -> Result<Schema> {
    let (sb, _busy) = super::running(engine, key).await?;
    if !engine.layout.generation_has_postgres(&sb.golden, sb.generation) {
        if table.is_some() {
            return Err(super::no_postgres(&sb));
        }
        let redis = redis_keyspace(engine, &sb).await?;
        let text = redis.as_ref().map(|r| r.text()).unwrap_or_default();
        return Ok(Schema { catalog: Catalog::default(), rows: BTreeMap::new(), text, redis });
    }
    let admin = admin(engine, &sb).await?;
    let mut catalog = catalog::read(admin.client()).await.map_err(locked)?;
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
    let rows =
        catalog::count_rows(&dir, sb.pid.unwrap_or_default(), &catalog, COUNT_PER_TABLE, COUNT_BUDGET).await;
    let mut text = catalog::describe::render(&catalog, &rows, table).unwrap_or_default();
    let redis = match table {
        Some(_) => None,
        None => redis_keyspace(engine, &sb).await?,
    };
    if let Some(space) = &redis {
        text = format!("{}\n\n{}\n", text.trim_end(), space.text());
    }
    Ok(Schema { catalog, rows, text, redis })
}

/// Compares a sandbox with the golden generation it was forked from.
pub async fn changes(engine: &Engine, key: &str) -> Result<Changes> {
    let (sb, _busy) = super::running(engine, key).await?;
    if !engine.layout.generation_has_postgres(&sb.golden, sb.generation) {
        return Ok(Changes {
            golden: sb.golden.clone(),
            generation: sb.generation,
            schema_changes: Vec::new(),
            row_changes: Vec::new(),
            caveats: Vec::new(),
            redis: redis_change(engine, &sb).await?,
            no_postgres: true,
        });
    }
    let golden = Snapshot::load(&engine.layout.golden_generation(&sb.golden, sb.generation))?;
    let admin = admin(engine, &sb).await?;
    let now = catalog::read(admin.client()).await.map_err(locked)?;
    let dir = engine.layout.sandbox_instance(&sb.id);
    let rows =
        catalog::count_rows(&dir, sb.pid.unwrap_or_default(), &now, COUNT_PER_TABLE, COUNT_BUDGET).await;
    let activity = catalog::attempted_and_committed(admin.client()).await.map_err(locked)?;
    let golden_pgdata = engine.layout.golden_generation(&sb.golden, sb.generation).join("pgdata");
    let rewritten = catalog::rewritten(admin.client(), &golden_pgdata).await.map_err(locked)?;
    let mut caveats = Vec::new();
    if catalog::counters_lost(admin.client()).await.map_err(locked)? {
        caveats.push(COUNTERS_LOST.to_owned());
    }
    if golden.catalog.objects.is_none() {
        caveats.push(OLD_RECORD.to_owned());
    }
    let mut row_changes = Vec::new();
    let tables: std::collections::BTreeSet<&String> = golden.rows.keys().chain(rows.keys()).collect();
    for table in tables {
        let then = golden.rows.get(table).map(|r| r.rows);
        let current = rows.get(table);
        let rewritten = then.is_some() && rewritten.contains(table);
        // Rolled-back work is on the server's counters too: what committed is
        // told apart by the committed total and the rows gained or lost.
        let (attempted, committed) = activity.get(table).copied().unwrap_or_default();
        let net = match (then, current) {
            (Some(then), Some(now)) if now.exact && !rewritten => Some(now.rows - then),
            (None, Some(now)) if now.exact => Some(now.rows),
            _ => None,
        };
        let [inserted, updated, deleted] = match (committed, net) {
            (Some(m), Some(net)) => catalog::committed(attempted, m, net),
            _ => attempted,
        };
        if then == current.map(|r| r.rows) && inserted + updated + deleted == 0 && !rewritten {
            continue;
        }
        row_changes.push(RowChange {
            table: catalog::short_name(table).to_owned(),
            golden_rows: then,
            rows: current.map(|r| r.rows),
            exact: current.is_none_or(|r| r.exact),
            inserted,
            updated,
            deleted,
            rewritten,
        });
    }
    Ok(Changes {
        golden: sb.golden.clone(),
        generation: sb.generation,
        schema_changes: catalog::diff::diff(&golden.catalog, &now),
        row_changes,
        caveats,
        redis: redis_change(engine, &sb).await?,
        no_postgres: false,
    })
}

/// A sandbox's Redis keys now beside its golden's, when it has a Redis.
async fn redis_change(engine: &Engine, sb: &Sandbox) -> Result<Option<RedisChange>> {
    let Some(now) = redis_keyspace(engine, sb).await? else { return Ok(None) };
    let manifest = engine.store().manifest(&sb.golden, sb.generation)?;
    let golden_keys = manifest.redis.map(|r| r.keys).unwrap_or(0);
    Ok(Some(RedisChange { golden_keys, now }))
}

impl Changes {
    /// The changes as lines a model reads.
    pub fn text(&self) -> String {
        let mut out = Vec::new();
        if self.no_postgres {
            out.push("No PostgreSQL: this task has a Redis only.".to_owned());
        } else {
            self.postgres_lines(&mut out);
        }
        if let Some(r) = &self.redis {
            out.push(format!("Redis keys: {} -> {}", r.golden_keys, r.now.keys()));
        }
        out.extend(self.caveats.iter().map(|c| format!("Note: {c}.")));
        out.join("\n")
    }

    /// The schema and row lines of `text`.
    fn postgres_lines(&self, out: &mut Vec<String>) {
        if self.schema_changes.is_empty() {
            out.push("Schema: unchanged.".to_owned());
        } else {
            out.push(format!("Schema: {} changes", self.schema_changes.len()));
            out.extend(self.schema_changes.iter().map(|c| format!("  {}", c.line())));
        }
        if self.row_changes.is_empty() {
            out.push("Rows: unchanged.".to_owned());
        } else {
            out.push("Rows (golden -> now; ~ marks an estimate):".to_owned());
            for r in &self.row_changes {
                let count = |n: Option<i64>| n.map_or("-".to_owned(), |n| n.to_string());
                let approx = if r.exact { "" } else { "~" };
                let rewritten = if r.rewritten { "; rewritten, so any row may differ" } else { "" };
                out.push(format!(
                    "  {}: {} -> {approx}{} rows (inserted {}, updated {}, deleted {}{rewritten})",
                    r.table,
                    count(r.golden_rows),
                    count(r.rows),
                    r.inserted,
                    r.updated,
                    r.deleted
                ));
            }
        }
    }
}
