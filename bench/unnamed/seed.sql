INSERT INTO customers SELECT g, CASE WHEN g % 10 = 0 THEN 'enterprise' ELSE 'standard' END, 'c' || g, 'c' || g || '@x.io',
       1 + g % 5, (ARRAY['eu','us','ap'])[1 + g % 3], g % 100, '2020-01-01'::timestamptz + g * interval '1 minute'
  FROM generate_series(1, 20000) g;
