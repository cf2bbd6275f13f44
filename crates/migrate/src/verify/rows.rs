//! Row images: a digest of each row of a table, by key, on the target and
//! in the test, so what each row became can be compared.

use std::collections::{BTreeMap, BTreeSet};

use airlock_core::error::Result;
use airlock_postgres::catalog::Catalog;
use airlock_postgres::cell::Cell;

use super::*;

/// The longest key text a read keeps as it is: a longer one (the candidate
/// can make its keys as long as it likes, and every row's key is held) is
/// kept as `md5:` and its digest.
pub const KEY_TEXT_MOST: usize = 200;

/// `key` (an SQL expression of a row's key as text), or its digest where it
/// is longer than [`KEY_TEXT_MOST`].
pub fn bounded_key(key: &str) -> String {
    format!(
        "(CASE WHEN pg_catalog.length({key}) OPERATOR(pg_catalog.>) {KEY_TEXT_MOST} THEN 'md5:' OPERATOR(pg_catalog.||) pg_catalog.md5({key}) ELSE {key} END)"
    )
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
            t.columns.iter().filter(|c| c.default.as_deref().is_some_and(crate::code::fills_by_chance));
        shape.filled.insert(table.clone(), filled.map(|c| c.name.clone()).collect());
    }
    shape
}

impl Shape {
    /// The golden's primary key of `table`, as its columns' quoted names.
    pub fn key(&self, table: &str) -> Option<&str> {
        self.keys.get(table).map(String::as_str)
    }

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
pub(super) fn digest_of(columns: &[String], empty: &str) -> String {
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

/// Each row of `table` as two texts, `key` and `value` (SQL expressions over
/// the row `t`), at most `most` rows, read by the reader's function from an
/// admin session whose reading settings are pinned.
pub(crate) async fn read_as_reader(
    client: &tokio_postgres::Client,
    grant_each: bool,
    table: &str,
    key: &str,
    value: &str,
    most: i64,
    timeout_ms: Option<u64>,
) -> Result<Vec<tokio_postgres::Row>> {
    let query = "SELECT k, d FROM pg_airlock.row_image($1::text::pg_catalog.regclass, $2, $3, $4)";
    as_reader(client, (grant_each, table, timeout_ms), query, &[&table, &key, &value, &most]).await
}

/// Runs `query` (a call of one of the reader's functions on `table`) in a
/// transaction of its own that grants the reader `table` (with
/// `grant_each`) and is rolled back, so nothing the candidate's code might
/// set in it outlives the read; under `timeout_ms` when given.
pub(crate) async fn as_reader(
    client: &tokio_postgres::Client,
    (grant_each, table, timeout_ms): (bool, &str, Option<u64>),
    query: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>> {
    client.batch_execute("BEGIN").await.map_err(pg_error)?;
    if let Some(ms) = timeout_ms {
        client.batch_execute(&format!("SET LOCAL statement_timeout = {ms}")).await.map_err(pg_error)?;
    }
    if grant_each {
        client.batch_execute(&airlock_postgres::catalog::reader_grant(table)).await.map_err(pg_error)?;
    }
    let rows = client.query(query, params).await.map_err(pg_error)?;
    client.batch_execute("ROLLBACK").await.map_err(pg_error)?;
    Ok(rows)
}

pub(super) async fn row_images_pinned(
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
                crate::code::fills_by_chance_sql("pg_catalog.pg_get_expr(d.adbin, d.adrelid)"),
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
            Some(key) => bounded_key(&format!("ROW({key})::text")),
            None => digest.clone(),
        };
        let both = format!("pg_catalog.concat({digest}, ':', {filled_digest})");
        let most = ROWS_READ_MOST + 1;
        let rows = match reading {
            Reading::Directly => client
                .query(&format!("SELECT {key}, {both} FROM {table} t LIMIT {most}"), &[])
                .await
                .map_err(pg_error)?,
            Reading::AsReader => read_as_reader(client, grant_each, &table, &key, &both, most, None).await?,
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
        out.insert(table, RowImage::new(image, filled));
    }
    Ok(out)
}
