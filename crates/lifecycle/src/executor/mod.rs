//! What every executor shares, attached to a sandbox (`sandbox/exec.rs`) or
//! to a grant (the live service's): files in and out of a private workspace
//! (`files.rs`), and running a contained command to its end or its timeout,
//! its output captured and every process it left killed (`run.rs`).

pub mod files;
pub mod run;
