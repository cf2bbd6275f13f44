//! Values a type change could not hold: `numeric(12,2)` to `numeric(12,0)`
//! rounds every balance to whole units, `timestamp` to `date` drops the
//! time of day, `double precision` to `integer` drops the fraction. Each old
//! value becomes a new one of its own, so no two rows become alike and the
//! merge rule ([`super::lost`]) sees nothing, yet what the rows held is gone.
//!
//! The test is the old value's round trip through the new type: converted
//! to it and back, is it still the value it was? That asks nothing of how
//! the file converted (`USING amount / 100.0` from cents into a type that
//! holds every cent loses nothing), only whether the new type can hold what
//! the column held. A column that held text is judged only into another
//! text type (`varchar(50)`, which cuts longer names short): reading text as
//! a number or a date is a reinterpretation, and its spelling (`'007'`,
//! `'2026-1-1'`) would not come back. A float promises so many significant
//! digits (15 for `double precision`): a value that comes back within them
//! is held, so `double precision` to `numeric` loses nothing.
//!
//! Only PostgreSQL's own scalar types are converted, named so that no type,
//! cast or operator the candidate made can stand in for them: the daemon's
//! session runs no code of the candidate's.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use airlock_postgres::catalog::Catalog;
use airlock_postgres::cell::Cell as _;

use super::{Loss, Lost, Target, Values};

/// Types named by SQL keywords, which the grammar maps to `pg_catalog`'s
/// own whatever the search path; each may carry a modifier.
const KEYWORD_TYPES: &[&str] = &[
    "smallint",
    "integer",
    "bigint",
    "real",
    "double precision",
    "numeric",
    "boolean",
    "character varying",
    "character",
    "timestamp without time zone",
    "timestamp with time zone",
    "time without time zone",
    "time with time zone",
    "interval",
];

/// Types named by plain names, qualified here with `pg_catalog`.
const PLAIN_TYPES: &[&str] = &["text", "date", "uuid", "inet", "cidr"];

/// Types whose values are text: a column of one is judged only into another.
const TEXT_TYPES: &[&str] = &["text", "character varying", "character"];

/// The float types, each with the significant digits it promises
/// (`FLT_DIG`, `DBL_DIG`): a value that comes back within a unit of the
/// last of them (relative to its first) is held.
const FLOAT_DIGITS: &[(&str, u32)] = &[("real", 6), ("double precision", 15)];

/// The fewest characters of a value's text held that may be cut short: a
/// value shown this long or longer is left out of the round trip.
const WHOLE_BELOW: usize = super::SHOWN_MOST - 4;

/// A type as `format_type` spells it (`numeric(12,2)`, `timestamp(3) with
/// time zone`), as a cast may name it, if it is one of PostgreSQL's own
/// scalar types; and its name without a modifier.
fn own_type(type_name: &str) -> Option<(String, &'static str)> {
    let (base, modifier) = match type_name.split_once('(') {
        Some((head, rest)) => {
            let (modifier, tail) = rest.split_once(')')?;
            if modifier.is_empty() || !modifier.chars().all(|c| c.is_ascii_digit() || c == ',') {
                return None;
            }
            (format!("{head}{tail}"), Some(modifier))
        }
        None => (type_name.to_owned(), None),
    };
    if let Some(k) = KEYWORD_TYPES.iter().find(|k| **k == base) {
        return Some((type_name.to_owned(), k));
    }
    PLAIN_TYPES.iter().find(|p| **p == base && modifier.is_none()).map(|p| (format!("pg_catalog.{p}"), *p))
}

