//! Runs: start an agent on a task (accepted at once, driven outside the request), read where a
//! run stands, cancel it, read its full history.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use super::error::ApiError;
use super::extract::{Caller, IdPath, JsonBody};
use super::{DecideState, StartState};
use crate::domain::ids::{AgentName, RunId};
use crate::engine::{EngineError, History, RunReport, StartRun, WaitingOn};
use crate::example::expense;
use crate::ports::queue::DriveMessage;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    /// The agent to run, by its definition's name, such as "refunds".
    pub agent: Option<String>,
    /// What the agent is asked to do.
    pub task: Option<String>,
    /// The expense agent's short form: the claim to process, such as "c-102".
    pub claim_id: Option<String>,
    /// Time a reviewer has to decide, shorter than the policy's: "30m", "2h", "0s".
    pub ttl: Option<String>,
}

fn parse_ttl(text: &str) -> Result<Duration, ApiError> {
    humantime::parse_duration(text).map_err(|e| {
        ApiError::bad_request(
            "invalid_field",
            format!("ttl {text:?} is not a duration such as 30m, 2h or 0s: {e}"),
        )
    })
}

/// Where to read a run, and what else may be done with it.
#[derive(Debug, Serialize)]
pub struct RunLinks {
    #[serde(rename = "self")]
    pub this: String,
    pub audit: String,
    pub cancel: String,
}

impl RunLinks {
    fn of(run: &RunId) -> Self {
        Self {
            this: format!("/runs/{run}"),
            audit: format!("/runs/{run}/audit"),
            cancel: format!("/runs/{run}/cancel"),
        }
    }
}

/// A run accepted by `POST /runs`: its id, `running`, and where to read it.
#[derive(Debug, Serialize)]
pub struct Accepted {
    #[serde(flatten)]
    pub run: RunReport,
    pub links: RunLinks,
}

/// `GET /runs/{id}`: where the run stands and what it waits on, each approval with its link.
#[derive(Debug, Serialize)]
pub struct RunView {
    #[serde(flatten)]
    pub run: RunReport,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub waiting_on: Vec<Waiting>,
    pub links: RunLinks,
}

/// One thing the run waits on; an approval with the path to read and decide it.
#[derive(Debug, Serialize)]
pub struct Waiting {
    #[serde(flatten)]
    pub on: WaitingOn,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

/// `POST /runs`: starts an agent on a task, for the caller. The caller is the run's requester:
/// they may never approve its calls, and neither may a person a call names as its claimant
/// (the expense claim's employee). Answers 202 once the run is stored; its turns go on outside
/// the request (the queue's consumer, or a task of the local server), so no model's latency
/// can time the caller out.
pub(super) async fn start(
    State(state): State<StartState>,
    Caller(who): Caller,
    JsonBody(body): JsonBody<StartBody>,
) -> Result<
    (
        StatusCode,
        [(header::HeaderName, String); 1],
        Json<Accepted>,
    ),
    ApiError,
> {
    let approval_ttl = body.ttl.as_deref().map(parse_ttl).transpose()?;
    let (agent, task) = match (body.agent, body.task, body.claim_id) {
        (agent, None, Some(claim_id)) => {
            let agent = agent.unwrap_or_else(|| expense::AGENT.into());
            if agent != expense::AGENT {
                return Err(ApiError::bad_request(
                    "invalid_field",
                    format!("a claim_id is the {} agent's short form", expense::AGENT),
                ));
            }
            let shown: String = claim_id.chars().take(64).collect();
            match state.claims.get(&claim_id) {
                Some(claim) if claim.tenant == who.tenant => {}
                // Another tenant's claim is as unknown as one that does not exist.
                _ => return Err(EngineError::not_found(format!("claim {shown}")).into()),
            }
            (agent, format!("Process expense claim {claim_id}."))
        }
        (Some(agent), Some(task), None) => (agent, task),
        _ => {
            return Err(ApiError::bad_request(
                "invalid_field",
                "send {\"agent\", \"task\"} (or the expense agent's {\"claim_id\"})",
            ));
        }
    };
    let agent = AgentName::parse(&agent)
        .map_err(|e| ApiError::bad_request("invalid_field", format!("agent: {e}")))?;
    let start = StartRun {
        approval_ttl,
        ..StartRun::for_person(&who, agent, task)
    };
    match crate::agents::prepare(&state.engine, &start.tenant, &start.agent).await {
        Err(error @ EngineError::Unavailable(_)) => {
            // Logged in full (a server's address, the definition's file); told in general terms.
            tracing::error!(%error, agent = %start.agent, "its tools cannot be reached");
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!(
                    "the {} agent cannot reach its tools now; nothing was started, try again later",
                    start.agent
                ),
            ));
        }
        other => other?,
    }
    let report = state.engine.accept(start).await?;
    tracing::Span::current().record("run_id", tracing::field::display(&report.run_id));
    let message = DriveMessage {
        tenant: report.tenant.clone(),
        run_id: report.run_id.clone(),
        drive: 0,
    };
    if state.engine.drives_in_process() {
        let engine = state.engine.clone();
        let span = tracing::Span::current();
        state.background.spawn(
            async move {
                if let Err(error) = engine.drive_run(&message).await {
                    tracing::warn!(%error, "the run stopped; the sweep takes it over once its lease runs out");
                }
            }
            .instrument(span),
        );
    } else if let Err(error) = state.engine.send_drive(&message).await {
        // Accepted all the same: the sweep drives the run once its lease runs out.
        tracing::warn!(%error, "the drive message was not sent");
    }
    tracing::info!("accepted");
    let links = RunLinks::of(&report.run_id);
    let location = links.this.clone();
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(Accepted { run: report, links }),
    ))
}

/// `GET /runs/{id}`: where a run of the caller's tenant stands and what it waits on.
pub(super) async fn read(
    State(state): State<DecideState>,
    Caller(who): Caller,
    IdPath(run): IdPath<RunId>,
) -> Result<Json<RunView>, ApiError> {
    let state = state.engine.run_state(&who.tenant, &run).await?;
    let waiting_on = state
        .waiting_on
        .into_iter()
        .map(|on| Waiting {
            link: match &on {
                WaitingOn::Approval { approval_id, .. } => {
                    Some(format!("/approvals/{approval_id}"))
                }
                _ => None,
            },
            on,
        })
        .collect();
    Ok(Json(RunView {
        links: RunLinks::of(&state.run.run_id),
        run: state.run,
        created_at: state.created_at,
        updated_at: state.updated_at,
        waiting_on,
    }))
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
    fn a_ttl_is_a_duration() {
        assert_eq!(parse_ttl("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_ttl("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_ttl("soon").unwrap_err().code, "invalid_field");
    }
}
