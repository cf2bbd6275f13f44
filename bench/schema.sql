-- Benchmark schema: accounts and a wide events table with an index, sized by the seed.
CREATE TABLE accounts (
    id      bigint PRIMARY KEY,
    name    text NOT NULL,
    plan    text NOT NULL
);
CREATE TABLE events (
    id          bigint PRIMARY KEY,
    account_id  bigint NOT NULL REFERENCES accounts(id),
    kind        text NOT NULL,
    at          timestamptz NOT NULL,
    payload     text NOT NULL
);
CREATE INDEX events_account ON events(account_id);
