//! A subset cut along references, in the staging database before masking:
//!
//! 1. the starting rows: each `--subset` table's rows that meet its
//!    condition, of which `--subset-percent` are kept (chosen by a hash of
//!    the row, so the same rows every build of the same data);
//! 2. their children, and theirs, to the end (every row that references a
//!    kept row, through self-references and cycles alike);
//! 3. the parents those rows need, and theirs (a NULL reference needs none);
//! 4. tables not reached that reference reached ones keep the rows whose
//!    references all lead to kept rows; tables no reference connects are kept whole.
//!
//! Each table that holds rows has a set of kept row addresses; the steps run
//! until nothing is added. It runs as the owner role (the conditions and the
//! comparisons are the application's), and the build then checks every
//! reference, declared or the rules file's, in the cut data.

use std::collections::{BTreeMap, BTreeSet};

use super::keys::{Keys, Link};
use super::tables::{failed, without_values_strict, Leaf};
use airlock_core::dsn::OWNER_ROLE;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::records::masking::{SubsetReport, SubsetTable};
use airlock_postgres::admin::Admin;
use airlock_postgres::catalog::quote_ident;
use airlock_postgres::cell::Cell;

fn invalid(message: String) -> Error {
    Error::new(
        ErrorCode::MaskInvalid,
        message,
        "give --subset as `schema.table: SQL condition` (or `schema.table` for all its rows), naming a table of the \
         source, and --subset-percent between 0 and 100",
    )
}

/// One starting table: `schema.table` and its condition.
pub fn parse_root(text: &str) -> Result<(String, String)> {
    let (table, condition) = match text.split_once(':') {
        Some((t, c)) if !t.contains(['(', ' ', '\'']) || t.trim().split_whitespace().count() == 1 => {
            (t.trim(), c.trim())
        }
        _ => (text.trim(), ""),
    };
    let parts: Vec<&str> = table.split('.').collect();
    if parts.len() != 2 || parts.iter().any(|p| p.is_empty() || p.contains(char::is_whitespace)) {
        return Err(invalid(format!("--subset {text:?} does not start with `schema.table`")));
    }
    if condition.contains(';') {
        return Err(invalid(format!("the condition of --subset {text:?} is more than one expression")));
    }
    Ok((table.to_owned(), if condition.is_empty() { "true".into() } else { condition.to_owned() }))
}

/// The address set of leaf `i`.
fn kept(i: usize) -> String {
    format!("airlock_mask.k{i}")
}

/// `(a.x, a.y)` of the columns, for comparing as a row.
fn row_of(alias: &str, columns: &[String]) -> String {
    format!(
        "({})",
        columns.iter().map(|c| format!("{alias}.{}", quote_ident(c))).collect::<Vec<_>>().join(", ")
    )
}

/// The leaves of each named table.
fn leaves_of(leaves: &[Leaf]) -> BTreeMap<&str, Vec<usize>> {
    let mut out: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, l) in leaves.iter().enumerate() {
        out.entry(l.named.as_str()).or_default().push(i);
    }
    out
}

