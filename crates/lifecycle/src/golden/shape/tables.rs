//! The staging database's tables as reshaping sees them: each table that
//! holds rows (a partition, or a table of its own), named by the table a rule
//! names (a partition by its partitioned root), with its columns.

use std::collections::BTreeMap;

use airlock_core::error::Result;
use airlock_mask::ColumnType;
use airlock_postgres::catalog::SYSTEM_SCHEMAS;
use airlock_postgres::cell::Cell;

/// A column of a table.
#[derive(Debug, Clone)]
pub struct Column {
    /// Its name, unquoted.
    pub name: String,
    /// Its type as `format_type` prints it (fit for a cast).
    pub type_sql: String,
    /// Its type's kind.
    pub ty: ColumnType,
    /// Whether it takes NULL.
    pub nullable: bool,
    /// Whether it is generated (computed from others: never set).
    pub generated: bool,
}

/// A table that holds rows.
#[derive(Debug, Clone)]
pub struct Leaf {
    /// Its name as the server prints it, quoted where needed: SQL.
    pub sql: String,
    /// The table rules and keys name: `schema.table` of the partitioned root, or its own; unquoted.
    pub named: String,
    /// Its columns, in order.
    pub columns: Vec<Column>,
    /// The planner's estimate of its rows.
    pub estimate: f64,
}

/// Reads every table that holds rows, outside PostgreSQL's schemas.
pub async fn read(c: &tokio_postgres::Client) -> Result<Vec<Leaf>> {
    let sql = format!(
        "SELECT c.oid::pg_catalog.regclass::text,
                COALESCE(rn.nspname, n.nspname)::text || '.' || COALESCE(r.relname, c.relname)::text,
                c.reltuples::float8
           FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
           LEFT JOIN pg_catalog.pg_class r ON c.relispartition AND r.oid = pg_catalog.pg_partition_root(c.oid)
           LEFT JOIN pg_catalog.pg_namespace rn ON rn.oid = r.relnamespace
          WHERE c.relkind = 'r' AND {SYSTEM_SCHEMAS}
            AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d WHERE d.objid = c.oid
                            AND d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.deptype = 'e')
          ORDER BY 1"
    );
    let mut leaves = Vec::new();
    let mut index = BTreeMap::new();
    for r in c.query(&sql, &[]).await.map_err(failed)? {
        let sql: String = r.cell(0)?;
        index.insert(sql.clone(), leaves.len());
        leaves.push(Leaf { sql, named: r.cell(1)?, columns: Vec::new(), estimate: r.cell(2)? });
    }
    let columns = format!(
        "SELECT a.attrelid::pg_catalog.regclass::text, a.attname::text,
                pg_catalog.format_type(a.atttypid, a.atttypmod), NOT a.attnotnull, a.attgenerated <> ''
           FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped AND {SYSTEM_SCHEMAS}
          ORDER BY a.attrelid, a.attnum"
    );
    for r in c.query(&columns, &[]).await.map_err(failed)? {
        let table: String = r.cell(0)?;
        let Some(i) = index.get(&table) else { continue };
        let type_sql: String = r.cell(2)?;
        leaves[*i].columns.push(Column {
            name: r.cell(1)?,
            ty: ColumnType::parse(&type_sql),
            type_sql,
            nullable: r.cell(3)?,
            generated: r.cell(4)?,
        });
    }
    Ok(leaves)
}

/// A failure reading or changing the staging database, named without the
/// server's detail line, which can quote a row's values.
pub fn failed(e: tokio_postgres::Error) -> airlock_core::error::Error {
    airlock_core::error::Error::postgres(without_values(&e))
}

/// What the server said, its code and message only: a `DETAIL` line can quote
/// a row (`Failing row contains (...)`), and a source value must not reach an
/// error, an event or a log.
pub fn without_values(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            // A data error quotes the value it met (`value "..." is out of
            // range`); only a syntax or naming error (class 42) quotes what
            // the statement said, a name, which is kept.
            let message = match db.code().code().starts_with("42") {
                true => db.message().to_owned(),
                false => without_quoted(db.message()),
            };
            match db.constraint() {
                Some(c) => format!("{}: {message} (constraint {c})", db.code().code()),
                None => format!("{}: {message}", db.code().code()),
            }
        }
        None => e.to_string(),
    }
}

/// What the server said of an expression it ran over source values (an
/// `sql` rule, a subset's condition): its code and message with every quoted
/// part left out, whatever the class (a cast to `regclass` names the value
/// as a relation), and no message at all for one a function raised (`RAISE
/// '%', value`).
pub fn without_values_strict(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) if db.code().code().starts_with("P0") => {
            format!(
                "{}: a function raised an error (its message is left out: it can quote the value)",
                db.code().code()
            )
        }
        Some(db) => format!("{}: {}", db.code().code(), without_quoted(db.message())),
        None => e.to_string(),
    }
}

/// `text` with every double-quoted part replaced by `"…"`.
pub fn without_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut inside = false;
    for c in text.chars() {
        if c == '"' {
            if !inside {
                out.push_str("\"…");
            } else {
                out.push('"');
            }
            inside = !inside;
        } else if !inside {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn quoted_values_are_left_out() {
        assert_eq!(
            super::without_quoted("value \"44207946001\" is out of range for type integer"),
            "value \"…\" is out of range for type integer"
        );
    }
}
