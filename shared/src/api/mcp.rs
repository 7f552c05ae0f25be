//! The MCP gateway: Countersign as an MCP server in front of one agent's tools, for an agent
//! Countersign does not drive (Claude Code, Cursor, an SDK's MCP client).
//!
//! - `tools/list` lists the agent's tools (HTTP, upstream MCP, built-in; not the ones their
//!   caller runs, which only the gate API's callers claim) with their
//!   descriptions, input schemas and, where the tool says it reads only or destroys, annotations;
//!   where some are run by their caller, the gateway's own [`PERMISSION_PROMPT`] tool, for
//!   Claude Code's `--permission-prompt-tool`.
//! - `tools/call` is one call through the gate ([`Engine::gate_call`]): the agent's schema,
//!   policy, approvals and execution, as the one action of a run of its own. A call that waits
//!   on a person is waited on up to [`Settings::wait`] (the caller may shorten it), with progress
//!   notifications when the caller gave a progress token; then its state is answered in words a
//!   model acts on. A repeated identical call attaches to a first that went to a person: never
//!   a second approval, never a second execution; one policy ruled on alone is ruled on and
//!   run again.
//!
//! Served over stdio by `countersign mcp` (one agent, one person: [`Gateway::for_caller`]) and
//! over Streamable HTTP at `/mcp/{agent}` ([`routes`]), stateless and answered in JSON where no
//! progress is sent, behind the API's bearer authentication: the token's person asks, in the
//! token's tenant. A request refused before the protocol takes it is answered as every route
//! refuses, `{"error": {"code", "message"}}`.
//!
//! A caller may put in the request's `_meta`: [`CALL_ID_META`], its own id for the call (a
//! repeated call with the same id attaches for good; the same id with another tool or other
//! arguments is refused); [`WAIT_META`],
//! a shorter wait in seconds. Every answer's `_meta` says where the call stands
//! (`countersign/status`, `countersign/run_id`, and the action, version and approval).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use reqwest::Url;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ContentBlock,
    Implementation, JsonObject, ListToolsResult, MetaObject, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken, ServerCapabilities, ServerConfig, Tool as Listed,
    ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::DecideState;
use super::auth::Authenticate;
use super::claude_code::{self, Verdict};
use super::error::ApiError;
use super::extract::{Caller, body_bytes, parse_json};
use super::waiting::WaitPlace;
use crate::adapters::webhook::review_link;
use crate::domain::action::NotExecuted;
use crate::domain::approval::Approval;
use crate::domain::identity::Identity;
use crate::domain::ids::AgentName;
use crate::domain::policy::ToolHints;
use crate::domain::run::GateVia;
use crate::engine::{Agent, CallState, CallStatus, Engine, EngineError, ErrorKind, GateCall};
use crate::ports::model::ToolSpec;

/// The `_meta` key of the caller's own id for a call: the same id again is the same call.
pub const CALL_ID_META: &str = "countersign/call_id";
/// The `_meta` key of how long, in seconds, the caller will wait for a decision this time;
/// longer than the gateway's wait counts as the gateway's.
pub const WAIT_META: &str = "countersign/wait_seconds";
/// How long a call that waits on a person is held open by default: well under the time-outs
/// of common MCP clients.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(45);
/// The largest `/mcp` request body: a call's arguments may be up to 32 KiB (the engine answers
/// a larger one "too large" in its own words), with room for the JSON-RPC around them.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The gateway's own tool for `claude -p --permission-prompt-tool mcp__<server>__permission_prompt`,
/// listed beside an agent's tools when some are run by their caller: it takes the call Claude
/// Code asks permission for (`tool_name`, `input`, `tool_use_id`) through the gate, and answers
/// `{"behavior": "allow", "updatedInput": …}` or `{"behavior": "deny", "message": …}`.
pub const PERMISSION_PROMPT: &str = "permission_prompt";
/// How often a waiting call tells a caller with a progress token that it still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What a gateway needs besides the engine.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The longest a call that waits on a person is held open (in AWS, under API Gateway's 30 s).
    pub wait: Duration,
    /// The review page's public address: a waiting call links to its approval there.
    pub public_url: Option<Url>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            wait: DEFAULT_WAIT,
            public_url: None,
        }
    }
}

/// Who calls through the gateway, and whose tools they get.
#[derive(Debug, Clone)]
pub struct McpCaller {
    pub who: Identity,
    pub agent: AgentName,
}

/// The MCP server of one agent's tools.
#[derive(Clone)]
pub struct Gateway {
    engine: Arc<Engine>,
    settings: Settings,
    /// Over stdio: the one caller. Over HTTP: none, each request carries its authenticated
    /// caller in its extensions.
    caller: Option<McpCaller>,
}

/// Why the stdio server could not run.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the MCP server over stdio stopped: {0}")]
pub struct ServeError(String);

impl Gateway {
    /// The gateway of one caller (the stdio server: one agent, one person).
    pub fn for_caller(engine: Arc<Engine>, settings: Settings, caller: McpCaller) -> Self {
        Self {
            engine,
            settings,
            caller: Some(caller),
        }
    }

    /// Serves MCP over this process's stdin and stdout until the client closes them.
    pub async fn serve_stdio(self) -> Result<(), ServeError> {
        let running = self
            .serve(rmcp::transport::stdio_pipes())
            .await
            .map_err(|e| ServeError(e.to_string()))?;
        running
            .waiting()
            .await
            .map(|_| ())
            .map_err(|e| ServeError(e.to_string()))
    }

