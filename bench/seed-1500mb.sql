-- About 1.4 GB of rows and index: a golden of about 1.5 GB on disk.
INSERT INTO accounts SELECT g, 'account ' || g, (ARRAY['free','team','enterprise'])[1 + g % 3]
FROM generate_series(1, 100000) g;
INSERT INTO events SELECT g, 1 + g % 100000, (ARRAY['login','click','purchase','logout'])[1 + g % 4],
       timestamptz '2025-01-01' + (g || ' seconds')::interval, md5(g::text) || repeat('x', 150)
FROM generate_series(1, 4600000) g;
