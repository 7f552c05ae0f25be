//! The gate: one call proposed by an agent Countersign does not drive (an MCP client through the
//! gateway, an agent with its own loop through the gate API). The call becomes the one action
//! of a run of its own, through the same path as a model's call ([`Engine::propose_one`]): the
//! tool's schema, the agent's policy, approvals, versions, edits, expiry, escalation, audit and
//! the recovery owner work unchanged. No model drives the run: it ends with its call's outcome.
//!
//! A repeated identical call finds the first by its key and may attach to it: never a second
//! approval, never a second execution. The key is the caller's own id for the call when it
//! gives one (attachable for good), else who asks which agent for which tool with which
//! arguments. A call known by its arguments is attachable while policy has not ruled on it yet,
//! and once it went to a person, while it is open and for [`ATTACHABLE`] after its outcome; a
//! call policy ruled on alone (allowed, denied) or refused is never attached by its arguments:
//! an identical call takes its key and is ruled on and run again, so a read is never answered
//! from an earlier one.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tracing::Instrument;

use super::drive::{Paused, Proposed};
use super::records::{Outgoing, Stored, Tx, keys, load};
use super::tally::Tally;
use super::{Agent, Engine, EngineError, History};
use crate::domain::action::{Action, ActionStatus, CallerClaim};
use crate::domain::approval::{Approval, ApprovalKind, ApprovalStatus};
use crate::domain::args::{Args, canonical};
use crate::domain::budget;
use crate::domain::conversation::{Block, Message, Speaker, ToolResultText};
use crate::domain::gate::GateRefusal;
use crate::domain::identity::{Identity, Standing};
use crate::domain::ids::{ActionId, AgentName, PersonId, RunId, TenantId};
use crate::domain::names::shown_by_serde_name;
use crate::domain::run::{GateOrigin, GateVia, HeldCall, Run, RunStatus};
use crate::ports::store::{Condition, StoreError};

/// How long after its outcome a call known by its arguments that went to a person stays
/// attachable: an identical call within it returns that outcome; one after it is a new call.
pub const ATTACHABLE: Duration = Duration::hours(24);

/// How often a waiter reads its call again, for changes made by another process that the
/// store cannot tell it of cheaply (DynamoDB), or that a busy store has not yet shown it.
pub const REREAD: StdDuration = StdDuration::from_secs(1);

/// The longest a caller's own id for a call, or its conversation's, may be.
const MAX_CALL_ID: usize = 200;

/// One call from outside, as its caller proposes it.
#[derive(Debug, Clone)]
pub struct GateCall {
    pub tenant: TenantId,
    pub agent: AgentName,
    /// Who asks, from authentication: never an approver of the call.
    pub requested_by: PersonId,
    pub tool: String,
    pub args: Value,
    /// The caller's own id for this call (its framework's tool-call id), if it has one.
    pub call_id: Option<String>,
    /// The caller's conversation or thread, shown to reviewers beside the call.
    pub conversation: Option<String>,
    pub via: GateVia,
    /// What authentication said of who asks, as policy rules read it.
    pub standing: Standing,
}

impl GateCall {
    /// `who` asks `agent` for `tool` with `args`, through `via`: a call with no id of its
    /// caller's and no conversation, until they are given.
    pub fn asked_by(
        who: &Identity,
        agent: AgentName,
        via: GateVia,
        tool: String,
        args: Value,
    ) -> Self {
        Self {
            tenant: who.tenant.clone(),
            agent,
            requested_by: who.person.clone(),
            tool,
            args,
            call_id: None,
            conversation: None,
            via,
            standing: who.standing(),
        }
    }
}

/// Where a call stands, as its caller reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// Taken, not yet ruled on or not yet run.
    Running,
    AwaitingApproval,
    Succeeded,
    Failed,
    /// It may have taken effect: reconciled with the tool, or answered by the recovery owner.
    Unknown,
    Rejected,
    Expired,
    Cancelled,
    /// Approved (by a person or by policy), for its caller to claim and run; not claimed yet.
    Approved,
    /// Policy denies it.
    Denied,
    /// Answered before policy ruled on it: no such tool, or arguments that do not fit.
    Refused,
}

shown_by_serde_name!(CallStatus);

impl CallStatus {
    /// Nothing more will happen to the call.
    pub fn is_settled(self) -> bool {
        !matches!(
            self,
            CallStatus::Running | CallStatus::AwaitingApproval | CallStatus::Unknown
        )
    }

