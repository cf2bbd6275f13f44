//! Read-only mode allows no persistent write at all: large objects, sequences,
//! a golden's own SECURITY DEFINER functions, fast-path calls and every way of
//! turning the session read-write are refused by PostgreSQL itself, held there
//! by the in-server guard.

use super::Scene;
use crate::harness::{dsn, psql, sql, Daemon};
use crate::storage::golden_digest;
use crate::wire::{startup_packet, Raw};

/// A golden like the shop with a sequence and a SECURITY DEFINER function that
/// writes, a read-only agent and an owner-mode neighbour.
fn readonly_scene() -> Scene {
    let d = Daemon::start(&[]);
    d.golden(
        "shop",
        "CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, total numeric NOT NULL);
         CREATE SEQUENCE order_ids;
         CREATE FUNCTION bump() RETURNS void LANGUAGE sql SECURITY DEFINER AS
           'INSERT INTO orders VALUES (99999, ''bumped'', 0)';",
        "INSERT INTO orders SELECT g, (ARRAY['pending','paid','shipped','cancelled'])[1 + g % 4], g * 1.5 \
         FROM generate_series(1, 1000) g;",
    );
    let golden_before = golden_digest(&d.home.join("volume/goldens/shop/1"));
    let forked = d.fork("shop", &["--mode", "readonly"]);
    let agent = dsn(&forked);
    let neighbour = dsn(&d.fork("shop", &[]));
    let (_, password) = crate::harness::split_password(&agent);
    Scene {
        id: forked["id"].as_str().unwrap().to_owned(),
        agent_socket: forked["socket_dsn"].as_str().unwrap().to_owned(),
        d,
        agent,
        password,
        neighbour,
        golden_before,
    }
}

/// Nothing was written: rows, large objects and the sequence are as forked.
fn nothing_written(s: &Scene) {
    assert_eq!(sql(&s.agent, "SELECT count(*) FROM orders"), "1000");
    assert_eq!(sql(&s.agent, "SELECT count(*) FROM pg_largeobject_metadata"), "0");
    assert_eq!(sql(&s.agent, "SELECT last_value FROM order_ids"), "1");
    s.untouched();
}

macro_rules! readonly_refused {
    ($($name:ident: $sql:expr;)*) => {$(
        #[test]
        fn $name() {
            let s = readonly_scene();
            let err = psql(&s.agent, $sql).expect_err(concat!($sql, " should have been refused"));
            assert!(
                err.contains("read-only transaction")
                    || err.contains("read-write mode must be set")
                    || err.contains("permission denied"),
                "{}: {err}", $sql
            );
            nothing_written(&s);
        }
    )*};
}

readonly_refused! {
    large_object_from_bytes: "SELECT lo_from_bytea(0, 'x')";
    large_object_created: "SELECT lo_create(0)";
    large_object_in_a_read_write_transaction: "BEGIN READ WRITE; SELECT lo_creat(-1); COMMIT";
    large_object_after_the_default_is_turned_off: "SET default_transaction_read_only = off; SELECT lo_creat(-1)";
    read_write_set_by_set_config: "SELECT set_config('transaction_read_only', 'off', false); SELECT lo_creat(-1)";
    read_write_set_for_the_transaction: "BEGIN; SET TRANSACTION READ WRITE; SELECT lo_creat(-1); COMMIT";
    read_write_for_the_session: "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE; SELECT lo_creat(-1)";
    next_sequence_value: "BEGIN READ WRITE; SELECT nextval('order_ids'); COMMIT";
    security_definer_write: "BEGIN READ WRITE; SELECT bump(); COMMIT";
    security_definer_write_in_a_do_block: "SET default_transaction_read_only = off; DO $$ BEGIN PERFORM bump(); END $$";
    write_through_a_cte: "BEGIN READ WRITE; WITH x AS (DELETE FROM orders RETURNING 1) SELECT count(*) FROM x; COMMIT";
    temporary_table: "BEGIN READ WRITE; CREATE TEMP TABLE t (x int); COMMIT";
}

#[test]
fn a_fast_path_large_object_call_is_refused() {
    let s = readonly_scene();
    let packet = startup_packet(196608, &[("user", "airlock_agent"), ("database", &s.id)]);
    let mut session = Raw::connect(s.router(), &packet, &s.password).unwrap();
    session.query("SET default_transaction_read_only = off").unwrap();
    let oid: u32 = sql(&s.agent, "SELECT 'lo_creat(integer)'::regprocedure::oid").parse().unwrap();
    let refused = session.function_call(oid, &["-1"]).expect_err("lo_creat by fast path wrote");
    assert!(refused.message.contains("read-only"), "{refused:?}");
    nothing_written(&s);
}
