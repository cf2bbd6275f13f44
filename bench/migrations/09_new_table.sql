CREATE TABLE audit (id bigserial PRIMARY KEY, account_id bigint REFERENCES accounts(id), at timestamptz DEFAULT now());
