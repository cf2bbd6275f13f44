//! Reading the text of constraint and index definitions as the catalog
//! keeps them: which columns a key or an index holds, what a foreign key
//! references, whether two definitions are the same.

/// A constraint's definition, made again `NOT VALID` or not.
pub(crate) fn valid(definition: &str) -> &str {
    definition.strip_suffix(" NOT VALID").unwrap_or(definition)
}

/// Whether `a` and `b` are foreign keys on the same columns to the same
/// table (whatever their actions).
pub(crate) fn same_foreign_key(a: &str, b: &str) -> bool {
    a.starts_with("FOREIGN KEY")
        && b.starts_with("FOREIGN KEY")
        && sorted(key_columns(a)) == sorted(key_columns(b))
        && fk_target(a) == fk_target(b)
}

/// The table a foreign key's definition references.
pub(crate) fn fk_target(definition: &str) -> &str {
    let target = definition.split(" REFERENCES ").nth(1).unwrap_or("another table");
    target.split('(').next().unwrap_or(target).trim()
}

/// The columns a key constraint's definition names first:
/// `FOREIGN KEY (a, b) REFERENCES ...`, `PRIMARY KEY (a)`, `UNIQUE (a, b)`.
pub(crate) fn key_columns(definition: &str) -> Vec<String> {
    let keyed = ["FOREIGN KEY (", "PRIMARY KEY (", "UNIQUE NULLS NOT DISTINCT (", "UNIQUE ("];
    let Some(rest) = keyed.iter().find_map(|k| definition.strip_prefix(k)) else { return vec![] };
    rest.split(')').next().map(column_list).unwrap_or_default()
}

/// The leading columns of a `CREATE INDEX` statement, up to the first
/// expression (an expression's index serves no key).
pub(crate) fn index_columns(definition: &str) -> Vec<String> {
    let Some(start) =
        definition.find(" USING ").and_then(|at| definition[at..].find('(').map(|p| at + p + 1))
    else {
        return vec![];
    };
    let mut depth = 0;
    let mut end = definition.len();
    for (i, ch) in definition[start..].char_indices() {
        match ch {
            '(' => depth += 1,
            ')' if depth == 0 => {
                end = start + i;
                break;
            }
            ')' => depth -= 1,
            _ => {}
        }
    }
    let mut columns = Vec::new();
    for part in definition[start..end].split(',') {
        // `col`, `col DESC`, `col text_pattern_ops`: the column is the first word;
        // an expression ends the columns a key could use.
        let word = part.split_whitespace().next().unwrap_or("");
        if word.is_empty() || word.contains('(') {
            break;
        }
        columns.push(unquote(word));
    }
    columns
}

/// `a, "B c"` as its column names.
fn column_list(text: &str) -> Vec<String> {
    text.split(',').map(|c| unquote(c.trim())).filter(|c| !c.is_empty()).collect()
}

/// A column name as written, its quotes taken off.
fn unquote(word: &str) -> String {
    word.strip_prefix('"').and_then(|w| w.strip_suffix('"')).unwrap_or(word).replace("\"\"", "\"")
}

/// Two `CREATE INDEX` statements that differ only in the index's name.
pub(crate) fn same_index(a: &str, b: &str) -> bool {
    let unique = |d: &str| d.starts_with("CREATE UNIQUE INDEX ");
    unique(a) == unique(b) && index_body(a).is_some() && index_body(a) == index_body(b)
}

/// What follows `CREATE [UNIQUE] INDEX name ON `: the name may be quoted,
/// and hold anything.
fn index_body(definition: &str) -> Option<&str> {
    let rest = definition
        .strip_prefix("CREATE UNIQUE INDEX ")
        .or_else(|| definition.strip_prefix("CREATE INDEX "))?;
    let after_name = if let Some(quoted) = rest.strip_prefix('"') {
        // A quote inside a quoted name is doubled.
        let mut chars = quoted.char_indices().peekable();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            if c == '"' {
                if chars.peek().is_some_and(|(_, n)| *n == '"') {
                    chars.next();
                } else {
                    end = Some(i + 1);
                    break;
                }
            }
        }
        &quoted[end?..]
    } else {
        &rest[rest.find(' ')?..]
    };
    after_name.strip_prefix(" ON ")
}

/// Columns in order, to compare as sets.
pub(crate) fn sorted(mut columns: Vec<String>) -> Vec<String> {
    columns.sort();
    columns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_indexes_are_read_from_their_definitions() {
        assert_eq!(key_columns("FOREIGN KEY (user_id) REFERENCES users(id) ON DELETE CASCADE"), ["user_id"]);
        assert_eq!(key_columns("PRIMARY KEY (tenant_id, \"Id\")"), ["tenant_id", "Id"]);
        assert!(key_columns("CHECK ((total >= (0)::numeric))").is_empty());
        assert_eq!(
            index_columns("CREATE INDEX orders_user ON public.orders USING btree (user_id)"),
            ["user_id"]
        );
        assert_eq!(
            index_columns(
                "CREATE INDEX o ON public.orders USING btree (user_id DESC, total) WHERE (total > 0)"
            ),
            ["user_id", "total"]
        );
        assert!(index_columns("CREATE INDEX o ON public.orders USING btree (lower(note))").is_empty());
        assert_eq!(
            index_columns("CREATE INDEX o ON public.orders USING btree (user_id, lower(note))"),
            ["user_id"]
        );
        assert!(same_index(
            "CREATE INDEX a ON public.orders USING btree (user_id)",
            "CREATE INDEX b ON public.orders USING btree (user_id)"
        ));
        assert!(!same_index(
            "CREATE UNIQUE INDEX a ON public.orders USING btree (user_id)",
            "CREATE INDEX b ON public.orders USING btree (user_id)"
        ));
        // A quoted name may hold " ON " and quotes.
        assert!(same_index(
            "CREATE INDEX \"by user ON \"\"x\" ON public.orders USING btree (user_id)",
            "CREATE INDEX plain ON public.orders USING btree (user_id)"
        ));
        assert_eq!(key_columns("UNIQUE NULLS NOT DISTINCT (email)"), ["email"]);
    }
}
