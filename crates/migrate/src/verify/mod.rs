//! Checking a migration on its target before it is kept.
//!
//! A test fork can be told apart from production (its probe, its database's
//! name, its data), so a hostile candidate can behave well only while tested.
//! `migrate promote` therefore applies a single-transaction file inside one
//! transaction on the target and, before committing, compares what the target
//! saw with what the test saw; any difference rolls it back. What is compared:
//! row changes per table (their kinds, and how large a share of the table),
//! tables rewritten or truncated, every catalog entry made, dropped or changed
//! (with its definition, owners set aside), roles and memberships, and settings
//! stored for databases and roles. A session that could act outside the
//! database (a superuser, or a member of the roles that run programs or write
//! server files) is refused before anything runs, since its effects cannot be
//! compared or rolled back.

use airlock_postgres::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

use super::report::StatementReport;
use crate::rows::RowImage;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_postgres::catalog::diff::Change;
use airlock_postgres::catalog::Catalog;

/// Why the target session is too powerful to run a migration promote can
/// check, if it is.
pub async fn too_powerful(client: &tokio_postgres::Client) -> Result<Option<&'static str>> {
    let row = client
        .query_one(
            "SELECT r.rolsuper,
                    pg_catalog.pg_has_role(current_user, 'pg_execute_server_program', 'MEMBER')
                    OR pg_catalog.pg_has_role(current_user, 'pg_write_server_files', 'MEMBER'),
                    r.rolcreaterole, r.rolreplication
               FROM pg_catalog.pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await
        .map_err(pg_error)?;
    Ok(if row.cell(0)? {
        Some("is a superuser")
    } else if row.cell(1)? {
        Some("may run programs or write files on the server")
    } else if row.cell(2)? {
        Some("may create and change roles")
    } else if row.cell(3)? {
        // A replication slot outlives a rollback, and holds the server's WAL.
        Some("may replicate (make replication slots, which no rollback removes)")
    } else {
        None
    })
}

/// The target as the migration's transaction found it.
pub struct Before {
    tables: BTreeMap<String, (i64, f64)>,
    cluster: BTreeSet<String>,
    sequences: BTreeMap<String, Option<i64>>,
    /// Images of the tables whose changed rows the test recorded.
    rows: BTreeMap<String, RowImage>,
    /// The session's row counters as the part began: they hold what earlier
    /// transactions did until the session reports them (PostgreSQL 15 on),
    /// so only what they gain is the part's.
    activity: BTreeMap<String, [i64; 3]>,
    shared: BTreeMap<String, i64>,
    /// Indexes left INVALID (by a failed `CREATE INDEX CONCURRENTLY`).
    invalid: BTreeSet<String>,
    /// How often each table was analyzed: statistics an `ANALYZE` writes
    /// stay whatever becomes of its transaction.
    analyzed: BTreeMap<String, i64>,
}

impl Before {
    /// Reads what is compared afterwards; `compared` are the tables whose
    /// changed rows' keys the test recorded.
    pub async fn read(
        client: &tokio_postgres::Client,
        shape: &Shape,
        compared: &BTreeSet<String>,
    ) -> Result<Before> {
        let pinned = airlock_postgres::catalog::Pinned::pin(client).await?;
        let before = Before::read_pinned(client, shape, compared).await?;
        pinned.restore(client).await?;
        Ok(before)
    }

    async fn read_pinned(
        client: &tokio_postgres::Client,
        shape: &Shape,
        compared: &BTreeSet<String>,
    ) -> Result<Before> {
        Ok(Before {
            tables: tables(client).await?,
            cluster: cluster_state(client).await?,
            sequences: sequences(client).await?,
            rows: row_images(client, Reading::Directly, shape, compared, None).await?,
            activity: xact_activity(client).await?,
            shared: shared_catalog_writes(client).await?.into_iter().collect(),
            invalid: invalid_indexes(client).await?,
            analyzed: analyze_counts(client).await?,
        })
    }

