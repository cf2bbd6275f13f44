//! The records every layer reads: sandboxes and the access they grant,
//! where a golden's Redis part comes from, and routes the router leads
//! clients along to databases outside any sandbox. (A golden's own record carries
//! what its engines found, so it lives above them: `airlock_state::golden`.)

pub mod access;
pub mod masking;
pub mod redis;
pub mod route;
pub mod sandbox;
