//! Values compared by how many rows hold each, for columns whose rows no key
//! pairs: a table without a primary key, an `UPDATE` that also sets the key
//! (`SET id = id + 1000000, tier = 'standard'`), a table too big to read row
//! by row. The server counts; the daemon holds one entry per distinct value.
//!
//! Without pairs, which row went where is unknown, so the rule is the pairs'
//! rule read from the counts: rows left their values (counts that fell) and
//! joined values other rows already held (counts that rose on a value held
//! before), or many old values went into fewer new ones. Rows that joined
//! new values one for one (`upper(email)`) are taken as renamed, not lost,
//! as are rows that were `NULL`. A column computed from itself (`qty + 1`)
//! is judged only where its values collapsed, to half as many or fewer
//! (`amount * 0 + 1`, `kind::char(1)`): shifted counts cannot tell a bump
//! from a merge.

use std::collections::{BTreeMap, HashMap};

use airlock_core::error::Result;
use airlock_postgres::catalog::{quote_ident, Catalog};
use airlock_postgres::cell::Cell as _;

use super::{Cell, Lost, Target, SHOWN_MOST};

/// The most distinct values one read holds, all its columns together (a
/// candidate can make as many as it writes rows, each up to [`SHOWN_MOST`]
/// characters long): a column that would pass it is not read, and not
/// judged.
pub const DISTINCT_MOST: i64 = 200_000;

/// One table's counted columns: each column's rows by value.
pub type Counts = BTreeMap<String, HashMap<Cell, i64>>;

/// The counts of values read row by row: each column's rows by value.
pub fn of_values(values: &super::Values) -> Counts {
    let mut out = Counts::new();
    for (i, column) in values.columns.iter().enumerate() {
        let mut by_value: HashMap<Cell, i64> = HashMap::new();
        for row in values.rows.values() {
            *by_value.entry(row[i].clone()).or_default() += 1;
        }
        out.insert(column.clone(), by_value);
    }
    out
}

/// How many values (not NULL) one column's counts hold.
pub fn distinct(counts: &HashMap<Cell, i64>) -> usize {
    counts.iter().filter(|(v, n)| !v.is_null() && **n > 0).count()
}

/// Reads the counts of `targets`' columns that `catalog` (the schema at the time) still has, through the reader's
/// function. A column whose values would take the read past
/// [`DISTINCT_MOST`] is left out.
pub async fn read(
    client: &tokio_postgres::Client,
    targets: &[Target],
    catalog: &Catalog,
) -> Result<BTreeMap<String, Counts>> {
    let mut out = BTreeMap::new();
    let wanted: Vec<(&Target, Vec<&String>)> = targets
        .iter()
        .filter_map(|t| {
            let now = catalog.tables.get(&t.table)?;
            // Columns computed from themselves last: they are judged only
            // where they collapsed, and a key renumbered holds as many
            // values as rows.
            let mut columns =
                t.columns.iter().filter(|c| now.columns.iter().any(|n| &n.name == *c)).collect::<Vec<_>>();
            columns.sort_by_key(|c| t.from_itself.contains(*c));
            Some((t, columns)).filter(|(_, c)| !c.is_empty())
        })
        .collect();
    if wanted.is_empty() {
        return Ok(out);
    }
    let grant_each = airlock_postgres::catalog::ensure_reader(client).await?;
    let budget = super::Budget::start();
    super::pinned(client, async {
        let mut room = DISTINCT_MOST;
        for (t, columns) in wanted {
            let mut counts = Counts::new();
            for column in columns {
                let value = format!("ROW(t.{})", quote_ident(column));
                let (shown, most) = (SHOWN_MOST as i32, room + 1);
                let rows = super::super::verify::as_reader(
                    client,
                    (grant_each, &t.table, Some(budget.left()?)),
                    "SELECT d, s, n FROM pg_airlock.value_counts($1::text::pg_catalog.regclass, $2, $3, $4)",
                    &[&t.table, &value, &shown, &most],
                )
                .await?;
                if rows.len() as i64 > room {
                    continue;
                }
                room -= rows.len() as i64;
                let mut by_value = HashMap::with_capacity(rows.len());
                for r in rows {
                    let (digest, text, n): (String, String, i64) = (r.cell(0)?, r.cell(1)?, r.cell(2)?);
                    let shown = super::record_fields(&text).swap_remove(0);
                    by_value.insert(Cell { digest: super::digest_of(&digest), shown }, n);
                }
                counts.insert(column.clone(), by_value);
            }
            out.insert(t.table.clone(), counts);
        }
        Ok(out)
    })
    .await
}

/// What a column lost, from its counts before and after (see the module's
/// rule), by how its new values were made. No keys are known, so none are
/// given.
pub fn lost(before: &HashMap<Cell, i64>, after: &HashMap<Cell, i64>, making: &super::Making) -> Lost {
    let held = |m: &HashMap<Cell, i64>, v: &Cell| m.get(v).copied().unwrap_or(0);
    // Values rows left (NULL aside: a row that held nothing lost nothing).
    let mut left: Vec<(&Cell, i64)> = before
        .iter()
        .filter(|(v, _)| v.shown.is_some())
        .map(|(v, n)| (v, n - held(after, v)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let (mut onto_held, mut onto_new): (Vec<(&Cell, i64)>, Vec<(&Cell, i64)>) = after
        .iter()
        .map(|(v, n)| (v, n - held(before, v)))
        .filter(|(_, n)| *n > 0)
        .partition(|(v, _)| held(before, v) > 0);
    // Fewer new values than old ones left: some of them merged.
    let mut alone = 0;
    if onto_new.len() < left.len() {
        onto_held.append(&mut onto_new);
    } else if matches!(making, super::Making::Discarding(_)) {
        // Made discarding the old values, a new value one row holds is
        // that row's old value gone (what a relabel of many rows is not).
        let own: Vec<(&Cell, i64)> =
            onto_new.into_iter().filter(|(v, n)| *n == 1 && held(after, v) == 1).collect();
        alone = own.len() as i64;
        onto_held.extend(own);
    }
    let changed: i64 = left.iter().map(|(_, n)| n).sum();
    let lost = changed.min(onto_held.iter().map(|(_, n)| n).sum());
    let by_count = |a: &(&Cell, i64), b: &(&Cell, i64)| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0));
    left.sort_by(by_count);
    onto_held.sort_by(by_count);
    let distinct = (left.len(), onto_held.len());
    let was: Vec<(Option<String>, i64)> = left.iter().take(3).map(|(v, n)| (v.shown.clone(), *n)).collect();
    let into = onto_held
        .iter()
        .take(3)
        .map(|(now, n)| {
            let n = (*n).min(lost);
            let was = was.iter().map(|(v, m)| (v.clone(), (*m).min(n) as usize)).collect();
            (now.shown.clone(), n as usize, was)
        })
        .collect();
    let alone = alone.min(lost) as usize;
    Lost { changed: changed as usize, lost: lost as usize, distinct, alone, into, keys: vec![] }
}
