//! Deciding an approval: the approval (read, or the snapshot the reviewer was shown), the
//! domain's ruling, one conditional transaction.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tracing::Instrument;

use super::records::{Outgoing, Stored, Tx, decode_approval, keys};
use super::snapshot::Snapshot;
use super::tally::Tally;
use super::{AWAITING_ACTION_VER, Agent, CAS_ATTEMPTS, Deferred, Delivery, Engine, EngineError};
use super::{RunReport, deadline};
use crate::domain::action::{Action, ActionStatus, NotExecuted, ProposedCall, ToolOutcome};
use crate::domain::approval::{
    Approval, ApprovalStatus, Asking, Choice, Decided, Decision, DecisionEffect, DecisionRequest,
    PreviousVersion, Refusal,
};
use crate::domain::args::Args;
use crate::domain::audit::{AuditEntry, AuditEvent};
use crate::domain::identity::{Actor, Identity};
use crate::domain::ids::{ActionId, ApprovalId};
use crate::domain::policy::history::HistorySlot;
use crate::domain::policy::{Requirement, Total, Verdict, VerdictKind};
use crate::domain::run::Asker;
use crate::ports::store::{Condition, StoreError};

/// The outcome of a decision, including one replayed for a repeated `decision_id`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionReport {
    /// The approval as it stands after the decision.
    pub approval: Approval,
    pub decision: Decision,
    /// True when this `decision_id` was already recorded: nothing new happened.
    pub replayed: bool,
    /// After an edit that still needs people: the approval of the new version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_approval: Option<Approval>,
    /// Where the run stands, when this process resumed it itself (not when the resume was
    /// deferred).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<RunReport>,
}

const MAX_TEXT: usize = 2_000;

/// Rewrites the slots where an edited call is counted with its new version's amounts: it keeps
/// its place in each window. A window the policy no longer declares is left as it was.
fn recount(tx: &mut Tx, agent: &Agent, slots: &[HistorySlot], action: &ActionId, args: &Args) {
    for slot in slots {
        if let Some(window) = agent.policy.history.get(&slot.window) {
            tx.recount_call(slot, action, window.amount(args));
        }
    }
}

/// What an edited version says for itself: its editor's note, or what the editor changed. The
/// agent's words were about the version it proposed, not this one.
fn edited_explanation(decision: &Decision) -> String {
    match &decision.choice {
        Choice::Edit {
            note: Some(note), ..
        } if !note.trim().is_empty() => note.trim().to_string(),
        Choice::Edit { amount, .. } => format!("{} lowered the amount to {amount}.", decision.by),
        _ => String::new(),
    }
}

impl Engine {
    /// Decides an approval for an authenticated person. Refusals write nothing, except a late
    /// decision, which expires the approval.
    pub async fn decide(
        &self,
        who: &Identity,
        approval_id: &ApprovalId,
        request: DecisionRequest,
    ) -> Result<DecisionReport, EngineError> {
        self.decide_shown(who, approval_id, request, None).await
    }

    /// [`Engine::decide`], ruled on the approval as the reviewer was shown it when `snapshot`
    /// is the one they were given with it: one conditional transaction and no read while that
    /// is still the stored approval. A stale or forged snapshot decides as if there were none;
    /// one that cannot be decoded is refused as bad input, and nothing is written.
    pub async fn decide_shown(
        &self,
        who: &Identity,
        approval_id: &ApprovalId,
        request: DecisionRequest,
        snapshot: Option<&str>,
    ) -> Result<DecisionReport, EngineError> {
        self.decide_delivering(who, approval_id, request, snapshot, None)
            .await
    }

    /// [`Engine::decide`], the decision recorded (or refused) just the same, but in the
    /// embedded mode the run it settles is not resumed here: what the decision hands over is
    /// returned, for the caller to deliver with [`Engine::deliver_deferred`] once it has
    /// answered (a Slack click must be answered within seconds, a tool may take longer). The
    /// report then says nothing of the run. With a queue, the resume message is published as
    /// [`Engine::decide`] publishes it, and nothing is left.
    pub async fn decide_deferred(
        &self,
        who: &Identity,
        approval_id: &ApprovalId,
        request: DecisionRequest,
    ) -> (Result<DecisionReport, EngineError>, Deferred) {
        let mut deferred = Deferred::default();
        let later = matches!(self.delivery, Delivery::InProcess).then_some(&mut deferred);
        let decided = self
            .decide_delivering(who, approval_id, request, None, later)
            .await;
        (decided, deferred)
    }

