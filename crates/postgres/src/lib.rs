//! The PostgreSQL engine: everything that talks to PostgreSQL. Binaries and
//! the majors installed, instances and their containment, admin sessions, the
//! in-server guard, loading scripts and dumps, the wire protocol, and
//! descriptions of a database's catalog ([`catalog`]).

pub mod admin;
pub mod bin;
pub mod catalog;
pub mod cell;
pub mod extensions;
pub mod guard;
pub mod imported;
pub mod install;
pub mod instance;
pub mod jail;
pub mod load;
pub mod loader;
pub mod majors;
pub mod outbound;
pub mod scram;
pub mod socket;
pub mod split;
pub mod target;
pub mod tunnel;
pub mod wire;

pub use bin::PgBin;
