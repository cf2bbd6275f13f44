ALTER TABLE customers ADD COLUMN note text;
