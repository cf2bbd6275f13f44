//! Grants: short-lived, read-only roles on a live target, scoped to named
//! tables (and, with a row filter, to some of their rows), reached only
//! through the router.
//!
//! A grant is a role of its own on the target: a random name, `LOGIN` with a
//! password only the router knows (set as a SCRAM verifier, so no password
//! reaches the target's logs), `VALID UNTIL` its expiry (the target's own
//! server refuses it afterwards, whether Airlock runs or not), a connection
//! limit, and role defaults for its timeouts (which [`crate::watch`] holds
//! against a grantee that resets them). It may `SELECT` exactly what was
//! named: the tables themselves, or, with a row filter, security-barrier
//! views of them in a schema of the grant's own, owned by the target's admin
//! role, so production's tables, their owners and their row security are
//! never changed. Read-only comes from privileges: the role is given nothing
//! else, and what every role has on the target (through `PUBLIC`) is said in
//! the answer, with how to close it there.
//!
//! The agent's DSN names the grant's id at the router, with a password of its
//! own; the router logs in upstream with the role's, so neither the target's
//! address nor any credential on it reaches the agent.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use airlock_core::clock::Timestamp;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{EventKind, NewEvent};
use airlock_core::records::route::{self, Route};
use airlock_postgres::cell::Cell;

use super::Live;

/// What `POST /v1/targets/{name}/grants` asks for.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantRequest {
    /// Tables (or views) to read: `schema.name`, or a name in `schema`.
    pub tables: Vec<String>,
    /// The schema of unqualified names (`public` if unset).
    #[serde(default)]
    pub schema: Option<String>,
    /// A row filter, a SQL boolean expression over each table's columns
    /// (`tenant_id = 42`): each table is then read through a view of it.
    #[serde(default, rename = "where")]
    pub where_clause: Option<String>,
    /// Seconds until the grant ends (default 120, at most the daemon's TTL ceiling).
    #[serde(default)]
    pub ttl_seconds: Option<i64>,
    /// Milliseconds a statement may run (default 10 000, at most an hour).
    #[serde(default)]
    pub statement_timeout_ms: Option<i64>,
    /// Sessions at once (default 4, at most 64).
    #[serde(default)]
    pub connections: Option<i32>,
}

/// A grant, as answers show it (never its credentials).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Grant {
    /// `gr-` and ten random characters: the user and database its DSN names.
    pub id: String,
    /// The target it is on.
    pub target: String,
    /// Its role on the target.
    pub role: String,
    /// What it may read, as the target names them (`schema.name`).
    pub tables: Vec<String>,
    /// Its row filter, if any.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "where")]
    pub where_clause: Option<String>,
    /// The schema of its views, when it has a row filter (its search path
    /// then); the tables' own schemas otherwise.
    pub search_path: Vec<String>,
    /// When it was minted.
    pub created_at: Timestamp,
    /// When it ends (the role's `VALID UNTIL`).
    pub expires_at: Timestamp,
    /// See [`GrantRequest::statement_timeout_ms`]; also its
    /// `idle_in_transaction_session_timeout`.
    pub statement_timeout_ms: i64,
    /// See [`GrantRequest::connections`].
    pub connections: i32,
    /// What every role on the target has (through `PUBLIC`), so this one too,
    /// each with how to close it on the target.
    pub cannot_take_away: Vec<String>,
}

/// A grant as minted: the only answer that carries its DSN.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Granted {
    /// The grant.
    #[serde(flatten)]
    pub grant: Grant,
    /// Its DSN through the router: the grant's id as user and database, and a
    /// password of the router's (not the role's on the target).
    pub dsn: String,
}

/// The TTL of a grant that names none.
const DEFAULT_TTL: Duration = Duration::from_secs(120);
/// The statement timeout of a grant that names none.
const DEFAULT_STATEMENT_TIMEOUT_MS: i64 = 10_000;
/// The sessions a grant may hold, if it names no number.
const DEFAULT_CONNECTIONS: i32 = 4;
/// The most tables one grant names.
const MAX_TABLES: usize = 64;
/// How long the target has to answer while minting or ending.
pub(crate) const TARGET_WITHIN: Duration = Duration::from_secs(10);

