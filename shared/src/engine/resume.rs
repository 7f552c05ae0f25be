//! Resuming a run after one of its held actions settled: run exactly the approved version once,
//! hold its result with the run, and go on once the whole turn has its results.

use serde::Serialize;
use tracing::Instrument;

use super::records::{Outgoing, Stored, Tx, action_index, decode, keys};
use super::{CAS_ATTEMPTS, Engine, EngineError};
use super::{RunReport, deadline};
use crate::domain::action::{Action, ActionStatus, ToolOutcome};
use crate::domain::approval::Approval;
use crate::domain::audit::{AuditEntry, AuditEvent};
use crate::domain::identity::Actor;
use crate::domain::notice::NoticeKind;
use crate::domain::policy::MAX_TTL;
use crate::domain::run::Run;
use crate::ports::queue::{QueueMessage, ResumeMessage};
use crate::ports::store::StoreError;

/// What one resume message did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ResumeReport {
    /// Nothing to do: a message seen before, a superseded version, a run that moved on.
    Ignored { reason: String },
    /// The result is held with the run, which still waits on other calls of its turn.
    Held { run: RunReport },
    /// The turn was complete and the run went on to this point; or, for a drive message, the
    /// run was driven to this point.
    Continued { run: RunReport },
    /// The tool could not say whether the call took effect: the sweep reconciles it, or a
    /// person of the recovery owner role answers.
    Unknown { key: String },
}

/// Who settles an outcome a tool lost (`unknown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settles {
    /// The sweep, asking the tool; or looking again once this process has the tool listed.
    Sweep,
    /// Nobody: the call only reads, so nothing took effect; it failed, and may be made again.
    Nobody,
    /// A person of the agent's recovery owner role, asked at once.
    Owner,
    /// A person, once the agent names a recovery owner: nothing can ask the tool, and no role
    /// is named to answer. The sweep looks again and asks that role once it is named.
    NoOwnerYet,
}

/// The outcome of a read that lost its answer: failed, saying why nothing is left to reconcile.
pub(super) fn lost_read(action: &Action, detail: &str) -> ToolOutcome {
    ToolOutcome::Failed {
        error: format!(
            "{detail}; {} only reads, so nothing took effect and nothing is left to reconcile: \
             it may be called again",
            action.tool
        ),
    }
}

fn ignored(reason: impl Into<String>) -> (ResumeReport, Outgoing) {
    (
        ResumeReport::Ignored {
            reason: reason.into(),
        },
        Outgoing::default(),
    )
}

impl Engine {
    /// Handles one message of the resume queue, either kind. Safe to receive any number of
    /// times.
    pub async fn consume(&self, message: &QueueMessage) -> Result<ResumeReport, EngineError> {
        match message {
            QueueMessage::Resume(message) => self.resume(message).await,
            QueueMessage::Drive(message) => self.drive_run(message).await,
        }
    }

    /// Handles one resume message. Safe to receive any number of times.
    pub async fn resume(&self, message: &ResumeMessage) -> Result<ResumeReport, EngineError> {
        let (report, outbox) = self.resume_once(message).await?;
        self.deliver(outbox).await;
        Ok(report)
    }

    pub(super) async fn resume_once(
        &self,
        message: &ResumeMessage,
    ) -> Result<(ResumeReport, Outgoing), EngineError> {
        let span = tracing::info_span!(
            "resume",
            tenant = %message.tenant,
            run_id = %message.run_id,
            action_id = %message.action_id,
            version = %message.version,
            resent = message.resent,
            approval_id = tracing::field::Empty,
        );
        self.resume_in(message).instrument(span).await
    }

