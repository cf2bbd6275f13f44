//! A column that takes its default from a sequence another table's column
//! owns (`OWNED BY`). A copy made with `LIKE ... INCLUDING ALL` and swapped
//! in by renames keeps calling the old table's sequence: nothing fails
//! today, but dropping the old table (the contract step of the swap) drops
//! the sequence with it, and every insert that takes the default fails.
//!
//! Read on the fork before the candidate and after, from `pg_depend`: only
//! pairs the candidate made are told. A partition or an inheritance child
//! calls its parent's sequence by design, and is not one.

use std::collections::BTreeSet;

use airlock_core::error::{Error, Result};
use airlock_postgres::cell::Cell as _;

use crate::report::{Hazard, Severity, StatementReport};

/// A column whose default calls a sequence another table's column owns.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Borrowed {
    /// The column's table, `schema.name`.
    pub table: String,
    /// The column.
    pub column: String,
    /// The sequence, `schema.name`.
    pub sequence: String,
    /// The table that owns it, `schema.name`, and its column.
    pub owner: (String, String),
}

/// Every column of the database whose default calls a sequence owned by a
/// column of another table, read from an admin session.
pub async fn read(client: &tokio_postgres::Client) -> Result<BTreeSet<Borrowed>> {
    let name = |class: &str| {
        format!(
            "(SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname)
                FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
               WHERE c.oid OPERATOR(pg_catalog.=) {class})"
        )
    };
    let rows = client
        .query(
            &format!(
                "SELECT {}, a.attname::text, {}, {}, oa.attname::text
                   FROM pg_catalog.pg_attrdef d
                   JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) d.adrelid AND a.attnum OPERATOR(pg_catalog.=) d.adnum
                   JOIN pg_catalog.pg_depend uses ON uses.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_attrdef'::pg_catalog.regclass
                        AND uses.objid OPERATOR(pg_catalog.=) d.oid AND uses.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                   JOIN pg_catalog.pg_class s ON s.oid OPERATOR(pg_catalog.=) uses.refobjid AND s.relkind OPERATOR(pg_catalog.=) 'S'
                   JOIN pg_catalog.pg_depend owns ON owns.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                        AND owns.objid OPERATOR(pg_catalog.=) s.oid AND owns.deptype OPERATOR(pg_catalog.=) 'a'
                        AND owns.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                   JOIN pg_catalog.pg_attribute oa ON oa.attrelid OPERATOR(pg_catalog.=) owns.refobjid AND oa.attnum OPERATOR(pg_catalog.=) owns.refobjsubid
                  WHERE owns.refobjid OPERATOR(pg_catalog.<>) d.adrelid AND NOT a.attisdropped
                    AND owns.refobjid NOT IN (SELECT relid FROM pg_catalog.pg_partition_ancestors(d.adrelid))
                    AND NOT EXISTS (SELECT FROM pg_catalog.pg_inherits i
                                     WHERE i.inhrelid OPERATOR(pg_catalog.=) d.adrelid
                                       AND i.inhparent OPERATOR(pg_catalog.=) owns.refobjid)",
                name("d.adrelid"),
                name("s.oid"),
                name("owns.refobjid"),
            ),
            &[],
        )
        .await
        .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
    let mut out = BTreeSet::new();
    for r in rows {
        out.insert(Borrowed {
            table: r.cell(0)?,
            column: r.cell(1)?,
            sequence: r.cell(2)?,
            owner: (r.cell(3)?, r.cell(4)?),
        });
    }
    Ok(out)
}

/// A `sequence_owned_elsewhere` hazard for each column the candidate left
/// taking values from another table's sequence, that did not before.
pub fn hazards(
    before: &BTreeSet<Borrowed>,
    after: &BTreeSet<Borrowed>,
    statements: &[StatementReport],
) -> Vec<Hazard> {
    after
        .difference(before)
        .map(|b| {
            let (owner, owner_column) = &b.owner;
            // The statement that gave the sequence its owner, else the one
            // that made the column's table (a `LIKE ... INCLUDING ALL` copies
            // the default), else the one that named the owner last.
            let line = crate::lines::naming(statements.iter().rev(), &b.sequence)
                .or_else(|| crate::lines::naming(statements.iter(), &b.table))
                .or_else(|| crate::lines::naming(statements.iter().rev(), owner));
            let mut h = Hazard::new(
                "sequence_owned_elsewhere",
                Severity::Medium,
                format!(
                    "{}.{} takes its default from sequence {}, which belongs to {owner}.{owner_column}: \
                     dropping {owner} drops the sequence with it, and then every insert into {} that takes the default fails",
                    b.table, b.column, b.sequence, b.table
                ),
                line,
            );
            h.suggestion = Some(format!(
                "give the sequence to the column that uses it, in the same migration: ALTER SEQUENCE {} OWNED BY {}.{}",
                b.sequence, b.table, b.column
            ));
            h
        })
        .collect()
}
