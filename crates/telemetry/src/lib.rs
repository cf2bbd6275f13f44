//! What the daemon tells its operators: Prometheus metrics and the fleet's
//! health measures ([`metrics`]), and OpenTelemetry traces of its operations
//! ([`traces`]), both read from the events every operation records.

pub mod metrics;
pub mod traces;
