# The two commands of the Quick start, and a few more for development.
.PHONY: demo test deps build bench clean

deps:
	@scripts/deps.sh

build: deps
	cargo build --release --locked

## demo: the main job end to end on a small shop database
demo: build
	@scripts/demo.sh

## test: every test, against real PostgreSQL on real filesystems
test:
	@scripts/deps.sh test
	@scripts/test.sh

## bench: fork benchmarks against the baselines, then router, router authentication, pool, suspend,
## mitosis-db, density, live targets, the cluster, restarts and TTLs, client TLS, the router at 2-28
## clients, sustained cold forks (see docs/BENCHMARKS.md)
bench: build
	@scripts/bench.sh
	@scripts/bench-router.sh
	@scripts/bench-router-auth.sh
	@scripts/bench-import.sh
	@scripts/bench-majors.sh
	@scripts/bench-redis.sh
	@scripts/bench-tools.sh
	@scripts/bench-migrate.sh
	@scripts/bench-promote.sh
	@scripts/bench-density.sh
	@scripts/bench-live.sh
	@scripts/bench-masking.sh
	@scripts/bench-cluster.sh
	@scripts/bench-lifecycle.sh
	@scripts/bench-client-tls.sh
	@scripts/bench-router-clients.sh
	@scripts/bench-churn.sh

clean:
	cargo clean
