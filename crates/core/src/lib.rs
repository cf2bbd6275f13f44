//! Airlock's ground floor: what every layer above shares, knowing none of them.
//!
//! Errors with their stable codes, the clock, secrets and connection strings
//! kept out of sight, input validation, the event record, the data root's
//! layout, and the records of sandboxes as the state store keeps them. This
//! crate depends on no other of Airlock's, so it can use no code of an engine
//! or a service; what it shares with them is vocabulary: the kinds of events
//! and the doors they come through, the paths under the data root, and where
//! a golden's Redis part comes from.

pub mod clock;
pub mod crashpoint;
pub mod descriptors;
pub mod dsn;
pub mod error;
pub mod events;
pub mod layout;
pub mod process;
pub mod records;
pub mod secret;
pub mod validate;