    /// What a failed or refused part left behind that no rollback undoes:
    /// sequences it moved forward (`nextval` is never undone) and indexes it
    /// left INVALID.
    pub async fn left_behind(&self, client: &tokio_postgres::Client) -> Result<Vec<String>> {
        let pinned = airlock_postgres::catalog::Pinned::pin(client).await?;
        let now = sequences(client).await?;
        let invalid = invalid_indexes(client).await?;
        pinned.restore(client).await?;
        let mut out = Vec::new();
        let advanced: Vec<String> = now
            .iter()
            .filter_map(|(name, n)| match (self.sequences.get(name).copied().flatten(), *n) {
                (Some(was), Some(n)) if n > was => Some(format!("{name} {was} → {n}")),
                (None, Some(n)) => Some(format!("{name} → {n}")),
                _ => None,
            })
            .collect();
        if !advanced.is_empty() {
            out.push(format!("sequences it advanced stay advanced ({})", advanced.join(", ")));
        }
        for index in invalid.difference(&self.invalid) {
            out.push(format!("index {index} stays behind INVALID: DROP INDEX CONCURRENTLY {index}"));
        }
        let analyzed: Vec<String> = analyze_counts(client)
            .await?
            .into_iter()
            .filter(|(t, n)| self.analyzed.get(t).is_some_and(|was| n > was))
            .map(|(t, _)| t)
            .collect();
        if !analyzed.is_empty() {
            out.push(format!(
                "the planner statistics its ANALYZE wrote stay (ANALYZE {} to read them again)",
                analyzed.join(", ")
            ));
        }
        Ok(out)
    }
}

/// How many times each user table was analyzed (by hand and by autovacuum).
async fn analyze_counts(client: &tokio_postgres::Client) -> Result<BTreeMap<String, i64>> {
    let rows = client
        .query(
            "SELECT pg_catalog.quote_ident(schemaname) || '.' || pg_catalog.quote_ident(relname),
                    analyze_count + autoanalyze_count
               FROM pg_catalog.pg_stat_user_tables",
            &[],
        )
        .await
        .map_err(pg_error)?;
    rows.into_iter().map(|r| Ok((r.cell(0)?, r.cell(1)?))).collect()
}

/// Indexes not valid (a failed `CREATE INDEX CONCURRENTLY` leaves one).
async fn invalid_indexes(client: &tokio_postgres::Client) -> Result<BTreeSet<String>> {
    let rows = client
        .query(
            "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname)
               FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE NOT i.indisvalid",
            &[],
        )
        .await
        .map_err(pg_error)?;
    rows.into_iter().map(|r| r.cell::<String>(0)).collect()
}

mod drift;
mod rows;
mod sequences;
#[cfg(test)]
mod tests;

pub use drift::*;
pub use rows::*;
pub use sequences::*;

/// Rows the open transaction wrote in the catalogs every database shares:
/// roles (a password, `VALID UNTIL`), memberships, databases (a connection
/// limit, `ALLOW_CONNECTIONS`) and their settings. A session can change its
/// own role's password; no one but a superuser can read it, but the write is
/// counted.
async fn shared_catalog_writes(client: &tokio_postgres::Client) -> Result<Vec<(String, i64)>> {
    let rows = client
        .query(
            "SELECT relname, (n_tup_ins + n_tup_upd + n_tup_del)::bigint
               FROM pg_catalog.pg_stat_xact_sys_tables
              WHERE relname IN ('pg_authid', 'pg_auth_members', 'pg_database', 'pg_db_role_setting',
                                'pg_tablespace', 'pg_shseclabel', 'pg_replication_origin', 'pg_parameter_acl')
                AND n_tup_ins + n_tup_upd + n_tup_del > 0",
            &[],
        )
        .await
        .map_err(pg_error)?;
    rows.into_iter().map(|r| Ok((r.cell(0)?, r.cell(1)?))).collect()
}

