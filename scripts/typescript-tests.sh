#!/usr/bin/env bash
# Builds the TypeScript client (clients/typescript) and runs its tests against a
# real daemon: its development dependencies (TypeScript, openapi-typescript,
# and the agent SDKs its tool shapes are tested with: ai, @openai/agents,
# @anthropic-ai/sdk) come from npm's registry as package-lock.json pins them,
# and are kept under its node_modules/. The package itself depends on none.
set -euo pipefail
cd "$(dirname "$0")/../clients/typescript"

if [ ! -x node_modules/.bin/tsc ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --silent --no-audit --no-fund >&2
fi
[ -x ../../target/debug/airlock ] || (cd ../.. && cargo build --locked)
# The types are generated from the daemon's OpenAPI document (openapi.json,
# which a test checks is the one the daemon serves).
npx --no-install openapi-typescript openapi.json -o src/openapi.ts >/dev/null 2>&1
if ! git diff --quiet -- src/openapi.ts 2>/dev/null; then
  echo "clients/typescript/src/openapi.ts is not what openapi.json generates: commit the regenerated file" >&2
  exit 1
fi
rm -rf dist
npx --no-install tsc -p .
exec node --test dist/test/
