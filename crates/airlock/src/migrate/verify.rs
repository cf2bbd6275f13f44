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

use crate::pg::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

use super::promote::pg_error;
use super::report::StatementReport;
use crate::catalog::diff::Change;
use crate::catalog::Catalog;
use crate::error::Result;

/// Why the target session is too powerful to run a migration promote can
/// check, if it is.
pub async fn too_powerful(client: &tokio_postgres::Client) -> Result<Option<&'static str>> {
    let row = client
        .query_one(
            "SELECT r.rolsuper,
                    pg_catalog.pg_has_role(current_user, 'pg_execute_server_program', 'MEMBER')
                    OR pg_catalog.pg_has_role(current_user, 'pg_write_server_files', 'MEMBER'),
                    r.rolcreaterole
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
}

impl Before {
    /// Reads what is compared afterwards; `compared` are the tables whose
    /// changed rows' keys the test recorded.
    pub async fn read(client: &tokio_postgres::Client, compared: &BTreeSet<String>) -> Result<Before> {
        let pinned = crate::catalog::Pinned::pin(client).await?;
        let before = Before::read_pinned(client, compared).await?;
        pinned.restore(client).await?;
        Ok(before)
    }

    async fn read_pinned(client: &tokio_postgres::Client, compared: &BTreeSet<String>) -> Result<Before> {
        Ok(Before {
            tables: tables(client).await?,
            cluster: cluster_state(client).await?,
            sequences: sequences(client).await?,
            rows: row_images(client, Reading::Directly, compared, None).await?,
            activity: xact_activity(client).await?,
            shared: shared_catalog_writes(client).await?.into_iter().collect(),
            invalid: invalid_indexes(client).await?,
        })
    }

