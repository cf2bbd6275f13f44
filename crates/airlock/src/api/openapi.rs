//! The OpenAPI document, generated from the types and handlers the server uses.
//!
//! Every route is registered through [`utoipa_axum`] from its handler's
//! `#[utoipa::path]`, so a route cannot exist without its entry, and every body
//! is described by the type the server reads or writes (`ToSchema`), so the
//! document cannot drift from what is served. `make test` runs schemathesis
//! against a live daemon with it.

use std::collections::BTreeMap;

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};

use airlock_core::error::{Error, ErrorCode};

/// The document's fixed parts; the paths come from the routes.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Airlock",
        description = "Throwaway PostgreSQL sandboxes forked from seeded goldens. Served on the \
                       daemon's unix socket ($AIRLOCK_HOME/airlock.sock) and, with --tcp, on TCP \
                       with `Authorization: Bearer TOKEN`. Errors are JSON {code, message, hint}."
    ),
    // A JSON path rule refers back to the transformer spec: registered here, not followed.
    components(schemas(Error, ErrorCode, airlock_gateway::tools::Via, airlock_core::records::masking::JsonPathRule)),
    modifiers(&BearerToken),
    tags(
        (name = "daemon", description = "Health, the host report and shutdown"),
        (name = "goldens", description = "Seeded snapshots that sandboxes are forked from"),
        (name = "sandboxes", description = "Throwaway PostgreSQL instances"),
        (name = "tools", description = "The agent's tools, as the MCP gateway offers them"),
        (name = "migrations", description = "Candidate migrations tested on forks, and promoted"),
        (name = "events", description = "What happened, and why"),
        (name = "targets", description = "Live databases Airlock mints grants on"),
        (name = "cluster", description = "The nodes of a cluster this daemon is one of"),
    )
)]
pub struct ApiDoc;

/// The bearer token the TCP listener requires (the unix socket needs none).
struct BearerToken;

impl utoipa::Modify for BearerToken {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The error answers every operation may give: the API's JSON error with the
/// status [`ErrorCode::http_status`] maps each code to.
pub struct ApiErrors;

impl utoipa::IntoResponses for ApiErrors {
    fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::response::Response>> {
        use ErrorCode::*;
        let all = [
            InvalidRequest,
            Unauthorized,
            GoldenNotFound,
            GoldenExists,
            SeedFailed,
            Internal,
            CapacityExhausted,
            DiskFull,
            TimedOut,
            ReplicationFailed,
        ];
        all.into_iter()
            .map(|code| {
                let status = code.http_status();
                let response = ResponseBuilder::new()
                    .description(describe(status))
                    .content(
                        "application/json",
                        ContentBuilder::new().schema(Some(Ref::from_schema_name("Error"))).build(),
                    )
                    .build();
                (status.to_string(), response.into())
            })
            .collect()
    }
}

fn describe(status: u16) -> &'static str {
    match status {
        400 => "the request was malformed (invalid_request, invalid_name, invalid_ttl, invalid_label, file_unreadable)",
        401 => "the TCP listener's bearer token is missing or wrong",
        404 => "no such golden or sandbox",
        409 => "a conflict: golden_exists, name_taken, golden_in_use, migration_refused, promotion_refused",
        422 => "the work failed on its input: seed_failed, source_failed, migration_failed",
        500 => "internal, storage_failed, postgres_failed, redis_failed or data_root_not_writable; the daemon log has details",
        502 => "replication_failed: a golden fetched from another node of the cluster did not arrive whole; nothing was kept",
        503 => "capacity_exhausted: the host is full; or, in a cluster, cluster_unavailable or sandbox_lost",
        504 => "timed_out: the request ran past its deadline",
        507 => "disk_full: the volume or the sandbox's allowance is full, or it cannot promise another running sandbox its headroom",
        _ => "an error",
    }
}

#[cfg(test)]
mod tests {
    use utoipa::{IntoResponses, OpenApi, PartialSchema};

    use super::*;

    #[test]
    fn every_error_codes_status_is_documented() {
        let documented = ApiErrors::responses();
        let schema = serde_json::to_value(ErrorCode::schema()).unwrap();
        let codes = schema["enum"].as_array().expect("ErrorCode is an enum of strings");
        assert!(codes.len() > 20, "{schema}");
        for code in codes {
            let code: ErrorCode = serde_json::from_value(code.clone()).unwrap();
            let status = code.http_status().to_string();
            assert!(
                documented.contains_key(&status),
                "{} answers {status}, which is not documented",
                code.as_str()
            );
        }
    }

    #[test]
    fn the_document_names_the_bearer_scheme_and_the_error_schema() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
        assert!(doc["components"]["schemas"]["Error"].is_object());
    }
}
