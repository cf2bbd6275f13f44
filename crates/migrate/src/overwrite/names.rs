//! Targets followed through renames. A candidate may overwrite a column and
//! then rename it, or its table (`UPDATE users SET status = 'active'; ALTER
//! TABLE users RENAME COLUMN status TO state`): its values are read again
//! under the names they have at the end, found by the table's OID and the
//! column's number, which a rename keeps, and reported under the golden's.

use std::collections::BTreeMap;

use airlock_core::error::{Error, Result};
use airlock_postgres::cell::Cell as _;

use super::{counts::Counts, Target, Values};

/// The OID of each target's table and the number of each of its columns,
/// read before the candidate runs: `table -> (oid, column -> number)`.
#[derive(Debug, Clone, Default)]
pub struct Ids(BTreeMap<String, (u32, BTreeMap<String, i16>)>);

/// The names targets have now, and the way back to the golden's.
#[derive(Debug, Clone, Default)]
pub struct Followed {
    /// The targets under their names now (a table or column gone is left out).
    pub now: Vec<Target>,
    /// By a table's name now: its golden name, and its columns' golden names
    /// by their names now.
    back: BTreeMap<String, (String, BTreeMap<String, String>)>,
}

fn pg_error(e: tokio_postgres::Error) -> Error {
    Error::postgres(airlock_postgres::admin::describe(&e))
}

/// Each partition (a leaf) of a partitioned table of the golden's, with
/// the table at the top of its tree, as `schema.name` quoted as the catalog
/// quotes names (catalogs only; no table is read).
pub async fn partition_roots(client: &tokio_postgres::Client) -> Result<BTreeMap<String, String>> {
    let rows = client
        .query(
            "SELECT pg_catalog.quote_ident(rn.nspname) || '.' || pg_catalog.quote_ident(r.relname),
                    pg_catalog.quote_ident(ln.nspname) || '.' || pg_catalog.quote_ident(l.relname)
               FROM pg_catalog.pg_class r
               JOIN pg_catalog.pg_namespace rn ON rn.oid = r.relnamespace
               CROSS JOIN LATERAL pg_catalog.pg_partition_tree(r.oid) t
               JOIN pg_catalog.pg_class l ON l.oid = t.relid
               JOIN pg_catalog.pg_namespace ln ON ln.oid = l.relnamespace
              WHERE r.relkind = 'p' AND NOT r.relispartition AND t.isleaf",
            &[],
        )
        .await
        .map_err(pg_error)?;
    rows.into_iter().map(|r| Ok((r.cell(1)?, r.cell(0)?))).collect()
}

