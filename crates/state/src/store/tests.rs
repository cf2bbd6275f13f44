//! The store's tests.

use super::*;

#[test]
fn a_store_from_the_first_schema_is_migrated() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(
        "CREATE TABLE goldens (name TEXT PRIMARY KEY, current_generation INTEGER NOT NULL, source TEXT NOT NULL);
         CREATE TABLE sandboxes (id TEXT PRIMARY KEY, name TEXT UNIQUE, golden TEXT NOT NULL,
             generation INTEGER NOT NULL, state TEXT NOT NULL, labels TEXT NOT NULL,
             created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, pid INTEGER, dsn TEXT);
         CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, kind TEXT NOT NULL,
             sandbox TEXT, golden TEXT, reason TEXT, detail TEXT NOT NULL);
         INSERT INTO sandboxes VALUES ('sb-old', NULL, 'shop', 1, 'running', '{}', 0, 0, NULL, NULL);
         INSERT INTO events (at, kind, sandbox, detail) VALUES (0, 'created', 'sb-old', '{}');",
    )
    .unwrap();
    migrate(&conn).unwrap();
    migrate(&conn).unwrap();
    let store = Store { conn, journal: None };
    let sb = store.sandbox("sb-old").unwrap();
    assert_eq!(sb.access, airlock_core::records::access::Access::default());
    assert_eq!(sb.slot, None);
    assert_eq!(sb.idle_suspend_seconds, 0);
    // Events of before the audit log have neither a door nor a record.
    let events = store.events(None, 10).unwrap();
    assert_eq!((events.len(), events[0].door.as_deref()), (1, None));
    assert_eq!(store.events_with_audit(0, 10).unwrap()[0].audit_seq, None);
}

#[test]
fn trimming_keeps_the_newest_events() {
    let dir = std::env::temp_dir().join(format!("airlock-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut store = Store::open(&dir.join("state.db")).unwrap();
    for i in 0..10 {
        store
            .record(NewEvent {
                kind: airlock_core::events::EventKind::Connected,
                detail: serde_json::json!({"n": i}),
                ..Default::default()
            })
            .unwrap();
    }
    assert_eq!(store.trim_events(4).unwrap(), 6);
    let left = store.events(None, 100).unwrap();
    let kept: Vec<i64> = left.iter().map(|e| e.detail["n"].as_i64().unwrap()).collect();
    assert_eq!(kept, [6, 7, 8, 9]);
    assert_eq!(store.trim_events(4).unwrap(), 0);
    let _ = std::fs::remove_dir_all(dir);
}