    async fn resume_in(
        &self,
        message: &ResumeMessage,
    ) -> Result<(ResumeReport, Outgoing), EngineError> {
        let Some(run) = self.load_run(&message.tenant, &message.run_id).await? else {
            return Ok(ignored("no such run"));
        };
        if !run.value.is_waiting_on(&message.action_id) {
            return Ok(ignored(format!(
                "run is {} and not waiting on {}",
                run.value.status, message.action_id
            )));
        }
        // Resumed only where the agent's calls can run: elsewhere nothing is claimed or held,
        // and the message waits in the outbox for a process that has the agent's environment.
        if let Ok(agent) = self.agent_of(&run.value) {
            agent.runs_here()?;
        }
        let (pk, sk) = (
            keys::run_pk(&message.tenant, &message.run_id),
            keys::action_sk(&message.action_id, message.version),
        );
        let Some(item) = self.store.get(&pk, &sk).await? else {
            return Ok(ignored(format!(
                "no version {} of {}",
                message.version, message.action_id
            )));
        };
        let action: Stored<Action> = decode(&item)?;
        if let Some(approval) = &action.value.approval_id {
            tracing::Span::current().record("approval_id", tracing::field::display(approval));
        }
        // Whether the action still waits in the outbox index for this message.
        let queued = item.gsi1.as_ref().is_some_and(keys::is_outbox);
        match action.value.status {
            // Never run here: it waits approved for its caller's claim.
            ActionStatus::Approved if self.runs_in_caller(&run.value, &action.value) => {
                if queued {
                    self.dequeue(&action).await;
                }
                Ok(ignored(format!(
                    "action {} is approved for its caller to claim and run",
                    action.value.key()
                )))
            }
            ActionStatus::Approved => self.execute(run, action, queued).await,
            ActionStatus::Rejected
            | ActionStatus::Expired
            | ActionStatus::Cancelled
            | ActionStatus::Succeeded
            | ActionStatus::Failed => self.hold_result(run, action, queued).await,
            status => Ok(ignored(format!(
                "action {} is {status}",
                action.value.key()
            ))),
        }
    }

    /// Whether the action's tool is one its caller runs (`executor = "caller"`).
    pub(super) fn runs_in_caller(&self, run: &Run, action: &Action) -> bool {
        self.caller_lease(run, &action.tool).is_some()
    }

    /// The lease of a caller's claim of this tool, for a tool its caller runs.
    pub(super) fn caller_lease(&self, run: &Run, tool: &str) -> Option<std::time::Duration> {
        self.agent_of(run).ok()?.caller_lease(tool)
    }

    /// Claims the approved version (`approved → executing`), calls the tool with the key
    /// `action_id:version`, and records the outcome. The message is consumed with the claim: the
    /// action keeps its outbox entry (`queued`) as executing ([`Tx::claim_action`]), and leaves
    /// the index when its outcome is recorded.
    async fn execute(
        &self,
        run: Stored<Run>,
        read: Stored<Action>,
        queued: bool,
    ) -> Result<(ResumeReport, Outgoing), EngineError> {
        let intact = read.value.intact(&run.value.agent);
        // A tool only a listing gives is listed before the claim: a server that is down leaves
        // the action approved, for its resume to be delivered again.
        if let Ok(agent) = self.agent_of(&run.value) {
            agent.knowing(&read.value.tool).await?;
        }
        let Some(action) = self.claim(read, queued).await? else {
            return Ok(ignored("another worker claimed this action"));
        };
        let outcome = if intact {
            match self.agent_of(&run.value) {
                Ok(agent) => self.call_tool(agent, &action.value).await,
                Err(error) => ToolOutcome::Failed {
                    error: format!("not executed: {error}"),
                },
            }
        } else {
            ToolOutcome::Failed {
                error: "the stored arguments no longer match the approved hash; not executed"
                    .into(),
            }
        };
        if outcome.is_unknown() {
            return self.record_outcome(run, action, outcome, false).await;
        }
        let recorded = self
            .record_outcome(run.clone(), action.clone(), outcome, false)
            .await;
        match recorded {
            // The tool ran and its outcome could not be written: held as unknown at once, with
            // the true reason, rather than left executing until its lease runs out.
            Err(EngineError::Store(error)) => {
                tracing::warn!(key = %action.value.key(), %error, "outcome not stored; held as unknown");
                self.record_outcome(run, action, ToolOutcome::unstored(&error), false)
                    .await
            }
            other => other,
        }
    }

