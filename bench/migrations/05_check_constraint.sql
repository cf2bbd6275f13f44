ALTER TABLE accounts ADD CONSTRAINT accounts_plan_known CHECK (plan <> '');
