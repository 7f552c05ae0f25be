//! The agent loop: the model proposes calls, policy rules on each, allowed calls run, calls that
//! need a person are held, and the run pauses in one transaction.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::Instrument;

use super::records::{EscalationDue, Outgoing, OverCap, Stored, Tx, keys, lease_end};
use super::tally::{self, Tally};
use super::{
    AWAITING_ACTION_VER, Agent, Delivery, Engine, EngineError, ResumeReport, RunReport,
    Uncommitted, Unfit, WINDOW_ATTEMPTS, back_off, deadline,
};
use crate::domain::action::{Action, ActionStatus, NotExecuted, ProposedCall, ToolOutcome};
use crate::domain::approval::{Approval, ApprovalStatus};
use crate::domain::audit::{AuditEntry, AuditEvent};
use crate::domain::budget;
use crate::domain::conversation::{Block, Message, Speaker, StopReason, ToolResultText, TurnUsage};
use crate::domain::identity::{Actor, Identity, Standing};
use crate::domain::ids::{ActionId, ActionVersion, AgentName, PersonId, RunId, TenantId};
use crate::domain::notice::NoticeKind;
use crate::domain::policy::{Requirement, Verdict, VerdictKind};
use crate::domain::run::{GateVia, HeldCall, NotDriven, PausedTurn, Run};
use crate::ports::counters::{ModelOutcome, Series};
use crate::ports::model::ModelRequest;
use crate::ports::queue::DriveMessage;
use crate::ports::scheduler::Wake;
use crate::ports::store::{Condition, StoreError};
use crate::ports::tools::ToolCall;

/// A call past the gate every proposed call passes: its tool, its checked arguments, and what
/// its proposer said of it.
pub(super) struct Checked {
    pub tool: String,
    pub args: crate::domain::args::Args,
    pub explanation: String,
}

/// A request to start a run.
#[derive(Debug, Clone)]
pub struct StartRun {
    pub tenant: TenantId,
    /// The agent to run, by its definition's name.
    pub agent: AgentName,
    /// The person the agent works for; they may never approve this run's calls.
    pub requested_by: PersonId,
    /// Who started it, when that is someone else (an operator, an API caller).
    pub started_by: Option<PersonId>,
    pub task: String,
    /// Overrides the policy's time to decide for this run's approvals.
    pub approval_ttl: Option<Duration>,
    /// What authentication said of the requester, as policy rules read it; empty where the
    /// run is started for someone nobody authenticated here (an expense claim's employee).
    pub standing: Standing,
}

impl StartRun {
    /// A run `who` asks for and starts themselves, on their tenant.
    pub fn for_person(who: &Identity, agent: AgentName, task: String) -> Self {
        Self {
            tenant: who.tenant.clone(),
            agent,
            requested_by: who.person.clone(),
            started_by: None,
            task,
            approval_ttl: None,
            standing: who.standing(),
        }
    }
}

/// The longest task a run takes, counted in bytes of UTF-8, not in characters.
const MAX_TASK_BYTES: usize = 4_000;

fn run_span(run: &Run) -> tracing::Span {
    tracing::info_span!("run", tenant = %run.tenant, agent = %run.agent, run_id = %run.id)
}

/// How much of its lease a driver keeps in hand: a model turn that ends with less left renews
/// it before acting on the reply.
const LEASE_MARGIN: chrono::Duration = chrono::Duration::minutes(5);

/// Where a run stands after the engine drove it, and the notices its last write queued.
pub(super) type Driven = (RunReport, Outgoing);

/// What came of pausing a run on its approvals.
pub(super) enum Paused {
    /// It waits on them.
    Waiting(Driven),
    /// It does not pause: every call that needed a person was answered "not proposed" (its
    /// requester has as many approvals open as one may), and the run goes on with its calls.
    NotProposed {
        run: Box<Stored<Run>>,
        calls: Vec<HeldCall>,
    },
    /// It does not pause: decided again once another call was counted in a history window,
    /// none of its calls needs a person any more, and each has its result.
    Settled {
        run: Box<Stored<Run>>,
        calls: Vec<HeldCall>,
    },
}

/// What came of a pause's transaction.
enum Capped {
    Committed(Outgoing),
    /// It would take the requester past the cap on open approvals: nothing was written.
    OverCap(OverCap),
    /// Another call took a slot its calls were to take in a history window: nothing was
    /// written.
    HistoryMoved,
}

/// One call as proposed: the tool, its arguments as given, what the proposer said of it, and
/// why its arguments were not kept, if they were past their share.
pub(super) struct Proposed {
    pub tool: String,
    pub input: serde_json::Value,
    pub explanation: String,
    pub oversized: Option<String>,
}

impl Engine {
    /// Starts a run and drives it in this process until it is done, failed or paused for a
    /// person (the embedded CLI, a direct invoke of the start function). The run is written
    /// once, with its first drive already taken: no drive message is sent for it, and the
    /// sweep drives it only once its lease runs out.
    pub async fn start(&self, start: StartRun) -> Result<RunReport, EngineError> {
        let mut run = self.new_run(start)?;
        run.take_drive(0, run.created_at)
            .map_err(|e| EngineError::Corrupt(format!("a new run: {e}")))?;
        let span = run_span(&run);
        async {
            let run = self.write_started(run).await?;
            let (report, outbox) = self.drive(run).await?;
            self.deliver(outbox).await;
            Ok(report)
        }
        .instrument(span)
        .await
    }

