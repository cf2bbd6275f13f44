//! Airlock: every AI-agent task gets its own throwaway PostgreSQL, forked
//! copy-on-write from a seeded golden snapshot, reachable only with a credential
//! the harness holds, and gone when the task ends or its TTL passes.
//!
//! The map of this crate is in `docs/ARCHITECTURE.md`.

pub mod api;
pub mod audit;
pub mod catalog;
pub mod cgroup;
pub mod cli;
pub mod client;
pub mod clock;
pub mod crashpoint;
pub mod daemon;
pub mod descriptors;
pub mod engine;
pub mod error;
pub mod events;
pub mod gateway;
pub mod golden;
pub mod layout;
pub mod metrics;
pub mod migrate;
pub mod pg;
pub mod process;
pub mod reaper;
pub mod redis;
pub mod rootfs;
pub mod router;
pub mod sandbox;
pub mod seccomp;
pub mod secret;
pub mod serve;
pub mod slots;
pub mod storage;
pub mod store;
pub mod traces;
pub mod users;
pub mod validate;
