//! Which functions each function's body names: how a trigger's work reaches
//! functions the trigger does not name itself. PostgreSQL records no such
//! dependency for a function's body, so a function replaced (or dropped)
//! anywhere down that chain changes what the trigger does, unseen by the
//! trigger's own definition.
//!
//! Bodies are read as words: a name is taken as called wherever its body
//! holds it as a word outside quotes' meaning (a comment or a string that
//! names it counts too), which errs towards saying more.

use std::collections::{BTreeMap, BTreeSet};

use airlock_core::error::{Error, Result};
use airlock_postgres::catalog::{split_qualified, Catalog, SYSTEM_SCHEMAS};
use airlock_postgres::cell::Cell as _;

/// The longest stretch of a body read for names.
const BODY_READ_MOST: i32 = 1_000_000;

/// What runs which function, beyond what a definition names by word.
#[derive(Debug, Clone, Default)]
pub struct Calls {
    /// By a function's key (as [`Catalog::functions`] has it): the keys of
    /// the golden's functions its body names.
    pub functions: BTreeMap<String, BTreeSet<String>>,
    /// By the application's own operators' symbols (`>>>`): the keys of the
    /// functions behind them, which a definition runs through the symbol.
    pub operators: BTreeMap<String, BTreeSet<String>>,
    /// The application's domains' CHECK constraints now: what each is
    /// (`CHECK constraint c of domain public.d`) and its definition.
    pub domain_checks: Vec<(String, String)>,
    /// The golden's functions whose [`behaviours`] are the same after the
    /// candidate as before, though their definition may print otherwise
    /// (`ALTER FUNCTION ... PARALLEL SAFE`): unchanged, for what runs them.
    pub same_behaviour: BTreeSet<String>,
}

impl Calls {
    /// Whether the candidate left `function` (a golden function's key) as
    /// it was (`was` and `now`: its catalog entries), or changed only what
    /// cannot change what it does.
    pub fn unchanged(&self, function: &str, was: &str, now: &str) -> bool {
        was == now || self.same_behaviour.contains(function)
    }

    /// The golden functions `function`'s body names.
    pub fn get(&self, function: &str) -> Option<&BTreeSet<String>> {
        self.functions.get(function)
    }
}

/// A function's key as [`Catalog::functions`] has it, for `pg_proc` `p` in
/// namespace `n`.
const FUNCTION_KEY: &str = "pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(p.proname)
     || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')'";

/// Reads the bodies of `golden`'s functions that `now` (the catalog after
/// the candidate) holds unchanged (as the admin; catalogs only), and names,
/// for each, the functions of `golden` its body names. Only those: a
/// changed function is judged as changed, not walked, and no function the
/// candidate made is read, so the golden bounds what is read. Also the
/// functions behind the application's operators, and its domains' checks;
/// and which functions' behaviours, read before the candidate as `before`,
/// are the same now.
pub async fn read(
    client: &tokio_postgres::Client,
    golden: &Catalog,
    now: &Catalog,
    before: &BTreeMap<String, Behaviour>,
) -> Result<Calls> {
    let failed = |e: tokio_postgres::Error| Error::postgres(airlock_postgres::admin::describe(&e));
    let mut out = Calls::default();
    let after = behaviours(client, golden).await?;
    out.same_behaviour = before
        .iter()
        .filter(|(k, b)| after.get(*k).is_some_and(|a| a.same_as(b)))
        .map(|(k, _)| k.clone())
        .collect();
    // Only what stands on the golden's own functions and types is read: the
    // golden bounds it, whatever the candidate made.
    let golden_functions: Vec<&String> = golden.functions.keys().collect();
    let golden_types: Vec<&String> = golden.types.keys().collect();
    let operators = client
        .query(
            &format!(
                "SELECT o.oprname::text, {FUNCTION_KEY}
                   FROM pg_catalog.pg_operator o JOIN pg_catalog.pg_namespace o_n ON o_n.oid = o.oprnamespace
                   JOIN pg_catalog.pg_proc p ON p.oid = o.oprcode JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                  WHERE {} AND {FUNCTION_KEY} = ANY ($1)",
                SYSTEM_SCHEMAS.replace("n.nspname", "o_n.nspname")
            ),
            &[&golden_functions],
        )
        .await
        .map_err(failed)?;
    for r in operators {
        let (symbol, key): (String, Option<String>) = (r.cell(0)?, r.cell(1)?);
        out.operators.entry(symbol).or_default().extend(key);
    }
    let domains = client
        .query(
            &format!(
                "SELECT 'CHECK constraint ' || pg_catalog.quote_ident(c.conname) || ' of domain '
                          || pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(t.typname),
                        pg_catalog.left(pg_catalog.pg_get_constraintdef(c.oid), {BODY_READ_MOST})
                   FROM pg_catalog.pg_constraint c JOIN pg_catalog.pg_type t ON t.oid = c.contypid
                   JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
                  WHERE c.contype = 'c' AND {SYSTEM_SCHEMAS}
                    AND pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(t.typname) = ANY ($1)"
            ),
            &[&golden_types],
        )
        .await
        .map_err(failed)?;
    for r in domains {
        let (what, definition): (String, Option<String>) = (r.cell(0)?, r.cell(1)?);
        out.domain_checks.extend(definition.map(|d| (what, d)));
    }
    let unchanged: Vec<&String> = golden
        .functions
        .iter()
        .filter(|(k, was)| now.functions.get(*k).is_some_and(|is| out.unchanged(k, was, is)))
        .map(|(k, _)| k)
        .collect();
    if unchanged.is_empty() {
        return Ok(out);
    }
    let rows = client
        .query(
            &format!(
                "SELECT f.key, pg_catalog.left(p.prosrc, {BODY_READ_MOST})
                   FROM (SELECT p.oid, {FUNCTION_KEY} AS key
                           FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                          WHERE {SYSTEM_SCHEMAS}) f
                   JOIN pg_catalog.pg_proc p ON p.oid = f.oid
                  WHERE f.key = ANY ($1)"
            ),
            &[&unchanged],
        )
        .await
        .map_err(failed)?;
    let by_name = by_name(golden);
    for r in rows {
        // A function dropped while it is read has no arguments to print.
        let (Some(key), body): (Option<String>, Option<String>) = (r.cell(0)?, r.cell(1)?) else {
            continue;
        };
        let words = words(body.as_deref().unwrap_or_default());
        let called: BTreeSet<String> = by_name
            .iter()
            .filter(|(name, _)| words.contains(*name))
            .flat_map(|(_, keys)| keys.iter().map(|k| (*k).clone()))
            .filter(|k| *k != key)
            .collect();
        if !called.is_empty() {
            out.functions.insert(key, called);
        }
    }
    Ok(out)
}

