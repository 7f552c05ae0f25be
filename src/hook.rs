//! `countersign hook claude-code`: Claude Code's command hook (docs/claude-code.md). It reads one
//! hook event's JSON on stdin and answers on stdout as Claude Code's hooks reference defines it:
//! a `PreToolUse` call of a tool the agent lists goes through the gate and is answered with its
//! `permissionDecision`; a `PostToolUse` (or `PostToolUseFailure`) reports what the claimed call
//! did. A tool the agent does not list passes through: no output, exit 0.
//!
//! Every failure exits 2, which Claude Code takes as a blocking error (for `PreToolUse`, the
//! call does not run and stderr is fed back to Claude): a gate that cannot decide never allows.

use std::io::Read;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use shared::domain::args::canonical;
use shared::domain::identity::Identity;
use shared::domain::run::GateVia;
use shared::engine::{CallState, CallStatus, EngineError, GateCall, Reported};

use crate::cli::{ClaudeCodeHook, OnTimeout};
use crate::fail::Failure;
use crate::local::Local;

/// Who claims the calls the hook hands to Claude Code, and reports on them: one name for every
/// hook process, so a repeated `PreToolUse` and the `PostToolUse` after it are that claimant.
pub const CLAIMANT: &str = "claude-code hook";

/// The largest hook input read from stdin: a tool's input up to the gate's 32 KiB, with room.
const MAX_INPUT_BYTES: u64 = 1024 * 1024;

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

/// One hook event, as read from stdin.
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

/// A hook failure: exit 2, so Claude Code blocks the call and shows Claude the message.
fn blocking(message: impl Into<String>) -> Failure {
    Failure {
        code: "hook",
        message: message.into(),
        exit: 2,
    }
}

/// The engine failed on the way to a decision: blocking, so the call does not run.
fn undecided(error: EngineError) -> Failure {
    blocking(format!("Countersign could not decide: {error}"))
}

/// Reads one hook event from `stdin`: bad JSON, a missing field or an event the hook does not
/// answer is refused before anything is stored.
pub fn read_event(stdin: impl Read) -> Result<Event, Failure> {
    let mut text = String::new();
    stdin
        .take(MAX_INPUT_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| blocking(format!("cannot read the hook's input on stdin: {e}")))?;
    let input: HookInput = serde_json::from_str(&text).map_err(|e| {
        blocking(format!(
            "the hook's input on stdin is not a Claude Code tool event: {e}"
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
        other => Err(blocking(format!(
            "countersign hook claude-code answers PreToolUse, PostToolUse and \
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

/// Answers one event: the JSON to print on stdout, or `None` for no output.
pub async fn answer(
    local: &Local,
    options: &ClaudeCodeHook,
    event: Event,
) -> Result<Option<Value>, Failure> {
    let who = local
        .identify(&options.person)
        .map_err(|f| blocking(f.message))?;
    let agent = crate::agent_named(&options.agent).map_err(|f| blocking(f.message))?;
    local
        .loaded(&who.tenant, &agent)
        .map_err(|f| blocking(f.message))?;
    let definition = local.engine.agent(&who.tenant, &agent).map_err(undecided)?;
    let (call, reported) = match event {
        Event::PreToolUse(call) => (call, None),
        Event::PostToolUse(call, reported) => (call, Some(reported)),
    };
    // Claude Code goes on as it would without the hook.
    if definition.tools.get(&call.tool_name).is_none() {
        return Ok(None);
    }
    if definition.caller_lease(&call.tool_name).is_none() {
        return Err(blocking(format!(
            "agent {agent} runs {} itself; Claude Code's hook needs tools its caller runs \
             (executor = \"caller\")",
            call.tool_name
        )));
    }
    match reported {
        None => {
            let gate = GateCall {
                tenant: who.tenant.clone(),
                agent,
                requested_by: who.person.clone(),
                tool: call.tool_name,
                args: call.tool_input,
                call_id: Some(call.call_id),
                conversation: Some(call.session_id),
                via: GateVia::Api,
                standing: who.standing(),
            };
            pre_tool_use(local, &who, gate, options).await.map(Some)
        }
        Some(reported) => {
            post_tool_use(local, &who, &agent, &call.call_id, reported).await?;
            Ok(None)
        }
    }
}

/// Proposes the call, waits for its decision up to `--wait`, and answers it.
async fn pre_tool_use(
    local: &Local,
    who: &Identity,
    call: GateCall,
    options: &ClaudeCodeHook,
) -> Result<Value, Failure> {
    let tenant = call.tenant.clone();
    let mut state = local.engine.gate_call(call).await.map_err(undecided)?;
    // A call already handed over runs in Claude Code: nothing to wait for.
    if state.status.is_pending() && state.claim.is_none() {
        state = local
            .engine
            .wait_for_call(&tenant, &state.run_id, options.wait)
            .await
            .map_err(undecided)?;
    }
    if state.status == CallStatus::Approved && state.claim.is_none() {
        state = local
            .engine
            .claim_call(who, &state.run_id, CLAIMANT)
            .await
            .map_err(undecided)?;
        let reason = format!(
            "Countersign: approved; handed to Claude Code once as {}",
            state.key().unwrap_or_default()
        );
        let input = state.args.as_ref().map(|a| a.as_value());
        return Ok(decision("allow", &reason, input));
    }
    if state.status.is_pending() && state.claim.is_none() {
        let (word, what) = match options.on_timeout {
            OnTimeout::Ask => ("ask", "asking here instead"),
            OnTimeout::Defer => ("defer", "deferred: resume the session once it is decided"),
        };
        return Ok(decision(word, &waiting(&state, options.wait, what), None));
    }
    Ok(decision("deny", &refused(&state), None))
}

/// Why a call that waits on a person was not decided in time, with where to decide it.
fn waiting(state: &CallState, wait: Duration, what: &str) -> String {
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
        humantime::format_duration(wait)
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

/// A `PreToolUse` answer, as the hooks reference shapes it.
fn decision(word: &str, reason: &str, updated_input: Option<Value>) -> Value {
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

/// Reports what running a claimed call did. A call the hook never handed over (Claude Code ran
/// it after asking its user, or it was never proposed) has nothing to report: said on stderr.
async fn post_tool_use(
    local: &Local,
    who: &Identity,
    agent: &shared::domain::ids::AgentName,
    call_id: &str,
    reported: Reported,
) -> Result<(), Failure> {
    let Some(run) = local
        .engine
        .call_named(&who.tenant, agent, call_id)
        .await
        .map_err(undecided)?
    else {
        eprintln!("countersign hook: no call {call_id} was proposed; nothing to report");
        return Ok(());
    };
    let state = local
        .engine
        .call_state(&who.tenant, &run)
        .await
        .map_err(undecided)?;
    if state.claim.is_none() {
        eprintln!(
            "countersign hook: call {call_id} was not handed to Claude Code by Countersign \
             (it is {}); its outcome is not recorded",
            state.status
        );
        return Ok(());
    }
    local
        .engine
        .report_outcome(who, &run, CLAIMANT, reported)
        .await
        .map_err(undecided)?;
    Ok(())
}
