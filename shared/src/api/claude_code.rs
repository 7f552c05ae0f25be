//! Claude Code's hooks answered from the gate ([docs/claude-code.md](../../../docs/claude-code.md)):
//! one logic behind `countersign hook claude-code` (a command hook: the event on stdin, the
//! answer on stdout) and `POST /hooks/claude-code/{agent}` (an `http` hook: the event as the
//! body, the answer as the response's).
//!
//! A `PreToolUse` call of a tool the agent lists goes through the gate and is answered with its
//! `permissionDecision`; a `PostToolUse` (or `PostToolUseFailure`) reports what the claimed
//! call did. A tool the agent does not list passes through: no answer.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::auth::Authenticate;
use super::error::ApiError;
use super::extract::Caller;
use super::gate::{MAX_WAIT, wait_value};
use super::waiting::WaitPlace;
use crate::domain::args::canonical;
use crate::domain::identity::Identity;
use crate::domain::ids::AgentName;
use crate::domain::run::GateVia;
use crate::engine::{CallState, CallStatus, Engine, EngineError, GateCall, Reported};

/// Who claims the calls handed to Claude Code, and reports on them: one name for every hook,
/// command or http, and the gateway's permission prompt tool, so a repeated `PreToolUse` and
/// the `PostToolUse` after it are that claimant.
pub const CLAIMANT: &str = "claude-code hook";

/// The largest hook event read, by the command and over http: a tool's input up to the gate's
/// 32 KiB and, after the call, what it returned (an Edit's holds the whole file it changed),
/// which the audit keeps cut as every result is.
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// The fields of a hook's input the hook reads; the others (`transcript_path`, `cwd`,
/// `permission_mode`, …) are ignored.
#[derive(Debug, Deserialize)]
struct HookInput {
    hook_event_name: String,
    session_id: String,
    tool_name: String,
    tool_input: Value,
    tool_use_id: Option<String>,
    /// `PostToolUse`: what the tool returned.
    #[serde(default)]
    tool_response: Value,
    /// `PostToolUseFailure`: why the tool failed.
    #[serde(default)]
    error: Value,
}

/// One hook event.
#[derive(Debug)]
pub enum Event {
    PreToolUse(ToolCall),
    /// What running the call did: succeeded (`PostToolUse`) or failed (`PostToolUseFailure`).
    PostToolUse(ToolCall, Reported),
}

/// The call an event is about.
#[derive(Debug)]
pub struct ToolCall {
    session_id: String,
    tool_name: String,
    tool_input: Value,
    /// Claude Code's `tool_use_id`, or one derived from the call when the input has none.
    call_id: String,
}

/// The hook's answer when nobody decided in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Claude Code asks its user.
    Ask,
    /// A headless `claude -p` session stops, to be resumed once it is decided.
    Defer,
}

impl std::str::FromStr for OnTimeout {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "ask" => Ok(Self::Ask),
            "defer" => Ok(Self::Defer),
            other => Err(format!("{other:?} is not ask or defer")),
        }
    }
}

/// Why a hook could not answer an event.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The input is not a tool event the hook answers: nothing was stored.
    #[error("{0}")]
    Input(String),
    /// The agent runs the tool itself, so Claude Code may not.
    #[error(
        "agent {agent} runs {tool} itself; Claude Code's hook needs tools its caller runs \
         (executor = \"caller\")"
    )]
    NotCallerRun { agent: AgentName, tool: String },
    /// The engine failed on the way to a decision.
    #[error("Countersign could not decide: {0}")]
    Undecided(#[from] EngineError),
}

