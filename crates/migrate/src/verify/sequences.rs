//! Sequences on the target: where each stands before and after, set back
//! when a part is rolled back, and how far a part may advance one.

use std::collections::{BTreeMap, BTreeSet};

use airlock_core::error::Result;
use airlock_postgres::cell::Cell;

use super::*;

/// Each sequence's position: the last value it handed out, or, before its
/// first `nextval` (new, or just restarted), the one before the value it
/// hands out next, so a `RESTART` forward reads as a move forward. `None`
/// where the session may not read it.
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
    let mut out = BTreeMap::new();
    for row in rows {
        let (name, last): (String, Option<i64>) = (row.cell(0)?, row.cell(1)?);
        let position = match last {
            Some(last) => Some(last),
            None => before_next(client, &name).await,
        };
        out.insert(name, position);
    }
    Ok(out)
}

/// For a sequence that has not handed out its next value yet: that value
/// less one step (None when it cannot be read).
async fn before_next(client: &tokio_postgres::Client, name: &str) -> Option<i64> {
    let sql = format!(
        "SELECT CASE WHEN s.is_called THEN NULL
                     ELSE (s.last_value::pg_catalog.numeric - q.seqincrement)::pg_catalog.int8 END
           FROM {name} s, pg_catalog.pg_sequence q WHERE q.seqrelid = $1::text::pg_catalog.regclass"
    );
    client.query_one(&sql, &[&name]).await.ok().and_then(|row| row.cell::<Option<i64>>(0).ok().flatten())
}

/// Puts back every sequence set back since `before`, and every one moved
/// forward further than its test moved it allows (`tested`, as
/// [`advance_allowed`] reads it), after a rollback: `setval` is not undone
/// by one, and a sequence left at the end of its range stops every insert.
/// The sequences it put back.
pub async fn restore_sequences(
    client: &tokio_postgres::Client,
    before: &Before,
    tested: &BTreeMap<String, i64>,
) -> Result<Vec<String>> {
    let pinned = airlock_postgres::catalog::Pinned::pin(client).await?;
    let restored = restore_sequences_pinned(client, before, tested).await?;
    pinned.restore(client).await?;
    Ok(restored)
}

pub(super) async fn restore_sequences_pinned(
    client: &tokio_postgres::Client,
    before: &Before,
    tested: &BTreeMap<String, i64>,
) -> Result<Vec<String>> {
    let now = sequences(client).await?;
    let mut moved = set_back(&before.sequences, &now);
    for (name, by) in advanced(&before.sequences, &now) {
        if by > advance_allowed(tested.get(&name).copied().unwrap_or(0)) {
            moved.insert(name);
        }
    }
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
/// no integer column of a table, or an empty one. Only such a column is
/// read, with `pg_catalog`'s own `max`, so no function of the file's runs.
pub(super) async fn owned_column_max(
    client: &tokio_postgres::Client,
    sequence: &str,
) -> Result<Option<(String, i64)>> {
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
                AND d.refobjsubid > 0 AND c.relkind IN ('r', 'p')
                AND a.atttypid IN ('pg_catalog.int2'::pg_catalog.regtype, 'pg_catalog.int4'::pg_catalog.regtype,
                                   'pg_catalog.int8'::pg_catalog.regtype)
              LIMIT 1",
            &[&sequence],
        )
        .await
        .map_err(pg_error)?;
    let Some(owner) = owner else { return Ok(None) };
    let (table, column): (String, String) = (owner.cell(0)?, owner.cell(1)?);
    let max: Option<i64> = client
        .query_one(&format!("SELECT pg_catalog.max({column})::pg_catalog.int8 FROM {table}"), &[])
        .await
        .map_err(pg_error)?
        .cell(0)?;
    Ok(max.map(|m| (format!("{table}.{column}"), m)))
}