    /// The claim's compare-and-set, `None` when another worker claimed the action first. A
    /// version that moved while the action stayed approved (the sweep handed its message over
    /// again, giving its outbox entry a new lease) is read again and claimed at its new
    /// version, into the reconcile index.
    async fn claim(
        &self,
        mut read: Stored<Action>,
        mut queued: bool,
    ) -> Result<Option<Stored<Action>>, EngineError> {
        for _ in 0..CAS_ATTEMPTS {
            let now = self.now();
            let mut action = read.value.clone();
            // The action's item holds the claim's `executing` event: one item, a plain write.
            let mut tx = Tx::new();
            let logged = tx.log_slot(&action.tenant, &action.run_id);
            action
                .claim(now, Actor::system("resume"), logged)
                .map_err(|e| EngineError::Corrupt(e.to_string()))?;
            tx.claim_action(self.index_shards, &read, queued, &action);
            match self.commit(tx).await {
                Ok(_) => {
                    return Ok(Some(Stored {
                        value: action,
                        ver: read.ver + 1,
                    }));
                }
                Err(StoreError::ConditionFailed { .. }) => {
                    let again = self
                        .load_action(&action.tenant, &action.run_id, &action.id, action.version)
                        .await?;
                    match again {
                        // Handed over again: its version moved while approved.
                        Some(again) if again.value.status == ActionStatus::Approved => {
                            (read, queued) = (again, false);
                        }
                        _ => return Ok(None),
                    }
                }
                Err(error) => return Err(error.into()),
            }
        }
        Err(EngineError::Contended)
    }

    /// Records a tool's outcome for a claimed (or unknown) action and, when definite, holds it
    /// with the run in the same transaction.
    pub(super) async fn record_outcome(
        &self,
        run: Stored<Run>,
        action: Stored<Action>,
        outcome: ToolOutcome,
        reconciling: bool,
    ) -> Result<(ResumeReport, Outgoing), EngineError> {
        let by = Actor::system("resume");
        self.record_outcome_as(run, action, outcome, reconciling, by, None)
            .await
    }

