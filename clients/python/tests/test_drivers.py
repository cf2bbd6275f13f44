"""The router with the drivers people use, none written for Airlock: psycopg (on
its own libpq 17+), asyncpg, pgjdbc and node-postgres, over TLS verify-full and
plaintext. The router authenticates them itself (SCRAM-SHA-256 with 4096
iterations, SCRAM-SHA-256-PLUS on TLS)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import asyncpg
import psycopg
import pytest

REPO = Path(__file__).resolve().parents[3]
PGJDBC = "/usr/share/java/postgresql.jar"
NODE_MODULES = REPO / "target" / "node" / "node_modules"


@pytest.fixture()
def sandbox(client):
    sb = client.fork("shop", ttl="10m")
    yield sb
    client.delete(sb)


def plaintext(dsn: str) -> str:
    return dsn.split("?", 1)[0] + "?sslmode=disable"


def parts(dsn: str):
    url = urlsplit(dsn)
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    return url.hostname, url.port, url.path.lstrip("/"), url.password, query


def test_psycopg_binds_the_channel_cancels_safely_and_negotiates_tls_directly(sandbox):
    assert psycopg.pq.version() >= 170000, "psycopg's own libpq is 17 or newer"
    with psycopg.connect(sandbox.dsn + "&channel_binding=require") as conn:
        assert conn.info.pgconn.ssl_in_use
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (500,)
        # libpq 17's encrypted cancel: a TLS connection of its own, which the
        # router must close with a close_notify.
        done = {}

        def sleep():
            try:
                conn.execute("SELECT pg_sleep(30)")
            except psycopg.errors.QueryCanceled:
                done["cancelled"] = time.time()

        t = threading.Thread(target=sleep)
        t.start()
        time.sleep(0.5)
        conn.cancel_safe(timeout=10)
        t.join(15)
        assert "cancelled" in done
    with psycopg.connect(sandbox.dsn + "&sslnegotiation=direct") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with psycopg.connect(plaintext(sandbox.dsn)) as conn:
        assert not conn.info.pgconn.ssl_in_use
        assert conn.execute("SELECT current_user").fetchone() == ("airlock_agent",)
    with pytest.raises(psycopg.OperationalError, match="channel binding"):
        psycopg.connect(plaintext(sandbox.dsn) + "&channel_binding=require")
    wrong = sandbox.dsn.replace(parts(sandbox.dsn)[3], "not-the-password")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong)


def test_libpq_18_asking_for_the_newest_protocol_is_negotiated_down_to_3_0(sandbox):
    """libpq 18 asks for protocol 3.2 with max_protocol_version=latest (psycopg
    3.3 can set it); the router speaks 3.0 to the sandbox's server and says so
    in NegotiateProtocolVersion, as PostgreSQL 17 and older do."""
    assert psycopg.pq.version() >= 180000, "psycopg's own libpq is 18 or newer (psycopg-binary 3.3)"
    for extra in ("&max_protocol_version=latest", "&max_protocol_version=3.2", "&max_protocol_version=3.0"):
        for dsn in (sandbox.dsn, plaintext(sandbox.dsn)):
            with psycopg.connect(dsn + extra) as conn:
                assert conn.execute("SELECT count(*) FROM orders").fetchone() == (500,), extra
                assert conn.info.pgconn.full_protocol_version == 30000
    # A client that insists on 3.2 is told the server's version, by libpq itself.
    with pytest.raises(psycopg.OperationalError, match="3.0"):
        psycopg.connect(sandbox.dsn + "&min_protocol_version=3.2&max_protocol_version=latest")


def test_libpq_18_speaks_protocol_3_2_end_to_end_with_a_postgresql_18_sandbox(daemon, client):
    """On a sandbox of PostgreSQL 18 (installed by `airlock postgres install
    18`, as make test does), libpq 18 gets protocol 3.2 whole, even when it
    insists on it: its longer cancel key goes through the router, and a
    cancel_safe() ends the statement, over TLS and plaintext."""
    schema = daemon.home / "t18.sql"
    schema.write_text("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 7);")
    if not any(g["name"] == "shop18" for g in daemon.json("golden", "ls")):
        daemon.cli("golden", "create", "shop18", "--schema", str(schema), "--postgres", "18")
    sb = client.fork("shop18", ttl="10m")
    try:
        for dsn in (sb.dsn, plaintext(sb.dsn)):
            with psycopg.connect(dsn + "&min_protocol_version=3.2&max_protocol_version=3.2") as conn:
                version = "SELECT count(*), current_setting('server_version_num')::int / 10000 FROM t"
                assert conn.execute(version).fetchone() == (7, 18)
                assert conn.info.pgconn.full_protocol_version == 30002
                done = {}

                def sleep():
                    try:
                        conn.execute("SELECT pg_sleep(30)")
                    except psycopg.errors.QueryCanceled:
                        done["cancelled"] = True

                t = threading.Thread(target=sleep)
                t.start()
                deadline = time.time() + 10
                with psycopg.connect(dsn) as watcher:
                    while not watcher.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' AND state = 'active'"
                    ).fetchone()[0] and time.time() < deadline:
                        time.sleep(0.02)
                conn.cancel_safe(timeout=10)
                t.join(15)
                assert done.get("cancelled"), dsn
    finally:
        client.delete(sb)


DJANGO_SETTINGS = """
import os
SECRET_KEY = "not-a-secret"
INSTALLED_APPS = ["shopapp"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql",
    "HOST": os.environ["PROBE_HOST"], "PORT": os.environ["PROBE_PORT"],
    "NAME": os.environ["PROBE_DB"], "USER": os.environ["PROBE_DB"], "PASSWORD": os.environ["PROBE_PASSWORD"],
    "OPTIONS": {"sslmode": "verify-full", "sslrootcert": os.environ["PROBE_CA"]},
}}
"""

DJANGO_MODELS = """
from django.db import models

