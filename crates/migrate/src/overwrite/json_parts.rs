//! Parts of JSON documents a migration took away. `payload - 'ip'` leaves
//! every document unlike every other, so no two old values became one and
//! the rule for a whole column's values ([`super::lost`]) sees nothing
//! lost, yet every IP address is gone. Here a `json` or `jsonb` column is
//! read as its parts (each value in it that is not an object, by its path),
//! before the candidate and after, and a part is lost by the same rule as a
//! column's value: its new value at that path, or its absence, is one that
//! rows with another old value there hold too, and the old value is
//! nowhere else in the row's document. A value moved to another key, a key
//! added, a key that held one value in every row, or a JSON `null` dropped
//! loses nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use airlock_postgres::catalog::{short_name, Catalog};

use super::{count, gather, keeping_places, Loss, Reading, Target, Values, Wanted};
use crate::report::{Hazard, Severity, StatementReport};
use crate::verify::Shape;

/// The most parts read of one document; one with more is not judged.
const PARTS_MOST: usize = 64;
/// The most characters of one document's parts as read: one whose parts
/// write more is not judged. With [`ROWS_MOST`], what the daemon holds of a
/// table's documents stays in bounds whatever the candidate wrote.
const PARTS_TEXT_MOST: usize = 2_000;
/// How deep into nested objects and arrays parts are read; a document
/// deeper is not judged.
const DEPTH_MOST: usize = 16;
/// The most characters of a part's text read for a message.
const PART_SHOWN_MOST: usize = 40;
/// The longest key a path holds as written; a longer one by its digest.
const KEY_MOST: usize = 40;
/// The most rows of a table whose documents are read as parts.
pub const ROWS_MOST: i64 = 100_000;

/// An SQL expression of `column` (of row `t`) as its parts (the values in
/// it that are neither objects nor arrays; an array's elements by their
/// index, `[0]`), as JSON: an array of `[path, hash, start of text]`, the hash `null` for a JSON
/// `null` (`[]` for SQL `NULL`); the string [`UNJUDGED`] for a document of
/// more than [`PARTS_MOST`] parts, [`PARTS_TEXT_MOST`] characters of them,
/// or objects and arrays deeper than [`DEPTH_MOST`]. A string's text is its
/// characters without quotes, so a part copied into a `text` column is
/// found by its hash there (any other column's value is read as a
/// document of one string: [`as_document`]).
/// The walk stops at the part past the most, since a recursive query is
/// run only as far as it is read: a document of a million values costs no
/// more to find too large than one of 65.
pub fn read_parts(column: &str, type_name: &str) -> String {
    let document = as_document(column, type_name);
    let is = |what: &str| format!("pg_catalog.jsonb_typeof(e.v) OPERATOR(pg_catalog.=) '{what}'");
    format!(
        "(SELECT CASE WHEN s.n OPERATOR(pg_catalog.>) {PARTS_MOST} OR s.deep \
                        OR pg_catalog.length(s.a::text) OPERATOR(pg_catalog.>) {PARTS_TEXT_MOST} \
                      THEN '\"{UNJUDGED}\"'::pg_catalog.jsonb \
                      ELSE COALESCE(s.a, '[]'::pg_catalog.jsonb) END \
            FROM (SELECT pg_catalog.count(*) AS n, \
                         pg_catalog.bool_or(e.k OPERATOR(pg_catalog.=) ANY (ARRAY['object', 'array'])) AS deep, \
                         pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(e.p, \
                           CASE WHEN e.k OPERATOR(pg_catalog.=) 'null' THEN NULL ELSE pg_catalog.hashtextextended(e.x, 0) END, \
                           pg_catalog.left(e.x, {PART_SHOWN_MOST}))) AS a \
                    FROM (WITH RECURSIVE e(p, v, d) AS ( \
                            SELECT ARRAY[]::text[], {document}, 0 \
                            UNION ALL \
                            SELECT e.p OPERATOR(pg_catalog.||) c.k, c.v, e.d OPERATOR(pg_catalog.+) 1 \
                              FROM e, LATERAL ( \
                                SELECT CASE WHEN pg_catalog.length(j.key) OPERATOR(pg_catalog.>) {KEY_MOST} \
                                         THEN 'md5:' OPERATOR(pg_catalog.||) pg_catalog.md5(j.key) ELSE j.key END AS k, j.value AS v \
                                  FROM pg_catalog.jsonb_each(CASE WHEN {object} AND e.d OPERATOR(pg_catalog.<) {DEPTH_MOST} THEN e.v END) j \
                                UNION ALL \
                                SELECT '[' OPERATOR(pg_catalog.||) (a.i OPERATOR(pg_catalog.-) 1)::text OPERATOR(pg_catalog.||) ']', a.x \
                                  FROM pg_catalog.jsonb_array_elements(CASE WHEN {array} AND e.d OPERATOR(pg_catalog.<) {DEPTH_MOST} THEN e.v END) \
                                       WITH ORDINALITY AS a(x, i)) c) \
                          SELECT e.p, pg_catalog.jsonb_typeof(e.v) AS k, \
                                 CASE WHEN {string} THEN e.v OPERATOR(pg_catalog.#>>) '{{}}' ELSE e.v::text END AS x \
                            FROM e WHERE NOT ({object} OR {array}) OR e.d OPERATOR(pg_catalog.=) {DEPTH_MOST} \
                           LIMIT {past}) e) s)",
        past = PARTS_MOST + 1,
        object = is("object"),
        array = is("array"),
        string = is("string"),
    )
}