    /// [`Engine::record_outcome`], audited as `by`'s, and answering the open recovery
    /// `closing` of the action (its caller's late report) in the same transaction.
    pub(super) async fn record_outcome_as(
        &self,
        mut run: Stored<Run>,
        mut action: Stored<Action>,
        outcome: ToolOutcome,
        reconciling: bool,
        by: Actor,
        closing: Option<Stored<Approval>>,
    ) -> Result<(ResumeReport, Outgoing), EngineError> {
        let (outcome, recovery) = self.lost_answer(&run.value, &action.value, outcome)?;
        let now = self.now();
        action
            .value
            .record(&outcome, now)
            .map_err(|e| EngineError::Corrupt(e.to_string()))?;
        let event = match (&outcome, reconciling) {
            (ToolOutcome::Unknown { .. }, _) | (_, false) => {
                AuditEvent::outcome(&action.value, &outcome)
            }
            (_, true) => AuditEvent::Reconciled {
                action_id: action.value.id.clone(),
                version: action.value.version,
                succeeded: action.value.status == ActionStatus::Succeeded,
                result: action
                    .value
                    .result
                    .as_ref()
                    .map(|r| r.content.clone())
                    .unwrap_or_default(),
            },
        };
        if matches!(outcome, ToolOutcome::Unknown { .. }) {
            tracing::warn!(key = %action.value.key(), "outcome unknown; held for reconciliation");
        }
        let (tenant, run_id) = (action.value.tenant.clone(), action.value.run_id.clone());
        let (pk, sk) = (
            keys::run_pk(&tenant, &run_id),
            keys::action_sk(&action.value.id, action.value.version),
        );
        for _ in 0..CAS_ATTEMPTS {
            let mut tx = Tx::new();
            // An unknown outcome a person will settle is no longer the sweep's to ask about.
            let index = match recovery {
                Some(_) => None,
                None => action_index(self.index_shards, &action.value),
            };
            tx.update(pk.clone(), sk.clone(), index, &action.value, action.ver);
            if !reconciling {
                tx.count_execution(&run.value.agent, &action.value);
            }
            tx.audit(
                &tenant,
                AuditEntry::new(&run_id, by.clone(), event.clone(), now),
            );
            if let Some(recovery) = &closing {
                let mut answered = recovery.value.clone();
                if answered.answered_by_caller(now) {
                    tx.update_approval(&answered, recovery.ver);
                }
            }
            // What the approved call did, told where its approval was posted.
            if let Some(approval) = &action.value.approval_id {
                self.follow_up_later(&mut tx, (&tenant, &run_id, approval), now);
            }
            if action.value.status == ActionStatus::Unknown
                || !run.value.is_waiting_on(&action.value.id)
            {
                // The run waits for reconciliation, or moved on (cancelled): record the action alone.
                if let Some(recovery) = &recovery {
                    self.open_recovery(&mut tx, recovery, "resume");
                }
                let outbox = match self.commit(tx).await {
                    Ok(outbox) => outbox,
                    Err(StoreError::ConditionFailed { .. }) => {
                        return Ok(ignored("another worker recorded this action"));
                    }
                    Err(error) => return Err(error.into()),
                };
                let report = match action.value.status {
                    ActionStatus::Unknown => ResumeReport::Unknown {
                        key: action.value.key(),
                    },
                    _ => ResumeReport::Ignored {
                        reason: format!("run is {}", run.value.status),
                    },
                };
                return Ok((report, outbox));
            }
            match self.hold_result_in(&mut tx, &mut run, &action.value) {
                Err(error) => return Err(error),
                Ok(continues) => match self.commit(tx).await {
                    Ok(outbox) => return self.after_hold(run, continues, outbox).await,
                    Err(StoreError::ConditionFailed { failed }) if !failed.contains(&0) => {
                        // Another call of the same turn settled first: read the run again.
                        run = self.reload_run(&run.value).await?;
                    }
                    Err(StoreError::ConditionFailed { .. }) => {
                        return Ok(ignored("another worker recorded this action"));
                    }
                    Err(error) => return Err(error.into()),
                },
            }
        }
        Err(EngineError::Contended)
    }

    /// Holds the told result of a settled action with its run, continuing the run if the turn
    /// is complete. Once that commits, an action still `queued` in the outbox index is taken out
    /// by a plain write of its own ([`Engine::dequeue`]): one write unit where a transaction's
    /// item costs two. If it is lost, the sweep delivers the message again after its grace or
    /// lease, the redelivery finds the result held and does nothing, and the action leaves the
    /// index then.
    async fn hold_result(
        &self,
        mut run: Stored<Run>,
        action: Stored<Action>,
        queued: bool,
    ) -> Result<(ResumeReport, Outgoing), EngineError> {
        for _ in 0..CAS_ATTEMPTS {
            if !run.value.is_waiting_on(&action.value.id) {
                return Ok(ignored("the run already holds this result"));
            }
            let mut tx = Tx::new();
            let continues = self.hold_result_in(&mut tx, &mut run, &action.value)?;
            match self.commit(tx).await {
                Ok(outbox) => {
                    if queued {
                        self.dequeue(&action).await;
                    }
                    return self.after_hold(run, continues, outbox).await;
                }
                Err(StoreError::ConditionFailed { .. }) => {
                    run = self.reload_run(&run.value).await?
                }
                Err(error) => return Err(error.into()),
            }
        }
        Err(EngineError::Contended)
    }