    /// A decision that delivers what it hands over itself, or keeps it in `later`.
    async fn decide_delivering(
        &self,
        who: &Identity,
        approval_id: &ApprovalId,
        request: DecisionRequest,
        snapshot: Option<&str>,
        later: Option<&mut Deferred>,
    ) -> Result<DecisionReport, EngineError> {
        let snapshot = snapshot.map(Snapshot::parse).transpose()?;
        let too_long = request.choice.text().is_some_and(|t| t.len() > MAX_TEXT);
        if too_long {
            return Err(EngineError::BadInput(format!(
                "a reason or note has at most {MAX_TEXT} characters"
            )));
        }
        let span = tracing::info_span!(
            "decide",
            tenant = %who.tenant,
            approval_id = %approval_id,
            by = %who.person,
            run_id = tracing::field::Empty,
            action_id = tracing::field::Empty,
            version = tracing::field::Empty,
        );
        self.decide_approval(who, approval_id, request, snapshot, later)
            .instrument(span)
            .await
    }

    async fn decide_approval(
        &self,
        who: &Identity,
        approval_id: &ApprovalId,
        request: DecisionRequest,
        snapshot: Option<Snapshot>,
        mut later: Option<&mut Deferred>,
    ) -> Result<DecisionReport, EngineError> {
        let approval_pk = keys::approval_pk(&who.tenant, approval_id);
        // The approval as the reviewer was shown it, for the first attempt: ruled on without a
        // read, its write holding only if the stored approval is still exactly that one.
        let mut shown = match snapshot {
            Some(snapshot) => snapshot.approval(who, approval_id)?,
            None => None,
        };
        // After a lost race, the approval as the refusal found it: no read before trying again.
        let mut found: Option<Option<Stored<Approval>>> = None;
        for _ in 0..CAS_ATTEMPTS {
            let (stored, condition) = match shown.take() {
                Some(shown) => shown,
                None => {
                    let stored = match found.take() {
                        Some(stored) => stored,
                        None => self.load_approval(&who.tenant, approval_id).await?,
                    };
                    let Some(stored) = stored else {
                        return Err(EngineError::not_found(format!("approval {approval_id}")));
                    };
                    let read = Condition::VersionIs(stored.ver);
                    (stored, read)
                }
            };
            // A ruling that writes nothing cannot be checked by a condition: one made from a
            // snapshot is made again on the stored approval, so a stale or forged snapshot
            // never refuses or replays a decision wrongly.
            let from_snapshot = matches!(condition, Condition::Unchanged { .. });
            macro_rules! or_read_again {
                ($result:expr) => {
                    match $result {
                        Ok(value) => value,
                        Err(_) if from_snapshot => continue,
                        Err(error) => return Err(error),
                    }
                };
            }
            let mut approval = stored.value;
            let span = tracing::Span::current();
            span.record("run_id", tracing::field::display(&approval.run_id));
            span.record("action_id", tracing::field::display(&approval.action_id));
            span.record("version", tracing::field::display(approval.action_version));
            let now = self.now();
            let agent = or_read_again!(self.agent(&approval.tenant, &approval.agent)).clone();
            let (decision, edited_args) = match approval.decide(who, &request, &agent.policy, now) {
                Ok(Decided::AlreadyRecorded(_)) if from_snapshot => continue,
                Err(ref refusal)
                    if from_snapshot && !matches!(refusal, Refusal::Expired { .. }) =>
                {
                    continue;
                }
                Ok(Decided::AlreadyRecorded(decision)) => {
                    return self.replay(approval, decision, later).await;
                }
                Ok(Decided::New {
                    decision,
                    edited_args,
                }) => {
                    // An edit's version passes the tool's schema check, which a tool only a
                    // listing gives needs listed.
                    if edited_args.is_some() {
                        agent.knowing(&approval.tool).await?;
                    }
                    (decision, edited_args)
                }
                Err(Refusal::Expired { expires_at }) => {
                    // The deadline expired it, not whoever happened to send a late decision
                    // (who may not even hold the approver role).
                    let mut tx = Tx::new();
                    self.write_expiry(
                        &mut tx,
                        &approval,
                        condition,
                        Actor::system("deadline"),
                        now,
                    );
                    match self.commit(tx).await {
                        Ok(outbox) => {
                            tokio::join!(
                                self.unschedule_wakeups(&approval),
                                self.deliver_or_keep(outbox, later.as_deref_mut())
                            );
                            return Err(Refusal::Expired { expires_at }.into());
                        }
                        Err(StoreError::ConditionFailed { .. }) => continue,
                        Err(error) => return Err(error.into()),
                    }
                }
                Err(refusal) => return Err(refusal.into()),
            };

            // The approval's item holds the decision's `decision` event, first of this write's.
            let mut tx = Tx::new();
            let mut decision = decision;
            decision.logged = Some(tx.log_slot(&approval.tenant, &approval.run_id));
            *approval
                .decisions
                .last_mut()
                .expect("a new decision is the approval's last") = decision.clone();
            let next_approval = match &decision.effect {
                DecisionEffect::Counted { .. } => None,
                DecisionEffect::Approved => {
                    let mut action = approval.awaiting_action();
                    action
                        .approve(approval.authorized_by(), now)
                        .expect("a waiting action can be approved");
                    self.settle_action(&mut tx, &action);
                    None
                }
                DecisionEffect::Rejected => {
                    let Choice::Reject { reason } = &decision.choice else {
                        unreachable!("a rejection has a reason")
                    };
                    let told = NotExecuted::Rejected {
                        by: who.person.as_str(),
                        reason,
                    }
                    .told();
                    let mut action = approval.awaiting_action();
                    action
                        .close(ActionStatus::Rejected, told, now)
                        .expect("a waiting action can be rejected");
                    self.settle_action(&mut tx, &action);
                    None
                }
                DecisionEffect::Edited { .. } => {
                    let args = edited_args.expect("an edit brings the new arguments");
                    // Policy rules on the new version as it did on the first: for the run's
                    // requester, as the approval keeps them (one opened before it kept them
                    // reads its run).
                    let (person, standing) = match approval.asker() {
                        Some(asker) => (asker.person.clone(), asker.standing.clone()),
                        None => {
                            let run = or_read_again!(
                                self.load_run(&approval.tenant, &approval.run_id)
                                    .await?
                                    .ok_or_else(|| EngineError::not_found(format!(
                                        "run {}",
                                        approval.run_id
                                    )))
                            );
                            (run.value.requested_by, run.value.standing)
                        }
                    };
                    let tenant = approval.tenant.clone();
                    let asker = Asker {
                        tenant: &tenant,
                        person: &person,
                        standing: &standing,
                    };
                    // The call's own earlier version is left out of the totals it is decided
                    // on: the new version takes its place.
                    let own = Some(&approval.action_id);
                    let history = or_read_again!(
                        self.totals(
                            &agent,
                            asker,
                            (&approval.tool, &args),
                            now,
                            &mut Tally::default(),
                            own,
                        )
                        .await
                    );
                    or_read_again!(self.write_edit(
                        &agent,
                        asker,
                        &mut tx,
                        &mut approval,
                        &decision,
                        (args, &history),
                        now
                    ))
                }
                DecisionEffect::Answered { took_effect } => {
                    let answer =
                        self.write_answer(&mut tx, &approval, &decision, *took_effect, now);
                    or_read_again!(answer.await);
                    None
                }
            };
            match approval.status {
                // Counted toward a quorum: it still waits.
                ApprovalStatus::AwaitingApproval => tx.update_approval_if(&approval, condition),
                _ => tx.settle_approval(&approval, condition),
            }
            self.follow_up_later(
                &mut tx,
                (&approval.tenant, &approval.run_id, &approval.id),
                now,
            );

            match self
                .commit_watching(tx, (&approval_pk, keys::APPROVAL_SK))
                .await
            {
                Ok(outbox) => {
                    tracing::info!(
                        effect = ?decision.effect,
                        decision_seconds = approval.seconds_open(now),
                        "decided"
                    );
                    // After the commit, the resume message, the schedule deletes and a new
                    // version's schedules go out together: none waits on another.
                    let unschedule = async {
                        if approval.status != ApprovalStatus::AwaitingApproval {
                            self.unschedule_wakeups(&approval).await;
                        }
                    };
                    let schedule = async {
                        if let Some(next) = next_approval
                            .as_ref()
                            .filter(|a| a.status == ApprovalStatus::AwaitingApproval)
                        {
                            self.schedule_wakeups(next).await;
                        }
                    };
                    let deferring = later.is_some();
                    tokio::join!(unschedule, schedule, self.deliver_or_keep(outbox, later));
                    let run = match deferring {
                        true => None,
                        false => self.run_after_delivery(&approval).await?,
                    };
                    return Ok(DecisionReport {
                        approval,
                        decision,
                        replayed: false,
                        next_approval,
                        run,
                    });
                }
                Err((StoreError::ConditionFailed { .. }, seen)) => {
                    found = seen
                        .map(|item| item.as_ref().map(decode_approval).transpose())
                        .transpose()?;
                    continue;
                }
                Err((error, _)) => return Err(error.into()),
            }
        }
        Err(EngineError::Contended)
    }

