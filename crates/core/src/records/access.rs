//! What the agent's role may do inside its sandbox: the access mode and the
//! limits set on the role.
//!
//! Limits are role settings applied at login. The time and memory limits are
//! user-settable in PostgreSQL, so an agent can change them in its own session
//! (never for later sessions: the in-server guard refuses `ALTER ROLE`); the
//! daemon's watchdog holds the time limits whatever a session set, and the OS
//! limits bound what a sandbox can take from its neighbours. `temp_file_limit`
//! needs a superuser to change, so it holds.
//!
//! Read-only mode is membership in [`READ_ONLY_ROLE`]: the in-server guard makes
//! every transaction of such a session read-only, so PostgreSQL itself refuses
//! every persistent write (large objects and `SECURITY DEFINER` functions
//! included), whatever the session sets.

use serde::{Deserialize, Serialize};

use crate::dsn::{AGENT_ROLE, OWNER_ROLE};
use crate::error::{Error, ErrorCode, Result};

/// The access mode of a sandbox's credential.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Owns (through the owner role) everything the golden loaded: DDL, DML, temp tables.
    #[default]
    Owner,
    /// SELECT on the golden's tables only, in read-only transactions.
    Readonly,
}

impl Mode {
    /// Parses `owner` or `readonly`.
    pub fn parse(text: &str) -> Result<Mode> {
        match text {
            "owner" => Ok(Mode::Owner),
            "readonly" | "read-only" => Ok(Mode::Readonly),
            other => Err(Error::new(
                ErrorCode::InvalidRequest,
                format!("unknown access mode {other:?}"),
                "use --mode owner (the default) or --mode readonly",
            )),
        }
    }
}

/// Limits set on the agent's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct Limits {
    /// `statement_timeout`, milliseconds.
    pub statement_timeout_ms: u64,
    /// `lock_timeout`, milliseconds.
    pub lock_timeout_ms: u64,
    /// `idle_in_transaction_session_timeout`, milliseconds.
    pub idle_in_transaction_timeout_ms: u64,
    /// `temp_file_limit`, kilobytes.
    pub temp_file_limit_kb: u64,
    /// `work_mem`, kilobytes.
    pub work_mem_kb: u64,
    /// The role's connection limit.
    pub connection_limit: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            statement_timeout_ms: 30_000,
            lock_timeout_ms: 10_000,
            idle_in_transaction_timeout_ms: 60_000,
            temp_file_limit_kb: 1024 * 1024,
            work_mem_kb: 4 * 1024,
            connection_limit: 20,
        }
    }
}

/// The role whose members the in-server guard holds to read-only transactions.
pub const READ_ONLY_ROLE: &str = "airlock_readonly";

/// The most connections the agent may have (the instance allows 40; a few stay for admin work).
pub const MAX_CONNECTIONS: u32 = 30;

/// A mode with its limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct Access {
    /// What the role may do.
    pub mode: Mode,
    /// The limits on it.
    pub limits: Limits,
}

fn out_of_range(what: &str, hint: &str) -> Error {
    Error::new(ErrorCode::InvalidRequest, format!("{what} is out of range"), hint)
}

impl Access {
    /// This access, made no looser than `bound` in anything: read-only if
    /// either is, and each limit the smaller. What a fork made on a
    /// sandbox's behalf (a migration test's) gets, so it can do no more than
    /// the sandbox itself.
    pub fn at_most(&self, bound: &Access) -> Access {
        let (a, b) = (&self.limits, &bound.limits);
        Access {
            mode: if self.mode == Mode::Readonly || bound.mode == Mode::Readonly {
                Mode::Readonly
            } else {
                Mode::Owner
            },
            limits: Limits {
                statement_timeout_ms: a.statement_timeout_ms.min(b.statement_timeout_ms),
                lock_timeout_ms: a.lock_timeout_ms.min(b.lock_timeout_ms),
                idle_in_transaction_timeout_ms: a
                    .idle_in_transaction_timeout_ms
                    .min(b.idle_in_transaction_timeout_ms),
                temp_file_limit_kb: a.temp_file_limit_kb.min(b.temp_file_limit_kb),
                work_mem_kb: a.work_mem_kb.min(b.work_mem_kb),
                connection_limit: a.connection_limit.min(b.connection_limit),
            },
        }
    }