    /// Adds the run's update to `tx`: the result held, and the run resumed if that completes its
    /// turn. Returns whether the run continues.
    fn hold_result_in(
        &self,
        tx: &mut Tx,
        run: &mut Stored<Run>,
        action: &Action,
    ) -> Result<bool, EngineError> {
        let now = self.now();
        let result = action
            .result
            .clone()
            .ok_or_else(|| EngineError::Corrupt(format!("{} has no result", action.key())))?;
        let mut updated = run.value.clone();
        updated
            .settle(&action.id, result, now)
            .map_err(|e| EngineError::Corrupt(e.to_string()))?;
        let continues = updated.turn_is_complete();
        if continues {
            let results = updated.paused.as_ref().map_or(0, |t| t.calls.len());
            updated
                .resume(now)
                .map_err(|e| EngineError::Corrupt(e.to_string()))?;
            tx.audit(
                &updated.tenant,
                AuditEntry::new(
                    &updated.id,
                    Actor::system("resume"),
                    AuditEvent::Resumed { results, why: None },
                    now,
                ),
            );
        }
        run.value = updated;
        tx.run(self.index_shards, run);
        Ok(continues)
    }

    async fn after_hold(
        &self,
        run: Stored<Run>,
        continues: bool,
        mut outbox: Outgoing,
    ) -> Result<(ResumeReport, Outgoing), EngineError> {
        let mut run = run;
        run.written();
        if !continues {
            let waiting = self.pending_of_run(&run.value).await?;
            return Ok((
                ResumeReport::Held {
                    run: RunReport::of(&run.value, waiting),
                },
                outbox,
            ));
        }
        let (report, more) = self.drive(run).await?;
        outbox.extend(more);
        Ok((ResumeReport::Continued { run: report }, outbox))
    }

    /// An outcome as it is recorded, with the recovery to open beside it. An answer a read lost
    /// is a failure: nothing took effect. Of another call whose tool cannot be asked, the
    /// question for the agent's recovery owner, at once, whoever let the call run; where the
    /// agent names none, the unknown outcome says so. Any other outcome is as it came.
    pub(super) fn lost_answer(
        &self,
        run: &Run,
        action: &Action,
        outcome: ToolOutcome,
    ) -> Result<(ToolOutcome, Option<Approval>), EngineError> {
        let ToolOutcome::Unknown { detail } = outcome else {
            return Ok((outcome, None));
        };
        Ok(match self.who_settles(run, action) {
            Settles::Nobody => (lost_read(action, &detail), None),
            Settles::Owner => {
                let question = format!("{detail}; the tool cannot be asked");
                let recovery = self.recovery_question(run, action, &question)?;
                (ToolOutcome::Unknown { detail }, recovery)
            }
            Settles::NoOwnerYet => {
                tracing::warn!(key = %action.key(), agent = %run.agent, "outcome unknown, its tool cannot be asked and no recovery owner is named: a person must name one");
                let detail = format!(
                    "{detail}; its tool cannot be asked and agent {} names no recovery_owner \
                     to answer",
                    run.agent
                );
                (ToolOutcome::Unknown { detail }, None)
            }
            Settles::Sweep => (ToolOutcome::Unknown { detail }, None),
        })
    }

    /// Who settles an outcome the action's tool lost, by what the tool is in this process and
    /// whom the run's agent names.
    pub(super) fn who_settles(&self, run: &Run, action: &Action) -> Settles {
        let Ok(agent) = self.agent_of(run) else {
            return Settles::Sweep;
        };
        match agent.tools.get(&action.tool) {
            // Not listed in this process (its server is down): a later sweep looks again.
            None => Settles::Sweep,
            Some(tool) if tool.reconciles() => Settles::Sweep,
            Some(tool) if tool.reads_only() => Settles::Nobody,
            Some(_) if agent.recovery_owner.is_some() => Settles::Owner,
            Some(_) => Settles::NoOwnerYet,
        }
    }