class Widget(models.Model):
    name = models.CharField(max_length=40, unique=True)
"""

DJANGO_TESTS = """
from django.db import connection
from django.test import TestCase
from shopapp.models import Widget

class WidgetTests(TestCase):
    def test_widgets_live_in_the_test_database(self):
        Widget.objects.create(name="gear")
        self.assertEqual(Widget.objects.count(), 1)
        with connection.cursor() as c:
            c.execute("SELECT current_database()")
            self.assertTrue(c.fetchone()[0].startswith("test_"))
"""


def test_djangos_test_runner_creates_migrates_and_drops_its_test_database(sandbox, tmp_path):
    """`manage.py test` against a sandbox, with the sandbox id as USER and
    NAME: Django's maintenance connection (to `postgres`) reaches the
    sandbox's own database, from where it creates test_<NAME>, migrates it,
    runs the tests in it and drops it; the sandbox's own data is untouched."""
    host, port, db, password, query = parts(sandbox.dsn)
    app = tmp_path / "shopapp"
    (app / "migrations").mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "migrations" / "__init__.py").write_text("")
    (app / "models.py").write_text(DJANGO_MODELS)
    (app / "tests.py").write_text(DJANGO_TESTS)
    (tmp_path / "settings.py").write_text(DJANGO_SETTINGS)
    env = dict(
        os.environ, PYTHONPATH=str(tmp_path), DJANGO_SETTINGS_MODULE="settings",
        PROBE_HOST=host, PROBE_PORT=str(port), PROBE_DB=db, PROBE_PASSWORD=password, PROBE_CA=query["sslrootcert"],
    )
    for args in (["makemigrations", "shopapp"], ["test", "shopapp", "-v", "2", "--noinput"]):
        done = subprocess.run(
            [sys.executable, "-m", "django", *args], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "unable to create a connection to the 'postgres' database" not in done.stderr, done.stderr
    assert f"Creating test database for alias 'default' ('test_{db}')" in done.stderr, done.stderr
    assert "Ran 1 test" in done.stderr and "OK" in done.stderr, done.stderr
    assert f"Destroying test database for alias 'default' ('test_{db}')" in done.stderr, done.stderr
    with psycopg.connect(sandbox.dsn) as conn:
        names = [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE NOT datistemplate ORDER BY 1")]
        assert names == ["app"], names
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (500,)


def test_asyncpg_over_tls_and_plaintext(sandbox):
    async def run(dsn):
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch("SELECT g, repeat('x', 1000) FROM generate_series(1, 2000) g")
            return len(rows), await conn.fetchval("SELECT count(*) FROM orders")
        finally:
            await conn.close()

    assert asyncio.run(run(sandbox.dsn)) == (2000, 500)
    assert asyncio.run(run(plaintext(sandbox.dsn))) == (2000, 500)


JDBC_PROBE = """
import java.sql.*;
import java.util.Properties;

public class Probe {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.setProperty("user", "airlock_agent");
        p.setProperty("password", System.getenv("PROBE_PASSWORD"));
        try (Connection c = DriverManager.getConnection(System.getenv("PROBE_URL"), p);
             Statement s = c.createStatement();
             ResultSet r = s.executeQuery("SELECT count(*) FROM orders")) {
            r.next();
            System.out.println("orders=" + r.getLong(1));
        }
    }
}
"""


def test_pgjdbc_logs_in_over_tls_verify_full_and_plaintext(sandbox, tmp_path):
    host, port, db, password, query = parts(sandbox.dsn)
    (tmp_path / "Probe.java").write_text(JDBC_PROBE)
    urls = [
        f"jdbc:postgresql://{host}:{port}/{db}?sslmode=verify-full&sslrootcert={query['sslrootcert']}",
        f"jdbc:postgresql://{host}:{port}/{db}?sslmode=disable",
    ]
    for url in urls:
        env = dict(os.environ, PROBE_URL=url, PROBE_PASSWORD=password)
        done = subprocess.run(
            ["java", "-cp", PGJDBC, str(tmp_path / "Probe.java")],
            env=env, capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0 and "orders=500" in done.stdout, done.stderr


NODE_PROBE = """
const { Client } = require('pg');
(async () => {
  const c = new Client({ connectionString: process.env.PROBE_URL });
  await c.connect();
  const r = await c.query("SELECT count(*)::int AS n, length(string_agg(repeat('x', 1000), '')) AS big FROM generate_series(1, 5000)");
  const o = await c.query('SELECT count(*)::int AS n FROM orders');
  console.log(`orders=${o.rows[0].n} big=${r.rows[0].big}`);
  await c.end();
})().catch((e) => { console.error(e.message); process.exit(1); });
"""


def test_node_postgres_over_tls_verify_full_and_plaintext(sandbox, tmp_path):
    probe = tmp_path / "probe.js"
    probe.write_text(NODE_PROBE)
    for url in [sandbox.dsn, plaintext(sandbox.dsn)]:
        env = dict(os.environ, PROBE_URL=url, NODE_PATH=str(NODE_MODULES))
        done = subprocess.run(["node", str(probe)], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "orders=500 big=5000000" in done.stdout, done.stderr


IOREDIS_PROBE = """
const Redis = require('ioredis');
const fs = require('fs');
(async () => {
  const options = { maxRetriesPerRequest: 1, retryStrategy: () => null };
  if (process.env.PROBE_CA) options.tls = { ca: fs.readFileSync(process.env.PROBE_CA) };
  const r = new Redis(process.env.PROBE_URL, options);
  await r.set('from-node', 'ioredis');
  console.log('greeting=' + await r.get('greeting'));
  await r.quit();
})().catch((e) => { console.error(e.message); process.exit(1); });
"""


def test_redis_py_reaches_a_sandboxs_redis_through_the_router_over_tls_and_plaintext(daemon, client, tmp_path):
    import redis

    seed = daemon.home / "cache.redis"
    seed.write_text('HSET cart:42 apples 3\nSET greeting "hello world"\n')
    schema = daemon.home / "tiny.sql"
    schema.write_text("CREATE TABLE t (id int);\n")
    daemon.cli("golden", "create", "cached", "--schema", str(schema), "--redis-seed", str(seed))
    sb = client.fork("cached", ttl="10m")
    try:
        assert sb.redis_url and sb.redis_url.startswith(f"rediss://{sb.id}:")
        assert sb.redis_url not in repr(sb)
        ca = str(daemon.home / "tls" / "ca.crt")
        tls = redis.Redis.from_url(sb.redis_url, ssl_ca_certs=ca, ssl_cert_reqs="required")
        assert tls.get("greeting") == b"hello world"
        assert tls.hgetall("cart:42") == {b"apples": b"3"}
        tls.set("written", "by redis-py")
        plain = redis.Redis.from_url(sb.redis_url.replace("rediss://", "redis://", 1))
        assert plain.get("written") == b"by redis-py"
        with pytest.raises(redis.exceptions.NoPermissionError):
            plain.config_set("dir", "/tmp")
        wrong = redis.Redis.from_url(sb.redis_url.replace("rediss://", "redis://", 1).replace(sb.id + ":", sb.id + ":x", 1))
        with pytest.raises(redis.exceptions.AuthenticationError):
            wrong.ping()
        # Over its private socket too.
        sock = redis.Redis.from_url(sb.redis_socket_url)
        assert sock.get("written") == b"by redis-py"
        # ioredis, over TLS verified against Airlock's CA and in plaintext.
        probe = tmp_path / "ioredis.js"
        probe.write_text(IOREDIS_PROBE)
        for url, tls_ca in [(sb.redis_url, ca), (sb.redis_url.replace("rediss://", "redis://", 1), "")]:
            env = dict(os.environ, PROBE_URL=url, PROBE_CA=tls_ca, NODE_PATH=str(NODE_MODULES))
            done = subprocess.run(["node", str(probe)], env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0 and "greeting=hello world" in done.stdout, done.stderr
        assert plain.get("from-node") == b"ioredis"
    finally:
        client.delete(sb)
        daemon.cli("golden", "rm", "cached", "--force")


EXEC_REDIS_PROBE_JS = """
const which = process.argv[2];
(async () => {
  let value;
  if (which === 'ioredis') {
    const Redis = require('ioredis');
    const r = new Redis(process.env.REDIS_URL, { maxRetriesPerRequest: 1, retryStrategy: () => null });
    await r.set('from-ioredis', 'yes');
    value = await r.get('greeting');
    await r.quit();
  } else {
    const { createClient } = require('redis');
    const r = createClient({ url: process.env.REDIS_URL });
    await r.connect();
    await r.set('from-node-redis', 'yes');
    value = await r.get('greeting');
    await r.quit();
  }
  console.log(which + '=' + value);
})().catch((e) => { console.error(which + ': ' + e.message); process.exit(1); });
"""

EXEC_REDIS_PROBE_PY = """
import os, redis
r = redis.Redis.from_url(os.environ["REDIS_URL"])
r.set("from-redis-py", "yes")
print("redis-py=" + r.get("greeting").decode())
"""


def test_execs_redis_url_is_taken_as_it_is_by_redis_cli_redis_py_ioredis_and_node_redis(daemon, client):
    """The REDIS_URL `airlock exec` sets is a redis:// URL on loopback inside
    the sandbox's own network namespace: the four clients people use take it
    unchanged, from code running inside the sandbox."""
    import redis

    seed = daemon.home / "exec-cache.redis"
    seed.write_text('SET greeting "hello from the golden"\n')
    schema = daemon.home / "exec-tiny.sql"
    schema.write_text("CREATE TABLE t (id int);\n")
    daemon.cli("golden", "create", "execcache", "--schema", str(schema), "--redis-seed", str(seed))
    sb = client.fork("execcache", ttl="10m")
    try:
        def run(script):
            done = daemon.cli("exec", "--json", sb.id, "--timeout", "60s", "--", "sh", "-c", script)
            return json.loads(done.stdout)

        assert run("true")["exit_code"] == 0
        # The agent's project, as its code would find it in its working directory.
        work = daemon.home / "volume" / "sandboxes" / sb.id / "exec"
        (work / "probe.js").write_text(EXEC_REDIS_PROBE_JS)
        (work / "probe.py").write_text(EXEC_REDIS_PROBE_PY)
        shutil.copytree(NODE_MODULES, work / "node_modules")
        shutil.copytree(Path(redis.__file__).parent, work / "pylib" / "redis")
        import async_timeout

        shutil.copytree(Path(async_timeout.__file__).parent, work / "pylib" / "async_timeout")
        subprocess.run(["chmod", "-R", "a+rX", str(work)], check=True)
        out = run(
            'case "$REDIS_URL" in redis://*@127.0.0.1:6379/0) ;; *) echo "unexpected form"; exit 3;; esac; '
            'echo "redis-cli=$(redis-cli -u "$REDIS_URL" --no-auth-warning GET greeting)"; '
            "PYTHONPATH=pylib python3 probe.py && node probe.js ioredis && node probe.js redis"
        )
        assert out["exit_code"] == 0, out
        for client_name in ("redis-cli", "redis-py", "ioredis", "redis"):
            assert f"{client_name}=hello from the golden" in out["stdout"], out
        # What they wrote is the sandbox's own Redis, as the router shows it.
        plain = redis.Redis.from_url(sb.redis_url.replace("rediss://", "redis://", 1))
        assert [plain.get(k) for k in ("from-ioredis", "from-node-redis", "from-redis-py")] == [b"yes"] * 3
    finally:
        client.delete(sb)
        daemon.cli("golden", "rm", "execcache", "--force")


OVERSIZED_PROBE_JS = """
const which = process.argv[2];
const fs = require('fs');
const tls = { ca: fs.readFileSync(process.env.AIRLOCK_CA) };
const big = 'v'.repeat(9 * 1024 * 1024);
(async () => {
  let refused, value;
  if (which === 'ioredis') {
    const Redis = require('ioredis');
    const r = new Redis(process.env.URL, { tls, maxRetriesPerRequest: 1 });
    await r.set(which + '-big', big).catch((e) => { refused = e.message; });
    value = await r.get('greeting');
    r.disconnect();
  } else {
    const { createClient } = require('redis');
    const r = createClient({ url: process.env.URL, socket: { tls: true, ca: tls.ca } });
    r.on('error', () => {});
    await r.connect();
    await r.set(which + '-big', big).catch((e) => { refused = e.message; });
    value = await r.get('greeting');
    await r.disconnect();
  }
  console.log(JSON.stringify({ refused, value }));
})().catch((e) => { console.error(which + ': ' + e.message); process.exit(1); });
"""


def test_a_command_over_the_redis_limit_is_an_error_each_client_reports_and_recovers_from(daemon, client):
    """A value over the size limit gets an error reply through the router,
    in its place, which redis-py, ioredis and node-redis each raise as that
    command's error; each goes on with its next command on the same session."""
    import redis

    seed = daemon.home / "limit-cache.redis"
    seed.write_text("SET greeting hi\n")
    daemon.cli("golden", "create", "limitcache", "--redis-seed", str(seed))
    sb = client.fork("limitcache", ttl="10m")
    ca = str(daemon.home / "tls" / "ca.crt")
    try:
        r = redis.Redis.from_url(sb.redis_url, ssl_ca_certs=ca, ssl_cert_reqs="required")
        with pytest.raises(redis.ResponseError) as refused:
            r.set("py-big", b"v" * (9 << 20))
        assert "command too large" in str(refused.value) and "8 MB" in str(refused.value)
        assert "closed" not in str(refused.value)
        r.execute_command("CLIENT", "SETNAME", "kept")
        with pytest.raises(redis.ResponseError):
            r.set("py-big", b"v" * (9 << 20))
        assert r.execute_command("CLIENT", "GETNAME") == b"kept", "the same session"
        assert r.get("greeting") == b"hi"
        r.set("py-fits", b"v" * (7 << 20))
        assert r.strlen("py-fits") == 7 << 20

        probe = daemon.home / "oversized.js"
        probe.write_text(OVERSIZED_PROBE_JS)
        env = {**os.environ, "NODE_PATH": str(NODE_MODULES), "URL": sb.redis_url, "AIRLOCK_CA": ca}
        for which in ("ioredis", "redis"):
            done = subprocess.run(["node", str(probe), which], env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            said = json.loads(done.stdout.strip().splitlines()[-1])
            assert "command too large" in (said["refused"] or ""), (which, said)
            assert said["value"] == "hi", (which, said)
        assert r.exists("py-big", "ioredis-big", "redis-big") == 0
    finally:
        client.delete(sb)
        daemon.cli("golden", "rm", "limitcache", "--force")


def test_scratch_db_on_a_redis_only_golden_yields_a_redis_and_no_dsn(daemon, client):
    import redis

    from airlock_client import AirlockError, scratch_db

    seed = daemon.home / "kv-only.redis"
    seed.write_text("SET greeting hi\n")
    daemon.cli("golden", "create", "kvonly", "--redis-seed", str(seed))
    try:
        with scratch_db("kvonly", client=client) as sb:
            assert sb.dsn is None and sb.socket_dsn is None
            r = redis.Redis.from_url(sb.redis_url.replace("rediss://", "redis://", 1))
            assert r.get("greeting") == b"hi"
            r.set("written", "by the task")
            kept = sb.id
        with pytest.raises(AirlockError) as gone:
            client.get(kept)
        assert gone.value.code == "sandbox_not_found"
        with scratch_db("kvonly", client=client) as sb:
            r = redis.Redis.from_url(sb.redis_url.replace("rediss://", "redis://", 1))
            assert r.get("written") is None, "each scratch sandbox starts from the golden"
    finally:
        daemon.cli("golden", "rm", "kvonly", "--force")
