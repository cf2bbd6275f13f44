-- About 3 MB of rows: with catalogs and WAL, a golden of about 40 MB on disk.
INSERT INTO accounts SELECT g, 'account ' || g, (ARRAY['free','team','enterprise'])[1 + g % 3]
FROM generate_series(1, 1000) g;
INSERT INTO events SELECT g, 1 + g % 1000, (ARRAY['login','click','purchase','logout'])[1 + g % 4],
       timestamptz '2025-01-01' + (g || ' seconds')::interval, md5(g::text) || repeat('x', 60)
FROM generate_series(1, 20000) g;
