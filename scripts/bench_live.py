"""Times the live-target paths in interleaved rounds (run by bench-live.sh):
a plain connection to the target and its first row (the baseline), a grant
minted to its first row answered through the router, an executor started to
exit (a trivial command, and a 10 MB file in and out), and the whole
per-request pattern (grant, exec, files back, revoke)."""

import json
import os
import statistics
import sys
import time

import psycopg2

from airlock_client import Client, live_grant

direct, rounds = sys.argv[1], int(sys.argv[2])
client = Client()
QUERY = "SELECT id, name FROM accounts ORDER BY id LIMIT 1"
JOB = (
    "import os, psycopg2\n"
    "c = psycopg2.connect(os.environ['DATABASE_URL'])\n"
    "cur = c.cursor(); cur.execute(\"SELECT id, name FROM accounts ORDER BY id\")\n"
    "open('out.csv', 'w').write('\\n'.join(f'{i},{n}' for i, n in cur.fetchall()))\n"
)
BLOB = os.urandom(10 << 20)
times = {k: [] for k in ["psql_first_row", "grant_first_row", "revoke", "exec_trivial", "exec_10mb", "pattern_trivial", "pattern_python"]}


def ms(since):
    return (time.perf_counter() - since) * 1000


def first_row(dsn):
    conn = psycopg2.connect(dsn)
    cur = conn.cursor()
    cur.execute(QUERY if "gr-" in dsn else QUERY.replace("FROM accounts", "FROM analytics.accounts WHERE tenant_id = 42"))
    row = cur.fetchone()
    conn.close()
    assert row is not None


def grant():
    return client.grant("prod", ["analytics.accounts"], where="tenant_id = 42", ttl="2m")


for _ in range(rounds):
    t = time.perf_counter(); first_row(direct); times["psql_first_row"].append(ms(t))
    t = time.perf_counter(); g = grant(); first_row(g.dsn); times["grant_first_row"].append(ms(t))
    t = time.perf_counter(); client.revoke(g); times["revoke"].append(ms(t))
    g = grant()
    t = time.perf_counter(); r = client.exec_grant(g, ["true"]); times["exec_trivial"].append(ms(t))
    assert r.ok, r.stderr
    g = grant()
    t = time.perf_counter()
    r = client.exec_grant(g, ["cp", "in.bin", "out.bin"], files={"in.bin": BLOB}, get=["out.bin"])
    times["exec_10mb"].append(ms(t))
    assert r.ok and r.files["out.bin"] == BLOB, r.stderr
    t = time.perf_counter()
    with live_grant("prod", ["analytics.accounts"], where="tenant_id = 42", client=client) as g:
        r = g.run(["true"])
    times["pattern_trivial"].append(ms(t))
    t = time.perf_counter()
    with live_grant("prod", ["analytics.accounts"], where="tenant_id = 42", client=client) as g:
        r = g.run(["python3", "job.py"], files={"job.py": JOB}, get=["out.csv"])
    times["pattern_python"].append(ms(t))
    assert r.ok and r.files["out.csv"].count(b"\n") == 4, r.stderr


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


print(json.dumps({k: {"p50": round(statistics.median(v), 1), "p99": round(pct(v, 99), 1), "n": len(v)} for k, v in times.items()}, indent=1))
