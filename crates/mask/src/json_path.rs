//! Paths inside a JSON document: keys separated by dots, `*` for any key or
//! array element. What becomes of the values found there is the caller's
//! (the `json` transformer's rules).

use serde_json::Value;

/// What becomes of one value found at a path.
pub(crate) enum Leaf {
    /// Left as it is.
    Keep,
    /// Replaced by JSON null.
    Null,
    /// Replaced by this text (a number again when the value was one and it reads as one).
    Text(String),
}

/// The document `text` with each value (string or number) at `paths[i]`
/// replaced as `f(i, value, is_number)` says; `None` when nothing changed
/// (or it is not JSON).
pub(crate) fn rewrite(
    text: &str,
    paths: &[&[String]],
    f: &mut dyn FnMut(usize, &str, bool) -> Leaf,
) -> Option<String> {
    let mut doc = serde_json::from_str::<Value>(text).ok()?;
    let mut changed = false;
    for (i, path) in paths.iter().enumerate() {
        visit(&mut doc, path, &mut |leaf| {
            let (text, number) = match leaf {
                Value::String(s) => (s.clone(), false),
                Value::Number(n) => (n.to_string(), true),
                _ => return,
            };
            let new = match f(i, &text, number) {
                Leaf::Keep => return,
                Leaf::Null => Value::Null,
                Leaf::Text(v) if number => serde_json::from_str::<serde_json::Number>(&v)
                    .map(Value::Number)
                    .unwrap_or(Value::String(v)),
                Leaf::Text(v) => Value::String(v),
            };
            *leaf = new;
            changed = true;
        });
    }
    changed.then(|| doc.to_string())
}

/// The values (strings and numbers, as text) at `paths` in the document `text`.
pub(crate) fn values_at(text: &str, paths: &[&[String]]) -> Vec<String> {
    let Ok(mut doc) = serde_json::from_str::<Value>(text) else { return Vec::new() };
    let mut out = Vec::new();
    for path in paths {
        visit(&mut doc, path, &mut |leaf| match leaf {
            Value::String(s) => out.push(s.clone()),
            Value::Number(n) => out.push(n.to_string()),
            _ => {}
        });
    }
    out
}

/// Calls `f` on every value at `path` under `node` (`*`: any key or element).
fn visit(node: &mut Value, path: &[String], f: &mut dyn FnMut(&mut Value)) {
    let Some((head, rest)) = path.split_first() else {
        f(node);
        return;
    };
    match node {
        Value::Object(map) if head == "*" => map.values_mut().for_each(|v| visit(v, rest, f)),
        Value::Object(map) => {
            if let Some(v) = map.get_mut(head) {
                visit(v, rest, f)
            }
        }
        Value::Array(items) if head == "*" => items.iter_mut().for_each(|v| visit(v, rest, f)),
        Value::Array(items) => {
            if let Some(v) = head.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                visit(v, rest, f)
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_reach_into_objects_and_arrays() {
        let street = vec!["address".to_string(), "street".to_string()];
        let emails = vec!["contacts".to_string(), "*".to_string(), "email".to_string()];
        let paths: Vec<&[String]> = vec![&street, &emails];
        let doc = r#"{"address":{"street":"1 High St","city":"Leeds"},"contacts":[{"email":"a@b.io"},{"email":"c@d.io"}],"n":1}"#;
        let out = rewrite(doc, &paths, &mut |i, v, _| Leaf::Text(format!("{i}:{}", v.len()))).unwrap();
        assert!(!out.contains("High St") && !out.contains("a@b.io") && !out.contains("c@d.io"), "{out}");
        assert!(out.contains("Leeds") && out.contains("\"n\":1") && out.contains("\"1:6\""), "{out}");
        assert_eq!(rewrite(r#"{"other":1}"#, &paths, &mut |_, _, _| Leaf::Null), None);
        assert_eq!(rewrite("not json", &paths, &mut |_, _, _| Leaf::Null), None);
        assert_eq!(values_at(doc, &paths), vec!["1 High St", "a@b.io", "c@d.io"]);
    }
}