/// Each user table's storage file number (a rewrite or TRUNCATE gives it a new
/// one) and its estimated rows (the planner's, never a scan of production).
async fn tables(client: &tokio_postgres::Client) -> Result<BTreeMap<String, (i64, f64)>> {
    let rows = client
        .query(
            &format!(
                "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname), c.relfilenode::bigint,
                        GREATEST(c.reltuples, 0)::float8
                   FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.relkind IN ('r', 'm', 'p') AND {}",
                airlock_postgres::catalog::SYSTEM_SCHEMAS
            ),
            &[],
        )
        .await
        .map_err(pg_error)?;
    rows.into_iter().map(|r| Ok((r.cell(0)?, (r.cell(1)?, r.cell(2)?)))).collect()
}

/// Roles with their attributes, memberships, and settings stored for databases
/// and roles: what a migration may change beyond its own database's tables.
async fn cluster_state(client: &tokio_postgres::Client) -> Result<BTreeSet<String>> {
    let rows = client
        .query(
            "SELECT 'role ' || rolname || ' super=' || rolsuper || ' createrole=' || rolcreaterole
                    || ' createdb=' || rolcreatedb || ' login=' || rolcanlogin || ' replication='
                    || rolreplication || ' bypassrls=' || rolbypassrls || ' connection limit='
                    || rolconnlimit || ' valid until=' || COALESCE(rolvaliduntil::text, 'always')
               FROM pg_catalog.pg_roles
             UNION ALL
             SELECT 'database ' || datname || ' connection limit=' || datconnlimit || ' allow connections='
                    || datallowconn || ' template=' || datistemplate || ' grants='
                    || COALESCE(datacl::text, 'default')
               FROM pg_catalog.pg_database
             UNION ALL
             SELECT 'member ' || m.member::regrole::text || ' of ' || m.roleid::regrole::text
               FROM pg_catalog.pg_auth_members m
             UNION ALL
             SELECT 'setting for database ' || COALESCE(d.datname, '*') || ' role '
                    || COALESCE(s.setrole::regrole::text, '*') || ': ' || array_to_string(s.setconfig, ', ')
               FROM pg_catalog.pg_db_role_setting s LEFT JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase",
            &[],
        )
        .await
        .map_err(pg_error)?;
    rows.into_iter().map(|r| r.cell::<String>(0)).collect()
}

/// Runs what the commit would set off, until a round changes no row (see the
/// test's own `apply::run_deferred`); the error the commit would raise, if any.
pub async fn settle_deferred(client: &tokio_postgres::Client) -> Result<Option<String>> {
    let mut changed = xact_activity(client).await?;
    for _ in 0..DEFERRED_ROUNDS {
        if let Err(e) = client.batch_execute("SET CONSTRAINTS ALL IMMEDIATE").await {
            return Ok(Some(airlock_postgres::admin::describe(&e)));
        }
        let now = xact_activity(client).await?;
        if now == changed {
            return Ok(None);
        }
        changed = now;
    }
    Ok(Some("work deferred to the commit kept deferring more work".into()))
}

/// Rows inserted, updated and deleted per user table in the open transaction.
async fn xact_activity(client: &tokio_postgres::Client) -> Result<BTreeMap<String, [i64; 3]>> {
    let rows = client
        .query(
            "SELECT pg_catalog.quote_ident(schemaname) || '.' || pg_catalog.quote_ident(relname), n_tup_ins, n_tup_upd, n_tup_del
               FROM pg_catalog.pg_stat_xact_user_tables",
            &[],
        )
        .await
        .map_err(pg_error)?;
    rows.into_iter().map(|r| Ok((r.cell(0)?, [r.cell(1)?, r.cell(2)?, r.cell(3)?]))).collect()
}

/// A share of a table's rows the target may change beyond the test's share
/// before it is a difference (data is not the golden's, so shares drift some).
const SHARE_SLACK: f64 = 0.05;

/// What a part did on the target that its test did not, and the catalog it
/// left (what the next part's changes are read against: reading it again
/// after the commit would cost a second read of the same schema).
pub struct Surprises {
    /// Each difference, in words; none when the part did what its test did.
    pub found: Vec<String>,
    /// The target's catalog once the part ran.
    pub catalog: Catalog,
}