/// The old and new type of each column of `targets` whose type changed
/// from one of PostgreSQL's own scalar types other than text to another:
/// `(table, column) -> (old, new)` as `format_type` spells them.
fn retyped(
    targets: &[Target],
    golden: &Catalog,
    now: &Catalog,
) -> BTreeMap<(String, String), (String, String)> {
    let mut out = BTreeMap::new();
    for t in targets {
        let (Some(was), Some(is)) = (golden.tables.get(&t.table), now.tables.get(&t.table)) else { continue };
        for column in &t.columns {
            let type_of = |table: &airlock_postgres::catalog::Table| {
                table.columns.iter().find(|c| &c.name == column).map(|c| c.type_name.clone())
            };
            let (Some(old), Some(new)) = (type_of(was), type_of(is)) else { continue };
            let judged = match (own_type(&old), own_type(&new)) {
                (Some((_, was)), Some((_, is))) => !TEXT_TYPES.contains(&was) || TEXT_TYPES.contains(&is),
                _ => false,
            };
            if old != new && judged {
                out.insert((t.table.clone(), column.clone()), (old, new));
            }
        }
    }
    out
}

/// A value's text, where what was read of it is the whole of it.
fn whole(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| s.chars().count() < WHOLE_BELOW)
}

/// What of a value is taken through the round trip: the whole of it; or,
/// for text into a shorter text type, its start alone when that is all
/// that was read, since a start the new type cuts short is a whole value it
/// cuts short too.
fn taken<'a>(v: &'a Option<String>, from_text: bool) -> Option<&'a str> {
    match from_text {
        true => v.as_deref(),
        false => whole(v),
    }
}

/// The old values (as their text) among `values` that do not come back
/// the same from `new`, as `old`, each with the value it comes back as
/// (`None` for one the new type refuses: out of its range). `None` where
/// the round trip could not be made at all.
async fn not_held(
    client: &tokio_postgres::Client,
    values: &[&str],
    (old, new): (&str, &str),
) -> Option<HashMap<String, Option<String>>> {
    let (old, base) = own_type(old)?;
    let (new, _) = own_type(new)?;
    // Each value alone, so one the new type refuses (an overflow the file's
    // USING never met) is lost, not a failure of the whole read: a function
    // of the admin session's own, dropped after.
    let function = format!(
        "CREATE OR REPLACE FUNCTION pg_temp.airlock_round_trip(v pg_catalog.text) RETURNS pg_catalog.text
           LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $round_trip$
           BEGIN RETURN (((v::{old})::{new})::{old})::pg_catalog.text;
           EXCEPTION WHEN others THEN RETURN NULL; END $round_trip$"
    );
    let held = match FLOAT_DIGITS.iter().find(|(f, _)| *f == base) {
        // A float promises so many digits and no more: beyond them its
        // text is noise that no other type need keep. (Operators written
        // OPERATOR(...) share one precedence: the product is bracketed.)
        Some((_, digits)) => format!(
            "pg_catalog.abs(b::pg_catalog.float8 OPERATOR(pg_catalog.-) (v::{old})::pg_catalog.float8)
               OPERATOR(pg_catalog.<=) (pg_catalog.abs((v::{old})::pg_catalog.float8) OPERATOR(pg_catalog.*) 1e-{}::pg_catalog.float8)",
            digits - 1
        ),
        None => format!("b OPERATOR(pg_catalog.=) (v::{old})::pg_catalog.text"),
    };
    let sql = format!(
        "SELECT v, b FROM (SELECT v, pg_temp.airlock_round_trip(v) AS b FROM pg_catalog.unnest($1::pg_catalog.text[]) AS u(v)) r
          WHERE b IS NULL OR NOT ({held})"
    );
    let values: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
    let rows = super::pinned(client, async {
        let describe = |e: tokio_postgres::Error| {
            airlock_core::error::Error::postgres(airlock_postgres::admin::describe(&e))
        };
        client.batch_execute(&function).await.map_err(describe)?;
        let rows = client.query(&sql, &[&values]).await.map_err(describe);
        let _ =
            client.batch_execute("DROP FUNCTION IF EXISTS pg_temp.airlock_round_trip(pg_catalog.text)").await;
        rows
    })
    .await
    .ok()?;
    rows.iter().map(|r| Some((r.cell(0).ok()?, r.cell::<Option<String>>(1).ok()?))).collect()
}

