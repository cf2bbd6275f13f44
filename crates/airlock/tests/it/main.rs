//! Integration tests: a real daemon, real PostgreSQL instances, the real CLI and psql.
//! `make test` mounts an XFS volume (reflink=1) and points AIRLOCK_TEST_XFS at it.

mod harness;

mod adversarial;
mod api;
mod audit;
mod cluster;
mod containment;
mod crash;
mod databases;
mod disk;
mod exec;
mod gateway;
mod goldens;
mod imports;
mod lifecycle;
mod live;
mod majors;
mod masking;
mod metrics;
mod migrate;
mod migrate_code;
mod migrate_lines;
mod migrate_verdicts;
mod pool;
mod redis;
mod router;
mod sandboxes;
mod security;
mod storage;
mod stores;
mod suspend;
mod traces;
mod wire;
