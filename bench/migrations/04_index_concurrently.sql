CREATE INDEX CONCURRENTLY events_at ON events (at);
