UPDATE customers SET tier = 'standard' WHERE tier = 'enterprise';
