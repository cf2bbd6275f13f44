//! The records every layer reads: sandboxes and the access they grant, and
//! where a golden's Redis part comes from. (A golden's own record carries
//! what its engines found, so it lives above them: `airlock_state::golden`.)

pub mod access;
pub mod redis;
pub mod sandbox;
