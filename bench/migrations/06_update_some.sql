UPDATE accounts SET plan = 'pro' WHERE id % 10 = 0;