/// How many values each sequence that has handed out one (and does not
/// cycle) has left before `nextval` fails at its bound, and how many it has
/// handed out since its start: computed in numeric, so a sequence set to the
/// top of `bigint` reads 0, never an overflow.
pub async fn values_left(client: &tokio_postgres::Client) -> Result<BTreeMap<String, (i64, i64)>> {
    let rows = client
        .query(
            "SELECT pg_catalog.quote_ident(schemaname) || '.' || pg_catalog.quote_ident(sequencename),
                    pg_catalog.floor(CASE WHEN increment_by > 0
                                          THEN (max_value::pg_catalog.numeric - last_value) / increment_by
                                          ELSE (last_value::pg_catalog.numeric - min_value) / (-increment_by) END)::pg_catalog.int8,
                    LEAST(pg_catalog.abs((last_value::pg_catalog.numeric - start_value) / increment_by),
                                     9223372036854775807)::pg_catalog.int8
               FROM pg_catalog.pg_sequences
              WHERE NOT cycle AND last_value IS NOT NULL
                AND schemaname NOT IN ('pg_catalog', 'information_schema') AND schemaname NOT LIKE 'airlock%'",
            &[],
        )
        .await
        .map_err(pg_error)?;
    rows.into_iter().map(|r| Ok((r.cell(0)?, (r.cell(1)?, r.cell(2)?)))).collect()
}

/// A sequence is close to its end with fewer values left than this, or
/// than a tenth of those it has handed out.
pub const FEW_VALUES_LEFT: i64 = 1_000;

/// Whether `(left, handed_out)` is close to the end (see [`FEW_VALUES_LEFT`]).
fn near_the_end((left, handed_out): (i64, i64)) -> bool {
    left < FEW_VALUES_LEFT.max(handed_out / 10)
}

/// Sequences the file brought to their end, or near it, with the values
/// they have left. A sequence already near its end in the golden is not the
/// file's doing.
pub fn run_out(
    before: &BTreeMap<String, (i64, i64)>,
    after: &BTreeMap<String, (i64, i64)>,
) -> BTreeMap<String, i64> {
    after
        .iter()
        .filter(|(name, now)| near_the_end(**now) && !before.get(*name).is_some_and(|was| near_the_end(*was)))
        .map(|(name, (left, _))| (name.clone(), *left))
        .collect()
}

/// The value sequence `name` hands out next (None when it cannot be read).
pub(super) async fn next_value(client: &tokio_postgres::Client, name: &str) -> Result<Option<i64>> {
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
                (None, Some(now)) if now > 0 => now,
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

/// A column whose next values a sequence gives, with the rows that already
/// hold one of those values: what an insert leaving the column out meets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behind {
    /// The sequence, as `pg_sequences` names it.
    pub sequence: String,
    /// The table of the column it gives values to, quoted as SQL.
    pub table: String,
    /// The column, quoted as SQL.
    pub column: String,
    /// The value it hands out next.
    pub next: i64,
    /// Whether it counts down (a negative increment): its next values are
    /// those at or below `next`.
    pub descending: bool,
    /// What the column holds in the sequence's way: how many rows hold a
    /// value at or past `next`, and the farthest value; None when the
    /// reading failed (its error), which the report says rather than
    /// taking the sequence to be clear.
    pub held: std::result::Result<(i64, i64), String>,
    /// Whether a unique index of the column alone refuses a repeated value.
    pub unique: bool,
}