    /// Worth waiting on: a person has not decided, or the call is being carried out.
    pub fn is_pending(self) -> bool {
        matches!(self, CallStatus::Running | CallStatus::AwaitingApproval)
    }
}

/// A call's state: what its caller is told.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallState {
    pub run_id: RunId,
    pub agent: AgentName,
    /// The caller's own id for the call, and its conversation, when it gave them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    pub status: CallStatus,
    pub tool: String,
    /// The action, once proposed, and the version that ran or waits (an edit makes version 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action_id: Option<ActionId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// The exact arguments of that version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<Args>,
    /// What the caller's agent is told of the call: the tool's result, or why it did not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<ToolResultText>,
    /// The approval it waits on: who must decide, by when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
    /// Who runs it: Countersign, or its caller under a claim.
    pub executor: Executor,
    /// The caller's claim, once claimed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<CallerClaim>,
    /// This call found an earlier identical one and is its state.
    pub attached: bool,
    /// An identical call made now would attach to this one; else it is ruled on and run again.
    #[serde(skip)]
    pub attachable: bool,
    /// The policy rules that decided the version that ran or waits, by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
}

/// Who runs a call once it is approved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Executor {
    /// A tool bound in the definition, run here.
    Countersign,
    /// A tool marked `executor = "caller"`, run by the caller after it claims the call.
    Caller,
}

/// The item that finds a call by its key: which run holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CallKeyed {
    run_id: RunId,
}

impl CallState {
    /// The idempotency key the version runs under, `action_id:version`.
    pub fn key(&self) -> Option<String> {
        Some(format!("{}:{}", self.action_id.as_ref()?, self.version?))
    }
}

impl GateCall {
    /// The hash of what the call asks for, its tool and arguments: the same call id with
    /// another is another call.
    fn asked(&self) -> String {
        let asked = serde_json::json!({"tool": self.tool, "args": self.args});
        hex::encode(Sha256::digest(canonical(&asked).as_bytes()))
    }

    /// The key a repeated identical call finds this one by: the caller's own id for it, or the
    /// hash of who asks which agent for which tool with which arguments.
    fn key(&self) -> Result<String, EngineError> {
        let named = match &self.call_id {
            Some(id) if id.is_empty() || id.len() > MAX_CALL_ID => {
                return Err(EngineError::BadInput(format!(
                    "a call id has 1 to {MAX_CALL_ID} characters"
                )));
            }
            Some(id) => named_by_id(&self.agent, id),
            None => serde_json::json!({
                "agent": self.agent.as_str(),
                "requested_by": self.requested_by.as_str(),
                "tool": self.tool,
                "args": self.args,
            }),
        };
        if let Some(conversation) = &self.conversation
            && (conversation.is_empty() || conversation.len() > MAX_CALL_ID)
        {
            return Err(EngineError::BadInput(format!(
                "a conversation id has 1 to {MAX_CALL_ID} characters"
            )));
        }
        let kind = if self.call_id.is_some() { "id" } else { "args" };
        Ok(hashed_key(kind, &named))
    }
}

/// What names a call its caller gave an id: the agent and that id.
fn named_by_id(agent: &AgentName, call_id: &str) -> Value {
    serde_json::json!({"agent": agent.as_str(), "call_id": call_id})
}

/// A call's key: its kind (`id`, `args`) and the hash of what names it.
fn hashed_key(kind: &str, named: &Value) -> String {
    let hash = hex::encode(Sha256::digest(canonical(named).as_bytes()));
    format!("{kind}-{}", &hash[..40])
}

impl Engine {
    /// [`Engine::gate_call`] on a task of its own, taken to the end even if its caller goes
    /// away meanwhile: a call is never left half taken (a tool claimed and its outcome not
    /// written). It logs in its caller's span.
    pub async fn gate_call_to_the_end(
        self: &Arc<Self>,
        call: GateCall,
    ) -> Result<CallState, EngineError> {
        let engine = self.clone();
        let taking = async move { engine.gate_call(call).await };
        tokio::spawn(taking.instrument(tracing::Span::current()))
            .await
            .map_err(|e| EngineError::Unavailable(format!("the call was lost: {e}")))?
    }

