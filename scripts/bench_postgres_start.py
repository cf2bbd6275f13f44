"""The floor under a cold fork's "ready" step: a bare PostgreSQL server (no
guard, no containment, the sandboxes' settings) started on a reflinked copy
of a golden's data directory, timed from spawn to `ready` in its
postmaster.pid (polled every 0.3 ms), as the airlock user.

    python3 scripts/bench_postgres_start.py GOLDEN_PGDATA SCRATCH_DIR [RUNS]

SCRATCH_DIR must be on the same filesystem as the golden (for reflinks).
"""

import os
import pwd
import shutil
import statistics
import subprocess
import sys
import time

golden, scratch = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 20
bin_dir = os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")
user = pwd.getpwnam(os.environ.get("PG_USER", "airlock"))
hba = os.path.join(scratch, "hba.conf")
os.makedirs(scratch, exist_ok=True)
with open(hba, "w") as f:
    f.write("local all all trust\n")
os.chmod(hba, 0o644)


def as_user():
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)


def own(tree):
    for root, _, files in os.walk(tree):
        os.chown(root, user.pw_uid, user.pw_gid)
        for f in files:
            os.chown(os.path.join(root, f), user.pw_uid, user.pw_gid)


ready, copied = [], []
for i in range(runs):
    data, sock = os.path.join(scratch, f"data{i}"), os.path.join(scratch, f"sock{i}")
    t = time.perf_counter()
    subprocess.run(["cp", "-a", "--reflink=always", golden, data], check=True)
    copied.append((time.perf_counter() - t) * 1000)
    own(data)
    os.makedirs(sock)
    os.chown(sock, user.pw_uid, user.pw_gid)
    settings = ["listen_addresses=", f"unix_socket_directories={sock}", "fsync=off", "full_page_writes=off",
                "shared_buffers=16MB", "max_connections=40", "max_wal_size=48MB", "min_wal_size=32MB",
                "jit=off", f"hba_file={hba}"]
    args = [os.path.join(bin_dir, "postgres"), "-D", data] + [a for s in settings for a in ("-c", s)]
    log = open(os.path.join(scratch, f"log{i}"), "w")
    t = time.perf_counter()
    server = subprocess.Popen(args, stdout=log, stderr=log, preexec_fn=as_user)
    while True:
        try:
            lines = open(os.path.join(data, "postmaster.pid")).read().split("\n")
            if len(lines) > 7 and lines[7].strip() == "ready":
                break
        except FileNotFoundError:
            pass
        if server.poll() is not None:
            sys.exit(open(os.path.join(scratch, f"log{i}")).read())
        time.sleep(0.0003)
    ready.append((time.perf_counter() - t) * 1000)
    server.send_signal(3)
    server.wait()
    shutil.rmtree(data)
    shutil.rmtree(sock)
shutil.rmtree(scratch)
q = lambda v, p: sorted(v)[min(len(v) - 1, int(p * len(v)))]
print(f"bare postgres, spawn to ready: p50 {statistics.median(ready):.1f} ms, p99 {q(ready, 0.99):.1f} ms ({runs} runs)")
print(f"cp -a --reflink=always of the data directory: p50 {statistics.median(copied):.1f} ms")