/// Cuts the staging database to the subset; returns what it kept and why.
pub async fn cut(
    roots: &[String],
    percent: Option<f64>,
    leaves: &[Leaf],
    keys: &Keys,
    admin: &Admin,
    owner: &Admin,
) -> Result<SubsetReport> {
    let began = std::time::Instant::now();
    if let Some(p) = percent {
        if !(p > 0.0 && p <= 100.0) {
            return Err(invalid(format!("--subset-percent {p} is not above 0 and at most 100")));
        }
    }
    let named = leaves_of(leaves);
    let mut starts = Vec::new();
    for r in roots {
        let (table, condition) = parse_root(r)?;
        let Some(found) = named.get(table.as_str()) else {
            return Err(invalid(format!("--subset names {table}, which the source does not have")));
        };
        starts.push((found.clone(), condition));
    }
    // Links between tables that hold rows: (child leaf, parent leaf, link).
    let mut edges: Vec<(usize, usize, &Link)> = Vec::new();
    for link in &keys.links {
        let (Some(children), Some(parents)) =
            (named.get(link.from.table.as_str()), named.get(link.to.table.as_str()))
        else {
            continue;
        };
        let has =
            |i: usize, cols: &[String]| cols.iter().all(|c| leaves[i].columns.iter().any(|x| &x.name == c));
        for &c in children {
            for &p in parents {
                if has(c, &link.from.columns) && has(p, &link.to.columns) {
                    edges.push((c, p, link));
                }
            }
        }
    }
    // Which tables each step reaches, from the shape of the references alone.
    let starting: BTreeSet<usize> = starts.iter().flat_map(|(l, _)| l.iter().copied()).collect();
    let down = grow(starting, &edges, |c, p, set| set.contains(&p).then_some(c));
    let reached = grow(down.clone(), &edges, |c, p, set| set.contains(&c).then_some(p));
    let filtered = grow(BTreeSet::new(), &edges, |c, p, set| {
        (!reached.contains(&c) && (reached.contains(&p) || set.contains(&p))).then_some(c)
    });
    let mut source_rows = BTreeMap::new();
    for (i, leaf) in leaves.iter().enumerate() {
        let n: i64 = admin
            .client()
            .query_one(&format!("SELECT count(*) FROM ONLY {}", leaf.sql), &[])
            .await
            .map_err(failed)?
            .cell(0)?;
        source_rows.insert(i, n);
    }
    for &i in &reached {
        let k = kept(i);
        admin
            .execute(&format!(
                "CREATE UNLOGGED TABLE {k} (t tid PRIMARY KEY, step smallint NOT NULL);
                 GRANT SELECT, INSERT ON {k} TO {OWNER_ROLE};"
            ))
            .await?;
    }
    let run = |sql: String| async move {
        owner
            .client()
            .execute(&sql, &[])
            .await
            .map_err(|e| invalid(format!("cutting the subset failed: {}", without_values_strict(&e))))
    };
    // 1. The starting rows.
    let share = percent.map_or(String::from("true"), |p| {
        format!(
            "pg_catalog.abs(pg_catalog.hashtextextended(x::text, 0) % 1000000) < {}",
            (p * 10000.0).round() as i64
        )
    });
    for (found, condition) in &starts {
        for &i in found {
            let sql = format!(
                "INSERT INTO {} (t, step) SELECT x.ctid, 0 FROM ONLY {} AS x WHERE ({condition}) AND {share} ON CONFLICT DO NOTHING",
                kept(i),
                leaves[i].sql
            );
            owner.client().execute(&sql, &[]).await.map_err(|e| {
                invalid(format!(
                    "the --subset condition for {} failed: {}",
                    leaves[i].named,
                    without_values_strict(&e)
                ))
            })?;
        }
    }
    // 2. Children, to the end; 3. the parents they need, to the end.
    for step in [1, 2] {
        loop {
            let mut added = 0;
            for (c, p, link) in &edges {
                let (from, to, into, follows) = match step {
                    1 if down.contains(c) => (*p, *c, &link.from.columns, &link.to.columns),
                    2 if reached.contains(p) => (*c, *p, &link.to.columns, &link.from.columns),
                    _ => continue,
                };
                let sql = format!(
                    "INSERT INTO {} (t, step) SELECT x.ctid, {step} FROM ONLY {} AS x
                      WHERE {} IN (SELECT {} FROM ONLY {} AS y JOIN {} AS k ON k.t = y.ctid)
                     ON CONFLICT DO NOTHING",
                    kept(to),
                    leaves[to].sql,
                    row_of("x", into),
                    row_of("y", follows).trim_start_matches('(').trim_end_matches(')'),
                    leaves[from].sql,
                    kept(from),
                );
                added += run(sql).await?;
            }
            if added == 0 {
                break;
            }
        }
    }
    // The cut itself.
    for &i in &reached {
        run(format!(
            "DELETE FROM ONLY {} AS x WHERE NOT EXISTS (SELECT 1 FROM {} k WHERE k.t = x.ctid)",
            leaves[i].sql,
            kept(i)
        ))
        .await?;
    }
    // 4. Rows of tables not reached whose references lead to rows cut away.
    loop {
        let mut removed = 0;
        for &i in &filtered {
            removed +=
                run(format!("DELETE FROM ONLY {} AS x WHERE {}", leaves[i].sql, orphaned(i, &edges, leaves)))
                    .await?;
        }
        if removed == 0 {
            break;
        }
    }
    // Every reference holds in what is left.
    let mut checked = 0;
    for i in 0..leaves.len() {
        if !edges.iter().any(|(c, _, _)| *c == i) {
            continue;
        }
        let n: i64 = owner
            .client()
            .query_one(
                &format!(
                    "SELECT count(*) FROM ONLY {} AS x WHERE {}",
                    leaves[i].sql,
                    orphaned(i, &edges, leaves)
                ),
                &[],
            )
            .await
            .map_err(failed)?
            .cell(0)?;
        if n > 0 {
            return Err(Error::internal(format!(
                "the subset left {n} rows of {} whose references lead to no row; nothing was built",
                leaves[i].named
            )));
        }
        checked += edges.iter().filter(|(c, _, _)| *c == i).count() as u64;
    }
    // What each table kept, and why.
    let mut tables: BTreeMap<String, (i64, i64, [i64; 3], &str)> = BTreeMap::new();
    for (i, leaf) in leaves.iter().enumerate() {
        let left: i64 = admin
            .client()
            .query_one(&format!("SELECT count(*) FROM ONLY {}", leaf.sql), &[])
            .await
            .map_err(failed)?
            .cell(0)?;
        let mut steps = [0i64; 3];
        if reached.contains(&i) {
            for r in admin
                .client()
                .query(&format!("SELECT step, count(*) FROM {} GROUP BY step", kept(i)), &[])
                .await
                .map_err(failed)?
            {
                let (step, n): (i16, i64) = (r.cell(0)?, r.cell(1)?);
                steps[step as usize] += n;
            }
        }
        let kind = if starts.iter().any(|(l, _)| l.contains(&i)) {
            "start"
        } else if reached.contains(&i) {
            "reached"
        } else if filtered.contains(&i) {
            "filtered"
        } else {
            "whole"
        };
        let e = tables.entry(leaf.named.clone()).or_insert((0, 0, [0; 3], kind));
        e.0 += source_rows[&i];
        e.1 += left;
        for s in 0..3 {
            e.2[s] += steps[s];
        }
    }
    let root_text: BTreeMap<String, String> = roots.iter().filter_map(|r| parse_root(r).ok()).collect();
    let tables = tables
        .into_iter()
        .map(|(table, (source_rows, kept_rows, steps, kind))| {
            let why = match kind {
                "start" => format!(
                    "starting rows: {} where {}{}, with {} more as children and {} as parents kept rows need",
                    steps[0],
                    root_text.get(&table).map(String::as_str).unwrap_or("true"),
                    percent.map_or(String::new(), |p| format!(", {p}% of them")),
                    steps[1],
                    steps[2]
                ),
                "reached" => {
                    format!("{} as children of kept rows, {} as parents kept rows need", steps[1], steps[2])
                }
                "filtered" => "rows whose references all lead to kept rows".into(),
                _ => "whole: no reference connects it to the subset".into(),
            };
            SubsetTable { table, source_rows, kept_rows, why }
        })
        .collect();
    Ok(SubsetReport {
        roots: roots.to_vec(),
        percent,
        tables,
        references_checked: checked,
        seconds: began.elapsed().as_secs_f64(),
    })
}