/// What the migration did on the target, in its open transaction (or in a
/// part that ran outside one), that its test did not.
///
/// `tested` is what the test saw of the part: its statements, the catalog
/// changes they made, the sequences they set back, and the rows of the
/// compared tables before it with what it did to them.
pub async fn surprises(
    client: &tokio_postgres::Client,
    tested: &Tested<'_>,
    catalog_before: &Catalog,
    before: &Before,
) -> Result<Surprises> {
    // Names are read as the test read them, whatever the migration set.
    let pinned = airlock_postgres::catalog::Pinned::pin(client).await?;
    let out = surprises_pinned(client, tested, catalog_before, before).await?;
    pinned.restore(client).await?;
    Ok(out)
}

/// What a test saw one part do, to hold the target to.
pub struct Tested<'a> {
    /// The statements it ran.
    pub statements: &'a [StatementReport],
    /// The catalog changes they made.
    pub changes: &'a [Change],
    /// The sequences they set back.
    pub set_back: &'a BTreeSet<String>,
    /// How far they moved sequences forward.
    pub advanced: &'a BTreeMap<String, i64>,
    /// The compared tables' rows in the golden.
    pub golden_rows: &'a super::rows::RowSet,
    /// The compared tables' rows before the part.
    pub rows_before: &'a super::rows::RowSet,
    /// What the part did to them.
    pub rows: &'a super::rows::RowChanges,
    /// The golden's shape rows are read by ([`golden_shape`]).
    pub shape: &'a Shape,
}

