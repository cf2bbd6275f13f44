CREATE INDEX events_kind ON events (kind);
