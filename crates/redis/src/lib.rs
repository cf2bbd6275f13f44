//! Redis beside PostgreSQL: a golden's key space as one RDB file per
//! generation ([`golden`]), and a sandbox's own `redis-server` started from a
//! copy-on-write clone of it ([`server`]), reached through its unix socket as an
//! ACL user named after the sandbox, with the sandbox's password.
//!
//! The daemon talks to its servers with a small RESP client of its own
//! ([`resp`]), bounded like its PostgreSQL wire code.

pub mod commands;
pub mod golden;
pub mod keyspace;
pub mod loopback;
pub mod masking;
pub mod relay;
pub mod resp;
pub mod server;