async fn surprises_pinned(
    client: &tokio_postgres::Client,
    tested: &Tested<'_>,
    catalog_before: &Catalog,
    before: &Before,
) -> Result<Surprises> {
    let Tested { statements, changes, set_back: tested_set_back, .. } = *tested;
    let mut out = Vec::new();
    // Which rows, and what they hold: every row alike here and in the test
    // before the part comes out of it as it did there.
    if !before.rows.is_empty() {
        let compared: BTreeSet<String> = before.rows.keys().cloned().collect();
        let after =
            row_images(client, Reading::Directly, tested.shape, &compared, Some(&before.rows)).await?;
        out.extend(super::rows::differences(
            tested.golden_rows,
            tested.rows_before,
            tested.rows,
            &super::rows::set_of(&before.rows),
            &super::rows::changes_of(&before.rows, &after),
        ));
    }
    for (catalog, rows) in shared_catalog_writes(client).await? {
        let rows = rows - before.shared.get(&catalog).copied().unwrap_or(0);
        if rows <= 0 {
            continue;
        }
        out.push(format!(
            "{rows} rows written in {catalog} (roles, their passwords and databases are not the migration's)"
        ));
    }
    // Sequences: a test that set none back promises a target where none is
    // set back, and the other way round (for a file applied whole).
    let here = set_back(&before.sequences, &sequences(client).await?);
    for name in here.difference(tested_set_back).take(5) {
        out.push(format!("sequence {name} set back (not so in the test)"));
    }
    for name in tested_set_back.difference(&here).take(5) {
        out.push(format!("sequence {name} set back in the test, not here"));
    }
    // A sequence the part set back or restarted must still hand out values
    // its column does not hold (on a target whose rows moved on since the
    // golden, a RESTART the test saw pass can land among them).
    for name in &here {
        if let (Some(next), Some((column, max))) =
            (next_value(client, name).await?, owned_column_max(client, name).await?)
        {
            if next <= max {
                out.push(format!(
                    "sequence {name} would hand out {next} next, which {column} holds already (up to {max})"
                ));
            }
        }
    }
    // And none moved forward much further than in the test (an insert that
    // conflicts still takes its serial's value; a setval by code).
    for (name, moved) in advanced(&before.sequences, &sequences(client).await?) {
        let tested = tested.advanced.get(&name).copied().unwrap_or(0);
        if moved > advance_allowed(tested) {
            out.push(format!(
                "sequence {name} moved forward by {moved} ({tested} in the test; if the application inserted \
                 that many meanwhile, promote when it is quieter)"
            ));
        }
    }
    // Attempts, as the server counts them here: a rolled-back part of the
    // file counts alike on both sides.
    let seen = super::report::rows_by_table(statements, false);
    let mut rewritten: BTreeSet<&str> = BTreeSet::new();
    for st in statements {
        rewritten.extend(st.rows.iter().filter(|r| r.truncated).map(|r| r.table.as_str()));
        rewritten.extend(st.rewrites.iter().map(|w| w.table.as_str()));
    }
    for (table, mut did) in xact_activity(client).await? {
        let earlier = before.activity.get(&table).copied().unwrap_or_default();
        for (n, was) in did.iter_mut().zip(earlier) {
            *n = (*n - was).max(0);
        }
        let test = seen.get(table.as_str()).copied().unwrap_or_default();
        for (i, what) in ["inserted into", "updated in", "deleted from"].iter().enumerate() {
            if did[i] > 0 && test[i] == 0 {
                out.push(format!("{} {what} {table}", crate::report::rows(did[i])));
                continue;
            }
            // Updates and deletes: the share of the table, here against there.
            // The test's table sizes are the golden's (the report's catalog estimates).
            let here = before.tables.get(&table).map_or(0.0, |t| t.1);
            let there = tested_table_rows(catalog_before, &table);
            if i > 0 && did[i] > 0 && here > 0.0 && there > 0.0 {
                let (share_here, share_there) = (did[i] as f64 / here, test[i] as f64 / there);
                if share_here > share_there * 2.0 + SHARE_SLACK {
                    out.push(format!(
                        "{} rows {what} {table} ({:.0}% of it; {:.0}% in the test)",
                        did[i],
                        share_here.min(1.0) * 100.0,
                        share_there * 100.0
                    ));
                }
            }
        }
    }
    for (table, (file, _)) in tables(client).await? {
        if before.tables.get(&table).is_some_and(|t| t.0 != file) && !rewritten.contains(table.as_str()) {
            out.push(format!("{table} rewritten or truncated"));
        }
    }
    let cluster = cluster_state(client).await?;
    for changed in cluster.symmetric_difference(&before.cluster).take(5) {
        let how = if cluster.contains(changed) { "now" } else { "no longer" };
        out.push(format!("{how}: {changed}"));
    }
    // Catalog entries with their definitions; owners are set aside, since the
    // test's objects belong to the sandbox's roles and the target's to its own.
    let after = airlock_postgres::catalog::read(client).await?;
    let made = airlock_postgres::catalog::diff::diff(catalog_before, &after);
    out.extend(schemas_named_for_roles(client, &made).await?);
    out.extend(shadowed_under_stored_paths(client, &made).await?);
    // Default privileges a statement gives without FOR ROLE belong to the
    // role that runs it: the golden's owner's under test (or the agent's,
    // where the agent could not take the owner's role), the target session's here.
    let runner: String =
        client.query_one("SELECT pg_catalog.session_user()::text", &[]).await.map_err(pg_error)?.cell(0)?;
    let here = entries(&made, &[&runner]);
    let there = entries(changes, &[airlock_core::dsn::OWNER_ROLE, airlock_core::dsn::AGENT_ROLE]);
    for extra in here.difference(&there).take(5) {
        out.push(format!("{extra} (not so in the test)"));
    }
    for missing in there.difference(&here).take(5) {
        out.push(format!("{missing} in the test, not here"));
    }
    Ok(Surprises { found: out, catalog: after })
}

