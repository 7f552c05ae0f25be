//! The gate API ([docs/gate-api.md](../../../docs/gate-api.md)): an agent that runs its own loop
//! hands Countersign one proposed call at a time, long-polls for its decision and outcome, and,
//! for a tool it runs itself, claims the approved call and reports what running it did.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use reqwest::Url;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::auth::Authenticate;
use super::error::ApiError;
use super::extract::{Caller, IdPath, JsonBody};
use super::waiting::{RETRY_AFTER, WaitPlace, WaitRefused};
use crate::adapters::webhook::review_link;
use crate::domain::action::CallerClaim;
use crate::domain::conversation::ToolResultText;
use crate::domain::gate::GateRefusal;
use crate::domain::identity::Identity;
use crate::domain::ids::{ActionId, AgentName, ApprovalId, Role, RunId};
use crate::domain::policy::Need;
use crate::domain::run::GateVia;
use crate::engine::{CallState, CallStatus, Engine, EngineError, Executor, GateCall, Reported};

/// The longest a `GET /gate/calls/{id}?wait=` holds its answer: under API Gateway's 30 s.
pub const MAX_WAIT: Duration = Duration::from_secs(25);

/// The largest gate request body: a call's arguments, or an outcome's result, may be up to
/// 32 KiB (the engine answers a larger one in its own words), with room for the JSON around.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

#[derive(Clone)]
struct GateState {
    engine: Arc<Engine>,
    auth: Arc<dyn Authenticate>,
    /// The review page's public address: a waiting call links to its approval there.
    public_url: Option<Url>,
}

impl axum::extract::FromRef<GateState> for Arc<dyn Authenticate> {
    fn from_ref(state: &GateState) -> Self {
        state.auth.clone()
    }
}

