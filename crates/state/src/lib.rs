//! What the daemon remembers: the state store of goldens, generations,
//! sandboxes and events ([`store`]), the records of goldens and their
//! generations ([`golden`]), and the tamper-evident audit journal every event
//! is written to first ([`audit`]).

pub mod audit;
pub mod golden;
pub mod store;