    /// What a failed or refused part left behind that no rollback undoes:
    /// sequences it moved forward (`nextval` is never undone) and indexes it
    /// left INVALID.
    pub async fn left_behind(&self, client: &tokio_postgres::Client) -> Result<Vec<String>> {
        let pinned = crate::catalog::Pinned::pin(client).await?;
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
        Ok(out)
    }
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

/// Each sequence's position (`None` before its first `nextval`, or where the
/// session may not read it).
pub async fn sequences(client: &tokio_postgres::Client) -> Result<BTreeMap<String, Option<i64>>> {
    let rows = client
        .query(
            "SELECT pg_catalog.quote_ident(schemaname) || '.' || pg_catalog.quote_ident(sequencename), last_value
               FROM pg_catalog.pg_sequences
              WHERE schemaname NOT IN ('pg_catalog', 'information_schema') AND schemaname NOT LIKE 'airlock%'",
            &[],
        )
        .await
        .map_err(pg_error)?;
    rows.into_iter().map(|r| Ok((r.cell(0)?, r.cell(1)?))).collect()
}

/// Puts back every sequence set back since `before` (after a rollback:
/// `setval` is not undone by one); the sequences it put back.
pub async fn restore_sequences(client: &tokio_postgres::Client, before: &Before) -> Result<Vec<String>> {
    let pinned = crate::catalog::Pinned::pin(client).await?;
    let restored = restore_sequences_pinned(client, before).await?;
    pinned.restore(client).await?;
    Ok(restored)
}

async fn restore_sequences_pinned(client: &tokio_postgres::Client, before: &Before) -> Result<Vec<String>> {
    let moved = set_back(&before.sequences, &sequences(client).await?);
    let mut restored = Vec::new();
    for name in moved {
        let Some(Some(was)) = before.sequences.get(&name) else { continue };
        client
            .execute("SELECT pg_catalog.setval($1::text::regclass, $2, true)", &[&name, was])
            .await
            .map_err(pg_error)?;
        restored.push(name);
    }
    Ok(restored)
}

/// The sequences set back (or restarted) between two readings: what a
/// `setval` or `ALTER SEQUENCE ... RESTART` does, and a `nextval` never.
pub fn set_back(
    before: &BTreeMap<String, Option<i64>>,
    after: &BTreeMap<String, Option<i64>>,
) -> BTreeSet<String> {
    after
        .iter()
        .filter(|(name, now)| match (before.get(*name).copied().flatten(), **now) {
            (Some(was), Some(now)) => now < was,
            (Some(_), None) => true,
            _ => false,
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// Tables of at most this many rows have their rows compared between the
/// test and the target (see [`super::rows`]).
pub const ROWS_COMPARED: i64 = 100_000;

/// Each row of a table by its primary key (or, for a table without one, by
/// its own digest and how many rows before it share that digest), as a
/// digest of its columns that are not NULL, each by its name: a column added
/// changes no row until a value is put in it, one dropped changes those that
/// held a value, and the digest does not depend on the columns' order, so a
/// test's images and a target's read alike whatever each added first.
/// Values are read through their types' output functions (`ROW(v)::text`),
/// never a cast a database could define, so reading runs no code of theirs.
#[derive(Debug, Clone, Default)]
pub struct RowImage {
    /// Digest of each row, by its key.
    rows: BTreeMap<String, String>,
}

impl RowImage {
    /// Each row's digest, by its key.
    pub fn rows(&self) -> &BTreeMap<String, String> {
        &self.rows
    }
}

/// How a session reads a table's rows for its image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Itself: the target's own session at promote, the role the migration
    /// runs as, so whatever of the migration's a read runs gains nothing.
    Directly,
    /// Through the reader's function (`catalog::READER_SQL`), from a test
    /// fork's admin session. The admin never reads a table the candidate
    /// shaped itself: planning a read folds the table's partial-index
    /// predicates and its index and statistics expressions, which run any
    /// function the candidate marked immutable, as whoever reads.
    AsReader,
}

/// Images of `tables` (those of at most [`ROWS_COMPARED`] rows by the
/// planner's estimate and by count; others are left out), and only of those
/// in `first` when given (the images to compare with).
pub async fn row_images(
    client: &tokio_postgres::Client,
    reading: Reading,
    tables: &BTreeSet<String>,
    first: Option<&BTreeMap<String, RowImage>>,
) -> Result<BTreeMap<String, RowImage>> {
    if tables.is_empty() {
        return Ok(BTreeMap::new());
    }
    let grant_each = match reading {
        Reading::AsReader => crate::catalog::ensure_reader(client).await?,
        Reading::Directly => false,
    };
    // Rows read as text alike under test and on the target, whatever time
    // zone or date style either session has.
    let pinned = crate::catalog::Pinned::pin(client).await?;
    let images = row_images_pinned(client, (reading, grant_each), tables, first).await;
    if images.is_err() && reading == Reading::AsReader {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    pinned.restore(client).await?;
    images
}

async fn row_images_pinned(
    client: &tokio_postgres::Client,
    (reading, grant_each): (Reading, bool),
    tables: &BTreeSet<String>,
    first: Option<&BTreeMap<String, RowImage>>,
) -> Result<BTreeMap<String, RowImage>> {
    let keys = client
        .query(
            &format!(
                "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname),
                        (SELECT pg_catalog.string_agg(pg_catalog.quote_ident(a.attname), ', ' ORDER BY k.ord)
                           FROM pg_catalog.pg_index i,
                                pg_catalog.unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                           JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
                          WHERE i.indrelid = c.oid AND i.indisprimary),
                        (SELECT pg_catalog.array_agg(pg_catalog.quote_ident(a.attname)::text ORDER BY a.attnum)
                           FROM pg_catalog.pg_attribute a
                          WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
                        (SELECT pg_catalog.array_agg(pg_catalog.quote_ident(a.attname)::text ORDER BY a.attnum)
                           FROM pg_catalog.pg_attribute a
                           JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                          WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                            AND {})
                   FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.relkind IN ('r', 'p') AND c.reltuples <= {ROWS_COMPARED} AND {}",
                super::code::fills_by_chance_sql("pg_catalog.pg_get_expr(d.adbin, d.adrelid)"),
                crate::catalog::SYSTEM_SCHEMAS
            ),
            &[],
        )
        .await
        .map_err(pg_error)?;
    let mut out = BTreeMap::new();
    for row in keys {
        let (table, key, now, by_chance): (String, Option<String>, Option<Vec<String>>, Option<Vec<String>>) =
            (row.cell(0)?, row.cell(1)?, row.cell(2)?, row.cell(3)?);
        if !tables.contains(&table) {
            continue;
        }
        // Not imaged the first time: nothing to compare with.
        if first.is_some_and(|f| !f.contains_key(&table)) {
            continue;
        }
        // A column whose default reads the clock or chance holds a value that
        // differs between any two copies once filled (`ADD COLUMN at
        // timestamptz DEFAULT now()`, `... uuid DEFAULT gen_random_uuid()`),
        // which the classifier lets through: it is not compared.
        let by_chance = by_chance.unwrap_or_default();
        let mut columns: Vec<String> =
            now.unwrap_or_default().into_iter().filter(|c| !by_chance.contains(c)).collect();
        columns.sort();
        let named: Vec<String> = columns
            .iter()
            .map(|c| {
                let name = c.replace('\'', "''");
                format!(
                    "CASE WHEN t.{c} IS NULL THEN NULL \
                     ELSE pg_catalog.concat('{name}=', pg_catalog.md5(ROW(t.{c})::text)) END"
                )
            })
            .collect();
        let digest = if named.is_empty() {
            "pg_catalog.md5('')".to_owned()
        } else {
            // (An array, not concat_ws: a table may have more columns than a
            // function takes arguments; NULL elements are left out.)
            format!("pg_catalog.md5(pg_catalog.array_to_string(ARRAY[{}]::text[], ','))", named.join(", "))
        };
        let key = match &key {
            Some(key) => format!("ROW({key})::text"),
            None => digest.clone(),
        };
        let rows = match reading {
            Reading::Directly => client
                .query(&format!("SELECT {key}, {digest} FROM {table} t LIMIT {}", ROWS_COMPARED + 1), &[])
                .await
                .map_err(pg_error)?,
            Reading::AsReader => {
                // In a transaction of its own, rolled back: nothing the
                // candidate's code might set in it outlives the read.
                client.batch_execute("BEGIN").await.map_err(pg_error)?;
                if grant_each {
                    client.batch_execute(&crate::catalog::reader_grant(&table)).await.map_err(pg_error)?;
                }
                let rows = client
                    .query(
                        "SELECT k, d FROM pg_airlock.row_image($1::text::pg_catalog.regclass, $2, $3, $4)",
                        &[&table, &key, &digest, &(ROWS_COMPARED + 1)],
                    )
                    .await
                    .map_err(pg_error)?;
                client.batch_execute("ROLLBACK").await.map_err(pg_error)?;
                rows
            }
        };
        if rows.len() as i64 > ROWS_COMPARED {
            continue;
        }
        let mut image = BTreeMap::new();
        let mut alike: BTreeMap<String, usize> = BTreeMap::new();
        for r in rows {
            let (k, d): (String, String) = (r.cell(0)?, r.cell(1)?);
            // Rows alike in a table without a key: the first, the second...
            let seen = alike.entry(k.clone()).or_default();
            let k = if *seen == 0 { k } else { format!("{k}#{seen}") };
            *seen += 1;
            image.insert(k, d);
        }
        out.insert(table, RowImage { rows: image });
    }
    Ok(out)
}

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
                crate::catalog::SYSTEM_SCHEMAS
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
    for _ in 0..super::apply::DEFERRED_ROUNDS {
        if let Err(e) = client.batch_execute("SET CONSTRAINTS ALL IMMEDIATE").await {
            return Ok(Some(crate::pg::admin::describe(&e)));
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
    let pinned = crate::catalog::Pinned::pin(client).await?;
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
    /// The compared tables' rows before the part.
    pub rows_before: &'a super::rows::RowSet,
    /// What the part did to them.
    pub rows: &'a super::rows::RowChanges,
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
        let after = row_images(client, Reading::Directly, &compared, Some(&before.rows)).await?;
        out.extend(super::rows::differences(
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
    let seen = super::report::rows_by_table(statements, true);
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
                out.push(format!("{} rows {what} {table}", did[i]));
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
    let after = crate::catalog::read(client).await?;
    let made = crate::catalog::diff::diff(catalog_before, &after);
    out.extend(schemas_named_for_roles(client, &made).await?);
    let here = entries(&made);
    let there = entries(changes);
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

/// How the target's schema differs from the golden's the test ran on, owners
/// set aside: a golden built from the target gives its objects to the sandbox's
/// owner role, so an owner alone is no drift.
pub fn drift(golden: &Catalog, target: &Catalog) -> Vec<Change> {
    crate::catalog::diff::diff(golden, target)
        .into_iter()
        .filter(|c| match (&c.before, &c.after) {
            (Some(before), Some(after)) => without_owners(before) != without_owners(after),
            _ => true,
        })
        .collect()
}

/// A table's rows in the catalog the test ran against (the planner's estimate).
fn tested_table_rows(catalog: &Catalog, table: &str) -> f64 {
    catalog.tables.get(table).map_or(0.0, |t| t.row_estimate.max(0) as f64)
}

/// Changes as comparable lines: what changed, and its definition with owners,
/// grantors and the grants' holders that are owners written `OWNER`.
fn entries(changes: &[Change]) -> BTreeSet<String> {
    changes
        .iter()
        .map(|c| {
            let definition = c.after.as_deref().map(without_owners).unwrap_or_default();
            // An entry whose name says what it is has no object word.
            let what: Vec<&str> = [&c.change, &c.object, &c.name]
                .into_iter()
                .map(String::as_str)
                .filter(|w| !w.is_empty())
                .collect();
            format!("{}: {definition}", what.join(" "))
        })
        .collect()
}

/// A definition with its owner set aside: the owner's name is `OWNER` wherever
/// it appears as a word, and the owner's own privileges (implicit, and shown or
/// not depending on who owns it) are left out of its grants.
fn without_owners(definition: &str) -> String {
    let owner = definition.split("; ").find_map(|part| part.strip_prefix("owner ")).map(str::to_owned);
    let Some(owner) = owner else { return definition.to_owned() };
    let named = |text: &str| -> String {
        text.split_inclusive(['=', '/', ',', ' '])
            .map(|w| {
                let word = w.trim_end_matches(['=', '/', ',', ' ']);
                if word == owner {
                    format!("OWNER{}", &w[word.len()..])
                } else {
                    w.to_owned()
                }
            })
            .collect()
    };
    definition
        .split("; ")
        .filter_map(|part| match part.strip_prefix("grants ") {
            Some(list) => {
                let kept: Vec<String> =
                    list.split(',').map(named).filter(|entry| !entry.starts_with("OWNER=")).collect();
                (!kept.is_empty()).then(|| format!("grants {}", kept.join(",")))
            }
            None => Some(named(part)),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_set_aside_but_other_holders_are_not() {
        let test = "owner airlock_agent; grants airlock_agent=arwdDxt/airlock_agent; persistence p";
        let prod = "owner app_owner; grants app_owner=arwdDxt/app_owner; persistence p";
        assert_eq!(without_owners(test), without_owners(prod));
        let public = "owner app_owner; grants app_owner=arwdDxt/app_owner,=arwdDxt/app_owner; persistence p";
        assert_ne!(without_owners(test), without_owners(public));
        // The owner's own privileges may be shown or not: either way, the same.
        assert_eq!(without_owners("owner a; grants a=arwdDxt/a"), without_owners("owner b"));
    }
}
