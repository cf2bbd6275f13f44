//! Airlock: every AI-agent task gets its own throwaway PostgreSQL, forked
//! copy-on-write from a seeded golden snapshot, reachable only with a credential
//! the harness holds, and gone when the task ends or its TTL passes.
//!
//! The map of this crate is in `docs/ARCHITECTURE.md`.

pub mod api;
pub mod cli;
pub mod client;
pub mod daemon;
pub mod engine;
pub mod gateway;
pub mod golden;
pub mod metrics;
pub mod migrate;
pub mod reaper;
pub mod router;
pub mod sandbox;
pub mod serve;
pub mod slots;
pub mod traces;
