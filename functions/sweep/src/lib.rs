//! The sweep function, invoked by the recurring EventBridge schedule and by the one-time
//! deadline schedules. Every invocation is one bounded sweep; the payload is only a hint.

use serde::Deserialize;
use serde_json::Value;
use shared::engine::{Engine, EngineError, SweepReport};

/// What the schedules send; unknown fields and other events are accepted and ignored.
#[derive(Debug, Default, Deserialize)]
pub struct Wake {
    pub source: Option<String>,
    pub wake: Option<String>,
    pub approval_id: Option<String>,
}

/// Items of each kind one invocation touches at most (`COUNTERSIGN_SWEEP_BUDGET`).
pub fn budget_from_env() -> usize {
    std::env::var("COUNTERSIGN_SWEEP_BUDGET")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(200)
}

pub async fn handle(
    engine: &Engine,
    event: Value,
    budget: usize,
) -> Result<SweepReport, EngineError> {
    let wake: Wake = serde_json::from_value(event).unwrap_or_default();
    tracing::info!(source = ?wake.source, wake = ?wake.wake, approval = ?wake.approval_id, "sweeping");
    engine.sweep(budget).await
}