/// Reads one hook event: bad JSON, a missing field or an event the hook does not answer is
/// refused before anything is stored.
pub fn read_event(text: &[u8]) -> Result<Event, HookError> {
    let input: HookInput = serde_json::from_slice(text).map_err(|e| {
        HookError::Input(format!(
            "the hook's input is not a Claude Code tool event: {e}"
        ))
    })?;
    let call_id = match input.tool_use_id.clone() {
        Some(id) => id,
        None => derived_call_id(&input),
    };
    let call = ToolCall {
        session_id: input.session_id,
        tool_name: input.tool_name,
        tool_input: input.tool_input,
        call_id,
    };
    match input.hook_event_name.as_str() {
        "PreToolUse" => Ok(Event::PreToolUse(call)),
        "PostToolUse" => Ok(Event::PostToolUse(
            call,
            Reported {
                succeeded: true,
                result: input.tool_response,
            },
        )),
        "PostToolUseFailure" => Ok(Event::PostToolUse(
            call,
            Reported {
                succeeded: false,
                result: input.error,
            },
        )),
        other => Err(HookError::Input(format!(
            "Countersign's Claude Code hook answers PreToolUse, PostToolUse and \
             PostToolUseFailure, not {other:?}"
        ))),
    }
}

/// A call id for an input without `tool_use_id`: the hash of its session, tool and input, so
/// the same call in the same session is the same call (and attaches), and nothing else is.
fn derived_call_id(input: &HookInput) -> String {
    let call = json!({
        "session_id": input.session_id,
        "tool_name": input.tool_name,
        "tool_input": input.tool_input,
    });
    let hash = hex::encode(Sha256::digest(canonical(&call).as_bytes()));
    format!("derived-{}", &hash[..40])
}

/// How a hook waits for a person: at most `wait`, in a slot of `place`, then `on_timeout`.
#[derive(Debug, Clone)]
pub struct Waiting {
    pub wait: Duration,
    pub on_timeout: OnTimeout,
    pub place: WaitPlace,
}

/// Answers one event for `who`, under `agent`'s policy: the JSON to answer with, or `None` for
/// no answer.
pub async fn answer(
    engine: &Engine,
    who: &Identity,
    agent: &AgentName,
    event: Event,
    waiting: &Waiting,
) -> Result<Option<Value>, HookError> {
    let definition = engine.agent(&who.tenant, agent)?;
    let (call, reported) = match event {
        Event::PreToolUse(call) => (call, None),
        Event::PostToolUse(call, reported) => (call, Some(reported)),
    };
    // Claude Code goes on as it would without the hook.
    if definition.tools.get(&call.tool_name).is_none() {
        return Ok(None);
    }
    if definition.caller_lease(&call.tool_name).is_none() {
        return Err(HookError::NotCallerRun {
            agent: agent.clone(),
            tool: call.tool_name,
        });
    }
    match reported {
        None => {
            let gate = GateCall {
                call_id: Some(call.call_id),
                conversation: Some(call.session_id),
                ..GateCall::asked_by(
                    who,
                    agent.clone(),
                    GateVia::Api,
                    call.tool_name,
                    call.tool_input,
                )
            };
            pre_tool_use(engine, who, gate, waiting).await.map(Some)
        }
        Some(reported) => {
            post_tool_use(engine, who, agent, &call.call_id, reported).await?;
            Ok(None)
        }
    }
}

/// Proposes the call, waits for its decision up to the wait, and answers it.
async fn pre_tool_use(
    engine: &Engine,
    who: &Identity,
    call: GateCall,
    waiting: &Waiting,
) -> Result<Value, HookError> {
    let tenant = call.tenant.clone();
    let mut state = engine.gate_call(call).await?;
    let mut waited = Duration::ZERO;
    // A call already handed over runs in Claude Code: nothing to wait for.
    if state.status.is_pending() && state.claim.is_none() {
        match waiting.place.take(who) {
            Ok(_slot) => {
                state = engine
                    .wait_for_call(&tenant, &state.run_id, waiting.wait)
                    .await?;
                waited = waiting.wait;
            }
            Err(refused) => tracing::info!(%refused, "wait refused; answered at once"),
        }
    }
    Ok(match settle(engine, who, state).await? {
        Verdict::Allow { reason, input } => decision("allow", &reason, input),
        Verdict::Deny(reason) => decision("deny", &reason, None),
        Verdict::Undecided(state) => {
            let (word, what) = match waiting.on_timeout {
                OnTimeout::Ask => ("ask", "asking here instead"),
                OnTimeout::Defer => ("defer", "deferred: resume the session once it is decided"),
            };
            decision(word, &not_decided(&state, waited, what), None)
        }
    })
}

