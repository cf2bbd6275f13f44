ALTER TABLE accounts ALTER COLUMN name TYPE varchar(200);
