//! One hazard for a statement's work on a partitioned table, not one per
//! partition. PostgreSQL builds an index, checks a key or rewrites rows
//! partition by partition, and each partition's work is measured and
//! judged as its own; a statement on a table of twelve partitions would
//! read as twelve hazards with no total. Those alike (the same kind, line,
//! severity and safer form) whose tables are partitions of one table are
//! told once, by the first, with the others and their rows added (their
//! times too, but for a lock held to the end of a transaction, which is
//! held on all of them at once).

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
                .filter(|leaf| crate::lines::names_word(&h.message, leaf))
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
                let held = hazards[at].kind == "long_lock";
                if let (Some(total), Some(ms)) = (hazards[at].estimated_ms.as_mut(), ms) {
                    // Work is done partition after partition, and adds up; a
                    // lock held to the end of a transaction is held on every
                    // partition at once, for the longest of them.
                    *total = if held { total.max(ms) } else { ((*total + ms) * 10.0).round() / 10.0 };
                }
            }
        }
    }
    for (key, at) in &first {
        let mut others = folded[*at].clone();
        if others.is_empty() {
            continue;
        }
        others.sort();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Severity;

    fn hazard(kind: &str, table: &str, ms: f64) -> Hazard {
        let mut h = Hazard::new(kind, Severity::High, format!("holds a lock on {table}"), Some(2));
        h.estimated_ms = Some(ms);
        h
    }

    #[test]
    fn work_adds_up_over_partitions_and_a_lock_held_on_all_at_once_does_not() {
        let roots: BTreeMap<String, String> = ["c", "a", "b"]
            .iter()
            .map(|p| (format!("public.events_{p}"), "public.events".to_owned()))
            .collect();
        let rows: BTreeMap<String, i64> = roots.keys().map(|p| (p.clone(), 10)).collect();
        let mut locks = vec![
            hazard("long_lock", "public.events_c", 300.0),
            hazard("long_lock", "public.events_b", 378.0),
            hazard("long_lock", "public.events_a", 350.0),
        ];
        fold(&mut locks, &roots, &rows);
        assert_eq!(locks.len(), 1);
        assert_eq!(locks[0].estimated_ms, Some(378.0));
        // The others in order of their names.
        assert!(
            locks[0].message.ends_with(
                "; the same for 2 more partitions of public.events: events_a (10 rows), events_b (10 rows) (3 partitions, 30 rows in the golden, in all)"
            ),
            "{}",
            locks[0].message
        );
        let mut rewrites = vec![
            hazard("table_rewrite", "public.events_a", 100.0),
            hazard("table_rewrite", "public.events_b", 50.5),
        ];
        fold(&mut rewrites, &roots, &rows);
        assert_eq!(rewrites[0].estimated_ms, Some(150.5));
    }
}
