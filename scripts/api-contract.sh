#!/usr/bin/env bash
# The REST API against its own OpenAPI document: schemathesis generates requests
# for every operation (valid and invalid ones) from the document the daemon
# serves, sends them to a live daemon holding a golden and a sandbox, and fails on
# any 5xx, any answer whose status, content type or body the document does not
# allow, and any invalid request the daemon accepted. Bounded: a fixed number of
# examples per operation.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=$(scripts/python-env.sh "schemathesis>=4.32,<5")
bin=$PWD/target/debug/airlock
[ -x "$bin" ] || cargo build --locked

# As root a data root may not be under /tmp (sandboxes get private ones).
if [ -n "${AIRLOCK_TEST_XFS:-}" ]; then base=$AIRLOCK_TEST_XFS
elif [ "$(id -u)" -eq 0 ]; then base=/var/lib/airlock-api-contract; mkdir -p "$base"
else base=${TMPDIR:-/tmp}; fi
home=$(mktemp -d "$base/api-contract.XXXXXX")
export AIRLOCK_HOME=$home
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
api=127.0.0.1:$(port)
export AIRLOCK_ROUTER=127.0.0.1:$(port) AIRLOCK_GATEWAY=off
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '%s\n' "$token" > "$home/token"

"$bin" serve --tcp "$api" --token-file "$home/token" >"$home/serve.log" 2>&1 &
daemon=$!
cleanup() {
  { "$bin" ls --json 2>/dev/null || echo '[]'; } \
    | python3 -c 'import json,sys; [print(s["id"]) for s in json.load(sys.stdin) if isinstance(s, dict)]' 2>/dev/null \
    | xargs -r "$bin" rm >/dev/null 2>&1 || true
  kill "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  # The router runs in a process of its own that outlives the daemon.
  pkill -f "$home/router.spec.json" 2>/dev/null || true
  # Servers outlive the daemon by design: stop what is left of this run's.
  pkill -QUIT -f "$home/volume" 2>/dev/null || true
  sleep 1
  rm -rf "$home"
}
trap cleanup EXIT
for _ in $(seq 100); do "$bin" daemon status >/dev/null 2>&1 && break; sleep 0.2; done

# Something for the operations to work on: paths name this golden and sandbox.
"$bin" golden create shop --schema examples/demo/schema.sql --seed examples/demo/seed.sql >/dev/null
"$bin" fork shop --name kept --ttl 1h >/dev/null
cat >"$home/schemathesis.toml" <<TOML
[parameters]
"path.name" = "shop"
"path.id" = "kept"
"path.tool" = "describe_schema"
TOML

status=0
"$venv/bin/schemathesis" --no-color --config-file "$home/schemathesis.toml" run "http://$api/openapi.json" \
  --header "Authorization: Bearer $token" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,negative_data_rejection \
  --exclude-operation-id shutdown --exclude-path /v1/migrations/promote \
  --phases examples,coverage,fuzzing --max-examples 15 --request-timeout 120 \
  --generation-deterministic --workers 1 || status=$?
if [ $status -ne 0 ]; then
  echo "api-contract: failed; the daemon's log follows" >&2
  tail -50 "$home/serve.log" >&2
fi
exit $status