fn invalid(message: String, hint: &str) -> Error {
    Error::new(ErrorCode::InvalidRequest, message, hint)
}

fn refused(message: String, hint: &str) -> Error {
    Error::new(ErrorCode::TargetRefused, message, hint)
}

/// `name` quoted as an SQL identifier.
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// What a request asks for, checked.
struct Asked {
    tables: Vec<String>,
    where_clause: Option<String>,
    ttl: Duration,
    statement_timeout_ms: i64,
    connections: i32,
}

fn check_request(req: &GrantRequest, max_ttl: Duration) -> Result<Asked> {
    let names: Vec<&str> =
        req.tables.iter().flat_map(|t| t.split(',')).map(str::trim).filter(|t| !t.is_empty()).collect();
    if names.is_empty() {
        return Err(invalid(
            "a grant names no table".into(),
            "name what it may read: --tables analytics.accounts,analytics.usage_daily",
        ));
    }
    if names.len() > MAX_TABLES {
        return Err(invalid(
            format!("a grant names {} tables, over {MAX_TABLES}", names.len()),
            "name fewer",
        ));
    }
    let schema = req.schema.as_deref().map(str::trim).filter(|s| !s.is_empty()).unwrap_or("public");
    // A name is passed to the target's to_regclass as a parameter, never as
    // SQL text: it is read there as a (possibly quoted) qualified name.
    let tables = names
        .iter()
        .map(|name| if name.contains('.') { (*name).to_owned() } else { format!("{}.{name}", ident(schema)) })
        .collect();
    let where_clause =
        req.where_clause.as_deref().map(str::trim).filter(|w| !w.is_empty()).map(str::to_owned);
    if let Some(w) = &where_clause {
        if let Err(why) = one_expression(w) {
            return Err(invalid(
                format!("the row filter {w:?} is not one expression: {why}"),
                "give one boolean expression over the tables' columns, such as tenant_id = 42",
            ));
        }
    }
    let ttl = match req.ttl_seconds {
        None => DEFAULT_TTL.min(max_ttl),
        Some(s) => airlock_core::validate::ttl_seconds(s, max_ttl)?,
    };
    let statement_timeout_ms = req.statement_timeout_ms.unwrap_or(DEFAULT_STATEMENT_TIMEOUT_MS);
    if !(1..=3_600_000).contains(&statement_timeout_ms) {
        return Err(invalid(
            format!("a statement timeout of {statement_timeout_ms} ms is out of bounds"),
            "give one between 1 ms and an hour, such as 10s",
        ));
    }
    let connections = req.connections.unwrap_or(DEFAULT_CONNECTIONS);
    if !(1..=64).contains(&connections) {
        return Err(invalid(format!("{connections} connections is out of bounds"), "give 1 to 64"));
    }
    Ok(Asked { tables, where_clause, ttl, statement_timeout_ms, connections })
}

/// Checks that a row filter cannot end the `WHERE ( … )` it is put in: its
/// parentheses balance outside quoted text, and it holds no statement
/// separator, comment or dollar quote there. (The view is made with one
/// statement of the extended protocol in any case.)
fn one_expression(filter: &str) -> std::result::Result<(), &'static str> {
    // An escape string's backslash can hide a quote from the count below.
    if filter.contains('\\') {
        return Err("it holds a backslash");
    }
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut chars = filter.chars().peekable();
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            if c == q {
                // A doubled quote is one quote inside the text.
                if chars.peek() == Some(&q) {
                    chars.next();
                } else {
                    quote = None;
                }
            }
            continue;
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '(' => depth += 1,
            ')' if depth == 0 => return Err("a parenthesis closes what it did not open"),
            ')' => depth -= 1,
            ';' => return Err("it holds a semicolon"),
            '$' => return Err("it holds a dollar sign"),
            '-' if chars.peek() == Some(&'-') => return Err("it holds a comment"),
            '/' if chars.peek() == Some(&'*') => return Err("it holds a comment"),
            _ => {}
        }
    }
    match (quote, depth) {
        (Some(_), _) => Err("a quote is not closed"),
        (None, 0) => Ok(()),
        _ => Err("a parenthesis is not closed"),
    }
}