/// `POST /gate/calls`, `GET /gate/calls/{id}`, and a caller-run call's
/// `POST /gate/calls/{id}/claim` and `POST /gate/calls/{id}/outcome`.
pub fn routes(engine: Arc<Engine>, auth: Arc<dyn Authenticate>, public_url: Option<Url>) -> Router {
    Router::new()
        .route("/gate/calls", post(propose))
        .route("/gate/calls/{id}", get(read))
        .route("/gate/calls/{id}/claim", post(claim))
        .route("/gate/calls/{id}/outcome", post(outcome))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(GateState {
            engine,
            auth,
            public_url,
        })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProposeBody {
    agent: String,
    tool: String,
    args: Value,
    call_id: String,
    conversation: Option<String>,
}

/// `POST /gate/calls`: one call, for the caller; 202 while it waits on a person.
async fn propose(
    State(state): State<GateState>,
    Caller(who): Caller,
    JsonBody(body): JsonBody<ProposeBody, MAX_BODY_BYTES>,
) -> Result<(StatusCode, Json<CallView>), ApiError> {
    let agent = AgentName::parse(&body.agent)
        .map_err(|e| ApiError::bad_request("invalid_field", format!("agent: {e}")))?;
    let call = GateCall {
        call_id: Some(body.call_id),
        conversation: body.conversation,
        ..GateCall::asked_by(&who, agent, GateVia::Api, body.tool, body.args)
    };
    let taken = state.engine.gate_call_to_the_end(call).await?;
    tracing::Span::current().record("run_id", tracing::field::display(&taken.run_id));
    let status = match taken.status {
        CallStatus::AwaitingApproval => StatusCode::ACCEPTED,
        _ => StatusCode::OK,
    };
    Ok((status, Json(CallView::of(taken, state.public_url.as_ref()))))
}

/// `GET /gate/calls/{id}?wait=`: the call, held until it moves on or the wait ends, in one of
/// the server's waiting slots; past the caller's share of them, answered at once.
async fn read(
    State(state): State<GateState>,
    Caller(who): Caller,
    IdPath(run): IdPath<RunId>,
    RawQuery(query): RawQuery,
    place: WaitPlace,
) -> Result<Json<CallView>, Response> {
    let wait = wait_of(query.as_deref().unwrap_or_default()).map_err(|e| e.into_response())?;
    let waiting = match wait.filter(|wait| !wait.is_zero()) {
        Some(wait) => match place.take(&who) {
            Ok(slot) => Some((wait, slot)),
            Err(refused) => return not_waited(&state, &who, &run, refused).await,
        },
        None => None,
    };
    let call = match waiting {
        Some((wait, _slot)) => state.engine.wait_for_call(&who.tenant, &run, wait).await,
        None => state.engine.call_state(&who.tenant, &run).await,
    };
    let call = call.map_err(|e| ApiError::from(e).into_response())?;
    Ok(Json(CallView::of(call, state.public_url.as_ref())))
}

/// A wait the caller may not take now: the call as it stands, at once; while it still waits or
/// runs, as 429 `too_many_waits` with `Retry-After` and the call in its body.
async fn not_waited(
    state: &GateState,
    who: &Identity,
    run: &RunId,
    refused: WaitRefused,
) -> Result<Json<CallView>, Response> {
    let call = state
        .engine
        .call_state(&who.tenant, run)
        .await
        .map_err(|e| ApiError::from(e).into_response())?;
    if !call.status.is_pending() {
        return Ok(Json(CallView::of(call, state.public_url.as_ref())));
    }
    tracing::info!(%refused, "wait refused");
    let view = CallView::of(call, state.public_url.as_ref());
    let mut response = with_call(ApiError::too_many_waits(refused.to_string()), view);
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(RETRY_AFTER.as_secs()),
    );
    Err(response)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimBody {
    claimant: String,
}

/// `POST /gate/calls/{id}/claim`: one claimant takes an approved call its caller runs.
async fn claim(
    State(state): State<GateState>,
    Caller(who): Caller,
    IdPath(run): IdPath<RunId>,
    JsonBody(body): JsonBody<ClaimBody, MAX_BODY_BYTES>,
) -> Result<Json<CallView>, Response> {
    let claimed = state.engine.claim_call(&who, &run, &body.claimant).await;
    answered(&state, &who, &run, claimed).await
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reporting {
    Succeeded,
    Failed,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OutcomeBody {
    claimant: String,
    status: Reporting,
    #[serde(default)]
    result: Value,
}

/// `POST /gate/calls/{id}/outcome`: what running a claimed call did, from its claimant.
async fn outcome(
    State(state): State<GateState>,
    Caller(who): Caller,
    IdPath(run): IdPath<RunId>,
    JsonBody(body): JsonBody<OutcomeBody, MAX_BODY_BYTES>,
) -> Result<Json<CallView>, Response> {
    let reported = Reported {
        succeeded: matches!(body.status, Reporting::Succeeded),
        result: body.result,
    };
    let settled = state
        .engine
        .report_outcome(&who, &run, &body.claimant, reported)
        .await;
    answered(&state, &who, &run, settled).await
}

/// A claim's or a report's answer: the call, or the refusal; a conflict carries the call as it
/// stands, so the caller knows what happened without asking again.
async fn answered(
    state: &GateState,
    who: &Identity,
    run: &RunId,
    done: Result<CallState, EngineError>,
) -> Result<Json<CallView>, Response> {
    let error = match done {
        Ok(call) => return Ok(Json(CallView::of(call, state.public_url.as_ref()))),
        Err(error) => error,
    };
    let conflict = matches!(
        error,
        EngineError::Gate(
            GateRefusal::Claimed { .. }
                | GateRefusal::NotClaimable { .. }
                | GateRefusal::OutcomeRecorded { .. }
        )
    );
    let call = match conflict {
        true => state.engine.call_state(&who.tenant, run).await.ok(),
        false => None,
    };
    let api = ApiError::from(error);
    let Some(call) = call else {
        return Err(api.into_response());
    };
    Err(with_call(
        api,
        CallView::of(call, state.public_url.as_ref()),
    ))
}

/// A refusal with the call as it stands in its body, so the caller need not ask again.
fn with_call(api: ApiError, call: CallView) -> Response {
    let body = serde_json::json!({
        "error": {"code": api.code, "message": api.message},
        "call": call,
    });
    (api.status, Json(body)).into_response()
}

/// The `wait` of a read: seconds (`25`, `2.5`) or a duration (`25s`, `500ms`), at most
/// [`MAX_WAIT`] (a longer one waits that long); the query's only parameter.
fn wait_of(query: &str) -> Result<Option<Duration>, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query)
        .map_err(|_| ApiError::bad_request("invalid_field", "the query string does not parse"))?;
    let mut wait = None;
    for (name, value) in pairs {
        if name != "wait" {
            return Err(ApiError::bad_request(
                "unknown_field",
                format!("{name} is not a parameter of a call; it takes wait"),
            ));
        }
        wait = Some(wait_value(&value)?);
    }
    Ok(wait)
}

/// A `wait` parameter's value: a number of seconds or a duration such as `25s`, at most
/// [`MAX_WAIT`].
pub(super) fn wait_value(value: &str) -> Result<Duration, ApiError> {
    let read = value
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .or_else(|| humantime::parse_duration(value).ok())
        .ok_or_else(|| {
            ApiError::bad_request(
                "invalid_field",
                format!(
                    "wait {:?} is not a number of seconds or a duration such as 25s",
                    value.chars().take(40).collect::<String>()
                ),
            )
        })?;
    Ok(read.min(MAX_WAIT))
}

/// A call as its caller reads it (docs/gate-api.md's "the call").
#[derive(Debug, Serialize)]
struct CallView {
    id: RunId,
    #[serde(skip_serializing_if = "Option::is_none")]
    call_id: Option<String>,
    agent: AgentName,
    tool: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    conversation: Option<String>,
    executor: Executor,
    status: CallStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    action_id: Option<ActionId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<ToolResultText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    approval: Option<ApprovalView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    claim: Option<CallerClaim>,
    attached: bool,
    /// The policy rules that decided it, by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    rules: Vec<String>,
}

/// Who must decide a waiting call, how many, by when, and where.
#[derive(Debug, Serialize)]
struct ApprovalView {
    id: ApprovalId,
    approver_role: Role,
    quorum: u8,
    /// The other roles that must approve too, each with its quorum.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    also: Vec<Need>,
    expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    link: Option<String>,
}

impl CallView {
    fn of(call: CallState, public_url: Option<&Url>) -> Self {
        let key = call.key();
        Self {
            approval: call.approval.map(|a| ApprovalView {
                link: public_url.map(|url| review_link(url, &a.id)),
                id: a.id,
                approver_role: a.approver_role,
                quorum: a.quorum,
                also: a.also,
                expires_at: a.expires_at,
            }),
            id: call.run_id,
            call_id: call.call_id,
            agent: call.agent,
            tool: call.tool,
            conversation: call.conversation,
            executor: call.executor,
            status: call.status,
            action_id: call.action_id,
            version: call.version,
            args: call.args.map(|a| a.as_value()),
            key,
            result: call.result,
            claim: call.claim,
            attached: call.attached,
            rules: call.rules,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_is_seconds_or_a_duration_and_at_most_25_seconds() {
        assert_eq!(wait_of("").unwrap(), None);
        assert_eq!(
            wait_of("wait=2.5").unwrap(),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(
            wait_of("wait=500ms").unwrap(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(wait_of("wait=25s").unwrap(), Some(MAX_WAIT));
        assert_eq!(wait_of("wait=10m").unwrap(), Some(MAX_WAIT));
        assert_eq!(wait_of("wait=soon").unwrap_err().code, "invalid_field");
        assert_eq!(wait_of("wait=-1").unwrap_err().code, "invalid_field");
        assert_eq!(wait_of("limit=3").unwrap_err().code, "unknown_field");
    }
}
