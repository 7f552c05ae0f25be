//! The sweep function, invoked by the recurring EventBridge schedule and by the one-time
//! deadline schedules. Every invocation is one bounded sweep; the payload is only a hint.
//! The recurring schedule's invocations then report the gauges as metric lines.

use serde::Deserialize;
use serde_json::Value;
use shared::adapters::emf::Emf;
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

/// One bounded sweep, then, where `gauges` is given and this is not an approval's one-time wake
/// (a burst of reminders or deadlines would read every waiting approval once each), the
/// approvals waiting, the oldest one's wait and the unknown outcomes of every tenant and agent,
/// a line each.
pub async fn handle(
    engine: &Engine,
    event: Value,
    budget: usize,
    gauges: Option<&Emf>,
) -> Result<SweepReport, EngineError> {
    let wake: Wake = serde_json::from_value(event).unwrap_or_default();
    tracing::info!(source = ?wake.source, wake = ?wake.wake, approval_id = ?wake.approval_id, "sweeping");
    let swept = engine.sweep(budget).await?;
    // A one-time wake-up names the approval it is for; the recurring schedule names none.
    if let Some(gauges) = gauges.filter(|_| wake.approval_id.is_none()) {
        // The sweep's work is done and recorded: gauges that cannot be read are only logged.
        match engine.figures(None).await {
            Ok(figures) => gauges.figures(&figures),
            Err(error) => tracing::warn!(%error, "could not read the gauges"),
        }
    }
    Ok(swept)
}
