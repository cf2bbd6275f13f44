//! The keys a build's tables will have: unique keys and references, read
//! from the dump's definitions (they are created only after the data, so the
//! staging database does not have them yet while it is reshaped), and the
//! references the rules file adds.

use crate::golden::archive::{name_parts, tokens, unquote};
use airlock_core::error::{Error, ErrorCode, Result};

/// Columns of one table, `schema.table` unquoted.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Columns {
    /// `schema.table`, unquoted.
    pub table: String,
    /// The columns, unquoted, in order.
    pub columns: Vec<String>,
}

/// A reference: `from` rows need `to` rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The referencing columns.
    pub from: Columns,
    /// The referenced columns.
    pub to: Columns,
    /// Declared by the schema (else the rules file's).
    pub declared: bool,
}

/// The keys of a build's tables.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    /// References, declared and added.
    pub links: Vec<Link>,
    /// Primary keys, unique constraints and unique indexes on plain columns.
    pub unique: Vec<Columns>,
}

impl Keys {
    /// Reads the keys pg_dump's definitions create.
    pub fn from_statements(statements: &[String]) -> Keys {
        let mut keys = Keys::default();
        for sql in statements {
            let words = tokens(sql);
            let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
            let at = |i: usize| upper.get(i).map(String::as_str).unwrap_or("");
            if at(0) == "ALTER" && at(1) == "TABLE" {
                let t = if at(2) == "ONLY" { 3 } else { 2 };
                let Some(table) = words.get(t).map(|w| qualified(w)) else { continue };
                let Some(c) = upper.iter().position(|w| w == "CONSTRAINT") else { continue };
                match (at(c + 2), at(c + 3)) {
                    ("FOREIGN", "KEY") => {
                        let Some(cols) = words.get(c + 4).and_then(|w| column_list(w)) else { continue };
                        let Some(r) = upper.iter().position(|w| w == "REFERENCES") else { continue };
                        let Some(to) = words.get(r + 1).map(|w| qualified(w)) else { continue };
                        let Some(to_cols) = words.get(r + 2).and_then(|w| column_list(w)) else { continue };
                        keys.links.push(Link {
                            from: Columns { table, columns: cols },
                            to: Columns { table: to, columns: to_cols },
                            declared: true,
                        });
                    }
                    ("PRIMARY", "KEY") => {
                        if let Some(cols) = words.get(c + 4).and_then(|w| column_list(w)) {
                            keys.unique.push(Columns { table, columns: cols });
                        }
                    }
                    ("UNIQUE", _) => {
                        // `UNIQUE NULLS NOT DISTINCT (...)` on PostgreSQL 15 and later.
                        if let Some(cols) =
                            words[c + 3..].iter().find(|w| w.starts_with('(')).and_then(|w| column_list(w))
                        {
                            keys.unique.push(Columns { table, columns: cols });
                        }
                    }
                    _ => {}
                }
            } else if at(0) == "CREATE" && at(1) == "UNIQUE" && at(2) == "INDEX" {
                let Some(on) = upper.iter().position(|w| w == "ON") else { continue };
                let t = if at(on + 1) == "ONLY" { on + 2 } else { on + 1 };
                let Some(table) = words.get(t).map(|w| qualified(w)) else { continue };
                let list = words[t + 1..].iter().find(|w| w.starts_with('('));
                if let Some(cols) = list.and_then(|w| column_list(w)) {
                    keys.unique.push(Columns { table, columns: cols });
                }
            }
        }
        keys
    }

    /// Adds the rules file's references (`schema.table(col, ...)`).
    pub fn add(&mut self, references: &[airlock_core::records::masking::Reference]) -> Result<()> {
        for r in references {
            let (from, to) = (parse_columns(&r.from)?, parse_columns(&r.to)?);
            if from.columns.len() != to.columns.len() {
                return Err(invalid(format!(
                    "reference {} -> {} names {} columns on one side and {} on the other",
                    r.from,
                    r.to,
                    from.columns.len(),
                    to.columns.len()
                )));
            }
            self.links.push(Link { from, to, declared: false });
        }
        Ok(())
    }

    /// Whether `table.column` is in a unique key or either end of a reference.
    pub fn keyed(&self, table: &str, column: &str) -> bool {
        let has = |c: &Columns| c.table == table && c.columns.iter().any(|x| x == column);
        self.unique.iter().any(has) || self.links.iter().any(|l| has(&l.from) || has(&l.to))
    }
}