    /// Takes one call from outside: attaches to an earlier identical call, or makes it the one
    /// action of a new run and takes it through policy as a model's call is. Returns its state
    /// once it is settled or waits on a person; [`Engine::call_state`] reads it again later.
    pub async fn gate_call(&self, call: GateCall) -> Result<CallState, EngineError> {
        let span = tracing::info_span!(
            "gate",
            tenant = %call.tenant,
            agent = %call.agent,
            tool = %call.tool,
            run_id = tracing::field::Empty,
            action_id = tracing::field::Empty,
            approval_id = tracing::field::Empty,
        );
        self.take_call(call).instrument(span).await
    }

    /// [`Engine::gate_call`], in its span: the ids are recorded in it as they are known.
    async fn take_call(&self, call: GateCall) -> Result<CallState, EngineError> {
        let span = tracing::Span::current();
        let agent = self.agent(&call.tenant, &call.agent)?.clone();
        agent.runs_here()?;
        agent.list_tools().await?;
        let key = call.key()?;
        let (pk, sk) = (keys::call_pk(&call.tenant, &key), keys::CALL_SK.to_string());
        let keyed = load::<CallKeyed>(self.store.as_ref(), &pk, &sk).await?;
        let replaces = match &keyed {
            Some(keyed) => {
                span.record("run_id", tracing::field::display(&keyed.value.run_id));
                match self.attachable(&call, &keyed.value.run_id).await? {
                    Some(Attached::Unproposed(run)) => {
                        return self.propose_call(&agent, &call, *run, (pk, sk)).await;
                    }
                    Some(Attached::State(state)) => return Ok(*state),
                    None => Some(keyed.ver),
                }
            }
            None => None,
        };

        let now = self.now();
        // A reviewer reads the caller's conversation where they read what the run is for.
        let conversation = call
            .conversation
            .as_ref()
            .map(|c| format!(" (conversation {c})"))
            .unwrap_or_default();
        let task = format!(
            "{} through the {}{conversation}: {}",
            call.tool,
            match call.via {
                GateVia::Mcp => "MCP gateway",
                GateVia::Api => "gate API",
            },
            clipped(&canonical(&call.args), 400)
        );
        let mut run = Run::start(
            RunId::generate(),
            call.tenant.clone(),
            call.agent.clone(),
            call.requested_by.clone(),
            None,
            &task,
            agent.policy.version,
            now,
        );
        span.record("run_id", tracing::field::display(&run.id));
        run.standing = call.standing.clone();
        run.gate = Some(GateOrigin {
            via: call.via,
            call_key: key,
            call_id: call.call_id.clone(),
            conversation: call.conversation.clone(),
            asked: Some(call.asked()),
        });
        let (tool_use, _) = tool_use(&call, &run.id);
        run.messages.push(Message {
            role: Speaker::Assistant,
            content: vec![tool_use],
        });
        let mut run = Stored { value: run, ver: 0 };

        let mut tx = Tx::new();
        tx.run(self.index_shards, &mut run);
        let keyed = CallKeyed {
            run_id: run.value.id.clone(),
        };
        match replaces {
            Some(ver) => tx.update(pk.clone(), sk.clone(), None, &keyed, ver),
            None => tx.create(pk.clone(), sk.clone(), None, &keyed),
        }
        let register = !self.is_registered(&call.tenant);
        if register {
            tx.upsert(
                keys::TENANTS_PK.into(),
                keys::tenant_sk(&call.tenant),
                &call.tenant,
            );
        }
        match self.commit(tx).await {
            Ok(_) => {}
            // An identical call made its run first: this one is that call.
            Err(StoreError::ConditionFailed { .. }) => {
                let keyed = load::<CallKeyed>(self.store.as_ref(), &pk, &sk)
                    .await?
                    .ok_or(EngineError::Contended)?;
                return self.attached_state(&call, &keyed.value.run_id).await;
            }
            Err(error) => return Err(error.into()),
        }
        run.written();
        if register {
            self.registered(&call.tenant);
        }
        self.propose_call(&agent, &call, run, (pk, sk)).await
    }

    /// Proposes the call its stored `run` holds, as its caller made it or, once that caller
    /// died before proposing it, as the caller's retry asks again. The action is named after
    /// its run, so of two processes proposing one call only one write lands: the other answers
    /// the state the first left.
    async fn propose_call(
        &self,
        agent: &Agent,
        call: &GateCall,
        run: Stored<Run>,
        key: (String, String),
    ) -> Result<CallState, EngineError> {
        let run_id = run.value.id.clone();
        match self.propose_stored(agent, call, run, key).await {
            Err(
                lost @ (EngineError::Store(StoreError::ConditionFailed { .. })
                | EngineError::RunFinished { .. }
                | EngineError::Contended),
            ) => {
                let state = self.attached_state(call, &run_id).await?;
                match state.status {
                    CallStatus::Running if state.action_id.is_none() => Err(lost),
                    _ => Ok(state),
                }
            }
            proposed => proposed,
        }
    }

