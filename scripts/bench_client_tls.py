"""What TLS costs a client of the router, per connection: psycopg (libpq) and
redis-py, a new connection and its first answer each time, in plaintext and
in TLS (verify-full against Airlock's CA), in alternating rounds; and what
building the SSL context alone costs in Python.

Run by scripts/bench-client-tls.sh with: DSN (the sandbox's router DSN,
sslmode=verify-full), REDIS_URL (its rediss:// URL) and CA (the CA file).
Prints Markdown tables.
"""

import os
import ssl
import statistics
import sys
import time

import psycopg
import redis

ROUNDS = int(os.environ.get("ROUNDS", "5"))
PER_ROUND = int(os.environ.get("PER_ROUND", "20"))
DSN, REDIS_URL, CA = os.environ["DSN"], os.environ["REDIS_URL"], os.environ["CA"]
PLAIN_DSN = DSN.split("?")[0] + "?sslmode=disable"
PLAIN_REDIS = REDIS_URL.replace("rediss://", "redis://", 1)


def timed(f):
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1000


def pg(dsn):
    with psycopg.connect(dsn) as c:
        c.execute("SELECT 1").fetchone()


def fresh_redis(url, **tls):
    r = redis.Redis.from_url(url, **tls)
    r.ping()
    r.close()


def only_airlocks_ca():
    # OpenSSL's default trust store is the file SSL_CERT_FILE names, read when
    # a context is made: create_default_context() then loads one certificate.
    os.environ["SSL_CERT_FILE"] = CA
    try:
        fresh_redis(REDIS_URL, ssl_ca_certs=CA, ssl_cert_reqs="required")
    finally:
        del os.environ["SSL_CERT_FILE"]


class Kept:
    """A client kept open beside the measured ones, holding one connection
    (redis-py 8 shares a context among connections while one is open)."""

    def __enter__(self):
        self.client = redis.Redis.from_url(REDIS_URL, ssl_ca_certs=CA, ssl_cert_reqs="required")
        self.client.ping()

    def __exit__(self, *_):
        self.client.close()


class Nothing:
    def __enter__(self):
        pass

    def __exit__(self, *_):
        pass


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


cases = {
    "psycopg, plaintext": lambda: pg(PLAIN_DSN),
    "psycopg, TLS verify-full": lambda: pg(DSN),
    "redis-py, plaintext": lambda: fresh_redis(PLAIN_REDIS),
    "redis-py, TLS (ssl_ca_certs)": lambda: fresh_redis(REDIS_URL, ssl_ca_certs=CA, ssl_cert_reqs="required"),
    "redis-py, TLS, with another client's connection open": lambda: fresh_redis(REDIS_URL, ssl_ca_certs=CA, ssl_cert_reqs="required"),
    "redis-py, TLS, SSL_CERT_FILE set to Airlock's CA": only_airlocks_ca,
    "ssl.create_default_context() alone": lambda: ssl.create_default_context(),
    "an SSLContext of Airlock's CA alone": lambda: ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=CA),
}
times = {name: [] for name in cases}
beside = {"redis-py, TLS, with another client's connection open": Kept}
for name, f in cases.items():
    with beside.get(name, Nothing)():
        f()  # warm: imports, first context, first handshake
for _ in range(ROUNDS):
    for name, f in cases.items():
        with beside.get(name, Nothing)():
            times[name] += [timed(f) for _ in range(PER_ROUND)]

print(f"\nredis-py {redis.__version__}, psycopg {psycopg.__version__} (libpq {psycopg.pq.version()}), "
      f"{ROUNDS} rounds x {PER_ROUND}, a new connection and its first answer each time\n")
print("| what | p50 ms | p99 ms |")
print("|---|---|---|")
for name, v in times.items():
    print(f"| {name} | {statistics.median(v):.2f} | {pct(v, 99):.2f} |")
