DELETE FROM events WHERE id % 100 = 0;
