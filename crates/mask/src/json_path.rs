//! Masking inside a JSON document: the values found at a rule's paths.

use serde_json::Value;

use crate::key::Key;
use crate::transform::{ColumnType, Output, Transformer};

/// The document `text` with every value at each rule's path masked;
/// [`Output::Unchanged`] when no path is in it (or it is not JSON).
pub(crate) fn apply(rules: &[(Vec<String>, Transformer)], key: &Key, text: &str, salt: u32) -> Output {
    let Ok(mut doc) = serde_json::from_str::<Value>(text) else { return Output::Unchanged };
    let mut changed = false;
    for (path, t) in rules {
        visit(&mut doc, path, &mut |leaf| {
            let text = match leaf {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(_) | Value::Null | Value::Array(_) | Value::Object(_) => return,
            };
            let ty = match leaf {
                Value::Number(_) => ColumnType::Number,
                _ => ColumnType::Text { max_chars: None, fold_case: false },
            };
            let masked = match t.apply(key, &text, salt, &ty) {
                Some(Output::Value(v)) => match leaf {
                    Value::Number(_) => serde_json::from_str::<serde_json::Number>(&v)
                        .map(Value::Number)
                        .unwrap_or(Value::String(v)),
                    _ => Value::String(v),
                },
                Some(Output::Null) => Value::Null,
                Some(Output::Unchanged) | None => return,
            };
            *leaf = masked;
            changed = true;
        });
    }
    match changed {
        true => Output::Value(doc.to_string()),
        false => Output::Unchanged,
    }
}

/// The values (strings and numbers, as text) at each rule's path in the
/// document `text`: what masking replaces inside it, which the leak check
/// looks for everywhere else.
pub(crate) fn values_at(rules: &[(Vec<String>, Transformer)], text: &str) -> Vec<String> {
    let Ok(mut doc) = serde_json::from_str::<Value>(text) else { return Vec::new() };
    let mut out = Vec::new();
    for (path, _) in rules {
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
        let k = Key::random();
        let rules = vec![
            (vec!["address".into(), "street".into()], Transformer::Address),
            (vec!["contacts".into(), "*".into(), "email".into()], Transformer::Email),
        ];
        let doc = r#"{"address":{"street":"1 High St","city":"Leeds"},"contacts":[{"email":"a@b.io"},{"email":"c@d.io"}],"n":1}"#;
        let Output::Value(out) = apply(&rules, &k, doc, 0) else { panic!() };
        assert!(!out.contains("High St") && !out.contains("a@b.io") && !out.contains("c@d.io"), "{out}");
        assert!(out.contains("Leeds") && out.contains("\"n\":1"), "{out}");
        assert_eq!(apply(&rules, &k, r#"{"other":1}"#, 0), Output::Unchanged);
        assert_eq!(apply(&rules, &k, "not json", 0), Output::Unchanged);
    }
}