/// A table as the target resolved it.
struct Resolved {
    schema: String,
    name: String,
}

impl Resolved {
    fn qualified(&self) -> String {
        format!("{}.{}", ident(&self.schema), ident(&self.name))
    }
}

/// The prefix of every grant role of this data root on a target: the data
/// root's random mark keeps another Airlock's grants on the same target apart.
pub(crate) fn role_prefix(live: &Live) -> String {
    format!("airlock_grant_{}_", live.mark)
}

impl Live {
    /// Mints a grant on `target`; the answer carries its DSN, once.
    pub async fn grant(&self, target: &str, req: &GrantRequest) -> Result<Granted> {
        let asked = check_request(req, self.engine.config.max_ttl)?;
        let dsn = self.store().dsn(target)?.ok_or_else(|| super::target::not_found(target))?;
        let address = self.engine.router.get().ok_or_else(|| {
            Error::new(
                ErrorCode::InvalidRequest,
                "the router is off, and a grant is reached only through it",
                "start the daemon with the router on (`airlock serve --router HOST:PORT`)",
            )
        })?;
        let id = airlock_core::secret::grant_id();
        let role = format!("{}{}", role_prefix(self), &id[3..]);
        let minting = self.minting(&role);
        let (upstream_password, client_password) =
            (airlock_core::secret::password(), airlock_core::secret::password());
        let (role_verifier, route_verifier) = {
            let (u, c) = (upstream_password.clone(), client_password.clone());
            tokio::task::spawn_blocking(move || {
                (
                    airlock_postgres::scram::verifier(&u, airlock_postgres::scram::ROUTER_ITERATIONS),
                    airlock_postgres::scram::verifier(&c, airlock_postgres::scram::ROUTER_ITERATIONS),
                )
            })
            .await
            .map_err(|e| Error::internal(e.to_string()))?
        };
        let now = Timestamp::now();
        let expires_at = now.plus(asked.ttl);
        let mut client = super::target::admin(&dsn).await?;
        let minted =
            tokio::time::timeout(TARGET_WITHIN, mint(&mut client, &role, &role_verifier, expires_at, &asked))
                .await;
        let minted = match minted {
            Ok(m) => m,
            Err(_) => {
                // Its COMMIT may have reached the server: the role is ended
                // on a session of its own (the one cut short is dropped, which
                // rolls back what did not commit).
                drop(client);
                if let Ok(fresh) = super::target::admin(&dsn).await {
                    let _ = tokio::time::timeout(TARGET_WITHIN, end_on_target(&fresh, &dsn, &role)).await;
                }
                return Err(refused(
                    format!("the target {target} did not finish minting within {TARGET_WITHIN:?}"),
                    "try again",
                ));
            }
        };
        let (tables, search_path, cannot_take_away) = match minted {
            Ok(m) => m,
            Err(e) => {
                // A transaction cut short leaves nothing; one that committed
                // and then failed to answer is ended.
                let _ = end_on_target(&client, &dsn, &role).await;
                return Err(e);
            }
        };
        let grant = Grant {
            id: id.clone(),
            target: target.to_owned(),
            role: role.clone(),
            tables,
            where_clause: asked.where_clause.clone(),
            search_path,
            created_at: now,
            expires_at,
            statement_timeout_ms: asked.statement_timeout_ms,
            connections: asked.connections,
            cannot_take_away,
        };
        let upstream = upstream_dsn(&dsn, &role, &upstream_password)?;
        let route = Route { id: id.clone(), upstream, verifier: route_verifier, expires_at };
        let kept = route::write(&self.engine.layout, &route)
            .and_then(|()| self.store().add_grant(&grant, &client_password));
        if let Err(e) = kept {
            let _ = route::remove(&self.engine.layout, &id);
            let _ = end_on_target(&client, &dsn, &role).await;
            return Err(e);
        }
        drop(minting);
        self.engine.store().record_or_log(NewEvent {
            kind: EventKind::GrantMinted,
            detail: serde_json::json!({
                "grant": id, "target": target, "role": role, "tables": grant.tables,
                "where": grant.where_clause, "expires_at": expires_at,
                "statement_timeout_ms": grant.statement_timeout_ms, "connections": grant.connections,
            }),
            ..Default::default()
        });
        let dsn = address.dsn_as(&id, &id, &client_password);
        Ok(Granted { grant, dsn })
    }

