//! `changes_since_fork`: a sandbox's catalog and rows compared with the
//! golden generation it was forked from, in its own database and in every
//! other it holds (those its agent created, and those its golden holds).

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use airlock_core::dsn::DATABASE;
use airlock_core::error::Result;
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::Sandbox;
use airlock_postgres::admin::Admin;
use airlock_postgres::catalog::{self, diff::Change, Snapshot};
use airlock_postgres::cell::Cell;

use super::schema::{admin, locked, redis_keyspace, COUNT_BUDGET, COUNT_PER_TABLE};

/// What changed in a sandbox since it was forked (or last reset).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Changes {
    /// The golden and generation compared with.
    pub golden: String,
    /// See [`Changes::golden`].
    pub generation: i64,
    /// Objects added, dropped or changed in the sandbox's own database.
    pub schema_changes: Vec<Change>,
    /// Tables of the sandbox's own database whose rows changed.
    pub row_changes: Vec<RowChange>,
    /// The sandbox's other databases that were created or changed since the fork.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<DatabaseChange>,
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

/// One database other than the sandbox's own, compared with the golden's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DatabaseChange {
    /// Its name.
    pub name: String,
    /// `created` (since the fork) or `changed`. (None the golden holds can
    /// be dropped: they are the owner role's, never the agent's.)
    pub change: String,
    /// Objects added, dropped or changed (every object, for one created).
    pub schema_changes: Vec<Change>,
    /// Tables whose rows changed.
    pub row_changes: Vec<RowChange>,
}

/// A Redis key count then and now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RedisChange {
    /// Keys in the golden's Redis part.
    pub golden_keys: u64,
    /// Keys now, per database.
    pub now: airlock_redis::keyspace::KeySpace,
}

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

/// Databases other than the sandbox's own compared at most: each is a
/// session and a catalog read of its own.
const MAX_DATABASES: usize = 20;

/// Said when the server's counters of inserted, updated and deleted rows were lost.
const COUNTERS_LOST: &str =
    "the server restarted after a crash and lost its counts of inserted, updated and \
     deleted rows: those below count from the restart, and a table whose rows were changed before it \
     without changing their number shows as unchanged";

/// Said when the golden's record predates the comparison of every catalog entry.
const OLD_RECORD: &str =
    "the golden's record predates the comparison of rules, policies, grants and options, \
     so changes to those are not shown: refresh the golden (`airlock golden refresh`) to compare them";

/// Said of a database the golden holds but whose record predates the
/// recording of databases other than the sandbox's own.
fn unrecorded(name: &str) -> String {
    format!(
        "the golden holds database {name}, but its record predates the recording of more than one \
         database, so {name} is not compared: refresh the golden (`airlock golden refresh`) to compare it"
    )
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
            databases: Vec::new(),
            caveats: Vec::new(),
            redis: redis_change(engine, &sb).await?,
            no_postgres: true,
        });
    }
    let generation_dir = engine.layout.golden_generation(&sb.golden, sb.generation);
    let golden = Snapshot::load(&generation_dir)?;
    let golden_pgdata = generation_dir.join("pgdata");
    let own = admin(engine, &sb, DATABASE).await?;
    let mut caveats = Vec::new();
    if catalog::counters_lost(own.client()).await.map_err(locked)? {
        caveats.push(COUNTERS_LOST.to_owned());
    }
    if golden.catalog.objects.is_none() {
        caveats.push(OLD_RECORD.to_owned());
    }
    // Each database now, and whether the golden held it: its files are there
    // (a database's directory is named by its oid, which a fork keeps).
    let now: Vec<(String, bool)> = own
        .client()
        .query(
            "SELECT datname::text, oid::text FROM pg_catalog.pg_database
              WHERE datallowconn AND NOT datistemplate ORDER BY datname",
            &[],
        )
        .await
        .map_err(|e| airlock_core::error::Error::postgres(airlock_postgres::admin::describe(&e)))?
        .iter()
        .map(|r| Ok((r.cell::<String>(0)?, golden_pgdata.join("base").join(r.cell::<String>(1)?).is_dir())))
        .collect::<Result<_>>()?;
    let (schema_changes, row_changes) = compare(engine, &sb, &own, DATABASE, &golden, &golden_pgdata).await?;
    drop(own);

    let mut databases = Vec::new();
    // The golden's own first, then those created since the fork: names the
    // agent picks cannot push a golden's database out of the comparison.
    let mut others: Vec<&(String, bool)> = now.iter().filter(|(name, _)| name != DATABASE).collect();
    others.sort_by_key(|(name, in_golden)| (!in_golden, name.clone()));
    if others.len() > MAX_DATABASES {
        let skipped: Vec<&str> =
            others[MAX_DATABASES..].iter().map(|(name, _)| name.as_str()).take(50).collect();
        caveats.push(format!(
            "the sandbox holds {} other databases; {} of them were not compared: {}{}",
            others.len(),
            others.len() - MAX_DATABASES,
            skipped.join(", "),
            if others.len() - MAX_DATABASES > skipped.len() { ", ..." } else { "" }
        ));
    }
    for (name, in_golden) in others.into_iter().take(MAX_DATABASES) {
        let recorded = golden.databases.get(name);
        if *in_golden && recorded.is_none() {
            caveats.push(unrecorded(name));
            continue;
        }
        // One database that cannot be read (a lock held, dropped meanwhile)
        // is said, and the others still compared.
        let compared = async {
            let session = admin(engine, &sb, name).await?;
            let empty = Snapshot::default();
            compare(engine, &sb, &session, name, recorded.unwrap_or(&empty), &golden_pgdata).await
        }
        .await;
        let (schema_changes, row_changes) = match compared {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(sandbox = %sb.id, database = %name, error = %e, "a database could not be compared");
                caveats.push(format!(
                    "database {name} could not be compared (a lock one of the sandbox's own sessions holds, \
                     or it was dropped meanwhile): ask again"
                ));
                continue;
            }
        };
        let change = if recorded.is_some() { "changed" } else { "created" };
        if change == "changed" && schema_changes.is_empty() && row_changes.is_empty() {
            continue;
        }
        databases.push(DatabaseChange {
            name: name.clone(),
            change: change.into(),
            schema_changes,
            row_changes,
        });
    }
    Ok(Changes {
        golden: sb.golden.clone(),
        generation: sb.generation,
        schema_changes,
        row_changes,
        databases,
        caveats,
        redis: redis_change(engine, &sb).await?,
        no_postgres: false,
    })
}