    fn caller(&self, context: &RequestContext<RoleServer>) -> Result<McpCaller, ErrorData> {
        if let Some(caller) = &self.caller {
            return Ok(caller.clone());
        }
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<McpCaller>())
            .cloned()
            .ok_or_else(|| {
                ErrorData::internal_error("the request has no authenticated caller", None)
            })
    }

    fn agent(&self, caller: &McpCaller) -> Result<Arc<Agent>, ErrorData> {
        self.engine
            .agent(&caller.who.tenant, &caller.agent)
            .cloned()
            .map_err(|e| ErrorData::invalid_params(e.to_string(), None))
    }

    /// Waits while the call waits on a person or runs, until `deadline`, the caller going
    /// away, or the call settling; tells a caller with a progress token every so often. The
    /// wait takes one of the server's waiting slots: past the caller's share of them, the call
    /// is answered at once, as it stands.
    async fn wait(
        &self,
        caller: &McpCaller,
        mut state: CallState,
        started: Instant,
        deadline: Instant,
        progress: Option<ProgressToken>,
        context: &RequestContext<RoleServer>,
    ) -> CallState {
        let attached = state.attached;
        if !state.status.is_pending() || Instant::now() >= deadline {
            return state;
        }
        let place = context
            .extensions
            .get::<axum::http::request::Parts>()
            .map(|parts| WaitPlace::of(&parts.extensions))
            .unwrap_or_default();
        let _slot = match place.take(&caller.who) {
            Ok(slot) => slot,
            Err(refused) => {
                tracing::info!(%refused, "wait refused; answered at once");
                return state;
            }
        };
        while state.status.is_pending() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if let Some(token) = &progress {
                let told =
                    ProgressNotificationParam::new(token.clone(), (now - started).as_secs_f64())
                        .with_total((deadline - started).as_secs_f64())
                        .with_message(progress_line(&state));
                if let Err(error) = context.peer.notify_progress(told).await {
                    tracing::debug!(%error, "progress not sent");
                }
            }
            let slice = (deadline - now).min(PROGRESS_EVERY);
            let read = tokio::select! {
                read = self.engine.wait_for_call(&caller.who.tenant, &state.run_id, slice) => read,
                () = context.ct.cancelled() => break,
            };
            match read {
                Ok(read) => state = read,
                Err(error) => {
                    tracing::warn!(%error, run = %state.run_id, "cannot read the call's state");
                    break;
                }
            }
        }
        state.attached = attached;
        state
    }
}

/// What Claude Code's permission prompt tool is given.
#[derive(Debug, serde::Deserialize)]
struct PermissionAsked {
    tool_name: String,
    input: Value,
    tool_use_id: Option<String>,
}

impl Gateway {
    /// The permission prompt tool: the call Claude Code asks about, through the gate for the
    /// caller, waited on as any call, and answered allow (claimed, with the approved input) or
    /// deny (with the reason, also when nobody decided in time or it cannot be decided). A tool
    /// the agent does not list as its caller's is denied: the prompt tool must answer, and a
    /// gate that cannot rule never allows.
    async fn permission_prompt(
        &self,
        caller: &McpCaller,
        request: CallToolRequestParams,
        started: Instant,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let asked: PermissionAsked =
            serde_json::from_value(Value::Object(request.arguments.clone().unwrap_or_default()))
                .map_err(|e| {
                    ErrorData::invalid_params(format!("{PERMISSION_PROMPT}: {e}"), None)
                })?;
        let wait = Asked::read(&request, context)?
            .wait
            .map_or(self.settings.wait, |w| w.min(self.settings.wait));
        let agent = self.agent(caller)?;
        let behavior = match agent.caller_lease(&asked.tool_name) {
            None => json!({"behavior": "deny", "message": format!(
                "Countersign: agent {} has no tool {} that Claude Code runs; it is not allowed here",
                agent.name, asked.tool_name
            )}),
            Some(_) => {
                let verdict = self
                    .permission_verdict(caller, &request, asked, started, wait, context)
                    .await;
                match verdict {
                    Ok(Verdict::Allow { input, .. }) => {
                        json!({"behavior": "allow", "updatedInput": input})
                    }
                    Ok(Verdict::Deny(reason)) => json!({"behavior": "deny", "message": reason}),
                    Ok(Verdict::Undecided(state)) => {
                        let waited = Duration::from_secs(started.elapsed().as_secs()).min(wait);
                        let what = "denied for now: ask again with the same tool_use_id once it is decided";
                        json!({"behavior": "deny", "message": claude_code::not_decided(&state, waited, what)})
                    }
                    Err(error) => json!({"behavior": "deny", "message": format!(
                        "Countersign could not decide: {error}"
                    )}),
                }
            }
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(behavior.to_string())]).into())
    }

    /// The asked call through the gate, waited on up to the gateway's wait, and settled.
    async fn permission_verdict(
        &self,
        caller: &McpCaller,
        request: &CallToolRequestParams,
        asked: PermissionAsked,
        started: Instant,
        wait: Duration,
        context: &RequestContext<RoleServer>,
    ) -> Result<Verdict, EngineError> {
        let call = GateCall {
            call_id: asked.tool_use_id,
            // A call Claude Code runs itself once allowed: taken as the gate API's callers'
            // are, to be claimed.
            ..GateCall::asked_by(
                &caller.who,
                caller.agent.clone(),
                GateVia::Api,
                asked.tool_name,
                asked.input,
            )
        };
        let mut state = self.engine.gate_call_to_the_end(call).await?;
        // A call already handed over runs in Claude Code: nothing to wait for.
        if state.claim.is_none() {
            let progress = progress_token(request, context);
            let deadline = started + wait;
            state = self
                .wait(caller, state, started, deadline, progress, context)
                .await;
        }
        claude_code::settle(&self.engine, &caller.who, state).await
    }
}