/// What Claude Code is told of a call it asked to run, once waited on.
#[derive(Debug)]
pub enum Verdict {
    /// Run it, with `input` (the approved version's arguments): claimed, handed over once.
    Allow {
        reason: String,
        input: Option<Value>,
    },
    /// Do not run it, for this reason.
    Deny(String),
    /// Nobody decided yet.
    Undecided(Box<CallState>),
}

/// The verdict on a call as it stands after the wait: an approved call not yet handed over is
/// claimed for Claude Code, so it is handed over once.
pub async fn settle(
    engine: &Engine,
    who: &Identity,
    state: CallState,
) -> Result<Verdict, EngineError> {
    if state.status == CallStatus::Approved && state.claim.is_none() {
        let state = engine.claim_call(who, &state.run_id, CLAIMANT).await?;
        let reason = format!(
            "Countersign: approved; handed to Claude Code once as {}",
            state.key().unwrap_or_default()
        );
        let input = state.args.as_ref().map(|a| a.as_value());
        return Ok(Verdict::Allow { reason, input });
    }
    if state.status.is_pending() && state.claim.is_none() {
        return Ok(Verdict::Undecided(Box::new(state)));
    }
    Ok(Verdict::Deny(refused(&state)))
}

/// Why a call that waits on a person was not decided in time, with where to decide it.
pub fn not_decided(state: &CallState, waited: Duration, what: &str) -> String {
    let on = match &state.approval {
        Some(approval) => format!(
            " on approval {} ({} decides, until {})",
            approval.id,
            approval.approver_role,
            approval
                .expires_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
        None => String::new(),
    };
    format!(
        "Countersign: no decision within {}{on}; {what}",
        humantime::format_duration(waited)
    )
}

/// Why a call is not allowed: the reviewer's or the policy's words, or that it was already
/// handed to Claude Code once.
fn refused(state: &CallState) -> String {
    if state.claim.is_some() || matches!(state.status, CallStatus::Succeeded | CallStatus::Failed) {
        return format!(
            "Countersign: this call ({}) was already handed to Claude Code once; it does not \
             run twice.",
            state.call_id.as_deref().unwrap_or_default()
        );
    }
    match &state.result {
        Some(told) => format!("Countersign: {}", told.content),
        None => format!("Countersign: the call is {}", state.status),
    }
}

/// A `PreToolUse` answer, as the hooks reference shapes it (the tests with the real `claude` CLI
/// hold it to what Claude Code reads).
pub fn decision(word: &str, reason: &str, updated_input: Option<Value>) -> Value {
    let mut output = json!({
        "hookEventName": "PreToolUse",
        "permissionDecision": word,
        "permissionDecisionReason": reason,
    });
    if let Some(input) = updated_input {
        output["updatedInput"] = input;
    }
    json!({ "hookSpecificOutput": output })
}

/// A `PreToolUse` answer that blocks the call because the hook could not decide it.
pub fn blocked(error: &HookError) -> Value {
    decision("deny", &error.to_string(), None)
}

/// Reports what running a claimed call did. A call the hook never handed over (Claude Code ran
/// it after asking its user, or it was never proposed) has nothing to report: logged.
async fn post_tool_use(
    engine: &Engine,
    who: &Identity,
    agent: &AgentName,
    call_id: &str,
    reported: Reported,
) -> Result<(), HookError> {
    let Some(run) = engine.call_named(&who.tenant, agent, call_id).await? else {
        tracing::warn!(call_id, "no such call was proposed; nothing to report");
        return Ok(());
    };
    let state = engine.call_state(&who.tenant, &run).await?;
    if state.claim.is_none() {
        tracing::warn!(
            call_id,
            status = %state.status,
            "the call was not handed to Claude Code by Countersign; its outcome is not recorded"
        );
        return Ok(());
    }
    engine.report_outcome(who, &run, CLAIMANT, reported).await?;
    Ok(())
}

#[derive(Clone)]
struct HookState {
    engine: Arc<Engine>,
    auth: Arc<dyn Authenticate>,
}

impl axum::extract::FromRef<HookState> for Arc<dyn Authenticate> {
    fn from_ref(state: &HookState) -> Self {
        state.auth.clone()
    }
}

/// `POST /hooks/claude-code/{agent}`: Claude Code's `http` hook.
pub fn routes(engine: Arc<Engine>, auth: Arc<dyn Authenticate>) -> Router {
    Router::new()
        .route("/hooks/claude-code/{agent}", post(http_hook))
        .layer(DefaultBodyLimit::max(MAX_EVENT_BYTES))
        .with_state(HookState { engine, auth })
}

/// The query of `POST /hooks/claude-code/{agent}`: how long to wait, and the answer after.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HookQuery {
    wait: Option<String>,
    on_timeout: Option<OnTimeout>,
}

