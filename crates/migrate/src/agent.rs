//! The migration airlock as the lifecycle's [`AgentMigrations`]: what an
//! agent's `test_migration` tool call runs, through whichever service took the
//! call. The daemon registers it at start.

use std::sync::{Arc, Weak};

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::records::sandbox::Sandbox;
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::services::{AgentMigrations, TestedMigration};

use crate::{Candidate, TestRequest};

/// Tests an agent's migration against the golden its sandbox was forked from.
pub struct ForAgents {
    /// The engine it tests on: weak, since the engine holds this.
    engine: Weak<Engine>,
}

impl ForAgents {
    /// What tests agents' migrations on `engine`.
    pub fn new(engine: &Arc<Engine>) -> ForAgents {
        ForAgents { engine: Arc::downgrade(engine) }
    }
}

#[async_trait::async_trait]
impl AgentMigrations for ForAgents {
    async fn test(&self, sb: &Sandbox, sql: &str) -> Result<TestedMigration> {
        let engine = self.engine.upgrade().ok_or_else(|| {
            Error::new(
                ErrorCode::Internal,
                "the daemon is shutting down",
                "test the migration once it runs again",
            )
        })?;
        let request = TestRequest {
            golden: sb.golden.clone(),
            candidates: vec![Candidate {
                name: "migration.sql".into(),
                sql: Some(sql.to_owned()),
                exec: None,
                exec_files: vec![],
            }],
            // Each statement bounded by the agent's own statement timeout, so
            // an agent cannot tie up the host's room with tests.
            statement_timeout_ms: Some(sb.access.limits.statement_timeout_ms),
            on_behalf_of: Some(sb.id.clone()),
            ..Default::default()
        };
        let report = crate::test(engine, request).await?;
        let value = serde_json::to_value(&report).expect("report serializes");
        Ok(TestedMigration { passed: report.passed, report: value, text: report.text() })
    }
}