/// Schemas the part made that are named after a role of the target: with
/// the default `search_path` (`"$user", public`), that role's sessions find
/// the schema's objects before public's, so the application's own queries
/// could resolve to them. A test fork's roles are not the target's, so its
/// test cannot show this.
async fn schemas_named_for_roles(client: &tokio_postgres::Client, made: &[Change]) -> Result<Vec<String>> {
    let schemas: Vec<String> = made
        .iter()
        .filter(|c| c.change == "added" && c.object.is_empty())
        .filter_map(|c| c.name.strip_prefix("schema "))
        .map(|n| n.trim_matches('"').replace("\"\"", "\""))
        .collect();
    if schemas.is_empty() {
        return Ok(vec![]);
    }
    let rows = client
        .query(
            "SELECT rolname::text FROM pg_catalog.pg_roles WHERE rolname = ANY($1) ORDER BY 1",
            &[&schemas],
        )
        .await
        .map_err(pg_error)?;
    rows.into_iter()
        .map(|r| {
            let role: String = r.cell(0)?;
            Ok(format!(
                "schema {role} is named after a role here: through search_path's \"$user\", {role}'s sessions would find its objects before public's"
            ))
        })
        .collect()
}

/// Objects the part made that come, in a `search_path` the target stores for
/// a role or database (`ALTER ROLE app SET search_path = app, public`),
/// before a same-named object of a schema later in that path: those sessions
/// would find the new one instead. A test fork stores no such setting (a
/// golden never carries one), so its test cannot show this.
async fn shadowed_under_stored_paths(
    client: &tokio_postgres::Client,
    made: &[Change],
) -> Result<Vec<String>> {
    let added: Vec<(String, String, &str)> = made
        .iter()
        .filter(|c| {
            c.change == "added" && ["table", "view", "sequence", "function"].contains(&c.object.as_str())
        })
        .map(|c| {
            let name = c.name.split('(').next().unwrap_or(&c.name);
            let (schema, name) = airlock_postgres::catalog::split_qualified(name);
            (schema, name, if c.object == "function" { "function" } else { "relation" })
        })
        .collect();
    if added.is_empty() {
        return Ok(vec![]);
    }
    let stored = client
        .query(
            "SELECT CASE WHEN s.setrole = 0 THEN NULL ELSE s.setrole::pg_catalog.regrole::text END,
                    COALESCE(d.datname, '*'), c
               FROM pg_catalog.pg_db_role_setting s
               LEFT JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase,
                    pg_catalog.unnest(s.setconfig) c
              WHERE (s.setdatabase = 0 OR d.datname = pg_catalog.current_database())
                AND pg_catalog.starts_with(c, 'search_path=')",
            &[],
        )
        .await
        .map_err(pg_error)?;
    let mut out = Vec::new();
    for row in stored {
        let (role, database, setting): (Option<String>, String, String) =
            (row.cell(0)?, row.cell(1)?, row.cell(2)?);
        let path: Vec<String> = setting
            .trim_start_matches("search_path=")
            .split(',')
            .map(|p| p.trim().trim_matches('"').to_owned())
            .map(|p| if p == "$user" { role.clone().unwrap_or_default() } else { p })
            .filter(|p| !p.is_empty())
            .collect();
        for (schema, name, kind) in &added {
            let Some(at) = path.iter().position(|p| p == schema) else { continue };
            for later in &path[at + 1..] {
                let sql = match *kind {
                    "function" => {
                        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n \
                                   ON n.oid = p.pronamespace WHERE n.nspname = $1 AND p.proname = $2)"
                    }
                    _ => {
                        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n \
                          ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2)"
                    }
                };
                let shadows: bool = client.query_one(sql, &[later, name]).await.map_err(pg_error)?.cell(0)?;
                if shadows {
                    let who = role.as_deref().map_or("every role".to_owned(), |r| format!("role {r}"));
                    out.push(format!(
                        "{schema}.{name} comes before {later}.{name} in the search_path stored for {who} in database {database}: \
                         those sessions would find it instead"
                    ));
                }
            }
        }
    }
    Ok(out)
}

/// A target's refusal, as `migration_failed`.
pub(crate) fn pg_error(e: tokio_postgres::Error) -> Error {
    Error::new(
        ErrorCode::MigrationFailed,
        airlock_postgres::admin::describe(&e),
        "the target refused; nothing was applied",
    )
}

/// How many times deferred work may defer more before the test gives up on it.
pub(crate) const DEFERRED_ROUNDS: usize = 20;
