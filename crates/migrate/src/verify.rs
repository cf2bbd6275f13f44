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

use super::promote::pg_error;
use super::report::StatementReport;
use airlock_core::error::Result;
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
    let pinned = airlock_postgres::catalog::Pinned::pin(client).await?;
    let restored = restore_sequences_pinned(client, before).await?;
    pinned.restore(client).await?;
    Ok(restored)
}

async fn restore_sequences_pinned(client: &tokio_postgres::Client, before: &Before) -> Result<Vec<String>> {
    let moved = set_back(&before.sequences, &sequences(client).await?);
    let mut restored = Vec::new();
    // Whatever the file made of this session (a read-only default), the
    // putting back writes.
    if !moved.is_empty() {
        client
            .batch_execute("SET default_transaction_read_only = off; SET transaction_read_only = off")
            .await
            .map_err(pg_error)?;
    }
    for name in moved {
        let Some(Some(was)) = before.sequences.get(&name) else { continue };
        // Never below what its column holds: the application may have taken
        // values from where the file set it meanwhile.
        let held = owned_column_max(client, &name).await?.map_or(*was, |(_, max)| max.max(*was));
        client
            .execute("SELECT pg_catalog.setval($1::text::regclass, $2, true)", &[&name, &held])
            .await
            .map_err(pg_error)?;
        restored.push(name);
    }
    Ok(restored)
}

/// The column a sequence belongs to (`serial`, identity, `OWNED BY`), as
/// `table.column`, and the largest value it holds; None for a sequence of
/// no column, or an empty one.
async fn owned_column_max(client: &tokio_postgres::Client, sequence: &str) -> Result<Option<(String, i64)>> {
    let owner = client
        .query_opt(
            "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname),
                    pg_catalog.quote_ident(a.attname)
               FROM pg_catalog.pg_depend d
               JOIN pg_catalog.pg_class c ON c.oid = d.refobjid
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
               JOIN pg_catalog.pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
              WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                AND d.objid = $1::text::pg_catalog.regclass AND d.deptype IN ('a', 'i')
                AND d.refobjsubid > 0
              LIMIT 1",
            &[&sequence],
        )
        .await
        .map_err(pg_error)?;
    let Some(owner) = owner else { return Ok(None) };
    let (table, column): (String, String) = (owner.cell(0)?, owner.cell(1)?);
    let max: Option<i64> = client
        .query_one(&format!("SELECT max({column})::bigint FROM {table}"), &[])
        .await
        .map_err(pg_error)?
        .cell(0)?;
    Ok(max.map(|m| (format!("{table}.{column}"), m)))
}

/// The value sequence `name` hands out next (None when it cannot be read).
async fn next_value(client: &tokio_postgres::Client, name: &str) -> Result<Option<i64>> {
    let row = client
        .query_one(
            &format!(
                "SELECT CASE WHEN s.is_called THEN s.last_value + q.seqincrement ELSE s.last_value END
                   FROM {name} s, pg_catalog.pg_sequence q WHERE q.seqrelid = $1::text::pg_catalog.regclass"
            ),
            &[&name],
        )
        .await;
    match row {
        Ok(row) => Ok(row.cell(0)?),
        Err(_) => Ok(None),
    }
}

/// How far each sequence moved forward between two readings (those that did).
pub fn advanced(
    before: &BTreeMap<String, Option<i64>>,
    after: &BTreeMap<String, Option<i64>>,
) -> BTreeMap<String, i64> {
    after
        .iter()
        .filter_map(|(name, now)| {
            let moved = match (before.get(name).copied().flatten(), *now) {
                (Some(was), Some(now)) if now > was => now.saturating_sub(was),
                (None, Some(now)) => now,
                _ => return None,
            };
            Some((name.clone(), moved))
        })
        .collect()
}