    /// Every live grant.
    pub fn grants(&self) -> Result<Vec<Grant>> {
        self.store().grants()
    }

    /// One live grant.
    pub fn grant_of(&self, id: &str) -> Result<Grant> {
        self.store().grant(id)?.ok_or_else(|| grant_not_found(id))
    }

    /// A live grant's DSN through the router, for the daemon's own sessions
    /// on it (the tools of `airlock mcp --target`); never given out again.
    pub fn client_dsn(&self, id: &str) -> Result<String> {
        let password = self.store().grant_password(id)?.ok_or_else(|| grant_not_found(id))?;
        let address = self.engine.router.get().ok_or_else(|| {
            Error::new(
                ErrorCode::InvalidRequest,
                "the router is off, and a grant is reached only through it",
                "start the router",
            )
        })?;
        Ok(address.dsn_as(id, id, &password))
    }

    /// Ends a grant now: `airlock revoke ID`.
    pub async fn revoke(&self, id: &str) -> Result<Grant> {
        let grant = self.grant_of(id)?;
        self.end(&grant, "revoked").await?;
        Ok(grant)
    }

    /// Ends a grant: its route first (the router takes no new client and cuts
    /// those it has), then its role, sessions and views on the target, then
    /// its record. A target that cannot be reached keeps the record, marked,
    /// for [`crate::watch`] to try again; its server refuses the role after
    /// `VALID UNTIL` meanwhile.
    pub async fn end(&self, grant: &Grant, reason: &'static str) -> Result<()> {
        route::remove(&self.engine.layout, &grant.id)?;
        self.store().mark_ending(&grant.id)?;
        let ended = async {
            let dsn =
                self.store().dsn(&grant.target)?.ok_or_else(|| super::target::not_found(&grant.target))?;
            let client = super::target::admin(&dsn).await?;
            tokio::time::timeout(TARGET_WITHIN * 2, end_on_target(&client, &dsn, &grant.role)).await.map_err(
                |_| refused(format!("the target {} did not drop the role in time", grant.target), ""),
            )?
        }
        .await;
        if let Err(e) = ended {
            return Err(refused(
                format!(
                    "grant {} is closed at the router, but its role {} on target {} is not dropped yet: {}",
                    grant.id, grant.role, grant.target, e.message
                ),
                "it is tried again every half minute; the target's server refuses the role after its VALID UNTIL \
                 in any case",
            ));
        }
        self.store().remove_grant(&grant.id)?;
        self.engine.store().record_or_log(NewEvent {
            kind: EventKind::GrantEnded,
            reason: Some(reason),
            detail: serde_json::json!({"grant": grant.id, "target": grant.target, "role": grant.role}),
            ..Default::default()
        });
        Ok(())
    }
}

pub(crate) fn grant_not_found(id: &str) -> Error {
    Error::new(
        ErrorCode::GrantNotFound,
        format!("no live grant {id:?}"),
        "it may have ended (at its TTL, or revoked); `airlock grants` lists the live ones",
    )
}

