//! The report's JSON Schema, generated from the report's own types, so the
//! schema a script is written against is the one the daemon writes by.
//!
//! Every field of a report is always written (`[]`, `{}`, `""` or `null`
//! when empty), so every property the schema names is required.

use serde_json::{json, Map, Value};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use super::report::Report;

/// Where the generated schema is kept in the repository, for people and tools
/// that read it without running `airlock migrate schema`.
pub const PUBLISHED: &str = "docs/migration-report.schema.json";

/// The JSON Schema (draft 2020-12) of what `migrate test --json` writes.
pub fn report_schema() -> Value {
    let mut parts: Vec<(String, RefOr<Schema>)> = Vec::new();
    <Report as ToSchema>::schemas(&mut parts);
    let mut defs = Map::new();
    defs.insert(Report::name().into_owned(), as_json(&Report::schema()));
    for (name, schema) in parts {
        defs.insert(name, as_json(&schema));
    }
    let mut defs = Value::Object(defs);
    retarget(&mut defs);
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Airlock migration report",
        "description": "What `airlock migrate test --json` (or `--report FILE`) writes. Generated from the report's types by `airlock migrate schema`.",
        "$ref": "#/$defs/Report",
        "$defs": defs,
    })
}

/// The schema as JSON.
fn as_json(schema: &RefOr<Schema>) -> Value {
    serde_json::to_value(schema).expect("a schema serializes")
}

/// Points OpenAPI's component references at the schema's own `$defs`, and
/// requires every property of every object: the report writes them all.
fn retarget(value: &mut Value) {
    match value {
        Value::Object(object) => {
            if let Some(Value::String(target)) = object.get_mut("$ref") {
                if let Some(name) = target.strip_prefix("#/components/schemas/") {
                    *target = format!("#/$defs/{name}");
                }
            }
            let named: Option<Vec<Value>> = object
                .get("properties")
                .and_then(Value::as_object)
                .map(|properties| properties.keys().map(|k| Value::String(k.clone())).collect());
            if let Some(named) = named {
                object.insert("required".into(), Value::Array(named));
            }
            object.values_mut().for_each(retarget);
        }
        Value::Array(items) => items.iter_mut().for_each(retarget),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository's copy is the schema the types make today. Written
    /// again with `AIRLOCK_WRITE_SCHEMA=1 cargo test -p airlock-migrate schema`.
    #[test]
    fn the_published_schema_is_the_one_the_types_make() {
        let made = serde_json::to_string_pretty(&report_schema()).unwrap() + "\n";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(PUBLISHED);
        if std::env::var_os("AIRLOCK_WRITE_SCHEMA").is_some() {
            std::fs::write(&path, &made).unwrap();
        }
        let published = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            published == made,
            "{PUBLISHED} is not the schema the report's types make: write it again with \
             `AIRLOCK_WRITE_SCHEMA=1 cargo test -p airlock-migrate schema`"
        );
    }

    #[test]
    fn every_reference_resolves_and_every_property_is_required() {
        let schema = report_schema();
        let defs = schema["$defs"].as_object().unwrap();
        let text = schema.to_string();
        for name in text.split("\"#/$defs/").skip(1).map(|rest| &rest[..rest.find('"').unwrap()]) {
            assert!(defs.contains_key(name), "{name} is referenced and not defined");
        }
        assert!(!text.contains("#/components/"), "an OpenAPI reference is left");
        let candidate = &defs["CandidateReport"];
        let required: Vec<&str> =
            candidate["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        for field in ["notes", "failure", "exec", "workload", "queries", "node", "hazards"] {
            assert!(required.contains(&field), "{field} is not required: {required:?}");
        }
    }
}