    /// A recovery owner's answer settles the unknown action as they say, audited as a
    /// reconciliation by them, and resumes its run with it.
    async fn write_answer(
        &self,
        tx: &mut Tx,
        recovery: &Approval,
        decision: &Decision,
        took_effect: bool,
        now: DateTime<Utc>,
    ) -> Result<(), EngineError> {
        let stored = self
            .load_action(
                &recovery.tenant,
                &recovery.run_id,
                &recovery.action_id,
                recovery.action_version,
            )
            .await?
            .ok_or_else(|| EngineError::Corrupt(format!("{} has no action", recovery.id)))?;
        let mut action = stored.value;
        let by = &decision.by;
        let said = decision
            .choice
            .text()
            .map(|note| format!(": {note}"))
            .unwrap_or_default();
        let outcome = match took_effect {
            true => ToolOutcome::Succeeded {
                result: serde_json::json!({
                    "took_effect": true,
                    "confirmed_by": by,
                    "note": decision.choice.text(),
                }),
            },
            false => ToolOutcome::Failed {
                error: format!("it did not take effect, as {by} confirmed{said}"),
            },
        };
        action
            .record(&outcome, now)
            .map_err(|e| EngineError::Corrupt(e.to_string()))?;
        tx.resume_action(self.index_shards, &action, Condition::VersionIs(stored.ver));
        let event = AuditEvent::Reconciled {
            action_id: action.id.clone(),
            version: action.version,
            succeeded: took_effect,
            result: action
                .result
                .as_ref()
                .map(|r| r.content.clone())
                .unwrap_or_default(),
        };
        tx.audit(
            &action.tenant,
            AuditEntry::new(&action.run_id, Actor::person(by), event, now),
        );
        Ok(())
    }

