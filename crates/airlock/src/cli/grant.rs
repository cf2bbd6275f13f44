//! `airlock grant`, `airlock grants` and `airlock revoke`: short-lived,
//! read-only grants on live targets.

use hyper::Method;

use super::output;
use super::{Cli, GrantArgs};
use airlock_core::error::Result;
use airlock_listen::client::{encode, NO_BODY};
use airlock_live::grant::{Grant, GrantRequest, Granted};

pub(super) async fn grant(cli: &Cli, args: &GrantArgs) -> Result<i32> {
    let ttl_seconds = args.ttl.as_deref().map(airlock_core::validate::parse_ttl).transpose()?;
    let statement_timeout = args
        .statement_timeout
        .as_deref()
        .map(|t| airlock_core::validate::duration("statement timeout", t))
        .transpose()?;
    let body = GrantRequest {
        tables: args.tables.clone(),
        schema: args.schema.clone(),
        where_clause: args.where_clause.clone(),
        ttl_seconds: ttl_seconds.map(|d| d.as_secs().max(1) as i64),
        statement_timeout_ms: statement_timeout.map(|d| d.as_millis() as i64),
        connections: args.connections,
    };
    let path = format!("/v1/targets/{}/grants", encode(&args.target));
    let granted: Granted = cli.client()?.call(Method::POST, &path, Some(&body)).await?;
    output::print(cli.json, &granted, || output::granted(&granted));
    Ok(0)
}

pub(super) async fn list(cli: &Cli) -> Result<i32> {
    let list: Vec<Grant> = cli.client()?.call(Method::GET, "/v1/grants", NO_BODY).await?;
    output::print(cli.json, &list, || output::grants(&list));
    Ok(0)
}

pub(super) async fn revoke(cli: &Cli, id: &str) -> Result<i32> {
    let path = format!("/v1/grants/{}", encode(id));
    let g: Grant = cli.client()?.call(Method::DELETE, &path, NO_BODY).await?;
    output::print(cli.json, &g, || {
        format!("revoked grant {}: its sessions are cut and role {} is dropped", g.id, g.role)
    });
    Ok(0)
}
