CREATE TABLE customers (id int PRIMARY KEY, tier text NOT NULL, name text, email text, version int NOT NULL DEFAULT 1,
                        region text, score int, touched timestamptz);
CREATE VIEW plans AS SELECT id, tier AS plan FROM customers;