    /// The question "did it take effect?" for the run's agent's recovery owner, if it names one.
    pub(super) fn recovery_question(
        &self,
        run: &Run,
        action: &Action,
        detail: &str,
    ) -> Result<Option<Approval>, EngineError> {
        let Ok(agent) = self.agent_of(run) else {
            return Ok(None);
        };
        let Some(owner) = agent.recovery_owner.clone() else {
            return Ok(None);
        };
        let now = self.now();
        // Not a deadline: a recovery never expires. It sorts its pending entry.
        let longest = chrono::Duration::from_std(MAX_TTL).expect("90 days fit");
        let asking = agent.asking(
            run,
            &action.tool,
            &action.args,
            now,
            deadline(now, longest)?,
        );
        Ok(Some(Approval::recovery(action, owner, detail, asking)))
    }

    /// Hands an unknown outcome its tool could not settle within `patience` to the run's
    /// agent's recovery owner: the action leaves the reconcile index and the recovery opens, in
    /// one write. `None` where the agent names no owner (the sweep keeps asking) or another
    /// sweep moved the action first; else the notices to deliver.
    pub(super) async fn give_up_reconciling(
        &self,
        run: &Stored<Run>,
        action: &Stored<Action>,
        patience: std::time::Duration,
    ) -> Result<Option<Outgoing>, EngineError> {
        let detail = format!(
            "its service could not tell within {} of asking",
            humantime::format_duration(patience)
        );
        self.to_recovery_owner(run, action, &detail).await
    }

    /// Puts an unknown outcome to the run's agent's recovery owner, asking about `detail`: the
    /// action leaves the reconcile index and the recovery opens, in one write. `None` where the
    /// agent names no owner or another sweep moved the action first; else the notices to
    /// deliver.
    pub(super) async fn to_recovery_owner(
        &self,
        run: &Stored<Run>,
        action: &Stored<Action>,
        detail: &str,
    ) -> Result<Option<Outgoing>, EngineError> {
        let Some(recovery) = self.recovery_question(&run.value, &action.value, detail)? else {
            return Ok(None);
        };
        let (tenant, run_id) = (&action.value.tenant, &action.value.run_id);
        let mut tx = Tx::new();
        tx.update(
            keys::run_pk(tenant, run_id),
            keys::action_sk(&action.value.id, action.value.version),
            None,
            &action.value,
            action.ver,
        );
        self.open_recovery(&mut tx, &recovery, "sweep");
        match self.commit(tx).await {
            Ok(outbox) => Ok(Some(outbox)),
            Err(StoreError::ConditionFailed { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Writes a recovery as it opens: the approval, its audit event, and its notices.
    pub(super) fn open_recovery(&self, tx: &mut Tx, recovery: &Approval, by: &str) {
        let tenant = &recovery.tenant;
        tx.create_approval(recovery);
        let event = AuditEvent::RecoveryRequested {
            approval_id: recovery.id.clone(),
            action_id: recovery.action_id.clone(),
            version: recovery.action_version,
            owner: recovery.approver_role.clone(),
        };
        tx.audit(
            tenant,
            AuditEntry::new(
                &recovery.run_id,
                Actor::system(by),
                event,
                recovery.created_at,
            ),
        );
        self.notify_later(
            tx,
            recovery,
            NoticeKind::ApprovalRequested,
            recovery.created_at,
        );
        tracing::warn!(approval_id = %recovery.id, owner = %recovery.approver_role, "outcome unknown; asked the recovery owner");
    }

    async fn reload_run(&self, run: &Run) -> Result<Stored<Run>, EngineError> {
        self.load_run(&run.tenant, &run.id)
            .await?
            .ok_or_else(|| EngineError::not_found(format!("run {}", run.id)))
    }
}
