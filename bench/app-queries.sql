-- The application's queries for the benchmark schema, as pg_stat_statements shows them.
SELECT id, name, plan FROM accounts WHERE id = $1;
SELECT count(*) FROM events WHERE account_id = $1;
SELECT id, kind, at FROM events WHERE account_id = $1 ORDER BY at DESC LIMIT 20;
UPDATE accounts SET plan = $2 WHERE id = $1;
INSERT INTO events (id, account_id, kind, at, payload) VALUES ($1, $2, $3, now(), $4);
