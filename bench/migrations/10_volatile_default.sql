ALTER TABLE events ADD COLUMN seen_at timestamptz DEFAULT clock_timestamp();
