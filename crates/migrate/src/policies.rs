//! Row policies read from their catalog definition (`permissive for all to
//! public using (...) with check (...)`), to tell whether a permissive
//! policy a candidate adds lets any role see or write a row that a policy
//! already there did not.

/// A row policy's parts, as its catalog entry spells them.
#[derive(Debug, PartialEq, Eq)]
struct Policy<'a> {
    permissive: bool,
    /// `select`, `insert`, `update`, `delete` or `all`.
    command: &'a str,
    /// Its roles (`public` for every role).
    roles: Vec<&'a str>,
    using: Option<&'a str>,
    check: Option<&'a str>,
}

impl<'a> Policy<'a> {
    /// Reads a definition; `None` when it is not in the catalog's form.
    fn read(definition: &'a str) -> Option<Policy<'a>> {
        let (kind, rest) = definition.split_once(" for ")?;
        let (command, rest) = rest.split_once(" to ")?;
        let (roles, rest) = rest.split_once(' ').unwrap_or((rest, ""));
        let (using, check) = match rest.rfind("with check (") {
            Some(at) => (rest[..at].trim_end(), Some(rest[at + "with check ".len()..].trim())),
            None => (rest, None),
        };
        let using = using.strip_prefix("using ").map(str::trim);
        Some(Policy {
            permissive: kind == "permissive",
            command,
            roles: roles.split(',').collect(),
            using,
            check,
        })
    }

    /// The check a written row must pass: its own, else its `using`.
    fn check(&self) -> Option<&'a str> {
        self.check.or(self.using)
    }

    /// Whether `self` (permissive) lets through only what `other`
    /// (permissive) already lets through, for every command and role of
    /// `self`: the same condition, for a command and roles `other` covers.
    fn within(&self, other: &Policy) -> bool {
        let command = other.command == "all" || other.command == self.command;
        let roles = other.roles.contains(&"public") || self.roles.iter().all(|r| other.roles.contains(r));
        let reads = || self.using.is_some() && self.using == other.using;
        let writes = || self.check().is_some() && self.check() == other.check();
        let same = match self.command {
            "select" | "delete" => reads(),
            "insert" => writes(),
            _ => reads() && writes(),
        };
        self.permissive && other.permissive && command && roles && same
    }
}

/// Whether permissive policy `added` (a definition) lets no role see or
/// write a row that one of the permissive policies `kept` (definitions of
/// policies there before and still there) did not already let it: the same
/// condition, for a command and roles one of them covers (an `INSERT`
/// policy spelling out what a `FOR ALL` policy's check already holds).
pub(crate) fn adds_nothing<'a>(added: &str, mut kept: impl Iterator<Item = &'a str>) -> bool {
    let Some(added) = Policy::read(added) else { return false };
    kept.any(|k| Policy::read(k).is_some_and(|k| added.within(&k)))
}

/// Whether policy `now` (a definition) is policy `was` with its condition
/// (`USING`) widened by an alternative: the old condition still whole
/// inside the new, joined to more by `OR` and to nothing more by `AND`
/// (`USING (current_setting('app.tenant', true) IS NULL OR tenant = ...)`),
/// so every row it let through and more.
pub(crate) fn widened_by_or(was: &str, now: &str) -> bool {
    let (Some(was), Some(now)) = (Policy::read(was), Policy::read(now)) else { return false };
    let (Some(old), Some(new)) = (was.using, now.using) else { return false };
    let inner = old.strip_prefix('(').and_then(|o| o.strip_suffix(')')).unwrap_or(old);
    let count = |text: &str, word: &str| text.matches(word).count();
    new != old
        && new.contains(inner)
        && count(new, " OR ") > count(old, " OR ")
        && count(new, " AND ") <= count(old, " AND ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TENANT: &str = "((tenant = (current_setting('app.tenant'::text, true))::bigint))";

    #[test]
    fn reads_the_catalogs_form() {
        let p = Policy::read("permissive for all to public using ((a = 1)) with check ((b = 2))").unwrap();
        assert_eq!(
            p,
            Policy {
                permissive: true,
                command: "all",
                roles: vec!["public"],
                using: Some("((a = 1))"),
                check: Some("((b = 2))"),
            }
        );
        let p = Policy::read("permissive for insert to alice,bob with check ((a = 1))").unwrap();
        assert_eq!((p.roles, p.using, p.check), (vec!["alice", "bob"], None, Some("((a = 1))")));
    }

    #[test]
    fn a_condition_given_an_alternative_is_widened() {
        // As the catalog writes them: `using (` around pg_get_expr's own parentheses.
        let tenant = "(tenant = (current_setting('app.tenant'::text, true))::bigint)";
        let was = format!("permissive for all to public using ({tenant})");
        let unset = format!("permissive for all to public using (((current_setting('app.tenant'::text, true) IS NULL) OR {tenant}))");
        assert!(widened_by_or(&was, &unset));
        let narrower = format!("permissive for all to public using (({tenant} AND (NOT archived)))");
        assert!(!widened_by_or(&was, &narrower));
        assert!(!widened_by_or(&was, "permissive for all to public using ((owner = CURRENT_USER))"));
    }

    #[test]
    fn a_policy_spelling_out_what_another_holds_adds_nothing() {
        let all = format!("permissive for all to public using ({TENANT})");
        let kept = || [all.as_str()].into_iter();
        assert!(adds_nothing(&format!("permissive for insert to public with check ({TENANT})"), kept()));
        assert!(adds_nothing(&format!("permissive for select to alice using ({TENANT})"), kept()));
        assert!(adds_nothing(&format!("permissive for update to public using ({TENANT})"), kept()));
        // Another condition, a command the kept policy does not cover, or
        // roles it does not name, may let more through.
        assert!(!adds_nothing("permissive for insert to public with check ((tenant > 0))", kept()));
        let select_only = format!("permissive for select to alice using ({TENANT})");
        let insert = format!("permissive for insert to alice with check ({TENANT})");
        assert!(!adds_nothing(&insert, [select_only.as_str()].into_iter()));
        let bob = format!("permissive for all to bob using ({TENANT})");
        assert!(!adds_nothing(
            &format!("permissive for all to alice using ({TENANT})"),
            [bob.as_str()].into_iter()
        ));
        // An UPDATE policy whose check differs from its using.
        let update = format!("permissive for update to public using ({TENANT}) with check (true)");
        assert!(!adds_nothing(&update, kept()));
        let restrictive = format!("restrictive for all to public using ({TENANT})");
        assert!(!adds_nothing(
            &format!("permissive for select to public using ({TENANT})"),
            [restrictive.as_str()].into_iter()
        ));
    }
}
