//! Airlock: every AI-agent task gets its own throwaway PostgreSQL, forked
//! copy-on-write from a seeded golden snapshot, reachable only with a credential
//! the harness holds, and gone when the task ends or its TTL passes.
//!
//! This crate is the top of the workspace: the REST API that exposes every
//! service ([`api`]), the daemon that starts and wires them ([`daemon`]), the
//! command line ([`cli`]), and the router's relay in a cluster ([`relay`]). The map of the workspace is in
//! `docs/ARCHITECTURE.md`.

pub mod api;
pub mod cli;
pub mod daemon;
pub mod relay;