/// `column` (of type `type_name`, as the catalog writes it under the pinned
/// search path) as a `jsonb` document. A `json` or `jsonb` value is its own;
/// any other is the text its type's output function writes (`format`'s
/// `%s`), as one JSON string. Never `to_jsonb` of it, nor a cast: a type
/// the candidate made can carry a cast to `json` that `to_jsonb` would
/// call, running the candidate's code in the admin's session.
fn as_document(column: &str, type_name: &str) -> String {
    match type_name {
        "jsonb" => column.to_owned(),
        // (A cast between two built-in types, which no candidate can own.)
        "json" => format!("({column})::pg_catalog.jsonb"),
        _ => format!(
            "CASE WHEN {column} IS NULL THEN NULL ELSE pg_catalog.to_jsonb(pg_catalog.format('%s', {column})) END"
        ),
    }
}

/// What [`read_parts`] writes for a document it does not judge.
const UNJUDGED: &str = "unjudged";

/// A document as [`read_parts`] read it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Read {
    /// Its parts.
    Parts(Vec<Part>),
    /// Too many parts, too long or too deep to compare part by part.
    Unjudged,
}

/// The document [`read_parts`] wrote; `None` where nothing was read.
fn read_of(text: Option<&str>) -> Option<Read> {
    let text = text?;
    if serde_json::from_str::<String>(text).is_ok_and(|s| s == UNJUDGED) {
        return Some(Read::Unjudged);
    }
    serde_json::from_str(text).ok().map(Read::Parts)
}

/// One part of a document.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Part {
    /// The keys that lead to it from the document's top.
    pub path: Vec<String>,
    /// Its value's hash; `None` for a JSON `null`.
    pub hash: Option<i64>,
    /// The start of its text.
    pub shown: String,
}

/// The parts [`read_parts`] wrote; `None` for a document not judged.
pub fn parts_of(text: Option<&str>) -> Option<Vec<Part>> {
    match read_of(text)? {
        Read::Parts(parts) => Some(parts),
        Read::Unjudged => None,
    }
}

/// The `json` and `jsonb` columns of `targets`, of tables of at most
/// [`ROWS_MOST`] rows (`rows`, the golden's).
pub fn targets(targets: &[Target], catalog: &Catalog, rows: &BTreeMap<String, i64>) -> Vec<Target> {
    targets
        .iter()
        .filter(|t| rows.get(&t.table).is_some_and(|n| *n <= ROWS_MOST))
        .filter_map(|t| {
            let table = catalog.tables.get(&t.table)?;
            let json = |c: &String| {
                table
                    .columns
                    .iter()
                    .any(|col| &col.name == c && matches!(col.type_name.as_str(), "json" | "jsonb"))
            };
            let columns: Vec<String> = t.columns.iter().filter(|c| json(c)).cloned().collect();
            (!columns.is_empty()).then(|| Target { columns, ..t.clone() })
        })
        .collect()
}

/// What a document's column lost at one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathLost {
    /// The path, as SQL writes it: `payload->'meta'->'ip'`.
    pub path: String,
    /// Rows that lost the value there.
    pub rows: usize,
    /// The most common of the values they held (a few).
    pub was: Vec<String>,
    /// How many distinct values they held.
    pub distinct: usize,
    /// What the path holds now in most of those rows; `None` where the key
    /// is gone.
    pub now: Option<String>,
}

