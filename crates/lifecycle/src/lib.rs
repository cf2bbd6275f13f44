//! The lifecycle of goldens and sandboxes: what the daemon's services all
//! stand on.
//!
//! [`engine::Engine`] holds what every operation shares (settings, the state
//! store, the cloner, the engines' binaries, identities). [`golden`] builds and
//! keeps goldens; [`sandbox`] forks, suspends, wakes, resets, branches and
//! deletes sandboxes. Services above reach sandboxes through this crate and
//! tell it what they hold through [`services`]; nothing here names one of them.

pub mod activity;
pub mod doctor;
pub mod doors;
pub mod engine;
pub mod executor;
pub mod golden;
pub mod sandbox;
pub mod services;