/// `catalog`'s functions by the name a body or a definition calls them by,
/// lowercased.
pub fn by_name(catalog: &Catalog) -> BTreeMap<String, Vec<&String>> {
    let mut out: BTreeMap<String, Vec<&String>> = BTreeMap::new();
    for key in catalog.functions.keys() {
        let name = split_qualified(key.split('(').next().unwrap_or_default()).1.to_lowercase();
        out.entry(name).or_default().push(key);
    }
    out
}

/// A golden function the candidate replaced or dropped, found down a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changed<'a> {
    /// The function.
    pub function: &'a String,
    /// The function whose body names it; none where the chain began with it.
    pub via: Option<&'a String>,
    /// Whether it was dropped (else replaced).
    pub dropped: bool,
}

impl Changed<'_> {
    /// What befell it, as a message says: `replaces` or `drops`.
    pub fn verb(&self) -> &'static str {
        if self.dropped {
            "drops"
        } else {
            "replaces"
        }
    }
}

/// The functions of `from`, and those down their chains, that the candidate
/// replaced or dropped (`before` the golden's catalog, `after` the one after
/// it), in the order found. Only unchanged functions are walked, since
/// their bodies now are the golden's. A function `from` holds cannot be
/// dropped without what names it (which is reported as gone), so only one
/// down a chain is reported as dropped.
pub fn changed_down<'a>(
    calls: &'a Calls,
    (before, after): (&'a Catalog, &'a Catalog),
    from: Vec<&'a String>,
) -> Vec<Changed<'a>> {
    let mut out = Vec::new();
    let mut seen: BTreeSet<&String> = BTreeSet::new();
    let mut walk: Vec<(&String, Option<&String>)> = from.into_iter().rev().map(|k| (k, None)).collect();
    while let Some((function, via)) = walk.pop() {
        if !seen.insert(function) {
            continue;
        }
        let Some(was) = before.functions.get(function) else { continue };
        match after.functions.get(function) {
            Some(now) if calls.unchanged(function, was, now) => {
                let called = calls.get(function).into_iter().flatten().rev();
                walk.extend(called.filter(|c| !seen.contains(c)).map(|c| (c, Some(function))));
            }
            Some(_) => out.push(Changed { function, via, dropped: false }),
            None if via.is_some() => out.push(Changed { function, via, dropped: true }),
            None => {}
        }
    }
    out
}

/// What a function does, as far as its `pg_proc` row tells: see [`behaviours`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behaviour {
    /// A digest of the row without what cannot change what it returns or
    /// does (`PARALLEL`, `COST`, `ROWS`, `LEAKPROOF`, its support function,
    /// its grants) and without its settings.
    digest: String,
    /// Its settings but `search_path`, in order.
    settings: Option<String>,
    /// Its own `search_path` setting, if it has one.
    path: Option<String>,
    /// Whether, under that `search_path`, every name its body holds that
    /// names an object of the database's own schemas (a table, a function,
    /// a type) names one in a single schema, on the path, with no built-in
    /// of the same name: so pinning the path resolves each the same.
    resolves: bool,
}