impl Link {
    /// The condition on a row `x` of the referencing table whose reference
    /// finds no row in any of `parents` (the referenced table's tables that
    /// hold rows, as SQL); a reference with a NULL in it needs none.
    pub fn finds_no_row(&self, parents: &[&str]) -> String {
        use airlock_postgres::catalog::quote_ident;
        let present =
            self.from.columns.iter().map(|c| format!("x.{} IS NOT NULL", quote_ident(c))).collect::<Vec<_>>();
        let equal = self
            .from
            .columns
            .iter()
            .zip(&self.to.columns)
            .map(|(a, b)| format!("y.{} = x.{}", quote_ident(b), quote_ident(a)))
            .collect::<Vec<_>>()
            .join(" AND ");
        let missing: Vec<String> = parents
            .iter()
            .map(|p| format!("NOT EXISTS (SELECT 1 FROM ONLY {p} AS y WHERE {equal})"))
            .collect();
        format!(
            "({} AND {})",
            present.join(" AND "),
            if missing.is_empty() { "true".into() } else { missing.join(" AND ") }
        )
    }
}

fn invalid(message: String) -> Error {
    Error::new(
        ErrorCode::MaskInvalid,
        message,
        "write references as `schema.table(column, ...)`, the same number of columns on each side",
    )
}

/// `schema.table(a, b)` of a rules file.
fn parse_columns(text: &str) -> Result<Columns> {
    let bad = || invalid(format!("{text:?} is not `schema.table(column, ...)`"));
    let open = text.find('(').ok_or_else(bad)?;
    let (parts, _) = name_parts(text[..open].trim());
    if parts.len() != 2 {
        return Err(bad());
    }
    let columns = column_list(text[open..].trim()).ok_or_else(bad)?;
    Ok(Columns { table: parts.join("."), columns })
}

fn qualified(word: &str) -> String {
    name_parts(word).0.join(".")
}

/// `(a, "B")` as `["a", "B"]`; `None` when an element is an expression.
fn column_list(group: &str) -> Option<Vec<String>> {
    let inner = group.strip_prefix('(')?.strip_suffix(')')?;
    let mut out = Vec::new();
    let words = tokens(inner);
    let mut current: Vec<&String> = Vec::new();
    for w in words.iter().chain(std::iter::once(&",".to_string())) {
        if w == "," {
            // A column, maybe with an operator class or an order after it.
            let first = current.first()?;
            if first.starts_with('(') || first.contains('(') || first.starts_with('\'') {
                return None;
            }
            out.push(unquote(first));
            current.clear();
        } else {
            if w.starts_with('(') && current.len() == 1 {
                return None; // a function call: lower(email)
            }
            current.push(w);
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_from_pg_dumps_definitions() {
        let statements: Vec<String> = [
            "ALTER TABLE ONLY public.people\n    ADD CONSTRAINT people_pkey PRIMARY KEY (id);",
            "ALTER TABLE ONLY public.people\n    ADD CONSTRAINT people_email_key UNIQUE (email);",
            "ALTER TABLE ONLY public.orders\n    ADD CONSTRAINT orders_email_fkey FOREIGN KEY (email) REFERENCES public.people(email) ON UPDATE CASCADE;",
            "ALTER TABLE ONLY app.\"Odd\"\n    ADD CONSTRAINT x UNIQUE NULLS NOT DISTINCT (\"Phone\", region);",
            "CREATE UNIQUE INDEX people_lower ON public.people USING btree (lower(email));",
            "CREATE UNIQUE INDEX people_tag ON public.people USING btree (tag text_pattern_ops);",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let k = Keys::from_statements(&statements);
        assert_eq!(k.links.len(), 1);
        assert_eq!(k.links[0].to, Columns { table: "public.people".into(), columns: vec!["email".into()] });
        assert!(k.keyed("public.people", "email") && k.keyed("public.orders", "email"));
        assert!(k.keyed("app.Odd", "Phone") && k.keyed("public.people", "tag"));
        assert!(!k.keyed("public.people", "name"));
        let mut k = k;
        k.add(&[airlock_core::records::masking::Reference {
            from: "public.events(actor_email)".into(),
            to: "public.people(email)".into(),
        }])
        .unwrap();
        assert!(k.keyed("public.events", "actor_email"));
        assert!(k
            .add(&[airlock_core::records::masking::Reference { from: "events".into(), to: "x(y)".into() }])
            .is_err());
    }
}