/// Whether the permission prompt tool is listed for `agent`: where some of its tools are run by
/// their caller, and no tool of its own has the name.
fn prompts_for_permission(agent: &Agent) -> bool {
    agent.tools.get(PERMISSION_PROMPT).is_none()
        && agent
            .tools
            .specs()
            .iter()
            .any(|spec| agent.caller_lease(&spec.name).is_some())
}

/// The permission prompt tool as `tools/list` gives it.
fn permission_prompt_tool() -> Listed {
    let schema = json!({
        "type": "object",
        "required": ["tool_name", "input"],
        "properties": {
            "tool_name": {"type": "string", "description": "The tool Claude Code asks to run."},
            "input": {"type": "object", "description": "The input it would run it with."},
            "tool_use_id": {"type": "string", "description": "Claude Code's id of the call."},
        },
    });
    let Value::Object(schema) = schema else {
        unreachable!("an object")
    };
    Listed::new(
        PERMISSION_PROMPT,
        "Claude Code's permission prompt (--permission-prompt-tool): the call goes through \
         Countersign's policy and, where it says so, a person; the answer is allow with the \
         approved input, or deny with the reason.",
        schema,
    )
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "countersign",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let caller = self.caller(&context)?;
        let agent = self.agent(&caller)?;
        agent.tools.prepare().await.map_err(|e| {
            ErrorData::internal_error(
                format!(
                    "the tools of agent {} cannot be listed now: {e}",
                    agent.name
                ),
                None,
            )
        })?;
        let mut tools = listing(&agent);
        if prompts_for_permission(&agent) {
            tools.push(permission_prompt_tool());
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let started = Instant::now();
        let caller = self.caller(&context)?;
        if request.name == PERMISSION_PROMPT && prompts_for_permission(&*self.agent(&caller)?) {
            return self
                .permission_prompt(&caller, request, started, &context)
                .await;
        }
        let asked = Asked::read(&request, &context)?;
        let progress = progress_token(&request, &context);
        let named = asked.call_id.is_some();
        let call = GateCall {
            call_id: asked.call_id,
            ..GateCall::asked_by(
                &caller.who,
                caller.agent.clone(),
                GateVia::Mcp,
                request.name.to_string(),
                Value::Object(request.arguments.unwrap_or_default()),
            )
        };
        let state = match self.engine.gate_call_to_the_end(call).await {
            Ok(state) => state,
            Err(error) => return not_taken(error).map(Into::into),
        };
        let wait = asked
            .wait
            .map_or(self.settings.wait, |w| w.min(self.settings.wait));
        let state = self
            .wait(&caller, state, started, started + wait, progress, &context)
            .await;
        let link = self.settings.public_url.as_ref();
        Ok(answer(&state, link, named, self.engine.now()).into())
    }
}

const INSTRUCTIONS: &str = "Countersign stands between you and these tools: policy decides \
     whether a call runs at once, is refused, or waits for a person's approval. A call that \
     waits returns at once saying so: nothing has run, and calling the same tool with the same \
     arguments again returns its outcome, never running it twice. A call that was rejected, \
     expired or cancelled did not run: do not retry it.";

/// Added to the description of a tool whose calls a person may have to approve.
const MAY_WAIT: &str = "Through Countersign, a person may have to approve a call of this tool \
     before it runs: such a call says so and who must approve, and the same call made again \
     returns its outcome.";

/// What the caller asked for besides the call, from the request's `_meta`.
#[derive(Debug, PartialEq)]
struct Asked {
    call_id: Option<String>,
    wait: Option<Duration>,
}

impl Asked {
    /// From the `_meta` objects the request carries, the first that has a key answering.
    fn from_meta(metas: &[&JsonObject]) -> Result<Self, ErrorData> {
        let field = |key: &str| metas.iter().find_map(|meta| meta.get(key));
        let call_id = match field(CALL_ID_META) {
            None => None,
            Some(Value::String(id)) => Some(id.clone()),
            Some(_) => {
                return Err(ErrorData::invalid_params(
                    format!("_meta.{CALL_ID_META} must be a string"),
                    None,
                ));
            }
        };
        let wait = field(WAIT_META)
            .map(|seconds| {
                seconds
                    .as_f64()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| {
                        ErrorData::invalid_params(
                            format!("_meta.{WAIT_META} must be a number of seconds, 0 or more"),
                            None,
                        )
                    })
            })
            .transpose()?;
        Ok(Self { call_id, wait })
    }

    fn read(
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<Self, ErrorData> {
        let mut metas = vec![&context.meta.0.0];
        metas.extend(request.meta.as_ref().map(|meta| &meta.0.0));
        Self::from_meta(&metas)
    }
}