    /// Checks every limit is within sane bounds.
    pub fn validate(&self) -> Result<()> {
        let l = &self.limits;
        let day = 24 * 3600 * 1000;
        for (name, v) in [
            ("statement timeout", l.statement_timeout_ms),
            ("lock timeout", l.lock_timeout_ms),
            ("idle-in-transaction timeout", l.idle_in_transaction_timeout_ms),
        ] {
            if v == 0 || v > day {
                return Err(out_of_range(name, "give a duration between 1ms and 24h"));
            }
        }
        if l.work_mem_kb < 64 || l.work_mem_kb > 2 * 1024 * 1024 {
            return Err(out_of_range("work_mem", "give between 64kB and 2GB"));
        }
        if l.temp_file_limit_kb == 0 || l.temp_file_limit_kb > 1024 * 1024 * 1024 {
            return Err(out_of_range("temp file limit", "give between 1kB and 1TB"));
        }
        if l.connection_limit == 0 || l.connection_limit > MAX_CONNECTIONS {
            return Err(out_of_range("connection limit", &format!("give between 1 and {MAX_CONNECTIONS}")));
        }
        Ok(())
    }

    /// The statements that create the agent role for this access, its mode
    /// and limits. It logs in by peer authentication from the sandbox's own OS
    /// users, so the server holds no password for it. Run by the admin in the
    /// application database (or in a golden's, for the default access, so
    /// that a fork that asks for it has nothing to make).
    pub fn create_role_sql(&self) -> String {
        let l = &self.limits;
        let attrs = "NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS";
        let mut sql = match self.mode {
            // An owner may create databases of its own (test runners do); the
            // in-server guard keeps them its own, and the sandbox's own
            // database out of its reach.
            Mode::Owner => format!(
                "CREATE ROLE {AGENT_ROLE} LOGIN IN ROLE {OWNER_ROLE} {attrs} CREATEDB CONNECTION LIMIT {};",
                l.connection_limit
            ),
            Mode::Readonly => format!(
                "DO $$ BEGIN
                   IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = '{READ_ONLY_ROLE}') THEN
                     CREATE ROLE {READ_ONLY_ROLE} NOLOGIN;
                   END IF;
                 END $$;
                 CREATE ROLE {AGENT_ROLE} LOGIN IN ROLE {READ_ONLY_ROLE} {attrs} NOCREATEDB CONNECTION LIMIT {};
                 DO $$ DECLARE d text; BEGIN
                   FOR d IN SELECT datname FROM pg_catalog.pg_database WHERE datallowconn LOOP
                     EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', d);
                   END LOOP;
                 END $$;
                 DO $$ DECLARE s text; BEGIN
                   FOR s IN SELECT nspname FROM pg_catalog.pg_namespace
                            WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' LOOP
                     EXECUTE format('GRANT USAGE ON SCHEMA %I TO {AGENT_ROLE}', s);
                     EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA %I TO {AGENT_ROLE}', s);
                     EXECUTE format('GRANT SELECT ON ALL SEQUENCES IN SCHEMA %I TO {AGENT_ROLE}', s);
                   END LOOP;
                 END $$;
                 ALTER ROLE {AGENT_ROLE} SET default_transaction_read_only = on;",
                l.connection_limit
            ),
        };
        for (setting, value) in [
            ("statement_timeout", format!("{}ms", l.statement_timeout_ms)),
            // The limit itself, which the in-server guard holds however the
            // session sets statement_timeout (only a superuser may change it).
            ("airlock.statement_limit", format!("{}ms", l.statement_timeout_ms)),
            ("lock_timeout", format!("{}ms", l.lock_timeout_ms)),
            ("idle_in_transaction_session_timeout", format!("{}ms", l.idle_in_transaction_timeout_ms)),
            ("temp_file_limit", format!("{}kB", l.temp_file_limit_kb)),
            ("work_mem", format!("{}kB", l.work_mem_kb)),
        ] {
            sql.push_str(&format!("\nALTER ROLE {AGENT_ROLE} SET {setting} = '{value}';"));
        }
        sql
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bounds_are_checked() {
        assert!(Access::default().validate().is_ok());
        let mut a = Access::default();
        a.limits.connection_limit = 0;
        assert_eq!(a.validate().unwrap_err().code, ErrorCode::InvalidRequest);
        a.limits.connection_limit = MAX_CONNECTIONS + 1;
        assert!(a.validate().is_err());
        let mut a = Access::default();
        a.limits.statement_timeout_ms = 0;
        assert!(a.validate().is_err());
    }

    #[test]
    fn modes_parse_and_shape_the_role() {
        assert_eq!(Mode::parse("readonly").unwrap(), Mode::Readonly);
        assert!(Mode::parse("admin").is_err());
        let owner = Access::default().create_role_sql();
        assert!(owner.contains("IN ROLE airlock_owner") && owner.contains("statement_timeout = '30000ms'"));
        let ro = Access { mode: Mode::Readonly, ..Default::default() }.create_role_sql();
        assert!(owner.contains(" LOGIN ") && !owner.contains("PASSWORD"));
        assert!(ro.contains("IN ROLE airlock_readonly") && !ro.contains("IN ROLE airlock_owner"));
        assert!(ro.contains("default_transaction_read_only = on"));
    }
}
