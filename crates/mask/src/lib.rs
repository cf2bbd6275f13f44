//! Masking's values. A [`Key`] (one per golden, kept by the daemon, never in
//! a golden) turns each source value into the same masked value every time,
//! in every table; a [`Transformer`] keeps the value's format (an email stays
//! an email, a phone number keeps its punctuation); the [`classify`] module
//! tells which columns hold personal data, by name and by content.
//!
//! Nothing here touches a database: the golden build (`airlock-lifecycle`)
//! reads the distinct source values, asks for their masked values here, and
//! writes them back.

pub mod classify;
mod fake;
mod json_path;
mod key;
mod transform;

pub use key::Key;
pub use transform::{ColumnType, Output, Transformer};