/// The caller's progress token, if it gave one.
fn progress_token(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Option<ProgressToken> {
    context
        .meta
        .get_progress_token()
        .or_else(|| request.meta.as_ref()?.get_progress_token())
}

/// What a caller with a progress token is told while its call waits.
fn progress_line(state: &CallState) -> String {
    match &state.approval {
        Some(approval) => format!(
            "waiting for approval by a person of role {} ({})",
            approval.approver_role, approval.id
        ),
        None => "the call is being carried out".to_string(),
    }
}

/// The agent's tools as an MCP client lists them: all but the ones their caller runs, which
/// only a caller of the gate API can claim.
fn listing(agent: &Agent) -> Vec<Listed> {
    agent
        .tools
        .specs()
        .iter()
        .filter(|spec| agent.caller_lease(&spec.name).is_none())
        .map(|spec| {
            let hints = agent
                .tools
                .get(&spec.name)
                .map(|tool| tool.hints())
                .unwrap_or_default();
            let may_wait = agent.policy.may_need_a_person(&spec.name, hints);
            listed(spec.clone(), hints, may_wait)
        })
        .collect()
}

fn listed(spec: ToolSpec, hints: ToolHints, may_wait: bool) -> Listed {
    let description = match (spec.description.trim(), may_wait) {
        ("", true) => MAY_WAIT.to_string(),
        (text, true) => format!("{text}\n\n{MAY_WAIT}"),
        (text, false) => text.to_string(),
    };
    let schema: JsonObject = match spec.input_schema {
        Value::Object(schema) => schema,
        _ => JsonObject::from_iter([("type".to_string(), json!("object"))]),
    };
    let tool = Listed::new(spec.name, description, schema);
    match hints {
        ToolHints {
            read_only: false,
            destructive: false,
        } => tool,
        ToolHints {
            read_only,
            destructive,
        } => tool.annotate(
            ToolAnnotations::new()
                .read_only(read_only && !destructive)
                .destructive(destructive),
        ),
    }
}

/// A call the engine could not take: bad input is the caller's error; anything else is told
/// to the model, which may try the same call again later.
fn not_taken(error: EngineError) -> Result<CallToolResult, ErrorData> {
    if let EngineError::TooManyOpenApprovals { requester, limit } = &error {
        // Nobody was asked: a plain answer the model acts on, as a refusal is.
        let told = NotExecuted::NotProposed {
            requester,
            limit: *limit,
        }
        .told();
        let meta = json!({"countersign/status": CallStatus::Refused});
        let Value::Object(meta) = meta else {
            unreachable!("an object")
        };
        return Ok(
            CallToolResult::error(vec![ContentBlock::text(told)]).with_meta(Some(MetaObject(meta)))
        );
    }
    match error.kind() {
        _ if matches!(error, EngineError::Gate(_)) => {
            Err(ErrorData::invalid_params(error.to_string(), None))
        }
        ErrorKind::BadInput | ErrorKind::NotFound => {
            Err(ErrorData::invalid_params(error.to_string(), None))
        }
        _ => {
            tracing::warn!(%error, "the gateway could not take a call");
            Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                "Countersign could not take this call now: {error}. Try the same call again \
                 later: if it was taken, the same call returns its outcome and never runs it \
                 twice."
            ))]))
        }
    }
}

/// What the caller is told of a call: its result, why it did not run, or what it waits on.
fn answer(
    state: &CallState,
    link: Option<&Url>,
    named: bool,
    now: DateTime<Utc>,
) -> CallToolResult {
    // As stored, to the last newline: a tool's text is handed on as the tool gave it.
    let told = state
        .result
        .as_ref()
        .map(|r| r.content.as_str())
        .filter(|t| !t.trim().is_empty());
    let again = again_words(named, state.attachable);
    let (text, is_error) = match state.status {
        CallStatus::Succeeded => (ran(state, told.unwrap_or("(no result)")), false),
        CallStatus::Failed | CallStatus::Denied | CallStatus::Refused => (
            told.map_or_else(
                || format!("Not executed: the call was {}.", word(state.status)),
                str::to_string,
            ),
            true,
        ),
        CallStatus::Rejected | CallStatus::Expired | CallStatus::Cancelled => {
            let told = told.map_or_else(
                || format!("Not executed: the call was {}.", word(state.status)),
                str::to_string,
            );
            (final_word(told), false)
        }
        CallStatus::Unknown => (
            format!(
                "{} {again}",
                told.unwrap_or(crate::domain::action::UNKNOWN_TEXT)
            ),
            false,
        ),
        CallStatus::AwaitingApproval => match &state.approval {
            Some(approval) => (waiting(approval, link, &again, now), false),
            None => (
                format!("Nothing has run yet: the call waits for a decision. {again}"),
                false,
            ),
        },
        // Only a caller of the gate API claims a call it runs itself; never reached here.
        CallStatus::Approved => (
            format!("Approved, for its caller to claim and run through the gate API. {again}"),
            false,
        ),
        CallStatus::Running => (
            format!(
                "Not finished yet: the call is being carried out and its outcome is not known \
                 yet. {again}"
            ),
            false,
        ),
    };
    // A call that ran an MCP server's tool answers as that server did: its blocks and its
    // structured content, as they were stored.
    let upstream = match state.status {
        CallStatus::Succeeded | CallStatus::Failed => {
            state.result.as_ref().and_then(|r| r.mcp.as_ref())
        }
        _ => None,
    };
    let content = match upstream.and_then(|mcp| mcp.content.as_ref()) {
        Some(blocks) => changed(state)
            .filter(|_| state.status == CallStatus::Succeeded)
            .map(ContentBlock::text)
            .into_iter()
            .chain(blocks.iter().map(block_of))
            .collect(),
        None => vec![ContentBlock::text(text)],
    };
    let mut result = match is_error {
        true => CallToolResult::error(content),
        false => CallToolResult::success(content),
    };
    result.structured_content = upstream.and_then(|mcp| mcp.structured_content.clone());
    result.with_meta(Some(meta_of(state, link)))
}

/// A stored MCP content block as the client gets it: as the server sent it, or, should a block
/// no longer read as one, its JSON as text.
fn block_of(block: &Value) -> ContentBlock {
    serde_json::from_value(block.clone()).unwrap_or_else(|_| ContentBlock::text(block.to_string()))
}