/// A sequence may move forward on the target this much more than its test
/// moved it (twice as far, and a thousand): the application's own inserts
/// meanwhile move it too.
pub fn advance_allowed(tested: i64) -> i64 {
    tested.saturating_mul(2).saturating_add(1_000)
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

/// Each row of a table by its key, as a digest of its columns that are not
/// NULL, each by its name: a column added changes no row until a value is put
/// in it, one dropped changes those that held a value, and the digest does
/// not depend on the columns' order, so a test's images and a target's read
/// alike whatever each added first. Values are read through their types'
/// output functions (`ROW(v)::text`), never a cast a database could define,
/// so reading runs no code of theirs.
///
/// A row's key is the golden's primary key (kept whatever a migration does to
/// the constraint meanwhile), else the table's own, else its contents (rows
/// alike counted one by one). Columns whose default reads the clock or chance
/// (`DEFAULT now()`, `DEFAULT gen_random_uuid()`), whose values differ
/// between any two copies once a default fills them, are digested apart
/// ([`RowImage::rows`]'s second part), so that a fill is not a difference but
/// a later change of their values is.
#[derive(Debug, Clone, Default)]
pub struct RowImage {
    /// Each row's digest, and its clock-filled columns' digest, by its key.
    rows: BTreeMap<String, (String, String)>,
    /// The clock-filled columns, by name.
    filled: Vec<String>,
}

impl RowImage {
    /// Each row's digest and its clock-filled columns' digest, by its key.
    pub fn rows(&self) -> &BTreeMap<String, (String, String)> {
        &self.rows
    }

    /// The columns whose default fills them by clock or chance.
    pub fn filled(&self) -> &[String] {
        &self.filled
    }
}

/// The most rows an image reads of one table: more is an error (a table the
/// test compared must be compared here too).
pub const ROWS_READ_MOST: i64 = 1_000_000;

/// What a run's images hold to from the golden, whatever the migration does
/// to its tables meanwhile.
#[derive(Debug, Clone, Default)]
pub struct Shape {
    /// Each table's primary key, as its columns' quoted names (`id`,
    /// `tenant_id, id`): what rows are keyed by in every image of a run.
    keys: BTreeMap<String, String>,
    /// Each table's columns, by name.
    columns: BTreeMap<String, BTreeSet<String>>,
    /// Each table's columns a default fills by clock or chance.
    filled: BTreeMap<String, BTreeSet<String>>,
}

/// The golden's [`Shape`], from its catalog.
pub fn golden_shape(catalog: &Catalog) -> Shape {
    let mut shape = Shape::default();
    for (table, t) in &catalog.tables {
        let key = t.constraints.values().find_map(|d| d.strip_prefix("PRIMARY KEY ("));
        if let Some(columns) = key.and_then(|d| d.split(')').next()).map(str::trim).filter(|c| !c.is_empty())
        {
            shape.keys.insert(table.clone(), columns.to_owned());
        }
        shape.columns.insert(table.clone(), t.columns.iter().map(|c| c.name.clone()).collect());
        let filled =
            t.columns.iter().filter(|c| c.default.as_deref().is_some_and(super::code::fills_by_chance));
        shape.filled.insert(table.clone(), filled.map(|c| c.name.clone()).collect());
    }
    shape
}

impl Shape {
    /// Whether column `column` (by name) of `table` is one whose values a
    /// default fills by clock or chance: the golden's such columns, and those
    /// the migration adds that fill so (`fills_now`: a clock or chance
    /// default, or an identity, numbered in whatever order rows lie). A
    /// golden column that only later gets such a default is not one: setting
    /// a default fills no row.
    fn filled(&self, table: &str, column: &str, fills_now: bool) -> bool {
        match self.columns.get(table) {
            Some(golden) if golden.contains(column) => {
                self.filled.get(table).is_some_and(|f| f.contains(column))
            }
            _ => fills_now,
        }
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

/// Images of `tables` (only those in `first` when given: the images to
/// compare with), keyed by `keys` (see [`golden_keys`]). A table of more than
/// [`ROWS_READ_MOST`] rows is an error.
pub async fn row_images(
    client: &tokio_postgres::Client,
    reading: Reading,
    shape: &Shape,
    tables: &BTreeSet<String>,
    first: Option<&BTreeMap<String, RowImage>>,
) -> Result<BTreeMap<String, RowImage>> {
    if tables.is_empty() {
        return Ok(BTreeMap::new());
    }
    let grant_each = match reading {
        Reading::AsReader => airlock_postgres::catalog::ensure_reader(client).await?,
        Reading::Directly => false,
    };
    // Rows read as text alike under test and on the target, whatever time
    // zone or date style either session has.
    let pinned = airlock_postgres::catalog::Pinned::pin(client).await?;
    let images = row_images_pinned(client, (reading, grant_each), shape, tables, first).await;
    if images.is_err() && reading == Reading::AsReader {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    pinned.restore(client).await?;
    images
}

/// A digest over `columns` that are not NULL, each by its name; `empty` when
/// there are none.
fn digest_of(columns: &[String], empty: &str) -> String {
    if columns.is_empty() {
        return empty.to_owned();
    }
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
    // (An array, not concat_ws: a table may have more columns than a function
    // takes arguments; NULL elements are left out.)
    format!("pg_catalog.md5(pg_catalog.array_to_string(ARRAY[{}]::text[], ','))", named.join(", "))
}

async fn row_images_pinned(
    client: &tokio_postgres::Client,
    (reading, grant_each): (Reading, bool),
    shape: &Shape,
    tables: &BTreeSet<String>,
    first: Option<&BTreeMap<String, RowImage>>,
) -> Result<BTreeMap<String, RowImage>> {
    let shapes = client
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
                        (SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attnum)
                           FROM pg_catalog.pg_attribute a
                          WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
                        (SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attnum)
                           FROM pg_catalog.pg_attribute a
                           LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                          WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                            AND (a.attidentity <> '' OR (d.adbin IS NOT NULL AND {})))
                   FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.relkind IN ('r', 'p') AND {}",
                super::code::fills_by_chance_sql("pg_catalog.pg_get_expr(d.adbin, d.adrelid)"),
                airlock_postgres::catalog::SYSTEM_SCHEMAS
            ),
            &[],
        )
        .await
        .map_err(pg_error)?;
    let mut out = BTreeMap::new();
    for row in shapes {
        let (table, own_key, now, raw, fills_now): (
            String,
            Option<String>,
            Option<Vec<String>>,
            Option<Vec<String>>,
            Option<Vec<String>>,
        ) = (row.cell(0)?, row.cell(1)?, row.cell(2)?, row.cell(3)?, row.cell(4)?);
        if !tables.contains(&table) {
            continue;
        }
        // Not imaged the first time: nothing to compare with.
        if first.is_some_and(|f| !f.contains_key(&table)) {
            continue;
        }
        let (now, raw, fills_now) =
            (now.unwrap_or_default(), raw.unwrap_or_default(), fills_now.unwrap_or_default());
        let mut filled: Vec<String> = Vec::new();
        let mut columns: Vec<String> = Vec::new();
        for (quoted, name) in now.iter().zip(&raw) {
            match shape.filled(&table, name, fills_now.contains(name)) {
                true => filled.push(quoted.clone()),
                false => columns.push(quoted.clone()),
            }
        }
        filled.sort();
        columns.sort();
        let digest = digest_of(&columns, "pg_catalog.md5('')");
        let filled_digest = digest_of(&filled, "''");
        // The golden's key while its columns are all there; else the table's own.
        let golden = shape.keys.get(&table).filter(|k| k.split(", ").all(|c| now.iter().any(|n| n == c)));
        let key = match golden.or(own_key.as_ref()) {
            Some(key) => format!("ROW({key})::text"),
            None => digest.clone(),
        };
        let both = format!("pg_catalog.concat({digest}, ':', {filled_digest})");
        let most = ROWS_READ_MOST + 1;
        let rows = match reading {
            Reading::Directly => client
                .query(&format!("SELECT {key}, {both} FROM {table} t LIMIT {most}"), &[])
                .await
                .map_err(pg_error)?,
            Reading::AsReader => {
                // In a transaction of its own, rolled back: nothing the
                // candidate's code might set in it outlives the read.
                client.batch_execute("BEGIN").await.map_err(pg_error)?;
                if grant_each {
                    client
                        .batch_execute(&airlock_postgres::catalog::reader_grant(&table))
                        .await
                        .map_err(pg_error)?;
                }
                let rows = client
                    .query(
                        "SELECT k, d FROM pg_airlock.row_image($1::text::pg_catalog.regclass, $2, $3, $4)",
                        &[&table, &key, &both, &most],
                    )
                    .await
                    .map_err(pg_error)?;
                client.batch_execute("ROLLBACK").await.map_err(pg_error)?;
                rows
            }
        };
        if rows.len() as i64 > ROWS_READ_MOST {
            return Err(airlock_core::error::Error::new(
                airlock_core::error::ErrorCode::MigrationRefused,
                format!("{table} holds more than {ROWS_READ_MOST} rows here, too many to compare row by row"),
                "its test compared it (the golden's is small): build a golden from the target and test again",
            ));
        }
        let mut image = BTreeMap::new();
        let mut alike: BTreeMap<String, usize> = BTreeMap::new();
        for r in rows {
            let (k, both): (String, String) = (r.cell(0)?, r.cell(1)?);
            let (d, f) = both
                .split_once(':')
                .map(|(d, f)| (d.to_owned(), f.to_owned()))
                .unwrap_or((both, String::new()));
            // Rows alike in a table without a key: the first, the second...
            let seen = alike.entry(k.clone()).or_default();
            let k = if *seen == 0 { k } else { format!("{k}#{seen}") };
            *seen += 1;
            image.insert(k, (d, f));
        }
        out.insert(table, RowImage { rows: image, filled });
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
    for _ in 0..super::apply::DEFERRED_ROUNDS {
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
    let after = airlock_postgres::catalog::read(client).await?;
    let made = airlock_postgres::catalog::diff::diff(catalog_before, &after);
    out.extend(schemas_named_for_roles(client, &made).await?);
    out.extend(shadowed_under_stored_paths(client, &made).await?);
    // Default privileges a statement gives without FOR ROLE belong to the
    // role that runs it: the agent's under test, the target session's here.
    let runner: String =
        client.query_one("SELECT pg_catalog.session_user()::text", &[]).await.map_err(pg_error)?.cell(0)?;
    let here = entries(&made, &runner);
    let there = entries(changes, airlock_core::dsn::AGENT_ROLE);
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

/// How the target's schema differs from the golden's the test ran on, owners
/// set aside: a golden built from the target gives its objects to the sandbox's
/// owner role, so an owner alone is no drift.
pub fn drift(golden: &Catalog, target: &Catalog) -> Vec<Change> {
    airlock_postgres::catalog::diff::diff(golden, target)
        .into_iter()
        .filter(|c| match (&c.before, &c.after) {
            (Some(before), Some(after)) => without_owners(before) != without_owners(after),
            _ => true,
        })
        .collect()
}

/// `catalog` (a target's) without what the golden's import left out on
/// purpose (`--exclude-table`, `--exclude-schema`, as pg_dump leaves them out:
/// a table with its indexes, constraints, triggers and the sequences its
/// columns draw from; a schema with everything in it). The golden cannot have
/// drifted from what it never held. What a migration does to those objects on
/// the target is still compared: the target check sets the target's catalog
/// after each part against its own before.
pub fn leaving_out(
    mut catalog: Catalog,
    left_out: &airlock_lifecycle::golden::Exclusions,
    golden: &Catalog,
) -> Catalog {
    if left_out.is_empty() {
        return catalog;
    }
    let in_schema_left_out = |qualified: &str| {
        qualified.contains('.')
            && left_out.leaves_out_schema(&airlock_postgres::catalog::split_qualified(qualified).0)
    };
    // What the golden holds all the same (pg_dump keeps the sequence a
    // left-out table's column draws from) is compared as ever.
    let mut gone: BTreeSet<String> = BTreeSet::new();
    catalog.tables.retain(|name, table| {
        if !left_out.leaves_out(name) || golden.tables.contains_key(name) {
            return true;
        }
        let (schema, _) = airlock_postgres::catalog::split_qualified(name);
        gone.insert(name.clone());
        gone.extend(table.indexes.keys().map(|i| format!("{schema}.{i}")));
        for column in &table.columns {
            let drawn = column.default.as_deref().and_then(|d| d.strip_prefix("nextval('"));
            if let Some(sequence) = drawn.and_then(|d| d.split_once('\'')).map(|(s, _)| s) {
                gone.insert(sequence.to_owned());
            }
        }
        false
    });
    for name in catalog.views.keys().chain(catalog.sequences.keys()) {
        if left_out.leaves_out(name) {
            gone.insert(name.clone());
        }
    }
    let kept = |name: &str, held: &BTreeMap<String, String>, left: bool| !left || held.contains_key(name);
    catalog.views.retain(|name, _| kept(name, &golden.views, gone.contains(name)));
    catalog
        .sequences
        .retain(|name, _| kept(name, &golden.sequences, gone.contains(name) || in_schema_left_out(name)));
    catalog.functions.retain(|name, _| {
        kept(name, &golden.functions, in_schema_left_out(name.split('(').next().unwrap_or(name)))
    });
    catalog.types.retain(|name, _| kept(name, &golden.types, in_schema_left_out(name)));
    let held = golden.objects.as_ref();
    if let Some(objects) = catalog.objects.as_mut() {
        objects.retain(|name, _| {
            if held.is_some_and(|h| h.contains_key(name)) {
                return true;
            }
            let words: Vec<&str> = name
                .split_whitespace()
                .map(|w| w.trim_matches(|c: char| matches!(c, '(' | ')' | ',' | ';')))
                .collect();
            let names_gone = words.iter().any(|w| {
                gone.contains(*w)
                    || gone.iter().any(|g| w.starts_with(&format!("{g}.")))
                    || in_schema_left_out(w)
            });
            let schema_gone = words
                .windows(2)
                .any(|p| p[0] == "schema" && left_out.leaves_out_schema(p[1].trim_matches('"')));
            !(names_gone || schema_gone)
        });
    }
    catalog
}

/// A table's rows in the catalog the test ran against (the planner's estimate).
fn tested_table_rows(catalog: &Catalog, table: &str) -> f64 {
    catalog.tables.get(table).map_or(0.0, |t| t.row_estimate.max(0) as f64)
}

/// Changes as comparable lines: what changed, and its definition with owners,
/// grantors and the grants' holders that are owners written `OWNER`; the
/// default privileges of `runner` (the session that ran the migration) are
/// written as `RUNNER`'s.
fn entries(changes: &[Change], runner: &str) -> BTreeSet<String> {
    // (PostgreSQL quotes a role's name where it must.)
    let runs = [runner.to_owned(), airlock_postgres::catalog::quote_ident(runner)]
        .map(|r| format!("belonging to role {r}"));
    changes
        .iter()
        .map(|c| {
            let mut definition = c.after.as_deref().map(without_owners).unwrap_or_default();
            let mut name = c.name.clone();
            let by_runner = runs.iter().find(|runs| name.ends_with(runs.as_str()));
            if let Some(runs) = by_runner.filter(|_| name.starts_with("default privileges ")) {
                name = format!("{}belonging to role RUNNER", &name[..name.len() - runs.len()]);
                definition = renamed(&definition, runner, "RUNNER");
            }
            // An entry whose name says what it is has no object word.
            let what: Vec<&str> = [&c.change, &c.object, &name]
                .into_iter()
                .map(String::as_str)
                .filter(|w| !w.is_empty())
                .collect();
            format!("{}: {definition}", what.join(" "))
        })
        .collect()
}

/// `text` with every whole word `from` (between `=`, `/`, `,`, spaces and
/// braces, as in an ACL) written `to`.
fn renamed(text: &str, from: &str, to: &str) -> String {
    text.split_inclusive(['=', '/', ',', ' ', '{', '}'])
        .map(|w| {
            let word = w.trim_end_matches(['=', '/', ',', ' ', '{', '}']);
            match word == from {
                true => format!("{to}{}", &w[word.len()..]),
                false => w.to_owned(),
            }
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
    fn default_privileges_of_whoever_ran_the_file_are_alike() {
        let change = |role: &str| Change {
            object: String::new(),
            name: format!("default privileges on new relations belonging to role {role}"),
            change: "added".into(),
            before: None,
            after: Some(format!("{{=r/{role},{role}=arwdDxt/{role}}}")),
        };
        let test = entries(&[change("airlock_agent")], "airlock_agent");
        assert_eq!(test, entries(&[change("app_owner")], "app_owner"));
        // Another role's, named by FOR ROLE, stays that role's.
        assert_ne!(test, entries(&[change("app_owner")], "app_admin"));
    }

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