    /// Accepts a run: its record, its `started` event and its lease, in one transaction.
    /// Nothing of it runs yet: a drive message ([`Engine::drive_run`]) drives it, or the sweep
    /// once its lease runs out.
    pub async fn accept(&self, start: StartRun) -> Result<RunReport, EngineError> {
        let run = self.new_run(start)?;
        let span = run_span(&run);
        let run = self.write_started(run).instrument(span).await?;
        Ok(RunReport::of(&run.value, vec![]))
    }

    /// A new run of `start`, checked: its task, agent, time to decide and model.
    fn new_run(&self, start: StartRun) -> Result<Run, EngineError> {
        let task = start.task.trim();
        if task.is_empty() || task.len() > MAX_TASK_BYTES {
            return Err(EngineError::BadInput(format!(
                "a task needs 1 to {MAX_TASK_BYTES} bytes of UTF-8 text (a character may take up \
                 to 4); this one has {} bytes",
                task.len()
            )));
        }
        let agent = self.agent(&start.tenant, &start.agent)?;
        if let Some(ttl) = start.approval_ttl {
            agent.policy.check_ttl(ttl).map_err(EngineError::BadInput)?;
        }
        if agent.model.is_none() && agent.gateway_only {
            return Err(EngineError::BadInput(format!(
                "the agent {} has no model (no [model] in its definition): it is for the MCP \
                 gateway and the gate API only, where the caller's own agent proposes each \
                 call, so a run cannot be started with it",
                agent.name
            )));
        }
        agent.model_here()?;
        agent.runs_here()?;
        let now = self.now();
        let mut run = Run::start(
            RunId::generate(),
            start.tenant.clone(),
            start.agent.clone(),
            start.requested_by.clone(),
            start.started_by,
            task,
            agent.policy.version,
            now,
        );
        run.approval_ttl = start.approval_ttl;
        run.standing = start.standing;
        Ok(run)
    }

    /// The run, its `started` event and its lease, in one transaction.
    async fn write_started(&self, run: Run) -> Result<Stored<Run>, EngineError> {
        tracing::info!(requested_by = %run.requested_by, "accepted");
        let mut run = Stored { value: run, ver: 0 };
        let mut tx = Tx::new();
        // Created with its `started` event, before anything of it runs.
        tx.run(self.index_shards, &mut run);
        let register = !self.is_registered(&run.value.tenant);
        if register {
            tx.upsert(
                keys::TENANTS_PK.into(),
                keys::tenant_sk(&run.value.tenant),
                &run.value.tenant,
            );
        }
        self.commit(tx).await?;
        run.written();
        if register {
            self.registered(&run.value.tenant);
        }
        Ok(run)
    }

    /// Whether this process drives the runs it accepts itself (the embedded mode), rather than
    /// sending them to the queue's consumer.
    pub fn drives_in_process(&self) -> bool {
        matches!(self.delivery, Delivery::InProcess)
    }

    /// Sends a run to the queue's consumer to be driven. If it is not sent, the sweep drives
    /// the run once its lease runs out.
    pub async fn send_drive(&self, message: &DriveMessage) -> Result<(), EngineError> {
        match &self.delivery {
            Delivery::Queue(queue) => queue
                .publish_drive(message)
                .await
                .map_err(|e| EngineError::Unavailable(e.to_string())),
            Delivery::InProcess => Err(EngineError::Unavailable(
                "this process has no queue: it drives its runs itself".into(),
            )),
        }
    }

    /// Handles one drive message: takes the run's lease by compare-and-set (a message for a
    /// lease already taken changes nothing), then runs its model turns until it is done,
    /// failed or paused. Safe to receive any number of times.
    pub async fn drive_run(&self, message: &DriveMessage) -> Result<ResumeReport, EngineError> {
        let span = tracing::info_span!(
            "drive",
            tenant = %message.tenant,
            run_id = %message.run_id,
            drive = message.drive
        );
        async {
            let ignored = |reason: String| Ok(ResumeReport::Ignored { reason });
            let Some(mut run) = self.load_run(&message.tenant, &message.run_id).await? else {
                return ignored("no such run".into());
            };
            if let Err(why) = run.value.take_drive(message.drive, self.now()) {
                return ignored(why.to_string());
            }
            let mut tx = Tx::new();
            tx.run(self.index_shards, &mut run);
            match self.commit(tx).await {
                Ok(_) => run.written(),
                Err(StoreError::ConditionFailed { .. }) => {
                    return ignored(NotDriven::Taken.to_string());
                }
                Err(error) => return Err(error.into()),
            }
            let (report, outbox) = self.drive(run).await?;
            self.deliver(outbox).await;
            Ok(ResumeReport::Continued { run: report })
        }
        .instrument(span)
        .await
    }