/// A column that lost parts of its documents in enough rows for a hazard.
#[derive(Debug, Clone)]
pub struct PartLoss {
    /// Its table, `schema.name`.
    pub table: String,
    /// The column.
    pub column: String,
    /// The line of the first statement that names it.
    pub line: usize,
    /// The rows its table held.
    pub rows: i64,
    /// Rows that lost a part.
    pub lost: usize,
    /// Rows rewritten into documents too large or deep to compare part by
    /// part ([`read_parts`]): what they lost is not known.
    pub unjudged: usize,
    /// By path, most rows first.
    pub paths: Vec<PathLost>,
    /// The hashes of the values each row lost, by the row's key.
    pub taken: HashMap<String, Vec<i64>>,
}

/// What a path holds after the candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Now {
    /// The key is gone.
    Gone,
    /// A value (`None` for JSON `null`).
    Holds(Option<i64>),
}

/// One part a row's document changed, or no longer holds.
struct Changed<'a> {
    key: &'a str,
    was: &'a Part,
    now: Now,
    shown: Option<&'a str>,
}

/// The columns of `targets` whose documents lost parts in enough rows, from
/// their parts before the candidate and after (read as [`Reading::Parts`]);
/// a column `already` counts as overwritten whole is left to that.
pub fn losses(
    targets: &[Target],
    before: &BTreeMap<String, Values>,
    after: &BTreeMap<String, Values>,
    rows_before: &BTreeMap<String, i64>,
    already: &[Loss],
) -> Vec<PartLoss> {
    let mut out = Vec::new();
    for t in targets {
        let (Some(b), Some(a)) = (before.get(&t.table), after.get(&t.table)) else { continue };
        let rows = rows_before.get(&t.table).copied().unwrap_or(b.rows.len() as i64);
        for column in &t.columns {
            if already.iter().any(|l| l.table == t.table && &l.column == column) {
                continue;
            }
            let Some(loss) = column_losses(b, a, column, t.from_itself.contains(column)) else { continue };
            if super::enough(loss.lost, rows) || super::enough(loss.unjudged, rows) {
                out.push(PartLoss {
                    table: t.table.clone(),
                    column: column.clone(),
                    line: t.line,
                    rows,
                    ..loss
                });
            }
        }
    }
    out
}

