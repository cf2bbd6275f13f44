//! Which sandbox, and which database inside it, a client's `database` names.
//!
//! A sandbox is a whole cluster for its owner: its own database (`app`), and
//! any its agent created (test runners create and drop theirs). The name a
//! client gives picks both:
//!
//! - `sb-ab12cd34ef` (or the sandbox's name): the sandbox's own database;
//! - `sb-ab12cd34ef/orders_test` (a second path element in a URL): the
//!   database `orders_test` inside it;
//! - any other name holding a sandbox id, such as `test_sb-ab12cd34ef` (the
//!   name Django's test runner derives, `_gw0` and all with pytest-xdist): that
//!   database, whole, inside that sandbox.
//!
//! A client may also give the sandbox's id as its user (in place of the agent
//! role's name): then every database name is one inside that sandbox, and
//! `postgres`, the maintenance database tools assume (Django, Rails), is the
//! sandbox's own.
//!
//! Which databases exist, and who may reach them, is the sandbox's server's
//! to say (its access file admits the agent to no template).

use airlock_core::dsn::DATABASE;

/// A sandbox and a database inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The sandbox's id or name, to look up.
    pub sandbox: String,
    /// The database inside it.
    pub database: String,
}

/// The length of a sandbox id's random part (`sb-` and ten characters).
const ID_TAIL: usize = 10;

impl Target {
    /// What a client's `database` parameter names.
    pub fn of(name: &str) -> Target {
        if let Some((sandbox, database)) = name.split_once('/') {
            let database = if database.is_empty() { DATABASE } else { database };
            return Target { sandbox: sandbox.to_owned(), database: database.to_owned() };
        }
        match embedded_id(name) {
            Some(id) if id != name => Target { sandbox: id.to_owned(), database: name.to_owned() },
            _ => Target { sandbox: name.to_owned(), database: DATABASE.to_owned() },
        }
    }

    /// What a client whose user is sandbox id `id` reaches with `database`:
    /// that sandbox, whatever the name (`postgres` being its own database);
    /// None when the name picks another sandbox.
    pub fn for_user(id: &str, database: &str) -> Option<Target> {
        let named = Target::of(database);
        if named.sandbox == id {
            return Some(named);
        }
        if database == "postgres" {
            return Some(Target { sandbox: id.to_owned(), database: DATABASE.to_owned() });
        }
        if database.contains('/') || embedded_id(database).is_some() {
            return None;
        }
        Some(Target { sandbox: id.to_owned(), database: database.to_owned() })
    }

    /// Whether it is the sandbox's own database.
    pub fn is_own_database(&self) -> bool {
        self.database == DATABASE
    }
}

/// Whether `name` is a sandbox id, and nothing else.
pub fn is_sandbox_id(name: &str) -> bool {
    embedded_id(name) == Some(name)
}

/// The first sandbox id (`sb-` and ten lower-case letters or digits, not
/// part of a longer word) in `name`.
fn embedded_id(name: &str) -> Option<&str> {
    let bytes = name.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric();
    let mut from = 0;
    while let Some(at) = name[from..].find("sb-").map(|i| i + from) {
        let end = at + 3 + ID_TAIL;
        let tail_ok = end <= bytes.len()
            && bytes[at + 3..end].iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if tail_ok && (at == 0 || !word(bytes[at - 1])) && (end == bytes.len() || !word(bytes[end])) {
            return Some(&name[at..end]);
        }
        from = at + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(name: &str) -> (String, String) {
        let t = Target::of(name);
        (t.sandbox, t.database)
    }

    fn pair(sandbox: &str, database: &str) -> (String, String) {
        (sandbox.to_owned(), database.to_owned())
    }

    #[test]
    fn names_pick_a_sandbox_and_a_database_inside_it() {
        assert_eq!(of("sb-ab12cd34ef"), pair("sb-ab12cd34ef", "app"));
        assert_eq!(of("my-task"), pair("my-task", "app"));
        assert_eq!(of("sb-ab12cd34ef/orders_test"), pair("sb-ab12cd34ef", "orders_test"));
        assert_eq!(of("my-task/orders_test"), pair("my-task", "orders_test"));
        assert_eq!(of("sb-ab12cd34ef/"), pair("sb-ab12cd34ef", "app"));
        // Django's test database, and pytest-xdist's per-worker ones.
        assert_eq!(of("test_sb-ab12cd34ef"), pair("sb-ab12cd34ef", "test_sb-ab12cd34ef"));
        assert_eq!(of("test_sb-ab12cd34ef_gw0"), pair("sb-ab12cd34ef", "test_sb-ab12cd34ef_gw0"));
        // Not an id: too short, too long, upper case, inside a word.
        for name in ["test_sb-ab12cd34e", "test_sb-ab12cd34efg", "test_sb-AB12CD34EF", "xsb-ab12cd34ef"] {
            assert_eq!(of(name), pair(name, "app"), "{name}");
        }
        // A sandbox id as the user: every name is inside that sandbox.
        let id = "sb-ab12cd34ef";
        let for_user = |db: &str| Target::for_user(id, db).map(|t| (t.sandbox, t.database));
        assert_eq!(for_user("postgres"), Some(pair(id, "app")));
        assert_eq!(for_user(id), Some(pair(id, "app")));
        assert_eq!(for_user("myapp_test"), Some(pair(id, "myapp_test")));
        assert_eq!(for_user("test_sb-ab12cd34ef"), Some(pair(id, "test_sb-ab12cd34ef")));
        assert_eq!(for_user("sb-ab12cd34ef/x"), Some(pair(id, "x")));
        for other in ["sb-zzzzzzzzzz", "test_sb-zzzzzzzzzz", "sb-zzzzzzzzzz/x", "my-task/x"] {
            assert_eq!(for_user(other), None, "{other}");
        }
        assert!(is_sandbox_id(id) && !is_sandbox_id("airlock_agent") && !is_sandbox_id("test_sb-ab12cd34ef"));
        // The first id wins.
        assert_eq!(of("sb-aaaaaaaaaa_sb-bbbbbbbbbb"), pair("sb-aaaaaaaaaa", "sb-aaaaaaaaaa_sb-bbbbbbbbbb"));
    }
}