    /// Runs model turns until the run finishes or pauses. The run record is written when it
    /// pauses, finishes or fails, each time compare-and-set on its version.
    pub(super) async fn drive(&self, mut run: Stored<Run>) -> Result<Driven, EngineError> {
        if run.value.gate.is_some() {
            // A call from outside: its run ends with the call's outcome, which it now holds.
            let answer = run
                .value
                .messages
                .last()
                .into_iter()
                .flat_map(|m| &m.content)
                .find_map(|b| match b {
                    Block::ToolResult { content, .. } => Some(content.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            return self.finish_run(run, answer).await;
        }
        let agent = self.agent_of(&run.value)?.clone();
        let model = agent.model_here()?.clone();
        agent.runs_here()?;
        // The model sees every tool, those only a listing gives too, whichever process drives.
        agent.list_tools().await?;
        let specs = agent.tools.specs();
        for _ in 0..agent.limits.max_model_turns {
            if run.value.messages.len() > run.value.written_messages {
                // Stored before each model turn: a driver that stops during the turn leaves a
                // conversation the sweep can replay, and the run's lease runs from now.
                self.renew_lease(&mut run).await?;
            }
            let request = ModelRequest {
                system: &agent.system_prompt,
                tools: &specs,
                messages: &run.value.messages,
            };
            let reply = match model.respond(request).await {
                Ok(reply) => reply,
                Err(error) => {
                    let failed = Series::ModelRequests(ModelOutcome::Error);
                    self.count_alone(&run.value.tenant, &run.value.agent, failed)
                        .await;
                    return self
                        .fail_run(run, format!("the model failed: {error}"))
                        .await;
                }
            };
            if self.now() + LEASE_MARGIN >= lease_end(&run.value) {
                // A long turn: whether the sweep took the run over is settled by the run's
                // compare-and-set before anything the model proposed is acted on.
                self.renew_lease(&mut run).await?;
            }
            match reply.usage {
                Some(usage) => {
                    self.record_turn(&run.value, usage, reply.stop_reason)
                        .await?
                }
                // Nothing to audit: the request is counted with the run's next write.
                None => run.value.uncounted_turns += 1,
            }
            let mut content = reply.content;
            // Calls whose arguments are past their share are answered without being kept.
            let oversized = budget::fit_reply(&mut content);
            let assistant = Message {
                role: Speaker::Assistant,
                content,
            };
            let explanation = assistant.text();
            let uses: Vec<(String, String, serde_json::Value)> = assistant
                .tool_uses()
                .map(|u| (u.id.to_string(), u.name.to_string(), u.input.clone()))
                .collect();
            run.value.messages.push(assistant);
            if uses.is_empty() {
                return self.finish_run(run, explanation).await;
            }

            let mut calls = Vec::new();
            let mut approvals = Vec::new();
            let mut tally = Tally::default();
            for (n, (tool_use_id, tool, input)) in uses.into_iter().enumerate() {
                let held = |result| HeldCall {
                    tool_use_id: tool_use_id.clone(),
                    action_id: ActionId::generate(),
                    result,
                };
                if n >= agent.limits.max_calls_per_turn {
                    let told = NotExecuted::OverTurnLimit {
                        limit: agent.limits.max_calls_per_turn,
                    }
                    .told();
                    calls.push(held(Some(ToolResultText::error(told))));
                    continue;
                }
                let oversized = oversized
                    .iter()
                    .find(|(id, _)| *id == tool_use_id)
                    .map(|(_, why)| why.clone());
                let proposed = Proposed {
                    tool,
                    input,
                    explanation: explanation.clone(),
                    oversized,
                };
                let (call, approval) = self
                    .propose_one(&agent, &run.value, held(None), proposed, &mut tally)
                    .await?;
                calls.push(call);
                approvals.extend(approval);
            }

            if approvals.is_empty() {
                let results = calls
                    .into_iter()
                    .map(|c| c.result.expect("ran or refused").into_block(&c.tool_use_id));
                run.value.push_results(results.collect());
                continue;
            }
            match self.pause(&agent, run, calls, approvals, tally).await? {
                Paused::Waiting(driven) => return Ok(driven),
                // Nobody was asked: the model reads why, and goes on.
                Paused::NotProposed {
                    run: going_on,
                    calls,
                }
                | Paused::Settled {
                    run: going_on,
                    calls,
                } => {
                    run = *going_on;
                    let results = calls
                        .into_iter()
                        .map(|c| c.result.expect("ran or refused").into_block(&c.tool_use_id));
                    run.value.push_results(results.collect());
                }
            }
        }
        let limit = agent.limits.max_model_turns;
        self.fail_run(
            run,
            format!("the agent did not finish within {limit} model turns"),
        )
        .await
    }

    /// Writes the running run as it stands, compare-and-set: its lease runs from now. Losing
    /// the compare-and-set means the run moved on (cancelled, or taken over by the sweep).
    async fn renew_lease(&self, run: &mut Stored<Run>) -> Result<(), EngineError> {
        run.value
            .renew_lease(self.now())
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        let mut tx = Tx::new();
        tx.run(self.index_shards, run);
        self.commit_run(tx, &run.value).await?;
        run.written();
        Ok(())
    }

    /// One proposed call, whoever proposed it (the model of a run the engine drives, or an agent
    /// outside through the gate): checked ([`Agent::check_call`]), ruled on by policy, and run,
    /// refused, or held for a person. Comes back as the run's held call, with its result when it
    /// was settled here, and the approval to open with the pause when a person must decide.
    pub(super) async fn propose_one(
        &self,
        agent: &Agent,
        run: &Run,
        call: HeldCall,
        proposed: Proposed,
        tally: &mut Tally,
    ) -> Result<(HeldCall, Option<Approval>), EngineError> {
        let caller_runs = agent.caller_lease(&proposed.tool).is_some();
        let checked = match proposed.oversized {
            Some(why) => Err(Unfit { why, args: None }),
            // Nobody could claim it: only a caller through the gate runs its own tools.
            None if caller_runs && !run.gate.as_ref().is_some_and(|g| g.via == GateVia::Api) => {
                Err(Unfit {
                    why: format!(
                        "{} runs in its caller's process: only a call through the gate API can run it",
                        proposed.tool
                    ),
                    args: None,
                })
            }
            None => agent.check_call(&proposed.tool, proposed.input),
        };
        let args = match checked {
            Ok(args) => args,
            Err(unfit) => {
                let told = self
                    .record_refused(run, &call, proposed.tool, unfit)
                    .await?;
                let call = HeldCall {
                    result: Some(told),
                    ..call
                };
                return Ok((call, None));
            }
        };

        let checked = Checked {
            tool: proposed.tool,
            args,
            explanation: proposed.explanation,
        };
        self.rule_on(agent, run, call, checked, tally).await
    }

    /// Policy's ruling on one checked call, on the totals of its windows as `tally` has them,
    /// and what comes of it: run, refused, or held for a person (then counted in `tally` for
    /// the calls after it). A call that runs takes its slots in the windows as it is written;
    /// when another call took one first, it is decided again on the totals read anew.
    async fn rule_on(
        &self,
        agent: &Agent,
        run: &Run,
        held: HeldCall,
        call: Checked,
        tally: &mut Tally,
    ) -> Result<(HeldCall, Option<Approval>), EngineError> {
        let caller_runs = agent.caller_lease(&call.tool).is_some();
        let hints = agent.hints(&call.tool);
        for attempt in 0..WINDOW_ATTEMPTS {
            back_off(attempt).await;
            let now = self.now();
            let history = self
                .totals(
                    agent,
                    run.asker(),
                    (&call.tool, &call.args),
                    now,
                    tally,
                    None,
                )
                .await?;
            let ruling = agent.decide(
                &agent.policy,
                run.asker(),
                &call.tool,
                &call.args,
                hints,
                &history,
                now,
            );
            let log_only = ruling.log_only();
            let proposal = ProposedCall {
                agent: agent.name.clone(),
                id: held.action_id.clone(),
                version: ActionVersion::FIRST,
                tenant: run.tenant.clone(),
                run_id: run.id.clone(),
                tool_use_id: held.tool_use_id.clone(),
                tool: call.tool.clone(),
                args: call.args.clone(),
                explanation: call.explanation.clone(),
                rules: ruling.rules,
                log_only,
            };
            let (result, approval) = match ruling.verdict {
                // Its caller claims and runs it: approved by policy, it waits for the claim.
                Verdict::Allow if caller_runs => {
                    match self.approve_for_caller(agent, run, proposal, tally).await? {
                        Some(()) => (None, None),
                        None => continue,
                    }
                }
                Verdict::Allow => match self.run_allowed(agent, run, proposal, tally).await? {
                    Some(told) => (Some(told), None),
                    None => continue,
                },
                Verdict::Deny { reason } => (
                    Some(self.record_denied(agent, proposal, reason).await?),
                    None,
                ),
                Verdict::RequireApproval(requirement) => {
                    let approval = self.approval_for(agent, run, proposal, requirement)?;
                    let called = (approval.tool.as_str(), &approval.args);
                    tally.hold(
                        agent,
                        run.asker(),
                        called,
                        &approval.action_id,
                        approval.created_at,
                    );
                    (None, Some(approval))
                }
            };
            return Ok((HeldCall { result, ..held }, approval));
        }
        Err(EngineError::Contended)
    }

    fn approval_for(
        &self,
        agent: &Agent,
        run: &Run,
        proposal: ProposedCall,
        requirement: Requirement,
    ) -> Result<Approval, EngineError> {
        let now = self.now();
        let ttl = run.approval_ttl.unwrap_or(requirement.ttl);
        let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
        let expires_at = deadline(now, ttl)?;
        let asking = agent.asking(run, &proposal.tool, &proposal.args, now, expires_at);
        Ok(Approval::open(proposal, &requirement, asking))
    }

    /// Writes an approval and its action version as they open, with the proposal's audit event
    /// and, while it waits, a notice of it for each destination.
    pub(super) fn open_approval(
        &self,
        tx: &mut Tx,
        approval: &Approval,
        verdict: Verdict,
        proposer: Actor,
    ) {
        let tenant = &approval.tenant;
        let mut action = approval.awaiting_action();
        if approval.status == ApprovalStatus::Approved {
            // An editor's counted approval can already meet the quorum of the new version.
            action
                .approve(approval.authorized_by(), approval.created_at)
                .expect("a new version can be approved");
        }
        let waits = approval.status == ApprovalStatus::AwaitingApproval;
        tx.create_approval(approval);
        if waits {
            self.notify_later(
                tx,
                approval,
                NoticeKind::ApprovalRequested,
                approval.created_at,
            );
        }
        if let Some((at, _)) = approval.next_escalation() {
            tx.create(
                keys::approval_pk(tenant, &approval.id),
                keys::ESCALATION_SK.into(),
                Some(keys::escalation(
                    self.index_shards,
                    at,
                    tenant,
                    &approval.id,
                )),
                &EscalationDue {
                    tenant: tenant.clone(),
                    approval_id: approval.id.clone(),
                },
            );
        }
        tx.count_ruling(&approval.agent, &action, VerdictKind::of(&verdict));
        let event = AuditEvent::proposed(&action, verdict, Some(approval.id.clone()));
        tx.audit(
            tenant,
            AuditEntry::new(&approval.run_id, proposer, event, approval.created_at),
        );
        debug_assert_eq!(AWAITING_ACTION_VER, 1, "created actions start at version 1");
        match approval.status {
            // Approved as it opens: its resume is due with this write.
            ApprovalStatus::Approved => {
                tx.resume_action(self.index_shards, &action, Condition::NotExists)
            }
            _ => tx.create_action(self.index_shards, &action),
        }
    }

    /// Pauses the run on the held calls: run, actions, approvals and audit in one transaction,
    /// with its requester's count of open approvals. The calls whose approvals would take the
    /// count past the cap are not proposed to anyone: each is answered so and audited as
    /// refused, and with no approval left to wait on, the run does not pause.
    pub(super) async fn pause(
        &self,
        agent: &Agent,
        run: Stored<Run>,
        mut calls: Vec<HeldCall>,
        mut approvals: Vec<Approval>,
        mut tally: Tally,
    ) -> Result<Paused, EngineError> {
        let limit = self.max_open_approvals;
        // How many of the approvals open; the rest are not proposed.
        let mut room = approvals.len();
        // Another call was counted in a window since these were decided.
        let mut moved = false;
        for attempt in 0..WINDOW_ATTEMPTS {
            back_off(attempt).await;
            if moved {
                // Each is decided again, in order, on the totals as they are now.
                tally.forget();
                (calls, approvals) = self
                    .decide_again(agent, &run.value, calls, approvals, &mut tally)
                    .await?;
                let settled = calls.iter().all(|call| call.result.is_some());
                if approvals.is_empty() && settled {
                    return Ok(Paused::Settled {
                        run: Box::new(run),
                        calls,
                    });
                }
                room = approvals.len();
                moved = false;
            }
            let (opened, refused) = approvals.split_at(room);
            let now = self.now();
            let mut tx = Tx::new();
            let held = self.not_proposed(&mut tx, &run.value, calls.clone(), refused, now);
            if opened.is_empty() && !refused.is_empty() {
                self.commit(tx).await?;
                tracing::info!(
                    calls = refused.len(),
                    "not proposed: too many open approvals"
                );
                return Ok(Paused::NotProposed {
                    run: Box::new(run),
                    calls: held,
                });
            }
            let mut paused = run.clone();
            paused
                .value
                .pause(PausedTurn { calls: held }, now)
                .map_err(|e| EngineError::Unavailable(e.to_string()))?;
            // Each approval's call takes its slots in the windows, after the turn's calls that
            // ran and the approvals before it.
            let mut taken = BTreeMap::new();
            let mut claims = Vec::new();
            let mut opening = Vec::with_capacity(opened.len());
            for approval in opened {
                let mut approval = approval.clone();
                let called = (approval.tool.as_str(), &approval.args);
                let these = tally.claims(
                    agent,
                    run.value.asker(),
                    called,
                    &approval.action_id,
                    approval.created_at,
                    &mut taken,
                );
                tally::count_in(&mut tx, &these);
                approval.counted = these.iter().map(|claim| claim.slot.clone()).collect();
                claims.extend(these);
                let verdict = Verdict::RequireApproval(Requirement {
                    reason: approval.reason.clone(),
                    approver_role: approval.approver_role.clone(),
                    quorum: approval.quorum,
                    ttl: (approval.expires_at - approval.created_at)
                        .to_std()
                        .unwrap_or_default(),
                    escalate: approval.escalate.clone(),
                    also: Vec::new(),
                });
                self.open_approval(&mut tx, &approval, verdict, Actor::Agent);
                opening.push(approval);
            }
            let ids = opening.iter().map(|a| a.id.clone()).collect();
            tx.audit(
                &paused.value.tenant,
                AuditEntry::new(
                    &paused.value.id,
                    Actor::Agent,
                    AuditEvent::Paused { approvals: ids },
                    now,
                ),
            );
            tx.run(self.index_shards, &mut paused);
            let outbox = match self.commit_run_capped(tx, &paused.value, limit).await? {
                Capped::Committed(outbox) => outbox,
                // Counted by others since: only what is left of the cap opens.
                Capped::OverCap(over) => {
                    room = limit.saturating_sub(over.open) as usize;
                    continue;
                }
                // Another call was counted in a window since these were decided: each is
                // decided again, after a pause, on the totals as they are then.
                Capped::HistoryMoved => {
                    moved = true;
                    continue;
                }
            };
            tally.written(&claims);
            tracing::info!(approvals = opening.len(), "paused for a person");
            for approval in &opening {
                self.schedule_wakeups(approval).await;
            }
            let report = RunReport::of(&paused.value, opening);
            return Ok(Paused::Waiting((report, outbox)));
        }
        Err(EngineError::Contended)
    }

    /// The calls that waited for `approvals`, decided again in order: each may now run, be
    /// refused, or wait for a new approval.
    async fn decide_again(
        &self,
        agent: &Agent,
        run: &Run,
        mut calls: Vec<HeldCall>,
        approvals: Vec<Approval>,
        tally: &mut Tally,
    ) -> Result<(Vec<HeldCall>, Vec<Approval>), EngineError> {
        let mut waiting = Vec::new();
        for approval in approvals {
            let Some(at) = calls.iter().position(|c| c.action_id == approval.action_id) else {
                continue;
            };
            let checked = Checked {
                tool: approval.tool,
                args: approval.args,
                explanation: approval.explanation,
            };
            let (held, approval) = self
                .rule_on(agent, run, calls[at].clone(), checked, tally)
                .await?;
            calls[at] = held;
            waiting.extend(approval);
        }
        Ok((calls, waiting))
    }

    /// Answers each of the calls `refused` asks about "not proposed": its requester already
    /// has as many approvals open as one may. Audited as refused in `tx`; nobody is asked.
    fn not_proposed(
        &self,
        tx: &mut Tx,
        run: &Run,
        mut calls: Vec<HeldCall>,
        refused: &[Approval],
        now: DateTime<Utc>,
    ) -> Vec<HeldCall> {
        let told = NotExecuted::NotProposed {
            requester: run.requested_by.as_str(),
            limit: self.max_open_approvals,
        }
        .told();
        for approval in refused {
            if let Some(call) = calls.iter_mut().find(|c| c.action_id == approval.action_id) {
                call.result = Some(ToolResultText::ok(told.clone()));
            }
            let event = AuditEvent::Refused {
                action_id: approval.action_id.clone(),
                tool: approval.tool.clone(),
                args: Some(approval.args.clone()),
                why: told.clone(),
            };
            tx.audit(
                &run.tenant,
                AuditEntry::new(&run.id, Actor::system("engine"), event, now),
            );
        }
        calls
    }

    /// One-time wake-ups are a convenience; the sweep finds the same work if they fail.
    pub(super) async fn schedule_wakeups(&self, approval: &Approval) {
        let deadline = self
            .scheduler
            .schedule(
                &approval.tenant,
                &approval.id,
                Wake::Deadline,
                approval.expires_at,
            )
            .await;
        if let Err(error) = deadline {
            tracing::warn!(approval_id = %approval.id, %error, "no deadline schedule; the recurring sweep will expire it");
        }
        if let Some(at) = self.reminder_at(approval) {
            let reminder = self
                .scheduler
                .schedule(&approval.tenant, &approval.id, Wake::Reminder, at)
                .await;
            if let Err(error) = reminder {
                tracing::warn!(approval_id = %approval.id, %error, "no reminder schedule; the recurring sweep will remind");
            }
        }
    }

    pub(super) async fn unschedule_wakeups(&self, approval: &Approval) {
        let unschedule = |wake: Wake| async move {
            if let Err(error) = self
                .scheduler
                .unschedule(&approval.tenant, &approval.id, wake)
                .await
            {
                tracing::warn!(approval_id = %approval.id, %error, wake = wake.as_str(), "the schedule stays; it will find nothing to do");
            }
        };
        // The deadline's and the reminder's schedules are deleted together.
        let reminder = async {
            if self.reminder_at(approval).is_some() {
                unschedule(Wake::Reminder).await;
            }
        };
        tokio::join!(unschedule(Wake::Deadline), reminder);
    }

    /// Commits a transaction that writes the run being driven. Losing its compare-and-set means
    /// someone else moved the run on: a cancel, or the sweep after the run's lease ran out.
    async fn commit_run(&self, tx: Tx, run: &Run) -> Result<Outgoing, EngineError> {
        match self.commit(tx).await {
            Ok(outbox) => Ok(outbox),
            Err(StoreError::ConditionFailed { .. }) => Err(self.moved_on(run).await),
            Err(error) => Err(error.into()),
        }
    }

    /// [`Engine::commit_run`], where the requester's count of open approvals may not pass
    /// `cap`, and whose calls take their slots in the history windows: what came of it.
    async fn commit_run_capped(&self, tx: Tx, run: &Run, cap: u32) -> Result<Capped, EngineError> {
        match self.commit_capped(tx, Some(cap)).await {
            Ok(outbox) => Ok(Capped::Committed(outbox)),
            Err(Uncommitted::OverCap(over)) => Ok(Capped::OverCap(over)),
            Err(Uncommitted::HistoryMoved { .. }) => Ok(Capped::HistoryMoved),
            Err(Uncommitted::Refused(refused)) => match refused.error {
                StoreError::ConditionFailed { .. } => Err(self.moved_on(run).await),
                error => Err(error.into()),
            },
        }
    }

    /// What a driver that lost the run's compare-and-set is told: where the run went.
    async fn moved_on(&self, run: &Run) -> EngineError {
        let status = match self.load_run(&run.tenant, &run.id).await {
            Ok(Some(stored)) => stored.value.status,
            Ok(None) => return EngineError::not_found(format!("run {}", run.id)),
            Err(error) => return error,
        };
        tracing::warn!(%status, "the run moved on while this process drove it");
        EngineError::RunFinished {
            run: run.id.to_string(),
            status,
        }
    }

    /// A call policy allows: written as executing, run, recorded. Two writes; an answer the
    /// tool lost is recorded as [`Engine::lost_answer`] says, its recovery opened in the second.
    /// `None` when another call took one of its history slots first: nothing was written or run,
    /// and `tally` is to be read again.
    async fn run_allowed(
        &self,
        agent: &Agent,
        run: &Run,
        proposal: ProposedCall,
        tally: &mut Tally,
    ) -> Result<Option<ToolResultText>, EngineError> {
        let now = self.now();
        let mut action = Action::propose(proposal, now);
        let policy = Actor::Policy {
            version: agent.policy.version,
        };
        let authorized = vec![policy.clone()];
        let (tenant, run_id) = (action.tenant.clone(), action.run_id.clone());

        let mut tx = Tx::new();
        let proposed = AuditEvent::proposed(&action, Verdict::Allow, None);
        tx.audit(
            &tenant,
            AuditEntry::new(&run_id, Actor::Agent, proposed, now),
        );
        tx.count_ruling(&agent.name, &action, VerdictKind::Allow);
        // Its `executing` event, after `proposed`, is held by the action's item.
        let logged = tx.log_slot(&tenant, &run_id);
        action
            .approve(authorized, now)
            .and_then(|_| action.claim(now, policy, logged))
            .expect("a new action is approved then claimed");
        tx.create_action(self.index_shards, &action);
        if !self.commit_counted(agent, run, &action, tx, tally).await? {
            return Ok(None);
        }

        let executing = action;
        let called = self.call_tool(agent, &executing).await;
        let (mut outcome, mut recovery) = self.lost_answer(run, &executing, called)?;
        loop {
            let now = self.now();
            let mut action = executing.clone();
            action
                .record(&outcome, now)
                .expect("an executing action records its outcome");
            let mut tx = Tx::new();
            match &recovery {
                // A person answers it: no longer the sweep's to ask about.
                Some(recovery) => {
                    let (pk, sk) = (
                        keys::run_pk(&tenant, &run_id),
                        keys::action_sk(&action.id, action.version),
                    );
                    tx.update(pk, sk, None, &action, 1);
                    self.open_recovery(&mut tx, recovery, "engine");
                }
                None => tx.update_action(self.index_shards, &action, 1),
            }
            tx.count_execution(&agent.name, &action);
            tx.audit(
                &tenant,
                AuditEntry::new(
                    &run_id,
                    Actor::system("engine"),
                    AuditEvent::outcome(&action, &outcome),
                    now,
                ),
            );
            return match self.commit(tx).await {
                Ok(outbox) => {
                    // A recovery's notices, the only thing this write posts.
                    self.post_notices(super::just_written(outbox.notices).collect())
                        .await;
                    Ok(Some(action.result.expect("recorded")))
                }
                // The call outlived the stale-execution limit and the sweep recorded its
                // outcome through the tool's reconciliation: that record stands, and is what
                // the model reads.
                Err(StoreError::ConditionFailed { .. }) => {
                    let recorded = self
                        .load_action(&tenant, &run_id, &action.id, action.version)
                        .await?;
                    recorded
                        .and_then(|stored| stored.value.result)
                        .map(Some)
                        .ok_or_else(|| {
                            EngineError::Corrupt(format!(
                                "{} was recorded without a result",
                                action.key()
                            ))
                        })
                }
                // The tool ran and its outcome could not be written: held as unknown at once,
                // with the true reason, rather than left executing until its lease runs out.
                // The sweep settles it from there as it settles any unknown outcome.
                Err(error) if !outcome.is_unknown() => {
                    tracing::warn!(key = %action.key(), %error, "outcome not stored; held as unknown");
                    (outcome, recovery) = (ToolOutcome::unstored(&error), None);
                    continue;
                }
                Err(error) => Err(error.into()),
            };
        }
    }

    /// A call policy allows whose caller runs it: written approved by policy, for the caller to
    /// claim. No resume message: nothing here runs it.
    /// `None` when another call took one of its history slots first, as [`Engine::run_allowed`].
    async fn approve_for_caller(
        &self,
        agent: &Agent,
        run: &Run,
        proposal: ProposedCall,
        tally: &mut Tally,
    ) -> Result<Option<()>, EngineError> {
        let now = self.now();
        let mut action = Action::propose(proposal, now);
        let policy = Actor::Policy {
            version: agent.policy.version,
        };
        action
            .approve(vec![policy], now)
            .expect("a new action can be approved");
        let mut tx = Tx::new();
        let proposed = AuditEvent::proposed(&action, Verdict::Allow, None);
        tx.audit(
            &action.tenant,
            AuditEntry::new(&action.run_id, Actor::Agent, proposed, now),
        );
        tx.count_ruling(&agent.name, &action, VerdictKind::Allow);
        tx.create_action(self.index_shards, &action);
        let committed = self.commit_counted(agent, run, &action, tx, tally).await?;
        Ok(committed.then_some(()))
    }

    /// Commits `tx`, which writes a new call that runs, with the slots it takes in its
    /// windows: false when another call took one first (nothing was written, and `tally`
    /// forgets what it read).
    async fn commit_counted(
        &self,
        agent: &Agent,
        run: &Run,
        action: &Action,
        mut tx: Tx,
        tally: &mut Tally,
    ) -> Result<bool, EngineError> {
        let called = (action.tool.as_str(), &action.args);
        let claims = tally.claims(
            agent,
            run.asker(),
            called,
            &action.id,
            action.proposed_at,
            &mut BTreeMap::new(),
        );
        tally::count_in(&mut tx, &claims);
        match self.commit_capped(tx, None).await {
            Ok(_) => {
                tally.written(&claims);
                Ok(true)
            }
            Err(Uncommitted::HistoryMoved { .. }) => {
                tracing::debug!(action = %action.key(), "counted by another call first; decided again");
                tally.forget();
                Ok(false)
            }
            Err(Uncommitted::Refused(refused)) => Err(refused.error.into()),
            Err(Uncommitted::OverCap(_)) => unreachable!("no cap, so nothing goes past it"),
        }
    }

    /// A call answered before policy ruled on it ([`Agent::check_call`]): audited, never shown
    /// to a person, never sent. What the model is told comes back.
    async fn record_refused(
        &self,
        run: &Run,
        call: &HeldCall,
        tool: String,
        unfit: Unfit,
    ) -> Result<ToolResultText, EngineError> {
        tracing::info!(%tool, why = %unfit.why, "refused before policy");
        let told = NotExecuted::BadArguments { why: &unfit.why }.told();
        let event = AuditEvent::Refused {
            action_id: call.action_id.clone(),
            tool,
            args: unfit.args,
            why: unfit.why,
        };
        let mut tx = Tx::new();
        tx.audit(
            &run.tenant,
            AuditEntry::new(&run.id, Actor::system("engine"), event, self.now()),
        );
        self.commit(tx).await?;
        Ok(ToolResultText::error(told))
    }

    /// What a model API said of one turn, audited before anything it proposed is acted on: the
    /// tokens were spent whatever becomes of the turn.
    async fn record_turn(
        &self,
        run: &Run,
        usage: TurnUsage,
        stop_reason: StopReason,
    ) -> Result<(), EngineError> {
        tracing::info!(model = %usage.model, input_tokens = ?usage.input_tokens, output_tokens = ?usage.output_tokens, ?stop_reason, "model turn");
        let mut tx = Tx::new();
        tx.count_model_turn(run, &usage);
        let event = AuditEvent::ModelTurn { usage, stop_reason };
        tx.audit(
            &run.tenant,
            AuditEntry::new(&run.id, Actor::Agent, event, self.now()),
        );
        self.commit(tx).await?;
        Ok(())
    }

    async fn record_denied(
        &self,
        agent: &Agent,
        proposal: ProposedCall,
        reason: String,
    ) -> Result<ToolResultText, EngineError> {
        let now = self.now();
        let mut action = Action::propose(proposal, now);
        let told = NotExecuted::Denied { reason: &reason }.told();
        action
            .close(ActionStatus::Rejected, told, now)
            .expect("a new action can be refused");
        action.authorized_by = vec![];
        let mut tx = Tx::new();
        let (tenant, run_id) = (action.tenant.clone(), action.run_id.clone());
        tx.create_action(self.index_shards, &action);
        tx.count_ruling(&agent.name, &action, VerdictKind::Deny);
        let proposed = AuditEvent::proposed(&action, Verdict::Deny { reason }, None);
        tx.audit(
            &tenant,
            AuditEntry::new(
                &run_id,
                Actor::Policy {
                    version: agent.policy.version,
                },
                proposed,
                now,
            ),
        );
        self.commit(tx).await?;
        Ok(action.result.expect("closed with a result"))
    }

    pub(super) async fn call_tool(&self, agent: &Agent, action: &Action) -> ToolOutcome {
        let Some(tool) = agent.tools.get(&action.tool) else {
            return ToolOutcome::Failed {
                error: format!("there is no tool named {}", action.tool),
            };
        };
        let key = action.key();
        let call = ToolCall {
            tenant: &action.tenant,
            run_id: &action.run_id,
            args: &action.args,
            idempotency_key: &key,
        };
        tool.call(call).await
    }

    pub(super) async fn finish_run(
        &self,
        run: Stored<Run>,
        answer: String,
    ) -> Result<Driven, EngineError> {
        self.finish_run_in(Tx::new(), run, answer).await
    }

    /// [`Engine::finish_run`], in `tx` with the writes it already holds.
    pub(super) async fn finish_run_in(
        &self,
        tx: Tx,
        mut run: Stored<Run>,
        answer: String,
    ) -> Result<Driven, EngineError> {
        let now = self.now();
        let answer = if answer.is_empty() {
            "(the agent gave no answer)".to_string()
        } else {
            answer
        };
        run.value
            .finish(answer.clone(), now)
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        let ended = self
            .end_run(tx, run, Actor::Agent, AuditEvent::Done { answer }, now)
            .await?;
        tracing::info!("done");
        Ok(ended)
    }

    async fn fail_run(&self, mut run: Stored<Run>, error: String) -> Result<Driven, EngineError> {
        let now = self.now();
        tracing::warn!(%error, "run failed");
        // A model's or a service's words, kept within a result's share in the run's item.
        let error = budget::cut(&error, budget::RESULT, "error").unwrap_or(error);
        run.value
            .fail(error.clone(), now)
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        let event = AuditEvent::Failed { error };
        self.end_run(Tx::new(), run, Actor::system("engine"), event, now)
            .await
    }

    /// Writes a run that has just finished or failed, with the event that says so.
    async fn end_run(
        &self,
        mut tx: Tx,
        mut run: Stored<Run>,
        by: Actor,
        event: AuditEvent,
        now: DateTime<Utc>,
    ) -> Result<Driven, EngineError> {
        tx.audit(
            &run.value.tenant,
            AuditEntry::new(&run.value.id, by, event, now),
        );
        tx.run(self.index_shards, &mut run);
        let outbox = self.commit_run(tx, &run.value).await?;
        Ok((RunReport::of(&run.value, vec![]), outbox))
    }
}
