#!/usr/bin/env bash
# Runs every test: unit tests, and integration tests against real PostgreSQL
# instances on a loop-mounted XFS volume (reflink=1) when run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

volume=""
if [ "$(id -u)" -eq 0 ]; then
  volume=$(scripts/test-volume.sh up)
  trap 'scripts/test-volume.sh down "$volume"' EXIT
  export AIRLOCK_TEST_XFS="$volume"
else
  echo "not root: integration tests run on the copy fallback; storage init is tested for its refusal" >&2
fi

# The crates stand in layers: none depends on one beside or above it, and
# docs/ARCHITECTURE.md draws the graph as it is.
scripts/layers.py
cargo build --locked --all-targets
# Methods that panic on what the agent can shape (a NULL read back, say) are
# not used (clippy.toml says which and why).
cargo clippy --locked --all-targets -- -A clippy::all -D clippy::disallowed_methods
# Goldens of other majors than the host's are tested on these (downloads are
# cached under the install root, so a second run fetches nothing).
target/debug/airlock postgres install 13 14 16 17 18
status=0
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --locked --no-fail-fast || status=$?
else
  cargo test --locked --no-fail-fast || status=$?
fi

# The Python client and the MCP servers, driven by the official MCP Python SDK.
scripts/python-tests.sh || status=$?

# The TypeScript client, built and run against a real daemon with Node.
scripts/typescript-tests.sh || status=$?

# The REST API against its generated OpenAPI document (schemathesis, bounded).
scripts/api-contract.sh || status=$?

# What a CI job keeps beside its log: the HTML migration report the browser
# test opened, and its screenshot.
if [ -d target/artifacts ]; then
  echo "artifacts (the HTML migration report and its screenshot): $(ls -d target/artifacts/* | tr '\n' ' ')"
fi
exit $status
