//! One hazard for a statement's work on a partitioned table, not one per
//! partition. PostgreSQL builds an index, checks a key or rewrites rows
//! partition by partition, and each partition's work is measured and
//! judged as its own; a statement on a table of twelve partitions would
//! read as twelve hazards with no total. Those alike (the same kind, line,
//! severity and safer form) whose tables are partitions of one table are
//! told once, by the first, with the others and their rows added.

use std::collections::BTreeMap;

use super::report::Hazard;

/// Folds `hazards` about partitions of one table into one each. `roots`
/// maps each partition to the partitioned table at the top of its tree;
/// `rows` is the golden's rows per table.
pub fn fold(hazards: &mut Vec<Hazard>, roots: &BTreeMap<String, String>, rows: &BTreeMap<String, i64>) {
    // The partition each hazard is about: the one its message names.
    let leaves: Vec<Option<String>> = hazards
        .iter()
        .map(|h| {
            roots
                .keys()
                .filter(|leaf| crate::integrity::names_word(&h.message, leaf))
                .max_by_key(|leaf| leaf.len())
                .cloned()
        })
        .collect();
    let mut first: BTreeMap<(String, Option<usize>, String, Option<String>, String), usize> = BTreeMap::new();
    let mut folded: Vec<Vec<String>> = vec![Vec::new(); hazards.len()];
    let mut gone = vec![false; hazards.len()];
    for (i, leaf) in leaves.iter().enumerate() {
        let Some(leaf) = leaf else { continue };
        let h = &hazards[i];
        let key = (
            h.kind.clone(),
            h.line,
            h.severity.as_str().to_owned(),
            h.suggestion.clone(),
            roots[leaf].clone(),
        );
        match first.get(&key) {
            None => {
                first.insert(key, i);
            }
            Some(&at) => {
                folded[at].push(leaf.clone());
                gone[i] = true;
                let ms = hazards[i].estimated_ms;
                if let (Some(total), Some(ms)) = (hazards[at].estimated_ms.as_mut(), ms) {
                    *total = ((*total + ms) * 10.0).round() / 10.0;
                }
            }
        }
    }
    for (key, at) in &first {
        let others = &folded[*at];
        if others.is_empty() {
            continue;
        }
        let root = &key.4;
        let leaf = leaves[*at].clone().unwrap_or_default();
        let total: i64 = others.iter().chain([&leaf]).map(|t| rows.get(t).copied().unwrap_or(0)).sum();
        let names: Vec<String> = others
            .iter()
            .map(|t| {
                format!(
                    "{} ({} rows)",
                    airlock_postgres::catalog::short_name(t),
                    rows.get(t).copied().unwrap_or(0)
                )
            })
            .collect();
        let more = if others.len() == 1 { "partition" } else { "partitions" };
        hazards[*at].message.push_str(&format!(
            "; the same for {} more {more} of {root}: {} ({} partitions, {total} rows in the golden, in all)",
            others.len(),
            names.join(", "),
            others.len() + 1
        ));
    }
    let mut i = 0;
    hazards.retain(|_| {
        i += 1;
        !gone[i - 1]
    });
}