/// What `column` lost between `before` and `after`, its table and line
/// left for the caller. As for a whole value ([`super::lost`]): where the
/// column is computed from itself (`payload - 'ip'`, `jsonb_set(payload,
/// ...)`) and a path's changed rows now hold more than one value there
/// (a counter bumped in some rows), only the changed rows' old values
/// count, since the change can be undone.
fn column_losses(before: &Values, after: &Values, column: &str, from_itself: bool) -> Option<PartLoss> {
    let was_at = before.columns.iter().position(|c| c == column)?;
    let now_at = after.columns.iter().position(|c| c == column)?;
    let mut unjudged = 0;
    let parsed: Vec<(&String, Vec<Part>, Option<Vec<Part>>)> = before
        .rows
        .iter()
        .filter_map(|(key, cells)| {
            let (was, now) = (&cells[was_at], &after.rows.get(key)?[now_at]);
            let parts = parts_of(was.shown.as_deref())?;
            // (A document left as it was needs no second reading.)
            let now = match was == now {
                true => None,
                false => match read_of(now.shown.as_deref())? {
                    Read::Parts(now) => Some(now),
                    // Made too large or deep to judge: said so, not taken as whole.
                    Read::Unjudged => {
                        unjudged += 1;
                        return None;
                    }
                },
            };
            Some((key, parts, now))
        })
        .collect();
    if unjudged == 0 && parsed.iter().all(|(_, _, now)| now.is_none()) {
        return None;
    }
    // Every old value behind each path's new value, of every row read.
    let mut sources: HashMap<(&[String], Now), HashSet<i64>> = HashMap::new();
    let mut changed: Vec<Changed> = Vec::new();
    for (key, was, now) in &parsed {
        let Some(now) = now else {
            for p in was {
                if let Some(h) = p.hash {
                    sources.entry((&p.path, Now::Holds(Some(h)))).or_default().insert(h);
                }
            }
            continue;
        };
        let at: HashMap<&[String], &Part> = now.iter().map(|p| (p.path.as_slice(), p)).collect();
        let held: HashSet<i64> = now.iter().filter_map(|p| p.hash).collect();
        for p in was {
            let Some(h) = p.hash else { continue };
            let there = at.get(p.path.as_slice());
            let to = there.map_or(Now::Gone, |n| Now::Holds(n.hash));
            // Unchanged, or moved elsewhere in the document.
            if to != Now::Holds(Some(h)) && held.contains(&h) {
                continue;
            }
            sources.entry((&p.path, to)).or_default().insert(h);
            if to != Now::Holds(Some(h)) {
                changed.push(Changed { key, was: p, now: to, shown: there.map(|n| n.shown.as_str()) });
            }
        }
    }
    // Of the changed rows alone, by path: the old values behind each new
    // value, and how many new values there are.
    let mut among_changed: HashMap<(&[String], Now), HashSet<i64>> = HashMap::new();
    let mut new_values: HashMap<&[String], HashSet<Now>> = HashMap::new();
    for c in &changed {
        among_changed.entry((&c.was.path, c.now)).or_default().extend(c.was.hash);
        new_values.entry(&c.was.path).or_default().insert(c.now);
    }
    // Lost where the new value hides which old value a row held.
    let lost: Vec<&Changed> = changed
        .iter()
        .filter(|c| {
            let at = (c.was.path.as_slice(), c.now);
            let shifted = from_itself && new_values[c.was.path.as_slice()].len() > 1;
            if shifted {
                among_changed[&at].len() > 1
            } else {
                sources[&at].len() > 1
            }
        })
        .collect();
    let mut taken: HashMap<String, Vec<i64>> = HashMap::new();
    for c in &lost {
        taken.entry(c.key.to_owned()).or_default().extend(c.was.hash);
    }
    let mut by_path: BTreeMap<&[String], Vec<&Changed>> = BTreeMap::new();
    for c in &lost {
        by_path.entry(&c.was.path).or_default().push(c);
    }
    let mut paths: Vec<PathLost> = by_path
        .into_iter()
        .map(|(path, lost)| {
            let mut was: HashMap<&str, usize> = HashMap::new();
            let mut now: HashMap<Option<&str>, usize> = HashMap::new();
            for c in &lost {
                *was.entry(c.was.shown.as_str()).or_default() += 1;
                *now.entry(match c.now {
                    Now::Gone => None,
                    Now::Holds(None) => Some("null"),
                    Now::Holds(Some(_)) => c.shown,
                })
                .or_default() += 1;
            }
            let distinct = lost.iter().filter_map(|c| c.was.hash).collect::<BTreeSet<_>>().len();
            let mut common: Vec<(&str, usize)> = was.into_iter().collect();
            common.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
            let now =
                now.into_iter().max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0))).and_then(|(v, _)| v);
            PathLost {
                path: path_of(column, path),
                rows: lost.len(),
                was: common.into_iter().take(2).map(|(v, _)| v.to_owned()).collect(),
                distinct,
                now: now.map(str::to_owned),
            }
        })
        .collect();
    paths.sort_by(|a, b| b.rows.cmp(&a.rows).then_with(|| a.path.cmp(&b.path)));
    Some(PartLoss {
        table: String::new(),
        column: String::new(),
        line: 0,
        rows: 0,
        lost: taken.len(),
        unjudged,
        paths,
        taken,
    })
}

/// Puts each loss at the last statement that updated its table's rows and
/// names its column: parts go at the statement that wrote the documents
/// last (a strip after a wrap), not at the first that named the column.
pub fn place(losses: &mut [PartLoss], statements: &[StatementReport]) {
    for loss in losses.iter_mut() {
        let column = loss.column.to_ascii_lowercase();
        let wrote = statements.iter().rev().find(|st| {
            !st.rolled_back
                && st.rows.iter().any(|r| r.table == loss.table && r.updated > 0)
                && crate::lines::names_word(&crate::lines::without_comments(&st.sql), &column)
        });
        if let Some(st) = wrote.filter(|st| st.line > 0) {
            loss.line = st.line;
        }
    }
}

/// A path as SQL reaches it: `payload->'meta'->'ip'` (the document itself
/// for a value that is not one).
fn path_of(column: &str, path: &[String]) -> String {
    let mut out = super::written(column);
    for key in path {
        let index =
            key.strip_prefix('[').and_then(|k| k.strip_suffix(']')).filter(|i| i.parse::<u64>().is_ok());
        match index {
            Some(i) => out.push_str(&format!("->{i}")),
            None => out.push_str(&format!("->'{}'", key.replace('\'', "''"))),
        }
    }
    out
}

/// Where the candidate may have kept the parts `losses` took: every column
/// but the key of columns it added to the loss's table and of tables it
/// made that hold the table's key, read as parts, so a value copied out as
/// text (`payload->>'ip'`) or the whole document is found by its hash.
pub fn keepers(losses: &[PartLoss], shape: &Shape, golden: &Catalog, now: &Catalog) -> Vec<Wanted> {
    let mut out: Vec<Wanted> = Vec::new();
    for loss in losses {
        let places = keeping_places(&loss.table, shape, golden, now, &|_| true);
        gather(&mut out, places, loss.rows.max(0) + 1, Reading::Parts);
    }
    out
}