/// How a repeated call finds this one, or that it would not: a call policy ruled on alone,
/// made again without a call id, is ruled on and run again.
fn again_words(named: bool, attachable: bool) -> String {
    match (named, attachable) {
        (true, _) => {
            "Calling again with the same call id returns its outcome and never runs it twice."
                .into()
        }
        (false, true) => "Calling the same tool with the same arguments again returns its \
                          outcome and never runs it twice."
            .into(),
        (false, false) => "Calling the same tool with the same arguments again is a new call: \
                           policy rules on it and it runs again."
            .into(),
    }
}

fn word(status: CallStatus) -> String {
    json!(status).as_str().unwrap_or_default().replace('_', " ")
}

/// A call that ran: its result, and where a reviewer changed it, which version ran with what.
fn ran(state: &CallState, result: &str) -> String {
    match changed(state) {
        Some(changed) => format!("{changed} {result}"),
        None => result.to_string(),
    }
}

/// What a call a reviewer changed says before its result: which version ran, with what.
fn changed(state: &CallState) -> Option<String> {
    match (state.version, &state.args) {
        (Some(version), Some(args)) if version > 1 => Some(format!(
            "A reviewer changed this call before it ran: it ran as version {version}, with the \
             arguments {}. Its result:",
            args.canonical()
        )),
        _ => None,
    }
}

/// A refusal as a plain answer that ends with "do not retry".
fn final_word(told: String) -> String {
    match told.ends_with(NotExecuted::DO_NOT_RETRY.trim()) {
        true => told,
        false => format!("{told}{}", NotExecuted::DO_NOT_RETRY),
    }
}

/// What a call waiting on people is told: nothing ran, who must approve, by when, and how to
/// get the outcome.
fn waiting(approval: &Approval, link: Option<&Url>, again: &str, now: DateTime<Utc>) -> String {
    let mut roles = vec![approval.approver_role.to_string()];
    roles.extend(approval.escalated_to.iter().map(|r| r.to_string()));
    let who = match approval.quorum {
        0 | 1 => format!("a person of role {}", roles.join(" or ")),
        n => format!("{n} people of role {}", roles.join(" or ")),
    };
    let place = match link {
        Some(url) => format!(
            "approval {}, {}",
            approval.id,
            review_link(url, &approval.id)
        ),
        None => format!("approval {}", approval.id),
    };
    format!(
        "Nothing has run yet: this call waits for approval by {who} ({place}), by {} ({}). \
         Why: {} {again} Tell the user it waits for approval; do not try to do it another way.",
        approval.expires_at.format("%Y-%m-%d %H:%M UTC"),
        time_left(approval.expires_at - now),
        sentence(&approval.reason),
    )
}

fn sentence(text: &str) -> String {
    let text = text.trim();
    match text.ends_with(['.', '!', '?']) {
        true => text.to_string(),
        false => format!("{text}."),
    }
}

/// How long until a deadline, as a person says it.
fn time_left(left: chrono::Duration) -> String {
    let minutes = left.num_minutes();
    match minutes {
        _ if left <= chrono::Duration::zero() => "its deadline has passed".to_string(),
        0 => "in under a minute".to_string(),
        1 => "in 1 minute".to_string(),
        2..120 => format!("in {minutes} minutes"),
        120..2880 => format!("in {} hours", minutes / 60),
        _ => format!("in {} days", minutes / 1440),
    }
}

/// Where the call stands, for programs: the answer's `_meta`.
fn meta_of(state: &CallState, link: Option<&Url>) -> MetaObject {
    let mut meta = json!({
        "countersign/status": state.status,
        "countersign/run_id": state.run_id,
        "countersign/attached": state.attached,
    });
    if let Some(action) = &state.action_id {
        meta["countersign/action_id"] = json!(action);
        meta["countersign/version"] = json!(state.version);
    }
    if let Some(approval) = &state.approval {
        meta["countersign/approval_id"] = json!(approval.id);
        meta["countersign/approver_role"] = json!(approval.approver_role);
        meta["countersign/expires_at"] = json!(approval.expires_at);
        if let Some(url) = link {
            meta["countersign/approval_url"] = json!(review_link(url, &approval.id));
        }
    }
    let Value::Object(meta) = meta else {
        unreachable!("an object")
    };
    MetaObject(meta)
}