/// Reads the identities of `targets`' tables and columns, and of the
/// columns of each table's golden key (`key_of`), from an admin session
/// (catalogs only; no table is read).
pub async fn ids(
    client: &tokio_postgres::Client,
    targets: &[&[Target]],
    key_of: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Ids> {
    let mut out = BTreeMap::new();
    for t in targets.iter().flat_map(|ts| ts.iter()) {
        let mut columns = t.columns.clone();
        columns.extend(key_of(&t.table).map(|k| super::key_columns(&k)).unwrap_or_default());
        let rows = client
            .query(
                "SELECT a.attrelid::oid, a.attname::text, a.attnum
                   FROM pg_catalog.pg_attribute a
                  WHERE a.attrelid = pg_catalog.to_regclass($1)
                    AND a.attname::text = ANY ($2) AND a.attnum > 0 AND NOT a.attisdropped",
                &[&t.table, &columns],
            )
            .await
            .map_err(pg_error)?;
        for r in rows {
            let (oid, name, number): (u32, String, i16) = (r.cell(0)?, r.cell(1)?, r.cell(2)?);
            let entry = out.entry(t.table.clone()).or_insert_with(|| (oid, BTreeMap::new()));
            entry.1.insert(name, number);
        }
    }
    Ok(Ids(out))
}

/// `targets` under the names their tables and columns have now: by OID and
/// number where they still exist, else under the same names (a table built
/// anew and put in the old one's place is compared as the old one was).
pub async fn follow(client: &tokio_postgres::Client, targets: &[Target], ids: &Ids) -> Result<Followed> {
    let mut out = Followed::default();
    for t in targets {
        let (mut table_now, mut names_now) = (None, BTreeMap::<i16, String>::new());
        let known = ids.0.get(&t.table);
        if let Some((oid, _)) = known {
            let rows = client
                .query(
                    "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname),
                            a.attnum, a.attname::text
                       FROM pg_catalog.pg_class c
                       JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                       JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid
                      WHERE c.oid = $1 AND a.attnum > 0 AND NOT a.attisdropped",
                    &[oid],
                )
                .await
                .map_err(pg_error)?;
            for r in rows {
                let (table, number, name): (String, i16, String) = (r.cell(0)?, r.cell(1)?, r.cell(2)?);
                table_now = Some(table);
                names_now.insert(number, name);
            }
        }
        let table_now = table_now.unwrap_or_else(|| t.table.clone());
        let mut now = Target { table: table_now.clone(), columns: vec![], ..t.clone() };
        now.from_itself.clear();
        now.discards.clear();
        let (_, back) = out.back.entry(table_now).or_insert_with(|| (t.table.clone(), BTreeMap::new()));
        // Every column known by number (the key's too) is followed.
        for (column, number) in known.into_iter().flat_map(|(_, numbers)| numbers) {
            if let Some(name) = names_now.get(number) {
                back.insert(name.clone(), column.clone());
            }
        }
        for column in &t.columns {
            let number = known.and_then(|(_, numbers)| numbers.get(column));
            let name = number.and_then(|n| names_now.get(n)).unwrap_or(column);
            now.columns.push(name.clone());
            if t.from_itself.contains(column) {
                now.from_itself.insert(name.clone());
            }
            if let Some(discard) = t.discards.get(column) {
                now.discards.insert(name.clone(), discard.clone());
            }
            back.insert(name.clone(), column.clone());
        }
        out.now.push(now);
    }
    Ok(out)
}

impl Followed {
    /// The golden's name of a table named so now.
    pub fn golden_table(&self, table: &str) -> Option<&str> {
        self.back.get(table).map(|(golden, _)| golden.as_str())
    }

    /// The key of each table under its name now, as `shape` (the golden's) keys it.
    pub fn keys_now<'a>(
        &'a self,
        shape: &'a crate::verify::Shape,
    ) -> impl Fn(&str) -> Option<String> + Sync + 'a {
        move |table| {
            let key = self.golden_table(table).and_then(|t| shape.key(t))?;
            Some(self.key_now(table, key))
        }
    }

    /// The golden's key `key` of the table named `table` now, under the
    /// names its columns have now (a key column renamed is followed too).
    pub fn key_now(&self, table: &str, key: &str) -> String {
        let Some((_, columns)) = self.back.get(table) else { return key.to_owned() };
        let now = |golden: &String| columns.iter().find(|(_, g)| *g == golden).map(|(n, _)| n.clone());
        let keyed = super::key_columns(key);
        keyed
            .iter()
            .map(|k| airlock_postgres::catalog::quote_ident(&now(k).unwrap_or_else(|| k.clone())))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The golden's names of a table and column named so now.
    fn golden(&self, table: &str, column: &str) -> Option<(&str, &str)> {
        let (golden, columns) = self.back.get(table)?;
        Some((golden, columns.get(column)?))
    }

    /// Values read under the names now, under the golden's names.
    pub fn values_back(&self, read: BTreeMap<String, Values>) -> BTreeMap<String, Values> {
        let mut out = BTreeMap::new();
        for (table, mut values) in read {
            let Some((golden, _)) = self.back.get(&table) else { continue };
            let golden = golden.clone();
            values.columns = values
                .columns
                .iter()
                .map(|c| self.golden(&table, c).map_or_else(|| c.clone(), |(_, g)| g.to_owned()))
                .collect();
            out.insert(golden, values);
        }
        out
    }

    /// Counts read under the names now, under the golden's names.
    pub fn counts_back(&self, read: BTreeMap<String, Counts>) -> BTreeMap<String, Counts> {
        let mut out = BTreeMap::new();
        for (table, counts) in read {
            let Some((golden, _)) = self.back.get(&table) else { continue };
            let golden = golden.clone();
            let counts = counts
                .into_iter()
                .filter_map(|(c, n)| Some((self.golden(&table, &c)?.1.to_owned(), n)))
                .collect();
            out.insert(golden, counts);
        }
        out
    }
}