    async fn propose_stored(
        &self,
        agent: &Agent,
        call: &GateCall,
        run: Stored<Run>,
        key: (String, String),
    ) -> Result<CallState, EngineError> {
        let (Block::ToolUse { id, input, .. }, oversized) = tool_use(call, &run.value.id) else {
            unreachable!("a tool use")
        };
        let held = HeldCall {
            tool_use_id: id,
            action_id: gate_action(&run.value.id),
            result: None,
        };
        // In the gate's span: the ids are recorded in it as they are known.
        let span = tracing::Span::current();
        span.record("action_id", tracing::field::display(&held.action_id));
        let proposed = Proposed {
            tool: call.tool.clone(),
            input,
            explanation: String::new(),
            oversized,
        };
        let mut tally = Tally::default();
        let (held, approval) = self
            .propose_one(agent, &run.value, held, proposed, &mut tally)
            .await?;
        if let Some(approval) = &approval {
            span.record("approval_id", tracing::field::display(&approval.id));
        }
        let run_id = run.value.id.clone();
        let outbox = match approval {
            None if held.result.is_some() => self.settle_call(run, held).await?,
            // Waits on a person; or, approved by policy for its caller to run, on the outcome
            // report.
            approval => match self
                .pause(
                    agent,
                    run,
                    vec![held],
                    approval.into_iter().collect(),
                    tally,
                )
                .await?
            {
                Paused::Waiting((_, outbox)) => outbox,
                Paused::NotProposed { run, calls } => {
                    return Err(self.not_proposed_call(*run, calls, key).await);
                }
                Paused::Settled { run, mut calls } => {
                    let held = calls.pop().expect("the call");
                    self.settle_call(*run, held).await?
                }
            },
        };
        self.deliver(outbox).await;
        self.call_state(&call.tenant, &run_id).await
    }

    /// Ends the run of a call settled without a person (it ran, or was refused) with its result.
    async fn settle_call(
        &self,
        mut run: Stored<Run>,
        held: HeldCall,
    ) -> Result<Outgoing, EngineError> {
        let result = held.result.expect("settled without a person");
        run.value
            .push_results(vec![result.clone().into_block(&held.tool_use_id)]);
        Ok(self.finish_run(run, result.content).await?.1)
    }

    /// Ends the run of a call that was not proposed (its requester has as many approvals open
    /// as one may) with what its caller is told, and forgets its key (`key`), so the same call
    /// made again once some have settled is proposed anew. The refusal to answer with.
    async fn not_proposed_call(
        &self,
        mut run: Stored<Run>,
        calls: Vec<HeldCall>,
        key: (String, String),
    ) -> EngineError {
        let requester = run.value.requested_by.to_string();
        let refused = EngineError::TooManyOpenApprovals {
            requester,
            limit: self.max_open_approvals,
        };
        let Some((told, tool_use_id)) = calls
            .into_iter()
            .find_map(|c| Some((c.result?, c.tool_use_id)))
        else {
            return refused;
        };
        run.value
            .push_results(vec![told.clone().into_block(&tool_use_id)]);
        let mut tx = Tx::new();
        tx.delete(key.0, key.1, Condition::Always);
        match self.finish_run_in(tx, run, told.content).await {
            Ok(_) => refused,
            Err(error) => error,
        }
    }

    /// The run of the call `agent`'s caller named `call_id`, if one was taken: a caller that
    /// reports on a call by its own id (a hook's PostToolUse) finds it without proposing it.
    pub async fn call_named(
        &self,
        tenant: &TenantId,
        agent: &AgentName,
        call_id: &str,
    ) -> Result<Option<RunId>, EngineError> {
        let pk = keys::call_pk(tenant, &hashed_key("id", &named_by_id(agent, call_id)));
        let keyed = load::<CallKeyed>(self.store.as_ref(), &pk, keys::CALL_SK).await?;
        Ok(keyed.map(|keyed| keyed.value.run_id))
    }