/// Of `sequences`, those whose next value is one that a column they give
/// values to (by its default, its identity or `OWNED BY`) already holds, on
/// a test's fork, and those whose column could not be read: the admin finds
/// the columns in the catalog, and the columns (integer columns of tables)
/// are read through the reader's function, as the reader, never by the
/// admin itself (planning a query on a table runs its indexes' predicates,
/// which the candidate wrote).
pub async fn behind(client: &tokio_postgres::Client, sequences: &[String]) -> Result<Vec<Behind>> {
    let mut out = Vec::new();
    if sequences.is_empty() {
        return Ok(out);
    }
    // As the final counts do: without the reader, nothing is read.
    let Ok(grant_each) = airlock_postgres::catalog::ensure_reader(client).await else { return Ok(out) };
    for sequence in sequences {
        let Some(next) = next_value(client, sequence).await? else { continue };
        let descending = client
            .query_one(
                "SELECT seqincrement < 0 FROM pg_catalog.pg_sequence WHERE seqrelid = $1::text::pg_catalog.regclass",
                &[sequence],
            )
            .await
            .map_err(pg_error)?
            .cell::<bool>(0)?;
        let columns = client
            .query(
                "SELECT DISTINCT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname),
                        pg_catalog.quote_ident(a.attname),
                        EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                                 WHERE i.indrelid = c.oid AND i.indisunique AND i.indnkeyatts = 1
                                   AND i.indkey[0] = a.attnum AND i.indpred IS NULL AND i.indexprs IS NULL)
                          -- A table's unique index leaves out its inheritance
                          -- children's rows, which the reading counts.
                          AND NOT (c.relkind = 'r' AND EXISTS (SELECT 1 FROM pg_catalog.pg_inherits h
                                                                WHERE h.inhparent = c.oid))
                   FROM pg_catalog.pg_depend d
                   LEFT JOIN pg_catalog.pg_attrdef ad
                          ON d.classid = 'pg_catalog.pg_attrdef'::pg_catalog.regclass AND ad.oid = d.objid
                   JOIN pg_catalog.pg_class c
                     ON c.oid = CASE WHEN ad.oid IS NULL THEN d.refobjid ELSE ad.adrelid END
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                   JOIN pg_catalog.pg_attribute a
                     ON a.attrelid = c.oid AND a.attnum = CASE WHEN ad.oid IS NULL THEN d.refobjsubid ELSE ad.adnum END
                  WHERE c.relkind IN ('r', 'p') AND NOT a.attisdropped
                    AND a.atttypid IN ('pg_catalog.int2'::pg_catalog.regtype, 'pg_catalog.int4'::pg_catalog.regtype,
                                       'pg_catalog.int8'::pg_catalog.regtype)
                    AND ((ad.oid IS NOT NULL AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
                          AND d.refobjid = $1::text::pg_catalog.regclass)
                      OR (ad.oid IS NULL AND d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                          AND d.objid = $1::text::pg_catalog.regclass AND d.deptype IN ('a', 'i')
                          AND d.refobjsubid > 0))",
                &[sequence],
            )
            .await
            .map_err(pg_error)?;
        for row in columns {
            let (table, column, unique): (String, String, bool) = (row.cell(0)?, row.cell(1)?, row.cell(2)?);
            let held = held_past(client, (&table, &column), (next, descending), grant_each).await?;
            // Clear: no row holds a value the sequence will hand out.
            if matches!(held, Ok((0, _))) {
                continue;
            }
            out.push(Behind { sequence: sequence.clone(), table, column, next, descending, held, unique });
        }
    }
    Ok(out)
}

/// How many rows of `table` hold a value of `column` at or past `next` in
/// the sequence's direction, and the farthest such value: one row of the
/// reader's `row_image`, whose two expressions are aggregates of
/// `pg_catalog`'s, in a transaction rolled back (with the reader's SELECT on
/// the table granted in it). The error, when the reading fails: code of the
/// candidate's that the reading ran (a predicate the planner folds) may
/// raise it, and a failure must not read as a sequence that is clear.
async fn held_past(
    client: &tokio_postgres::Client,
    (table, column): (&str, &str),
    (next, descending): (i64, bool),
    grant_each: bool,
) -> Result<std::result::Result<(i64, i64), String>> {
    client.batch_execute("BEGIN; SET LOCAL statement_timeout = 60000").await.map_err(pg_error)?;
    let (op, farthest) = if descending { ("<=", "min") } else { (">=", "max") };
    let read = async {
        if grant_each {
            client.batch_execute(&airlock_postgres::catalog::reader_grant(table)).await?;
        }
        let ahead =
            format!("pg_catalog.count(*) FILTER (WHERE {column} OPERATOR(pg_catalog.{op}) {next}::pg_catalog.int8)");
        let far = format!(
            "pg_catalog.{farthest}({column}) FILTER (WHERE {column} OPERATOR(pg_catalog.{op}) {next}::pg_catalog.int8)"
        );
        client
            .query_one(
                "SELECT k, d FROM pg_airlock.row_image($1::text::pg_catalog.regclass, $2, $3, 1)",
                &[&table, &ahead, &far],
            )
            .await
    }
    .await;
    client.batch_execute("ROLLBACK").await.map_err(pg_error)?;
    let row = match read {
        Ok(row) => row,
        Err(e) => return Ok(Err(airlock_postgres::admin::describe(&e))),
    };
    let (ahead, far): (Option<String>, Option<String>) = (row.cell(0)?, row.cell(1)?);
    let ahead = ahead.and_then(|a| a.parse().ok()).unwrap_or(0);
    Ok(Ok((ahead, far.and_then(|m| m.parse().ok()).unwrap_or(next))))
}
