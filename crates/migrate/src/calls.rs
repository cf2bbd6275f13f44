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
}

impl Calls {
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
/// functions behind the application's operators, and its domains' checks.
pub async fn read(client: &tokio_postgres::Client, golden: &Catalog, now: &Catalog) -> Result<Calls> {
    let failed = |e: tokio_postgres::Error| Error::postgres(airlock_postgres::admin::describe(&e));
    let mut out = Calls::default();
    let operators = client
        .query(
            &format!(
                "SELECT o.oprname::text, {FUNCTION_KEY}
                   FROM pg_catalog.pg_operator o JOIN pg_catalog.pg_namespace o_n ON o_n.oid = o.oprnamespace
                   JOIN pg_catalog.pg_proc p ON p.oid = o.oprcode JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                  WHERE {}",
                SYSTEM_SCHEMAS.replace("n.nspname", "o_n.nspname")
            ),
            &[],
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
                        pg_catalog.pg_get_constraintdef(c.oid)
                   FROM pg_catalog.pg_constraint c JOIN pg_catalog.pg_type t ON t.oid = c.contypid
                   JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
                  WHERE c.contype = 'c' AND {SYSTEM_SCHEMAS}"
            ),
            &[],
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
        .filter(|(k, was)| now.functions.get(*k) == Some(*was))
        .map(|(k, _)| k)
        .collect();
    if unchanged.is_empty() {
        return Ok(out);
    }
    let rows = client
        .query(
            &format!(
                "SELECT f.key, p.proname::text, pg_catalog.left(p.prosrc, {BODY_READ_MOST})
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
    let mut bodies: Vec<(String, BTreeSet<String>)> = Vec::with_capacity(rows.len());
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    for r in rows {
        // A function dropped while it is read has no arguments to print.
        let (Some(key), name, body): (Option<String>, String, Option<String>) =
            (r.cell(0)?, r.cell(1)?, r.cell(2)?)
        else {
            continue;
        };
        names.insert(key.clone(), name.to_lowercase());
        bodies.push((key, words(body.as_deref().unwrap_or_default())));
    }
    // The golden's functions by the name a body calls them by.
    let mut by_name: BTreeMap<String, Vec<&String>> = BTreeMap::new();
    for key in golden.functions.keys() {
        let name = names
            .get(key)
            .cloned()
            .unwrap_or_else(|| split_qualified(key.split('(').next().unwrap_or_default()).1.to_lowercase());
        by_name.entry(name).or_default().push(key);
    }
    for (key, words) in bodies {
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
