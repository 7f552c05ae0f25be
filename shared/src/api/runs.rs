//! Runs: start the expense agent on a claim, cancel a run, read its full history.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{Caller, IdPath, JsonBody};
use super::{DecideState, StartState};
use crate::domain::ids::RunId;
use crate::engine::{EngineError, History, RunReport};
use crate::example::expense;

/// The longest time to decide a caller may ask for.
const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    /// The claim to process, such as "c-102".
    pub claim_id: String,
    /// Time a reviewer has to decide, overriding the policy: "30m", "2h", "0s".
    #[serde(default)]
    pub ttl: Option<String>,
}

fn parse_ttl(text: &str) -> Result<Duration, ApiError> {
    let ttl = humantime::parse_duration(text).map_err(|e| {
        ApiError::bad_request(
            "invalid_field",
            format!("ttl {text:?} is not a duration such as 30m, 2h or 0s: {e}"),
        )
    })?;
    if ttl > MAX_TTL {
        return Err(ApiError::bad_request(
            "invalid_field",
            "ttl is at most 30 days",
        ));
    }
    Ok(ttl)
}

/// `POST /runs`: anyone in the claim's tenant may start the agent on it. Whoever starts a run
/// for someone else's claim is recorded as its starter, and may not approve its calls either.
pub(super) async fn start(
    State(state): State<StartState>,
    Caller(who): Caller,
    JsonBody(body): JsonBody<StartBody>,
) -> Result<(StatusCode, Json<RunReport>), ApiError> {
    let approval_ttl = body.ttl.as_deref().map(parse_ttl).transpose()?;
    let claim_id: String = body.claim_id.chars().take(64).collect();
    let unknown = || EngineError::not_found(format!("claim {claim_id}"));
    match state.claims.get(&body.claim_id) {
        Some(claim) if claim.tenant == who.tenant => {}
        // Another tenant's claim is as unknown as one that does not exist.
        _ => return Err(unknown().into()),
    }
    let mut start = expense::task_for(&state.claims, &body.claim_id)?;
    if start.requested_by != who.person {
        start.started_by = Some(who.person.clone());
    }
    start.approval_ttl = approval_ttl;
    let report = state.engine.start(start).await?;
    tracing::Span::current().record("run", tracing::field::display(&report.run_id));
    tracing::info!(status = %report.status, "started");
    Ok((StatusCode::CREATED, Json(report)))
}

/// `POST /runs/{id}/cancel`: its requester, or anyone who could decide one of its open
/// approvals, may cancel it.
pub(super) async fn cancel(
    State(state): State<DecideState>,
    Caller(who): Caller,
    IdPath(run): IdPath<RunId>,
) -> Result<Json<RunReport>, ApiError> {
    let report = state.engine.cancel(&who, &run).await?;
    tracing::info!("cancelled");
    Ok(Json(report))
}

/// `GET /runs/{id}/audit`: the run, every action version, its approvals and the audit log.
pub(super) async fn audit(
    State(state): State<DecideState>,
    Caller(who): Caller,
    IdPath(run): IdPath<RunId>,
) -> Result<Json<History>, ApiError> {
    Ok(Json(state.engine.history(&who.tenant, &run).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ttl_is_a_duration_of_at_most_30_days() {
        assert_eq!(parse_ttl("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_ttl("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_ttl("soon").unwrap_err().code, "invalid_field");
        assert_eq!(parse_ttl("31days").unwrap_err().code, "invalid_field");
    }
}