/// The place in `kept` (read as [`keepers`] says) that holds every value
/// `loss` took from the most rows, each row's in one column: `table.column`
/// and how many rows it keeps.
fn kept_in(loss: &PartLoss, kept: &BTreeMap<String, Values>) -> Option<(String, usize)> {
    let mut best: Option<(String, usize)> = None;
    for (table, values) in kept {
        for (i, column) in values.columns.iter().enumerate() {
            let holds = loss
                .taken
                .iter()
                .filter(|(key, hashes)| {
                    let parts = values.rows.get(*key).and_then(|r| parts_of(r[i].shown.as_deref()));
                    let held: HashSet<i64> =
                        parts.unwrap_or_default().iter().filter_map(|p| p.hash).collect();
                    hashes.iter().all(|h| held.contains(h))
                })
                .count();
            if holds > 0 && best.as_ref().is_none_or(|(_, n)| holds > *n) {
                best = Some((format!("{}.{}", short_name(table), super::written(column)), holds));
            }
        }
    }
    best
}

/// `values_overwritten` hazards for `losses`, and notes for those whose
/// every value taken the candidate kept (in `kept`: see [`keepers`]).
pub fn report(
    losses: &[PartLoss],
    kept: &BTreeMap<String, Values>,
    shape: &Shape,
) -> (Vec<Hazard>, Vec<Hazard>) {
    let (mut out, mut notes) = (Vec::new(), Vec::new());
    for loss in losses {
        let table = short_name(&loss.table);
        let line = Some(loss.line).filter(|l| *l > 0);
        let rows = loss.rows.max(0) as usize;
        if super::enough(loss.unjudged, loss.rows) {
            out.push(Hazard::new(
                "values_overwritten",
                Severity::Medium,
                format!(
                    "{} of the {} rows of {table} had their {} rewritten into documents too large or deep to compare part by part \
                     (more than {PARTS_MOST} values, {} characters of them, or {DEPTH_MOST} objects or arrays deep): what they lost is not known",
                    count(loss.unjudged),
                    count(rows),
                    loss.column,
                    count(PARTS_TEXT_MOST),
                ),
                line,
            ));
        }
        if !super::enough(loss.lost, loss.rows) {
            continue;
        }
        let mut groups: Vec<String> = loss.paths.iter().take(3).map(group).collect();
        if loss.paths.len() > 3 {
            groups.push(format!("and {} more paths", loss.paths.len() - 3));
        }
        let lead = format!(
            "{} of the {} rows of {table} lost part of their {}",
            count(loss.lost),
            count(rows),
            loss.column
        );
        let kept = kept_in(loss, kept);
        let not_kept = loss.lost - kept.as_ref().map_or(0, |(_, n)| *n);
        if let Some((place, _)) = kept.as_ref().filter(|_| !super::enough(not_kept, loss.rows)) {
            let all = if not_kept == 0 { "every value it took" } else { "nearly every value it took" };
            let said = format!("{lead}: {}; the migration kept {all} in {place}", groups.join("; "));
            notes.push(Hazard::new("values_overwritten", Severity::Low, said, line));
            continue;
        }
        let where_kept = match &kept {
            Some((place, n)) => format!(
                "the migration kept those of {} rows in {place}; the other {} are not kept anywhere",
                count(*n),
                count(not_kept)
            ),
            None => "what they held is not kept anywhere".to_owned(),
        };
        let said = format!("{lead}: {}; {where_kept}", groups.join("; "));
        let mut h = Hazard::new("values_overwritten", Severity::High, said, line);
        h.suggestion = Some(format!(
            "if the old values matter, keep them first, in the same migration (CREATE TABLE {} AS SELECT {}, {} FROM {table}); batching does not bring them back",
            super::written(&format!("{}_{}_before", airlock_postgres::catalog::split_qualified(&loss.table).1, loss.column)),
            shape.key(&loss.table).unwrap_or("id"),
            super::written(&loss.column),
        ));
        out.push(h);
    }
    (out, notes)
}

/// One path's loss as a message says it.
fn group(p: &PathLost) -> String {
    let some: Vec<String> = p.was.iter().map(|v| format!("'{v}'")).collect();
    let held = match p.distinct {
        1 => format!("{} held {} {}", count(p.rows), p.path, some.join(", ")),
        n => format!(
            "{} held {} (such as {}; {} distinct values)",
            count(p.rows),
            p.path,
            some.join(", "),
            count(n)
        ),
    };
    match &p.now {
        None => format!("{held}, now gone"),
        Some(v) => format!("{held}, now '{v}'"),
    }
}

#[cfg(test)]
mod tests;