    /// Writes an action that left `awaiting_approval`, approved or settled: its item enters
    /// the outbox index as the pending delivery of the message that resumes its run.
    fn settle_action(&self, tx: &mut Tx, action: &Action) {
        let waiting = Condition::VersionIs(AWAITING_ACTION_VER);
        tx.resume_action(self.index_shards, action, waiting);
    }

    /// Expires an approval already marked expired: approval, action, audit, resume message.
    /// The approval's write holds on `read`: how the expiry's ruling read it.
    pub(super) fn write_expiry(
        &self,
        tx: &mut Tx,
        approval: &Approval,
        read: Condition,
        actor: Actor,
        now: DateTime<Utc>,
    ) {
        debug_assert_eq!(approval.status, ApprovalStatus::Expired);
        let deadline = keys::sortable(approval.expires_at);
        let told = NotExecuted::Expired {
            deadline: &deadline,
        }
        .told();
        let mut action = approval.awaiting_action();
        action
            .close(ActionStatus::Expired, told, now)
            .expect("a waiting action can expire");
        let event = AuditEvent::Expired {
            approval_id: approval.id.clone(),
            action_id: approval.action_id.clone(),
            version: approval.action_version,
        };
        tx.audit(
            &approval.tenant,
            AuditEntry::new(&approval.run_id, actor, event, now),
        );
        tx.settle_approval(approval, read);
        self.follow_up_later(tx, (&approval.tenant, &approval.run_id, &approval.id), now);
        self.settle_action(tx, &action);
    }

