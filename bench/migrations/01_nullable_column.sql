ALTER TABLE accounts ADD COLUMN note text;