/// One database on `session` compared with the golden's record of it
/// (`golden`, empty for a database created since the fork).
async fn compare(
    engine: &Engine,
    sb: &Sandbox,
    session: &Admin,
    database: &str,
    golden: &Snapshot,
    golden_pgdata: &Path,
) -> Result<(Vec<Change>, Vec<RowChange>)> {
    let now = catalog::read(session.client()).await.map_err(locked)?;
    let dir = engine.layout.sandbox_instance(&sb.id);
    let rows =
        catalog::count_rows(&dir, sb.pid.unwrap_or_default(), database, &now, COUNT_PER_TABLE, COUNT_BUDGET)
            .await;
    let activity = catalog::attempted_and_committed(session.client()).await.map_err(locked)?;
    let rewritten = catalog::rewritten(session.client(), golden_pgdata).await.map_err(locked)?;
    let mut row_changes = Vec::new();
    let tables: BTreeSet<&String> = golden.rows.keys().chain(rows.keys()).collect();
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
    Ok((catalog::diff::diff(&golden.catalog, &now), row_changes))
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
            schema_lines(&self.schema_changes, "", &mut out);
            row_lines(&self.row_changes, "", &mut out);
        }
        for database in &self.databases {
            match database.change.as_str() {
                "created" => {
                    let tables = database.schema_changes.iter().filter(|c| c.object == "table").count();
                    let plural = if tables == 1 { "" } else { "s" };
                    out.push(format!("Database {}: created, with {tables} table{plural}.", database.name));
                    row_lines(&database.row_changes, "  ", &mut out);
                }
                _ => {
                    out.push(format!("Database {}:", database.name));
                    schema_lines(&database.schema_changes, "  ", &mut out);
                    row_lines(&database.row_changes, "  ", &mut out);
                }
            }
        }
        if let Some(r) = &self.redis {
            out.push(format!("Redis keys: {} -> {}", r.golden_keys, r.now.keys()));
        }
        out.extend(self.caveats.iter().map(|c| format!("Note: {c}.")));
        out.join("\n")
    }
}

fn schema_lines(changes: &[Change], indent: &str, out: &mut Vec<String>) {
    if changes.is_empty() {
        out.push(format!("{indent}Schema: unchanged."));
    } else {
        out.push(format!("{indent}Schema: {} changes", changes.len()));
        out.extend(changes.iter().map(|c| format!("{indent}  {}", c.line())));
    }
}

fn row_lines(changes: &[RowChange], indent: &str, out: &mut Vec<String>) {
    if changes.is_empty() {
        out.push(format!("{indent}Rows: unchanged."));
        return;
    }
    out.push(format!("{indent}Rows (golden -> now; ~ marks an estimate):"));
    for r in changes {
        let count = |n: Option<i64>| n.map_or("-".to_owned(), |n| n.to_string());
        let approx = if r.exact { "" } else { "~" };
        let rewritten = if r.rewritten { "; rewritten, so any row may differ" } else { "" };
        out.push(format!(
            "{indent}  {}: {} -> {approx}{} rows (inserted {}, updated {}, deleted {}{rewritten})",
            r.table,
            count(r.golden_rows),
            count(r.rows),
            r.inserted,
            r.updated,
            r.deleted
        ));
    }
}