    /// An edit supersedes this version and proposes the next one, which policy evaluates again.
    /// The editor's edit counts as their approval of the new version.
    #[allow(clippy::too_many_arguments)]
    fn write_edit(
        &self,
        agent: &Agent,
        asker: Asker<'_>,
        tx: &mut Tx,
        approval: &mut Approval,
        decision: &Decision,
        (args, history): (Args, &BTreeMap<String, Total>),
        now: DateTime<Utc>,
    ) -> Result<Option<Approval>, EngineError> {
        let editor = &decision.by;
        let mut old = approval.awaiting_action();
        old.close(ActionStatus::Superseded, String::new(), now)
            .expect("a waiting action can be superseded");
        tx.update(
            keys::run_pk(&old.tenant, &old.run_id),
            keys::action_sk(&old.id, old.version),
            None,
            &old,
            AWAITING_ACTION_VER,
        );

        let version = approval.action_version.next();
        let mut proposal = ProposedCall {
            agent: approval.agent.clone(),
            id: approval.action_id.clone(),
            version,
            tenant: approval.tenant.clone(),
            run_id: approval.run_id.clone(),
            tool_use_id: approval.tool_use_id.clone(),
            tool: approval.tool.clone(),
            args,
            explanation: edited_explanation(decision),
            rules: Vec::new(),
            log_only: None,
        };
        // The next version passes the gate every proposed call passes, before policy.
        if let Err(unfit) = agent.check_call(&proposal.tool, proposal.args.as_value()) {
            return Err(EngineError::PolicyRefused(format!(
                "the edited call cannot be proposed: {}",
                unfit.why
            )));
        }
        // The same tool, so the hints policy matched on the first version rule on this one.
        let ruling = agent.decide(
            &agent.policy,
            asker,
            &proposal.tool,
            &proposal.args,
            approval.hints,
            history,
            now,
        );
        proposal.rules = ruling.rules.clone();
        proposal.log_only = ruling.log_only();
        let verdict = ruling.verdict;
        let next = match &verdict {
            Verdict::Deny { reason } => {
                return Err(EngineError::PolicyRefused(format!(
                    "policy denies the edited call: {reason}"
                )));
            }
            Verdict::Allow => {
                let mut action = Action::propose(proposal, now);
                action
                    .approve(
                        vec![
                            Actor::person(editor),
                            Actor::Policy {
                                version: agent.policy.version,
                            },
                        ],
                        now,
                    )
                    .expect("a new version can be approved");
                self.write_superseded(tx, approval, version, None, now, editor);
                recount(tx, agent, &approval.counted, &action.id, &action.args);
                tx.count_ruling(&agent.name, &action, VerdictKind::Allow);
                let event = AuditEvent::proposed(&action, verdict.clone(), None);
                tx.audit(
                    &action.tenant,
                    AuditEntry::new(&action.run_id, Actor::person(editor), event, now),
                );
                tx.resume_action(self.index_shards, &action, Condition::NotExists);
                None
            }
            Verdict::RequireApproval(requirement) => {
                let mut next =
                    self.next_approval(agent, approval, decision, proposal, requirement, now)?;
                next.counted = approval.counted.clone();
                recount(tx, agent, &next.counted, &next.action_id, &next.args);
                self.write_superseded(tx, approval, version, Some(next.id.clone()), now, editor);
                self.open_approval(tx, &next, verdict.clone(), Actor::person(editor));
                let counted = next.decisions.last().expect("the editor's decision");
                let event = AuditEvent::Decision {
                    approval_id: next.id.clone(),
                    action_id: next.action_id.clone(),
                    version: next.action_version,
                    args_hash: next.args_hash.clone(),
                    choice: counted.choice.clone(),
                    effect: counted.effect.clone(),
                };
                tx.audit(
                    &next.tenant,
                    AuditEntry::new(&next.run_id, Actor::person(editor), event, now),
                );
                // An approved next version was written with its resume due (open_approval).
                Some(next)
            }
        };
        Ok(next)
    }

