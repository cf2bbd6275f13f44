ALTER TABLE events ADD COLUMN processed boolean NOT NULL DEFAULT false;
