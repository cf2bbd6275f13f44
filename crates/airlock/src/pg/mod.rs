//! Everything that talks to PostgreSQL: binaries and the majors installed, instances, admin sessions,
//! loading scripts and dumps, connection strings.

pub mod admin;
pub mod bin;
pub mod cell;
pub mod dsn;
pub mod guard;
pub mod install;
pub mod instance;
pub mod jail;
pub mod load;
pub mod loader;
pub mod majors;
pub mod scram;
pub mod socket;
pub mod target;
pub mod tunnel;
pub mod wire;

pub use bin::PgBin;