/// Answers the event in the body for the token's person, as the command hook does: 200 with
/// the answer, or with an empty body for no answer. Claude Code takes any other status as a
/// non-blocking error and goes on, so a `PreToolUse` the hook cannot decide is answered
/// 200 `deny`; input that is not a tool event is a 400.
async fn http_hook(
    State(state): State<HookState>,
    Caller(who): Caller,
    Path(agent): Path<String>,
    waiting: Waiting,
    body: Bytes,
) -> Result<Response, ApiError> {
    let agent = AgentName::parse(&agent)
        .map_err(|e| ApiError::bad_request("invalid_field", format!("agent: {e}")))?;
    let event = read_event(&body).map_err(refusal)?;
    let pre_tool_use = matches!(event, Event::PreToolUse(_));
    // Taken to the end even if Claude Code goes away meanwhile: a call is never left half
    // taken (claimed, and the answer that hands it over lost with the task).
    let engine = state.engine.clone();
    let answered =
        tokio::spawn(async move { answer(&engine, &who, &agent, event, &waiting).await })
            .await
            .map_err(|e| ApiError::from(EngineError::Unavailable(e.to_string())))?;
    match answered {
        Ok(Some(answer)) => Ok(axum::Json(answer).into_response()),
        Ok(None) => Ok(().into_response()),
        Err(error) if pre_tool_use => Ok(axum::Json(blocked(&error)).into_response()),
        Err(error) => Err(refusal(error)),
    }
}

/// A hook error as the API answers it.
fn refusal(error: HookError) -> ApiError {
    match error {
        HookError::Input(message) => ApiError::bad_request("hook_event", message),
        HookError::NotCallerRun { .. } => {
            ApiError::bad_request("not_caller_run", error.to_string())
        }
        HookError::Undecided(error) => error.into(),
    }
}

/// The wait and the answer after it, from the query: `wait` in seconds or as a duration, at
/// most the gate's long-poll (25 s, under API Gateway's 30), and `on_timeout`, `ask` unless
/// told; the wait taken in one of the server's waiting slots.
impl<S: Send + Sync> FromRequestParts<S> for Waiting {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let asked: HookQuery = serde_urlencoded::from_str(parts.uri.query().unwrap_or_default())
            .map_err(|e| ApiError::bad_request("invalid_field", format!("the query: {e}")))?;
        Ok(Waiting {
            wait: asked
                .wait
                .as_deref()
                .map(wait_value)
                .transpose()?
                .unwrap_or(MAX_WAIT),
            on_timeout: asked.on_timeout.unwrap_or(OnTimeout::Ask),
            place: WaitPlace::of(&parts.extensions),
        })
    }
}