/// `/mcp/{agent}`: MCP over Streamable HTTP for the named agent's tools, stateless (no
/// session, so any instance serves any request), answered in JSON unless progress is sent.
pub fn routes(engine: Arc<Engine>, auth: Arc<dyn Authenticate>, settings: Settings) -> Router {
    let service = StreamableHttpService::new(
        {
            let engine = engine.clone();
            move || {
                Ok(Gateway {
                    engine: engine.clone(),
                    settings: settings.clone(),
                    caller: None,
                })
            }
        },
        Arc::new(NeverSessionManager::default()),
        StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .with_max_request_body_bytes(MAX_BODY_BYTES)
            // A bearer token, never a cookie, names the caller: a page on a rebound host name
            // has none to send.
            .disable_allowed_hosts(),
    );
    Router::new()
        .route_service("/mcp/{agent}", service)
        .route_layer(middleware::from_fn_with_state(
            DecideState { engine, auth },
            admit,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// Lets a request through to the MCP server once its caller is authenticated, its agent is
/// loaded (both put in its extensions), and it is one the transport takes: every refusal is
/// the API's `{"error": {"code", "message"}}`, as on every other route. A JSON-RPC error that
/// answers a request the transport took is left as it is.
async fn admit(
    State(state): State<DecideState>,
    Path(agent): Path<String>,
    Caller(who): Caller,
    request: Request,
    next: Next,
) -> Result<Response, Response> {
    let agent = AgentName::parse(&agent)
        .map_err(|e| ApiError::bad_request("bad_id", e.to_string()).into_response())?;
    state
        .engine
        .agent(&who.tenant, &agent)
        .map_err(|e| ApiError::from(e).into_response())?;
    let mut request = taken(request).await?;
    request.extensions_mut().insert(McpCaller { who, agent });
    Ok(in_the_apis_words(next.run(request).await).await)
}

/// `request` as the Streamable HTTP transport takes it (a POST of one JSON-RPC message in
/// JSON), its body read; else why not. The transport checks the rest (`Accept`, say).
async fn taken(request: Request) -> Result<Request, Response> {
    if request.method() != Method::POST {
        let mut refused = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!(
                "{} takes POST only: the MCP gateway keeps no session and opens no stream to \
                 the client",
                request.uri().path()
            ),
        )
        .into_response();
        refused
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return Err(refused);
    }
    let json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(ApiError::bad_request(
            "bad_content_type",
            "send the body as JSON, with Content-Type: application/json",
        )
        .into_response());
    }
    let (parts, body) = request.into_parts();
    let bytes = body_bytes(
        Request::from_parts(parts.clone(), body),
        &(),
        MAX_BODY_BYTES,
    )
    .await
    .map_err(IntoResponse::into_response)?;
    let message: Value = parse_json(&bytes).map_err(IntoResponse::into_response)?;
    if let Err(error) = serde_json::from_value::<ClientJsonRpcMessage>(message) {
        return Err(ApiError::bad_request(
            "not_json_rpc",
            format!("the body is not a JSON-RPC message of the MCP protocol: {error}"),
        )
        .into_response());
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// A refusal the transport answers in plain text (an `Accept` without both media types, an
/// `MCP-Protocol-Version` it does not know), in the API's words: its status, a code, its text.
async fn in_the_apis_words(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), MAX_BODY_BYTES)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_string())
        .unwrap_or_default();
    match status {
        StatusCode::NOT_ACCEPTABLE => ApiError::new(status, "not_acceptable", text),
        _ if status.is_server_error() => {
            tracing::error!(%status, text, "the MCP transport failed");
            ApiError::new(
                status,
                "unavailable",
                "the service cannot complete this now; try again later",
            )
        }
        _ => ApiError::new(status, "bad_mcp_request", text),
    }
    .into_response()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::domain::action::{ProposedCall, UNKNOWN_TEXT};
    use crate::domain::approval::Asking;
    use crate::domain::args::Args;
    use crate::domain::conversation::{McpResult, ToolResultText};
    use crate::domain::ids::{ActionId, ActionVersion, PersonId, Role, RunId, TenantId};
    use crate::domain::policy::Requirement;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 5, 4, 9, 0, 0).unwrap()
    }

    fn refund(cents: i64) -> Args {
        Args::new(json!({"order_id": "ord_55", "amount_cents": cents})).unwrap()
    }

    fn call(status: CallStatus, result: Option<ToolResultText>) -> CallState {
        CallState {
            run_id: RunId::parse("run-7k2").unwrap(),
            agent: AgentName::parse("refunds").unwrap(),
            call_id: None,
            conversation: None,
            status,
            tool: "issue_refund".into(),
            action_id: Some(ActionId::parse("act-9x4").unwrap()),
            version: Some(1),
            args: Some(refund(12_500)),
            result,
            approval: None,
            executor: crate::engine::Executor::Countersign,
            claim: None,
            attached: false,
            attachable: true,
            rules: Vec::new(),
        }
    }

    fn approval(quorum: u8) -> Approval {
        let proposed = ProposedCall {
            agent: AgentName::parse("refunds").unwrap(),
            id: ActionId::parse("act-9x4").unwrap(),
            version: ActionVersion::FIRST,
            tenant: TenantId::parse("acme").unwrap(),
            run_id: RunId::parse("run-7k2").unwrap(),
            tool_use_id: "gate_run-7k2".into(),
            tool: "issue_refund".into(),
            args: refund(12_500),
            explanation: String::new(),
            rules: Vec::new(),
            log_only: None,
        };
        let requirement = Requirement {
            reason: "Refunds above USD 100 need a finance manager".into(),
            approver_role: Role::parse("finance_manager").unwrap(),
            quorum,
            ttl: std::time::Duration::from_secs(1800),
            escalate: Vec::new(),
            also: Vec::new(),
        };
        let asking = Asking {
            agent: AgentName::parse("refunds").unwrap(),
            hints: ToolHints::default(),
            requested_by: vec![PersonId::parse("sam").unwrap()],
            standing: None,
            policy_version: 1,
            opened_at: now(),
            expires_at: now() + chrono::Duration::minutes(30),
        };
        Approval::open(proposed, &requirement, asking)
    }

    fn waiting_on(quorum: u8) -> CallState {
        CallState {
            approval: Some(approval(quorum)),
            ..call(CallStatus::AwaitingApproval, None)
        }
    }

    fn text(result: &CallToolResult) -> &str {
        result.content[0]
            .as_text()
            .map(|t| t.text.as_str())
            .unwrap()
    }

    fn meta(result: &CallToolResult, key: &str) -> Value {
        result.meta.as_ref().unwrap().0[key].clone()
    }

    #[test]
    fn a_call_that_ran_answers_the_tools_result_as_it_is() {
        let ran = call(
            CallStatus::Succeeded,
            Some(ToolResultText::ok(r#"{"refund_id":"re_1"}"#)),
        );

        let answered = answer(&ran, None, false, now());

        assert_eq!(answered.is_error, Some(false));
        assert_eq!(text(&answered), r#"{"refund_id":"re_1"}"#);
        assert_eq!(meta(&answered, "countersign/status"), "succeeded");
        assert_eq!(meta(&answered, "countersign/action_id"), "act-9x4");
        assert_eq!(meta(&answered, "countersign/version"), 1);
    }

    /// What the orders server's MCP tool gave back: a line, a receipt image, and the refund.
    fn upstream(is_error: bool) -> ToolResultText {
        ToolResultText {
            content: "stored text".into(),
            is_error,
            mcp: Some(McpResult {
                content: Some(vec![
                    json!({"type": "text", "text": "Refunded."}),
                    json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}),
                ]),
                structured_content: Some(json!({"refund_id": "re_1"})),
            }),
        }
    }

    fn blocks(result: &CallToolResult) -> Value {
        serde_json::to_value(&result.content).unwrap()
    }

    #[test]
    fn a_call_that_ran_an_mcp_tool_answers_its_blocks_and_structured_content_as_the_server_gave_them()
     {
        let ran = call(CallStatus::Succeeded, Some(upstream(false)));
        let failed = call(CallStatus::Failed, Some(upstream(true)));

        let answered = answer(&ran, None, false, now());
        let refused = answer(&failed, None, false, now());

        assert_eq!(answered.is_error, Some(false));
        assert_eq!(
            blocks(&answered),
            json!([
                {"type": "text", "text": "Refunded."},
                {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
            ])
        );
        assert_eq!(
            answered.structured_content,
            Some(json!({"refund_id": "re_1"}))
        );
        assert_eq!(meta(&answered, "countersign/status"), "succeeded");
        assert_eq!(refused.is_error, Some(true));
        assert_eq!(blocks(&refused), blocks(&answered));
        assert_eq!(refused.structured_content, answered.structured_content);
    }

    #[test]
    fn an_mcp_call_a_reviewer_changed_says_so_in_a_block_before_the_servers() {
        let lowered = CallState {
            version: Some(2),
            args: Some(refund(7_500)),
            ..call(CallStatus::Succeeded, Some(upstream(false)))
        };

        let answered = answer(&lowered, None, false, now());

        assert_eq!(
            text(&answered),
            "A reviewer changed this call before it ran: it ran as version 2, with the \
             arguments {\"amount_cents\":7500,\"order_id\":\"ord_55\"}. Its result:"
        );
        assert_eq!(answered.content.len(), 3);
        assert_eq!(
            answered.structured_content,
            Some(json!({"refund_id": "re_1"}))
        );
    }

    #[test]
    fn a_call_a_reviewer_lowered_says_it_ran_as_version_2_with_the_lowered_arguments() {
        let lowered = CallState {
            version: Some(2),
            args: Some(refund(7_500)),
            ..call(
                CallStatus::Succeeded,
                Some(ToolResultText::ok(r#"{"refund_id":"re_2"}"#)),
            )
        };

        let answered = answer(&lowered, None, false, now());

        assert_eq!(answered.is_error, Some(false));
        assert_eq!(
            text(&answered),
            "A reviewer changed this call before it ran: it ran as version 2, with the \
             arguments {\"amount_cents\":7500,\"order_id\":\"ord_55\"}. Its result: \
             {\"refund_id\":\"re_2\"}"
        );
        assert_eq!(meta(&answered, "countersign/version"), 2);
    }

    #[test]
    fn a_failed_denied_or_refused_call_is_a_tool_error_with_what_the_engine_told() {
        let told = [
            (
                CallStatus::Failed,
                "The call failed: 422 order ord_42 is fully refunded",
            ),
            (
                CallStatus::Denied,
                "Not executed: policy denies this call (refunds are closed). Do not retry it.",
            ),
            (
                CallStatus::Refused,
                "Not executed: the arguments do not match the tool's schema.",
            ),
        ];
        for (status, words) in told {
            let answered = answer(
                &call(status, Some(ToolResultText::error(words))),
                None,
                false,
                now(),
            );

            assert_eq!(answered.is_error, Some(true), "{status:?}");
            assert_eq!(text(&answered), words);
        }
    }

    #[test]
    fn a_rejected_expired_or_cancelled_call_is_a_plain_answer_that_it_did_not_run_and_not_to_retry()
    {
        let rejected = NotExecuted::Rejected {
            by: "mia",
            reason: "Damage covers the jug only",
        }
        .told();
        let expired = NotExecuted::Expired {
            deadline: "2026-05-04T09:30:00Z",
        }
        .told();
        let cancelled = NotExecuted::Cancelled { by: "sam" }.told();
        let told = [
            (CallStatus::Rejected, rejected.clone(), rejected),
            (CallStatus::Expired, expired.clone(), expired),
            (
                CallStatus::Cancelled,
                cancelled,
                "Not executed: sam cancelled the run. Do not retry it.".to_string(),
            ),
        ];
        for (status, words, expected) in told {
            let answered = answer(
                &call(status, Some(ToolResultText::ok(words))),
                None,
                false,
                now(),
            );

            assert_eq!(answered.is_error, Some(false), "{status:?}");
            assert_eq!(text(&answered), expected);
            assert!(text(&answered).starts_with("Not executed: "));
        }
    }

    #[test]
    fn an_unknown_outcome_is_a_plain_answer_that_it_may_have_taken_effect_and_is_reconciled() {
        let unknown = call(
            CallStatus::Unknown,
            Some(ToolResultText::error(UNKNOWN_TEXT)),
        );

        let answered = answer(&unknown, None, false, now());

        assert_eq!(answered.is_error, Some(false));
        assert_eq!(
            text(&answered),
            format!(
                "{UNKNOWN_TEXT} Calling the same tool with the same arguments again returns its \
                 outcome and never runs it twice."
            )
        );
    }

    #[test]
    fn a_waiting_call_says_nothing_ran_who_must_approve_where_by_when_and_how_to_get_the_outcome() {
        let link = Url::parse("https://review.example.com/").unwrap();

        let waiting = waiting_on(1);
        let id = waiting.approval.clone().unwrap().id;

        let answered = answer(&waiting, Some(&link), false, now());

        assert_eq!(answered.is_error, Some(false));
        assert_eq!(
            text(&answered),
            format!(
                "Nothing has run yet: this call waits for approval by a person of role \
                 finance_manager (approval {id}, https://review.example.com/#approval={id}), by \
                 2026-05-04 09:30 UTC (in 30 minutes). Why: Refunds above USD 100 need a finance \
                 manager. Calling the same tool with the same arguments again returns its outcome \
                 and never runs it twice. Tell the user it waits for approval; do not try to do it \
                 another way."
            )
        );
        assert_eq!(meta(&answered, "countersign/status"), "awaiting_approval");
        assert_eq!(meta(&answered, "countersign/approval_id"), json!(id));
        assert_eq!(
            meta(&answered, "countersign/approval_url"),
            format!("https://review.example.com/#approval={id}")
        );
        assert_eq!(
            meta(&answered, "countersign/approver_role"),
            "finance_manager"
        );
    }

    #[test]
    fn a_waiting_call_without_a_public_address_names_its_approval_and_a_quorum_in_people() {
        let answered = answer(&waiting_on(2), None, true, now());

        let text = text(&answered);
        assert!(
            text.contains("by 2 people of role finance_manager (approval ap-"),
            "{text}"
        );
        assert!(!text.contains("http"), "{text}");
        assert!(
            text.contains(
                "Calling again with the same call id returns its outcome and never runs it twice."
            ),
            "{text}"
        );
        assert!(
            answered
                .meta
                .as_ref()
                .unwrap()
                .0
                .get("countersign/approval_url")
                .is_none()
        );
    }

    #[test]
    fn a_call_policy_ruled_on_alone_says_the_same_call_again_runs_again() {
        let allowed = CallState {
            attachable: false,
            ..call(CallStatus::Running, None)
        };

        let answered = answer(&allowed, None, false, now());

        assert!(
            text(&answered).ends_with(
                "Calling the same tool with the same arguments again is a new call: policy \
                 rules on it and it runs again."
            ),
            "{}",
            text(&answered)
        );
    }

    #[test]
    fn a_call_still_being_carried_out_says_its_outcome_is_not_known_yet() {
        let answered = answer(&call(CallStatus::Running, None), None, false, now());

        assert_eq!(answered.is_error, Some(false));
        assert!(text(&answered).starts_with("Not finished yet: "));
        assert!(text(&answered).contains("never runs it twice"));
    }

    #[test]
    fn the_time_left_reads_as_a_person_says_it() {
        let minutes = chrono::Duration::minutes;
        assert_eq!(time_left(minutes(-1)), "its deadline has passed");
        assert_eq!(
            time_left(chrono::Duration::seconds(40)),
            "in under a minute"
        );
        assert_eq!(time_left(minutes(1)), "in 1 minute");
        assert_eq!(time_left(minutes(119)), "in 119 minutes");
        assert_eq!(time_left(minutes(300)), "in 5 hours");
        assert_eq!(time_left(minutes(3 * 1440)), "in 3 days");
    }

    #[test]
    fn a_tool_is_listed_with_its_schema_its_hints_as_annotations_and_a_word_when_it_may_wait() {
        let spec = |schema| ToolSpec {
            name: "write_file".into(),
            description: "Writes a file.".into(),
            input_schema: schema,
        };
        let destructive = ToolHints {
            read_only: false,
            destructive: true,
        };

        let gated = listed(spec(json!({"type": "object"})), destructive, true);
        let plain = listed(spec(json!(true)), ToolHints::default(), false);

        assert_eq!(
            gated.description.as_deref(),
            Some(format!("Writes a file.\n\n{MAY_WAIT}").as_str())
        );
        let annotations = gated.annotations.unwrap();
        assert_eq!(annotations.destructive_hint, Some(true));
        assert_eq!(annotations.read_only_hint, Some(false));
        assert_eq!(plain.description.as_deref(), Some("Writes a file."));
        assert!(plain.annotations.is_none());
        assert_eq!(
            Value::Object((*plain.input_schema).clone()),
            json!({"type": "object"})
        );
    }

    #[test]
    fn the_callers_id_and_wait_come_from_meta_and_a_wrong_one_is_refused() {
        let meta = |value: Value| value.as_object().unwrap().clone();
        let context = meta(json!({"countersign/call_id": "toolu_01", "progressToken": 3}));
        let params = meta(json!({"countersign/call_id": "other", "countersign/wait_seconds": 2.5}));

        let asked = Asked::from_meta(&[&context, &params]).unwrap();

        assert_eq!(
            asked,
            Asked {
                call_id: Some("toolu_01".into()),
                wait: Some(Duration::from_millis(2500)),
            }
        );
        for wrong in [
            json!({"countersign/call_id": 7}),
            json!({"countersign/wait_seconds": -1}),
            json!({"countersign/wait_seconds": "soon"}),
        ] {
            let error = Asked::from_meta(&[&meta(wrong.clone())]).unwrap_err();
            assert_eq!(
                error.code,
                rmcp::model::ErrorCode::INVALID_PARAMS,
                "{wrong}"
            );
        }
        assert_eq!(
            Asked::from_meta(&[]).unwrap(),
            Asked {
                call_id: None,
                wait: None
            }
        );
    }
}