impl Behaviour {
    /// Whether a function that behaved as `was` behaves the same as `self`:
    /// the same but for a `search_path` pinned to one that resolves every
    /// name of its body to the one object it could mean (hardening, which
    /// changes nothing it does).
    pub fn same_as(&self, was: &Behaviour) -> bool {
        self.digest == was.digest
            && self.settings == was.settings
            && (self.path == was.path || (self.resolves && (was.path.is_none() || was.resolves)))
    }
}

/// Each of `golden`'s functions' [`Behaviour`], by its key. Read from the
/// catalog before the candidate runs and after, so a function whose hints
/// alone changed is told from one replaced whatever statement did it (a
/// rename swap, a `DO` block's dynamic SQL). Only the golden's functions,
/// and the first [`BODY_READ_MOST`] characters of a body, are read: what
/// the candidate made does not set how much the admin reads.
pub async fn behaviours(
    client: &tokio_postgres::Client,
    golden: &Catalog,
) -> Result<BTreeMap<String, Behaviour>> {
    let keys: Vec<&String> = golden.functions.keys().collect();
    let rows = client
        .query(
            &format!(
                "SELECT {FUNCTION_KEY},
                        pg_catalog.md5((pg_catalog.to_jsonb(p) - 'oid' - 'proparallel' - 'procost' - 'prorows'
                                        - 'proleakproof' - 'prosupport' - 'proacl' - 'proconfig')::text),
                        (SELECT pg_catalog.array_agg(c ORDER BY o)::text
                           FROM pg_catalog.unnest(p.proconfig) WITH ORDINALITY AS s(c, o)
                          WHERE c NOT LIKE 'search_path=%'),
                        path.value,
                        path.value IS NOT NULL AND NOT EXISTS (
                          SELECT FROM (SELECT DISTINCT w
                                         FROM pg_catalog.regexp_split_to_table(
                                                pg_catalog.lower(pg_catalog.left(p.prosrc, {BODY_READ_MOST})),
                                                '[^[:alnum:]_$]+') AS w) AS words
                          CROSS JOIN LATERAL (
                            SELECT pg_catalog.array_agg(DISTINCT ns.nspname::text)
                                     FILTER (WHERE ns.nspname <> 'pg_catalog') AS held,
                                   pg_catalog.bool_or(ns.nspname = 'pg_catalog') AS builtin
                              FROM (SELECT relnamespace AS nsp FROM pg_catalog.pg_class WHERE relname = words.w
                                    UNION ALL
                                    SELECT pronamespace FROM pg_catalog.pg_proc WHERE proname = words.w
                                    UNION ALL
                                    SELECT typnamespace FROM pg_catalog.pg_type WHERE typname = words.w) AS o
                              JOIN pg_catalog.pg_namespace ns ON ns.oid = o.nsp
                             WHERE ns.nspname <> 'information_schema'
                               AND ns.nspname !~ '^pg_(toast|temp_)') AS h
                          WHERE h.held IS NOT NULL
                            AND (pg_catalog.cardinality(h.held) > 1 OR h.builtin
                                 OR NOT h.held[1] = ANY (path.schemas)))
                   FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                   LEFT JOIN LATERAL (
                     SELECT c AS value,
                            ARRAY(SELECT pg_catalog.btrim(pg_catalog.btrim(e), '\"')
                                    FROM pg_catalog.regexp_split_to_table(pg_catalog.substr(c, 13), ',') AS e)
                              AS schemas
                       FROM pg_catalog.unnest(p.proconfig) AS c
                      WHERE c LIKE 'search_path=%') AS path ON true
                  WHERE {SYSTEM_SCHEMAS} AND {FUNCTION_KEY} = ANY($1::text[])"
            ),
            &[&keys],
        )
        .await
        .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
    rows.into_iter()
        .map(|r| {
            let behaviour = Behaviour {
                digest: r.cell(1)?,
                settings: r.cell(2)?,
                path: r.cell(3)?,
                resolves: r.cell(4)?,
            };
            Ok((r.cell(0)?, behaviour))
        })
        .collect()
}

/// The words of a body, lowercased: runs of letters, digits, `_` and `$`.
pub(crate) fn words(body: &str) -> BTreeSet<String> {
    body.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_read_as_its_words() {
        let w = words("BEGIN PERFORM audit.Log_Change(NEW.id); x := \"Other\"(1); END");
        assert!(w.contains("log_change") && w.contains("other") && w.contains("audit"));
        assert!(!w.contains("log"));
    }
}
