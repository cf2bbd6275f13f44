//! Reading values out of rows whose contents the agent may have shaped.
//!
//! A catalog read races the agent's own DDL (a function dropped while its
//! definition is printed reads back as NULL), and a promoted golden's tables
//! are the agent's: a NULL where none was expected, or a type other than the
//! one asked for, is an error that says so, never a panic. `Row::get`, which
//! panics on either, is not used in this crate (a test holds it).

use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

use airlock_core::error::{Error, Result};

/// Fallible reads of a row's columns.
pub trait Cell {
    /// Column `index` as `T`; an error if it is NULL (for a `T` that is not
    /// an `Option`) or of another type.
    fn cell<'a, T: FromSql<'a>>(&'a self, index: usize) -> Result<T>;
}

impl Cell for Row {
    fn cell<'a, T: FromSql<'a>>(&'a self, index: usize) -> Result<T> {
        self.try_get(index).map_err(|e| {
            let name = self.columns().get(index).map_or("?", |c| c.name());
            Error::postgres(format!(
                "a value read back ({name}, column {}) was not what was expected: {e}",
                index + 1
            ))
        })
    }
}