    /// The state of a call taken through the gate, by its run.
    pub async fn call_state(
        &self,
        tenant: &TenantId,
        run: &RunId,
    ) -> Result<CallState, EngineError> {
        let history = self.history(tenant, run).await?;
        if history.run.gate.is_none() {
            return Err(EngineError::not_found(format!("call {run}")));
        }
        Ok(self.state_of(&history))
    }

    /// Waits while the call waits on a person or runs, until it moves on or `wait` has passed,
    /// and answers its state then. A commit of this process that writes the call's run wakes
    /// the waiter at once; a commit another process made is seen within
    /// [`GLANCE`](super::GLANCE) where the
    /// store can tell it cheaply (the embedded store), else within [`REREAD`].
    pub async fn wait_for_call(
        &self,
        tenant: &TenantId,
        run: &RunId,
        wait: StdDuration,
    ) -> Result<CallState, EngineError> {
        let deadline = tokio::time::Instant::now() + wait;
        let watch = self.waiters.watch(tenant, run);
        loop {
            // Registered before the read, so a commit between the read and the sleep wakes it.
            let woken = watch.signal.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Looked at before the read, so a commit elsewhere after it is a change to read.
            let seen = self.waiters.commits_elsewhere(self.store.as_ref());
            let state = self.call_state(tenant, run).await?;
            let now = tokio::time::Instant::now();
            if !state.status.is_pending() || now >= deadline {
                return Ok(state);
            }
            tokio::select! {
                () = woken => {}
                () = self.waiters.committed_elsewhere(self.store.as_ref(), seen) => {}
                () = tokio::time::sleep(REREAD.min(deadline - now)) => {}
            }
        }
    }

    /// The earlier call `call` attaches to, if it is still attachable: its state, or its run
    /// when it was stored and never proposed (its caller died between the two writes).
    async fn attachable(
        &self,
        call: &GateCall,
        run: &RunId,
    ) -> Result<Option<Attached>, EngineError> {
        let Ok(history) = self.history(&call.tenant, run).await else {
            return Ok(None);
        };
        refuse_reuse(call, &history)?;
        let mut state = self.state_of(&history);
        if !state.attachable {
            return Ok(None);
        }
        let unproposed = history.actions.is_empty() && history.run.status == RunStatus::Running;
        if unproposed && let Some(run) = self.load_run(&call.tenant, run).await? {
            return Ok(Some(Attached::Unproposed(Box::new(run))));
        }
        state.attached = true;
        Ok(Some(Attached::State(Box::new(state))))
    }

    async fn attached_state(&self, call: &GateCall, run: &RunId) -> Result<CallState, EngineError> {
        let history = self.history(&call.tenant, run).await?;
        refuse_reuse(call, &history)?;
        let mut state = self.state_of(&history);
        state.attached = true;
        Ok(state)
    }
}

/// What an identical call attaches to.
enum Attached {
    State(Box<CallState>),
    Unproposed(Box<Stored<Run>>),
}

/// The one action of a gate call's run, named after the run: whoever proposes the call writes
/// the same action.
fn gate_action(run: &RunId) -> ActionId {
    let suffix = run.as_str().trim_start_matches(RunId::PREFIX);
    ActionId::parse(&format!("{}{suffix}", ActionId::PREFIX)).expect("a run id's suffix")
}

/// The call as its run holds it, a tool use named by the caller's id for it (else by its run),
/// its arguments as large as a message may hold; and why they were too large, if they were.
fn tool_use(call: &GateCall, run: &RunId) -> (Block, Option<String>) {
    let mut content = vec![Block::ToolUse {
        id: call
            .call_id
            .clone()
            .unwrap_or_else(|| format!("gate_{run}")),
        name: call.tool.clone(),
        input: call.args.clone(),
    }];
    let oversized = budget::fit_reply(&mut content).pop().map(|(_, why)| why);
    (content.pop().expect("one call"), oversized)
}

/// Refuses a call whose caller's id names an earlier call of another tool or other arguments.
fn refuse_reuse(call: &GateCall, history: &History) -> Result<(), EngineError> {
    let asked = history.run.gate.as_ref().and_then(|g| g.asked.as_deref());
    match (&call.call_id, asked) {
        (Some(call_id), Some(asked)) if asked != call.asked() => Err(GateRefusal::CallIdReused {
            call_id: call_id.clone(),
        }
        .into()),
        _ => Ok(()),
    }
}