/// The columns of `targets` (paired by key: `before` and `after`, by the
/// golden's names) that lost any of their values to a new type that
/// cannot hold them. `golden` and `now` are the schemas before and after.
pub async fn losses(
    client: &tokio_postgres::Client,
    targets: &[Target],
    (before, after): (&BTreeMap<String, Values>, &BTreeMap<String, Values>),
    (golden, now): (&Catalog, &Catalog),
    rows_before: &BTreeMap<String, i64>,
) -> Vec<Loss> {
    let mut out = Vec::new();
    let retyped = retyped(targets, golden, now);
    for t in targets {
        let (Some(b), Some(a)) = (before.get(&t.table), after.get(&t.table)) else { continue };
        for column in &t.columns {
            let Some((old, new)) = retyped.get(&(t.table.clone(), column.clone())) else { continue };
            let (Some(was_at), Some(now_at)) =
                (b.columns.iter().position(|c| c == column), a.columns.iter().position(|c| c == column))
            else {
                continue;
            };
            let from_text = own_type(old).is_some_and(|(_, base)| TEXT_TYPES.contains(&base));
            let distinct: BTreeSet<&str> =
                b.rows.values().filter_map(|r| taken(&r[was_at].shown, from_text)).collect();
            let values: Vec<&str> = distinct.into_iter().collect();
            let Some(changed) = not_held(client, &values, (old, new)).await else { continue };
            let mut lost =
                Lost { changed: 0, lost: 0, distinct: (0, 0), alone: 0, into: vec![], keys: vec![] };
            let mut into: BTreeMap<Option<String>, BTreeMap<Option<String>, usize>> = BTreeMap::new();
            for (key, row) in &b.rows {
                let Some(was) = taken(&row[was_at].shown, from_text).filter(|v| changed.contains_key(*v))
                else {
                    continue;
                };
                let now = a.rows.get(key).and_then(|r| r[now_at].shown.clone());
                *into.entry(now).or_default().entry(Some(was.to_owned())).or_default() += 1;
                lost.keys.push(key.clone());
            }
            lost.lost = lost.keys.len();
            lost.changed = lost.lost;
            let olds: BTreeSet<&Option<String>> = into.values().flat_map(|w| w.keys()).collect();
            lost.distinct = (olds.len(), into.len());
            let mut groups: Vec<(Option<String>, usize, Vec<(Option<String>, usize)>)> = into
                .into_iter()
                .map(|(now, was)| {
                    let n = was.values().sum();
                    let mut was: Vec<(Option<String>, usize)> = was.into_iter().collect();
                    was.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
                    was.truncate(3);
                    (now, n, was)
                })
                .collect();
            groups.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
            groups.truncate(3);
            lost.into = groups;
            let rows = rows_before.get(&t.table).copied().unwrap_or(b.rows.len() as i64);
            // A type change is not meant to change values: any it loses is
            // a hazard (high once enough are, as for an overwrite).
            if lost.lost > 0 {
                let mut loss = Loss::of(t, column, rows, lost, true);
                loss.narrowed = Some((old.clone(), new.clone()));
                out.push(loss);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::own_type;

    #[test]
    fn only_postgresqls_own_types_are_named_and_each_so_no_other_can_stand_in() {
        assert_eq!(own_type("numeric(12,2)"), Some(("numeric(12,2)".into(), "numeric")));
        assert_eq!(
            own_type("timestamp(3) with time zone"),
            Some(("timestamp(3) with time zone".into(), "timestamp with time zone"))
        );
        assert_eq!(own_type("integer"), Some(("integer".into(), "integer")));
        assert_eq!(own_type("date"), Some(("pg_catalog.date".into(), "date")));
        assert_eq!(own_type("text"), Some(("pg_catalog.text".into(), "text")));
        for other in [
            "positive",
            "public.money2",
            "integer[]",
            "numeric(1);drop",
            "numeric()",
            "date(3)",
            "money",
            "status",
            "\"integer\"",
        ] {
            assert_eq!(own_type(other), None, "{other}");
        }
    }
}
