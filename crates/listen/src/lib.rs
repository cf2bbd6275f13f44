//! The daemon's doors, whatever stands behind them: connection slots that
//! yield to newcomers ([`slots`]), HTTP served within bounds with errors
//! mapped once to statuses ([`serve`]), and the client of the daemon's REST API
//! that the CLI, the router process and the stdio gateway talk through
//! ([`client`]).

pub mod client;
pub mod serve;
pub mod slots;