/// The first `max` bytes of `text`, at a character boundary, marked where cut.
fn clipped(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

impl Engine {
    /// A call's state from its run's history, as this process's agent runs its tool.
    pub(super) fn state_of(&self, history: &History) -> CallState {
        let tool = history.actions.last().map(|a| a.tool.as_str());
        let executor = match tool.and_then(|tool| self.caller_lease(&history.run, tool)) {
            Some(_) => Executor::Caller,
            None => Executor::Countersign,
        };
        let mut state = state_of(history, executor);
        state.attachable = attachable(history, state.status, self.now());
        state
    }
}

/// Whether an identical call made `now` attaches to the call `history` holds, in `status`:
/// always when the caller named it by its own id; by its arguments, while policy has not ruled
/// on it yet, or once it went to a person (an approval, not a recovery), while it is open and
/// for [`ATTACHABLE`] after its outcome (an unknown one until it is settled). A person's
/// approval is what a repeated call must never run twice; a call policy ruled on alone, or
/// refused, is ruled on and run again, so a read always reads afresh.
fn attachable(history: &History, status: CallStatus, now: DateTime<Utc>) -> bool {
    let run = &history.run;
    if run.gate.as_ref().is_some_and(|g| g.call_id.is_some()) {
        return true;
    }
    if history.actions.is_empty() {
        return !run.status.is_finished();
    }
    let to_a_person = history
        .approvals
        .iter()
        .any(|a| a.kind == ApprovalKind::Action);
    to_a_person
        && (!run.status.is_finished()
            || status == CallStatus::Unknown
            || now <= run.updated_at + ATTACHABLE)
}

/// A call's state from its run's history: its action's latest version, its open approval.
fn state_of(history: &History, executor: Executor) -> CallState {
    let run = &history.run;
    let action: Option<&Action> = history.actions.last();
    let approval = action
        .and_then(|a| a.approval_id.as_ref())
        .and_then(|id| history.approvals.iter().find(|a| a.id == *id))
        .cloned();
    let status = match action {
        None => match run.status {
            RunStatus::Running => CallStatus::Running,
            RunStatus::Cancelled => CallStatus::Cancelled,
            // Answered before an action was proposed.
            _ => CallStatus::Refused,
        },
        Some(action) => match action.status {
            ActionStatus::AwaitingApproval => CallStatus::AwaitingApproval,
            // Nobody claims a cancelled run's call.
            ActionStatus::Approved if run.status == RunStatus::Cancelled => CallStatus::Cancelled,
            ActionStatus::Approved if executor == Executor::Caller => CallStatus::Approved,
            ActionStatus::Approved | ActionStatus::Executing => CallStatus::Running,
            ActionStatus::Succeeded => CallStatus::Succeeded,
            ActionStatus::Failed => CallStatus::Failed,
            ActionStatus::Unknown => CallStatus::Unknown,
            ActionStatus::Expired => CallStatus::Expired,
            ActionStatus::Cancelled => CallStatus::Cancelled,
            ActionStatus::Superseded => CallStatus::Running,
            ActionStatus::Rejected => match approval.as_ref().map(|a| a.status) {
                Some(ApprovalStatus::Rejected) => CallStatus::Rejected,
                _ => CallStatus::Denied,
            },
        },
    };
    let result = action
        .and_then(|a| a.result.clone())
        .or_else(|| match status {
            CallStatus::Refused => run.answer.clone().map(ToolResultText::error),
            _ => None,
        });
    let origin = run.gate.as_ref();
    CallState {
        run_id: run.id.clone(),
        agent: run.agent.clone(),
        call_id: origin.and_then(|g| g.call_id.clone()),
        conversation: origin.and_then(|g| g.conversation.clone()),
        status,
        tool: action
            .map(|a| a.tool.clone())
            .or_else(|| {
                run.messages
                    .iter()
                    .flat_map(|m| m.tool_uses())
                    .map(|u| u.name.to_string())
                    .next()
            })
            .unwrap_or_default(),
        action_id: action.map(|a| a.id.clone()),
        version: action.map(|a| a.version.get()),
        args: action.map(|a| a.args.clone()),
        result,
        approval: approval.filter(|a| a.status == ApprovalStatus::AwaitingApproval),
        executor,
        claim: action.and_then(|a| a.caller_claim().cloned()),
        attached: false,
        attachable: false,
        rules: action.map(|a| a.rules.clone()).unwrap_or_default(),
    }
}
