//! Tables and views a candidate makes under a name a golden table or view
//! already has in another schema: the `name_shadowed` note.
//!
//! `CREATE TABLE IF NOT EXISTS tax_rates` meant for `billing.tax_rates`
//! makes a new, empty `public.tax_rates` where `public` comes first on the
//! search path, and the statements after it that name `tax_rates` reach
//! the new one. Same names in two schemas are sometimes meant, so this is a
//! note, never a reason to refuse the file.

use airlock_postgres::catalog::{short_name, split_qualified};

use super::evidence::Evidence;
use super::lines::line_naming;
use super::report::{Hazard, Severity};

/// A note for each table or view the candidate made whose name a golden
/// table or view holds in another schema.
pub(crate) fn notes(e: &Evidence) -> Vec<Hazard> {
    let golden: Vec<&String> = e.before.tables.keys().chain(e.before.views.keys()).collect();
    let made = e
        .after
        .tables
        .keys()
        .filter(|n| !e.before.tables.contains_key(*n))
        .chain(e.after.views.keys().filter(|n| !e.before.views.contains_key(*n)));
    let mut out = Vec::new();
    for name in made {
        let (schema, short) = split_qualified(name);
        let Some(other) = golden.iter().find(|g| {
            let (s, n) = split_qualified(g);
            n == short && s != schema
        }) else {
            continue;
        };
        out.push(Hazard::new(
            "name_shadowed",
            Severity::Low,
            format!(
                "makes {name} while the golden has {other}: statements that name {short} without a schema now reach whichever schema comes first on their search path, and rows meant for {other} may land in {name}"
            ),
            line_naming(e, short_name(name)),
        ));
    }
    out
}