/// `set` grown until no reference adds to it: `step(child, parent, set)`
/// names the table a reference adds, if any.
fn grow(
    mut set: BTreeSet<usize>,
    edges: &[(usize, usize, &Link)],
    step: impl Fn(usize, usize, &BTreeSet<usize>) -> Option<usize>,
) -> BTreeSet<usize> {
    loop {
        let before = set.len();
        for (c, p, _) in edges {
            if let Some(table) = step(*c, *p, &set) {
                set.insert(table);
            }
        }
        if set.len() == before {
            return set;
        }
    }
}

/// The condition of a row of leaf `i` some of whose references lead to no row.
fn orphaned(i: usize, edges: &[(usize, usize, &Link)], leaves: &[Leaf]) -> String {
    // Per reference, the parent may be in any table of the referenced one.
    let mut by_link: Vec<(&Link, Vec<&str>)> = Vec::new();
    for (_, p, link) in edges.iter().filter(|(c, _, _)| *c == i) {
        match by_link.iter_mut().find(|(l, _)| std::ptr::eq(*l, *link)) {
            Some((_, parents)) => parents.push(leaves[*p].sql.as_str()),
            None => by_link.push((link, vec![leaves[*p].sql.as_str()])),
        }
    }
    let any: Vec<String> = by_link.iter().map(|(link, parents)| link.finds_no_row(parents)).collect();
    if any.is_empty() {
        "false".into()
    } else {
        any.join(" OR ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_read_as_table_and_condition() {
        assert_eq!(
            parse_root("public.customers: created_at > now() - interval '90 days'").unwrap(),
            ("public.customers".into(), "created_at > now() - interval '90 days'".into())
        );
        assert_eq!(parse_root("public.t").unwrap().1, "true");
        assert_eq!(parse_root("app.t: a::int > 2").unwrap().1, "a::int > 2");
        assert!(parse_root("customers: x").is_err());
        assert!(parse_root("public.t: 1; DROP TABLE x").is_err());
    }
}