    fn write_superseded(
        &self,
        tx: &mut Tx,
        approval: &mut Approval,
        by_version: crate::domain::ids::ActionVersion,
        new_approval_id: Option<ApprovalId>,
        now: DateTime<Utc>,
        editor: &crate::domain::ids::PersonId,
    ) {
        approval.superseded_by = new_approval_id.clone();
        let event = AuditEvent::Superseded {
            approval_id: approval.id.clone(),
            action_id: approval.action_id.clone(),
            version: approval.action_version,
            by_version,
            new_approval_id,
        };
        tx.audit(
            &approval.tenant,
            AuditEntry::new(&approval.run_id, Actor::person(editor), event, now),
        );
    }

    fn next_approval(
        &self,
        agent: &Agent,
        old: &Approval,
        decision: &Decision,
        proposal: ProposedCall,
        requirement: &Requirement,
        now: DateTime<Utc>,
    ) -> Result<Approval, EngineError> {
        let note = match &decision.choice {
            Choice::Edit { note, .. } => note.clone(),
            _ => None,
        };
        // The new version gets as long to decide as the old one had.
        let time_to_decide = old.expires_at - old.created_at;
        let asking = Asking {
            agent: old.agent.clone(),
            hints: old.hints,
            requested_by: old.requested_by.clone(),
            standing: old.standing.clone(),
            policy_version: agent.policy.version,
            opened_at: now,
            expires_at: deadline(now, time_to_decide)?,
        };
        let mut next = Approval::open(proposal, requirement, asking);
        next.previous = Some(PreviousVersion {
            version: old.action_version,
            args: old.args.clone(),
            edited_by: decision.by.clone(),
            note,
        });
        // The edit counts as its editor's approval of the new version, for the roles they hold.
        next.decisions.push(Decision {
            decision_id: decision.decision_id.clone(),
            by: decision.by.clone(),
            choice: decision.choice.clone(),
            action_version: next.action_version,
            args_hash: next.args_hash.clone(),
            at: now,
            effect: DecisionEffect::Approved,
            roles: decision.roles.clone(),
            // Its event is in this write's audit item, after the new version's own.
            logged: None,
        });
        let effect = match next.still_needed() {
            0 => DecisionEffect::Approved,
            n => DecisionEffect::Counted { still_needed: n },
        };
        if let Some(counted) = next.decisions.last_mut() {
            counted.effect = effect.clone();
        }
        if effect == DecisionEffect::Approved {
            next.status = ApprovalStatus::Approved;
            next.resolved_at = Some(now);
        }
        Ok(next)
    }

    /// What a committed decision handed over: delivered now, or kept in `later`.
    async fn deliver_or_keep(&self, outgoing: Outgoing, later: Option<&mut Deferred>) {
        match later {
            Some(later) => later.keep(outgoing),
            None => {
                self.deliver(outgoing).await;
            }
        }
    }

    async fn replay(
        &self,
        approval: Approval,
        decision: Decision,
        later: Option<&mut Deferred>,
    ) -> Result<DecisionReport, EngineError> {
        // The first attempt may have committed and stopped before it delivered: finish that.
        // Notices keep to their own schedule; the sweep posts them when they are due.
        let undelivered = self
            .awaiting_resume(&approval.tenant, &approval.run_id)
            .await?;
        let deferring = later.is_some();
        match later {
            Some(later) => later.keep_stored(undelivered),
            None => {
                self.deliver_stored(undelivered, vec![]).await;
            }
        }
        let next_approval = match &approval.superseded_by {
            Some(next) => self
                .load_approval(&approval.tenant, next)
                .await?
                .map(|s| s.value),
            None => None,
        };
        let run = match deferring {
            true => None,
            false => self.run_after_delivery(&approval).await?,
        };
        Ok(DecisionReport {
            approval,
            decision,
            replayed: true,
            next_approval,
            run,
        })
    }

    /// In the embedded mode the run was resumed in this process: say where it stands.
    async fn run_after_delivery(
        &self,
        approval: &Approval,
    ) -> Result<Option<RunReport>, EngineError> {
        if !matches!(self.delivery, Delivery::InProcess) {
            return Ok(None);
        }
        let run = self.load_run(&approval.tenant, &approval.run_id).await?;
        let Some(run) = run else { return Ok(None) };
        let waiting = if run.value.status == crate::domain::run::RunStatus::AwaitingApproval {
            self.pending_of_run(&run.value).await?
        } else {
            vec![]
        };
        Ok(Some(RunReport::of(&run.value, waiting)))
    }
}
