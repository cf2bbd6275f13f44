UPDATE plans SET plan = 'standard' WHERE plan = 'enterprise';