/// The target's DSN with the grant's role and password in place of the admin's.
fn upstream_dsn(admin: &str, role: &str, password: &str) -> Result<String> {
    let config: tokio_postgres::Config = airlock_postgres::target::without_file_options(admin)
        .parse()
        .map_err(|e| Error::internal(format!("the target's DSN no longer parses: {e}")))?;
    let mut keywords = vec![format!("user={role}"), format!("password={password}")];
    let quote = airlock_postgres::target::keyword_value;
    if let Some(tokio_postgres::config::Host::Tcp(host)) = config.get_hosts().first() {
        keywords.push(format!("host={}", quote(host)));
    }
    if let Some(port) = config.get_ports().first() {
        keywords.push(format!("port={port}"));
    }
    if let Some(db) = config.get_dbname() {
        keywords.push(format!("dbname={}", quote(db)));
    }
    for (k, v) in airlock_postgres::target::options(admin) {
        if k == "sslmode" || k == "sslrootcert" {
            keywords.push(format!("{k}={}", quote(&v)));
        }
    }
    Ok(keywords.join(" "))
}

/// Makes the role and what it may read, in one transaction; returns the
/// tables as the target names them, the role's search path, and what it
/// cannot be kept from.
async fn mint(
    client: &mut tokio_postgres::Client,
    role: &str,
    verifier: &str,
    expires_at: Timestamp,
    asked: &Asked,
) -> Result<(Vec<String>, Vec<String>, Vec<String>)> {
    let sql = |e: tokio_postgres::Error| {
        refused(format!("the target refused: {}", airlock_postgres::admin::describe(&e)), "")
    };
    let tx = client.transaction().await.map_err(sql)?;
    let mut resolved = Vec::new();
    for name in &asked.tables {
        let row = tx
            .query_opt(
                "SELECT n.nspname::text, c.relname::text,
                        pg_catalog.has_table_privilege(c.oid, 'SELECT WITH GRANT OPTION'),
                        pg_catalog.has_table_privilege(c.oid, 'SELECT')
                   FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.oid = pg_catalog.to_regclass($1) AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
                &[name],
            )
            .await
            .map_err(|e| {
                invalid(
                    format!("{name:?} is not a table name: {}", airlock_postgres::admin::describe(&e)),
                    "name tables as schema.name",
                )
            })?;
        let Some(row) = row else {
            return Err(refused(
                format!("the target has no table {name} (or its admin role cannot see it)"),
                "name tables that exist, as schema.name (`--schema` sets the schema of bare names)",
            ));
        };
        let table = Resolved { schema: row.cell(0)?, name: row.cell(1)? };
        let (grantable, readable): (bool, bool) = (row.cell(2)?, row.cell(3)?);
        if asked.where_clause.is_none() && !grantable {
            return Err(refused(
                format!("the target's admin role cannot grant SELECT on {}", table.qualified()),
                &format!(
                    "on the target: GRANT SELECT ON {} TO <the admin role> WITH GRANT OPTION",
                    table.qualified()
                ),
            ));
        }
        if asked.where_clause.is_some() && !readable {
            return Err(refused(
                format!(
                    "the target's admin role cannot read {}, which a filtered grant's view reads as it",
                    table.qualified()
                ),
                &format!("on the target: GRANT SELECT ON {} TO <the admin role>", table.qualified()),
            ));
        }
        if !resolved.iter().any(|r: &Resolved| r.qualified() == table.qualified()) {
            resolved.push(table);
        }
    }
    let r = ident(role);
    tx.batch_execute(&format!(
        "CREATE ROLE {r} LOGIN NOINHERIT NOCREATEDB NOCREATEROLE NOREPLICATION CONNECTION LIMIT {} \
         VALID UNTIL '{}' PASSWORD '{verifier}';
         GRANT {r} TO CURRENT_USER;
         ALTER ROLE {r} SET statement_timeout = {ms};
         ALTER ROLE {r} SET lock_timeout = {ms};
         ALTER ROLE {r} SET idle_in_transaction_session_timeout = {ms};
         ALTER ROLE {r} SET default_transaction_read_only = on;",
        asked.connections,
        expires_at.to_rfc3339(),
        ms = asked.statement_timeout_ms,
    ))
    .await
    .map_err(sql)?;
    let search_path: Vec<String> = match &asked.where_clause {
        None => {
            for table in &resolved {
                let schema = ident(&table.schema);
                let usable: bool = tx
                    .query_one(
                        "SELECT pg_catalog.has_schema_privilege($1, $2, 'USAGE')",
                        &[&role, &table.schema],
                    )
                    .await
                    .map_err(sql)?
                    .cell(0)?;
                if !usable {
                    tx.batch_execute(&format!("GRANT USAGE ON SCHEMA {schema} TO {r}")).await.map_err(sql)?;
                }
                tx.batch_execute(&format!("GRANT SELECT ON {} TO {r}", table.qualified()))
                    .await
                    .map_err(sql)?;
            }
            let mut schemas: Vec<String> = Vec::new();
            for t in &resolved {
                if !schemas.contains(&t.schema) {
                    schemas.push(t.schema.clone());
                }
            }
            schemas
        }
        Some(filter) => {
            // The views are the admin role's, in a schema named as the role:
            // they read as their owner, and with security_barrier no function
            // of the grantee's sees a row before the filter has. The filter is
            // applied below an OFFSET 0, which no condition of the grantee's
            // crosses: none can become an index condition on the table, whose
            // "rows removed" would tell which values other rows hold.
            tx.batch_execute(&format!("CREATE SCHEMA {r}; GRANT USAGE ON SCHEMA {r} TO {r}"))
                .await
                .map_err(sql)?;
            for table in &resolved {
                let view = format!("{r}.{}", ident(&table.name));
                let made = tx
                    .execute(
                        &format!(
                            "CREATE VIEW {view} WITH (security_barrier) AS SELECT * FROM \
                             (SELECT * FROM {} WHERE ({filter}) OFFSET 0) AS scoped",
                            table.qualified()
                        ),
                        &[],
                    )
                    .await;
                let made = match made {
                    Ok(_) => tx.batch_execute(&format!("GRANT SELECT ON {view} TO {r}")).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = made {
                    return Err(invalid(
                        format!(
                            "the row filter does not apply to {}: {}",
                            table.qualified(),
                            airlock_postgres::admin::describe(&e)
                        ),
                        "give one boolean expression over columns every named table has, such as tenant_id = 42",
                    ));
                }
            }
            vec![role.to_owned()]
        }
    };
    let path = search_path.iter().map(|s| ident(s)).collect::<Vec<_>>().join(", ");
    tx.batch_execute(&format!("ALTER ROLE {r} SET search_path = {path}")).await.map_err(sql)?;
    // A grant the server took silently ("no privileges were granted") is no grant.
    for table in &resolved {
        let object = match &asked.where_clause {
            None => table.qualified(),
            Some(_) => format!("{r}.{}", ident(&table.name)),
        };
        let granted: bool = tx
            .query_one("SELECT pg_catalog.has_table_privilege($1, $2, 'SELECT')", &[&role, &object])
            .await
            .map_err(sql)?
            .cell(0)?;
        if !granted {
            return Err(refused(
                format!("the target did not grant SELECT on {object}"),
                "check the admin role's privileges on it",
            ));
        }
    }
    let cannot_take_away = what_public_has(&tx).await?;
    tx.commit().await.map_err(sql)?;
    let tables = resolved.iter().map(|t| format!("{}.{}", t.schema, t.name)).collect();
    Ok((tables, search_path, cannot_take_away))
}

/// What every role on the target may do through `PUBLIC`, which no grant
/// can take away from one role, each with how to close it on the target.
async fn what_public_has(tx: &tokio_postgres::Transaction<'_>) -> Result<Vec<String>> {
    let row = tx
        .query_one(
            "SELECT current_database()::text,
                    pg_catalog.has_database_privilege('public', current_database(), 'TEMPORARY'),
                    pg_catalog.has_function_privilege('public', 'pg_catalog.lo_create(oid)', 'EXECUTE'),
                    pg_catalog.current_setting('max_prepared_transactions')::int4,
                    ARRAY(SELECT n.nspname::text FROM pg_catalog.pg_namespace n
                           WHERE pg_catalog.has_schema_privilege('public', n.oid, 'CREATE')
                             AND n.nspname NOT LIKE 'pg\\_%' ORDER BY 1),
                    ARRAY(SELECT n.nspname || '.' || c.relname FROM pg_catalog.pg_class c
                            JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                           WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
                             AND n.nspname NOT IN ('pg_catalog', 'information_schema')
                             AND pg_catalog.has_schema_privilege('public', n.oid, 'USAGE')
                             AND pg_catalog.has_table_privilege('public', c.oid, 'SELECT') ORDER BY 1)",
            &[],
        )
        .await
        .map_err(|e| refused(format!("the target's privileges could not be read: {e}"), ""))?;
    let database: String = row.cell(0)?;
    let mut said = Vec::new();
    if row.cell::<bool>(1)? {
        said.push(format!(
            "temporary tables: every role may create them in database {database}; close it with \
             REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC"
        ));
    }
    if row.cell::<bool>(2)? {
        said.push(
            "large objects: every role may create them (lo_create, lo_from_bytea), outside any table's \
             privileges; close it with REVOKE EXECUTE ON FUNCTION lo_create(oid), lo_creat(integer), \
             lo_from_bytea(oid, bytea) FROM PUBLIC"
                .to_owned(),
        );
    }
    if row.cell::<i32>(3)? > 0 {
        said.push(
            "prepared transactions: any role may PREPARE TRANSACTION, and a prepared one outlives the session \
             and the role (its locks held, vacuum held back) until someone commits or rolls it back; close it \
             with max_prepared_transactions = 0, or watch pg_prepared_xacts"
                .to_owned(),
        );
    }
    let schemas: Vec<String> = row.cell(4)?;
    if !schemas.is_empty() {
        said.push(format!(
            "objects: every role may create them in schema {}; close it with REVOKE CREATE ON SCHEMA {} FROM PUBLIC",
            schemas.join(", "),
            schemas.join(", ")
        ));
    }
    let readable: Vec<String> = row.cell(5)?;
    if !readable.is_empty() {
        let shown: Vec<&str> = readable.iter().take(5).map(String::as_str).collect();
        let more =
            if readable.len() > 5 { format!(" and {} more", readable.len() - 5) } else { String::new() };
        said.push(format!(
            "reading: every role may read {} table(s) granted to PUBLIC ({}{more}); close it with REVOKE SELECT ON \
             each FROM PUBLIC",
            readable.len(),
            shown.join(", ")
        ));
    }
    Ok(said)
}

/// Ends `role` on the target: no new logins, its sessions terminated (and
/// waited out), its views and schema dropped, what it was granted taken
/// back and what it made dropped, in every database of the server (a
/// grantee that logged in elsewhere with a password of its own may have made
/// objects there), the role dropped. Nothing if it is gone already. `dsn`
/// is the target's admin DSN, for the other databases.
pub(crate) async fn end_on_target(client: &tokio_postgres::Client, dsn: &str, role: &str) -> Result<()> {
    let sql = |e: tokio_postgres::Error| {
        refused(format!("the target refused: {}", airlock_postgres::admin::describe(&e)), "")
    };
    let exists: bool = client
        .query_one("SELECT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = $1)", &[&role])
        .await
        .map_err(sql)?
        .cell(0)?;
    let r = ident(role);
    if exists {
        // Membership lets the admin role end the role's sessions and drop
        // what it owns; a role of a mint cut short may lack it.
        client
            .batch_execute(&format!("GRANT {r} TO CURRENT_USER; ALTER ROLE {r} NOLOGIN"))
            .await
            .map_err(sql)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let left: i64 = client
                .query_one(
                    "SELECT pg_catalog.count(pg_catalog.pg_terminate_backend(pid)) FROM pg_catalog.pg_stat_activity
                      WHERE usename = $1 AND pid <> pg_catalog.pg_backend_pid()",
                    &[&role],
                )
                .await
                .map_err(sql)?
                .cell(0)?;
            if left == 0 || std::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    client.batch_execute(&format!("DROP SCHEMA IF EXISTS {r} CASCADE")).await.map_err(sql)?;
    if exists {
        let elsewhere = client
            .query(
                "SELECT DISTINCT d.datname::text FROM pg_catalog.pg_shdepend s
                   JOIN pg_catalog.pg_database d ON d.oid = s.dbid
                  WHERE s.refclassid = 'pg_catalog.pg_authid'::pg_catalog.regclass
                    AND s.refobjid = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = $1)
                    AND d.datname <> pg_catalog.current_database()",
                &[&role],
            )
            .await
            .map_err(sql)?;
        for row in elsewhere {
            let database: String = row.cell(0)?;
            let other =
                super::target::admin(&airlock_postgres::target::with_database(dsn, &database)).await?;
            other.batch_execute(&format!("DROP OWNED BY {r}")).await.map_err(sql)?;
        }
        client.batch_execute(&format!("DROP OWNED BY {r}; DROP ROLE IF EXISTS {r}")).await.map_err(sql)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_before_the_target_is_touched() {
        let max = Duration::from_secs(3600);
        let ok = GrantRequest { tables: vec!["analytics.accounts, usage".into()], ..Default::default() };
        let asked = check_request(&ok, max).unwrap();
        assert_eq!(asked.tables, vec!["analytics.accounts".to_owned(), "\"public\".usage".to_owned()]);
        assert_eq!((asked.ttl, asked.statement_timeout_ms, asked.connections), (DEFAULT_TTL, 10_000, 4));
        let code = |req: GrantRequest| check_request(&req, max).err().map(|e| e.code);
        assert_eq!(code(GrantRequest::default()), Some(ErrorCode::InvalidRequest));
        let filtered = |w: &str| GrantRequest { where_clause: Some(w.into()), ..ok.clone() };
        assert_eq!(code(filtered("tenant_id = 42; DROP TABLE x")), Some(ErrorCode::InvalidRequest));
        assert_eq!(code(filtered("tenant_id = 42 -- x")), Some(ErrorCode::InvalidRequest));
        assert_eq!(code(filtered("tenant_id = 42")), None);
        assert_eq!(code(filtered("name = 'it''s; (fine'")), None);
        assert_eq!(code(filtered("region IN ('eu', 'us') AND (tier = 'x')")), None);
        for bad in [
            "true) UNION SELECT * FROM secrets WHERE (true",
            "(true",
            "x = 'open",
            "a = $$x$$",
            "a /* b */",
            "x = E'\\'' ) OR (true'",
        ] {
            assert_eq!(code(filtered(bad)), Some(ErrorCode::InvalidRequest), "{bad}");
        }
        assert_eq!(code(GrantRequest { ttl_seconds: Some(7200), ..ok.clone() }), Some(ErrorCode::InvalidTtl));
        assert_eq!(
            code(GrantRequest { statement_timeout_ms: Some(0), ..ok.clone() }),
            Some(ErrorCode::InvalidRequest)
        );
        assert_eq!(
            code(GrantRequest { connections: Some(0), ..ok.clone() }),
            Some(ErrorCode::InvalidRequest)
        );
        let schema = GrantRequest {
            schema: Some("an\"alytics".into()),
            tables: vec!["t".into()],
            ..Default::default()
        };
        assert_eq!(check_request(&schema, max).unwrap().tables, vec!["\"an\"\"alytics\".t".to_owned()]);
    }

    #[test]
    fn the_upstream_dsn_keeps_where_and_how_but_not_the_admin() {
        let dsn = upstream_dsn(
            "postgresql://ops:s3cret@db.internal:6432/prod?sslmode=verify-full&sslrootcert=/etc/ca.crt",
            "airlock_grant_x",
            "pw",
        )
        .unwrap();
        assert!(!dsn.contains("ops") && !dsn.contains("s3cret"), "{dsn}");
        for part in [
            "user=airlock_grant_x",
            "password=pw",
            "host='db.internal'",
            "port=6432",
            "dbname='prod'",
            "sslmode='verify-full'",
            "sslrootcert='/etc/ca.crt'",
        ] {
            assert!(dsn.contains(part), "{part} in {dsn}");
        }
    }
}
