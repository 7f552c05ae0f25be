//! The sweep: expires overdue approvals, marks reminders due, delivers outbox stragglers (resume
//! messages, sent again with back-off until something acts on them, and notices), reconciles
//! actions whose outcome is unknown, and takes over runs whose driver stopped (driven again
//! from their stored conversation where that runs nothing twice, else failed). Bounded work per call; safe to run twice at once
//! (every write is a CAS, and notices are claimed before posting).

use std::sync::atomic::Ordering;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use super::records::{
    EscalationDue, OutboxEntry, Outgoing, STALE_EXECUTION, Stored, Tx, decode, decode_approval,
    keys, reconcile_key, resume_message,
};
use super::resume::{Settles, lost_read};
use super::{Delivery, Engine, EngineError, NoticeReport};
use crate::domain::action::{Action, ActionStatus, ToolOutcome};
use crate::domain::approval::Approval;
use crate::domain::audit::{AuditEntry, AuditEvent};
use crate::domain::identity::Actor;
use crate::domain::ids::{ApprovalId, RunId, TenantId};
use crate::domain::is_zero;
use crate::domain::notice::NoticeKind;
use crate::domain::run::{MOST_REDRIVES, NotRedriven, Run, RunStatus};
use crate::ports::queue::{DriveMessage, ResumeQueue};
use crate::ports::store::{Condition, Item, StoreError, query_all};
use crate::ports::tools::ToolCall;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SweepReport {
    pub expired: Vec<ApprovalId>,
    /// Approvals whose deadline is near, now with a reminder on its way.
    pub reminded: Vec<ApprovalId>,
    /// Approvals nobody decided in time, now open to one more role.
    pub escalated: Vec<ApprovalId>,
    /// Resume messages found undelivered and delivered again.
    pub redelivered: usize,
    /// `action_id:version` of resume messages nothing acted on within their lease (the workers
    /// that received them died, or they went to the dead-letter queue), sent again under a
    /// deduplication id of their own.
    pub resent: Vec<String>,
    /// `action_id:version` of resume messages the sweep stopped sending again: each run waits
    /// for a person to move its message back from the dead-letter queue.
    pub resumes_given_up: Vec<String>,
    /// The notices this sweep posted: new reminders, retries, and ones their writer left.
    pub notices: NoticeReport,
    /// `action_id:version` of actions whose outcome the tool settled.
    pub reconciled: Vec<String>,
    /// Reads whose answer was lost, now failed: nothing took effect, so nothing is left to
    /// reconcile.
    pub lost_reads: Vec<String>,
    /// Actions still without a definite outcome.
    pub unknown: Vec<String>,
    /// Of `unknown`, the ones only a person can settle and none is named to: their tool cannot
    /// be asked and their agent names no recovery owner. Once it names one, the next sweep asks
    /// that role.
    pub unowned: Vec<String>,
    /// Actions whose tool could not tell in its time, or cannot be asked at all, now a question
    /// for the recovery owner.
    pub to_recovery_owner: Vec<String>,
    /// Runs whose driving process stopped (their lease ran out), now failed: replaying their
    /// turn could have run a call twice, or they were driven again too often.
    pub abandoned: Vec<RunId>,
    /// Runs whose driving process stopped during a model turn, now driven again from their
    /// stored conversation.
    pub redriven: Vec<RunId>,
}

/// What the sweep did with a run whose lease ran out.
enum TakenOver {
    Redriven(RunId),
    Failed(RunId),
}

/// An action waiting in the outbox index for its resume message to be acted on, as the sweep
/// reads and writes it: the action, and how many times the sweep handed the message over. Only
/// the sweep knows the count; the write that acts on the message (the claim, or the result
/// held) writes the action alone, and the count goes with the entry.
#[derive(Serialize, Deserialize)]
struct AwaitingResume {
    #[serde(flatten)]
    action: Action,
    #[serde(default, skip_serializing_if = "is_zero")]
    handed_over: u32,
}

/// How long the sweep waits for something to act on a resume message it handed over for the
/// `n`-th time before it hands the message over again.
fn resend_lease(n: u32) -> Duration {
    RESEND_AFTER * 2_i32.pow(n.saturating_sub(1).min(MOST_HANDOVERS))
}

/// The run an index entry of the running runs is about.
#[derive(serde::Deserialize)]
struct RunNamed {
    id: RunId,
    tenant: TenantId,
}

/// How long an action may wait in the outbox index for its writer to publish its resume
/// message and its consumer to act on it (which takes it out) before the sweep delivers the
/// message again.
const OUTBOX_GRACE: Duration = Duration::seconds(30);
/// How long a resume message the sweep handed over may go without anything acting on it
/// before the sweep sends it again: about as long as the queue itself delivers a message its
/// workers receive and drop before it dead-letters it (template.yaml: 5 receives, 960 s
/// apart, 80 minutes). Doubled after each hand-over.
const RESEND_AFTER: Duration = Duration::hours(1);
/// How many times the sweep hands one resume message over (the first under its writer's
/// deduplication id, the others as re-sends, about 31 hours in all) before it leaves the
/// message to the dead-letter queue and a person.
const MOST_HANDOVERS: u32 = 5;
/// How long to wait before asking a tool again about an unknown outcome.
const RECHECK: Duration = Duration::minutes(5);
/// How many pages of a tenant's approvals due soon one sweep reads, past the ones it acts on.
const DUE_PAGES: usize = 4;
/// Why the sweep fails a run whose lease ran out.
const ABANDONED: &str = "the process driving this run stopped before it finished";

/// The span, named `$name`, of the sweep's work on one action version: the ids every line of
/// it carries. A span's name is fixed where it is declared, so this is a macro, not a function.
macro_rules! action_span {
    ($name:literal, $action:expr) => {{
        let action: &Action = $action;
        tracing::info_span!(
            $name,
            tenant = %action.tenant,
            run_id = %action.run_id,
            action_id = %action.id,
            version = %action.version,
            approval_id = action.approval_id.as_ref().map(tracing::field::display)
        )
    }};
}

impl Engine {
    /// One sweep, touching at most `budget` items of each kind.
    pub async fn sweep(&self, budget: usize) -> Result<SweepReport, EngineError> {
        self.sweep_once(budget)
            .instrument(tracing::info_span!("sweep"))
            .await
    }

    async fn sweep_once(&self, budget: usize) -> Result<SweepReport, EngineError> {
        let mut report = SweepReport::default();
        let budget = budget.max(1);
        self.sweeps.fetch_add(1, Ordering::Relaxed);

        let tenants = query_all(self.store.as_ref(), keys::TENANTS_PK, "TENANT#").await?;
        let mut outbox = Outgoing::default();
        for item in &tenants {
            let tenant = decode::<TenantId>(item)?.value;
            let left = budget.saturating_sub(report.expired.len() + report.reminded.len());
            if left == 0 {
                break;
            }
            self.due_approvals(&tenant, left, &mut report, &mut outbox)
                .await?;
        }
        self.due_escalations(budget, &mut report, &mut outbox)
            .await?;
        let posted = self.deliver(outbox).await;
        report.notices.add(posted);

        // A resume message gets a grace period to be published and consumed; a notice is due at
        // its index key (written, or next attempt, or end of claim), and its claim settles who
        // posts it.
        let grace = match self.delivery {
            Delivery::InProcess => Duration::zero(),
            Delivery::Queue(_) => OUTBOX_GRACE,
        };
        let now = self.now();
        let due = self
            .due_in(keys::OUTBOX_INDEX, &keys::due_until(now), budget)
            .await?;
        // The index holds outbox items (notices), actions whose resume message is due (first
        // after the grace, then when the lease of the sweep's last hand-over runs out), and
        // actions claimed from that message (its consumer kept the entry as it was).
        let (after_grace, now_key) = (keys::due_until(now - grace), keys::due_until(now));
        let (mut resumes, mut claimed, mut notices) = (Vec::new(), Vec::new(), Vec::new());
        for item in &due {
            if !item.sk.starts_with(keys::ACTION_PREFIX) {
                notices.push(decode::<OutboxEntry>(item)?);
                continue;
            }
            let key = item.gsi1.as_ref().map_or("", |k| k.sk.as_str());
            let waiting = decode::<AwaitingResume>(item)?;
            let due_by = match waiting.value.handed_over {
                0 => &after_grace,
                _ => &now_key,
            };
            if key > due_by.as_str() {
                continue;
            }
            match waiting.value.action.status {
                ActionStatus::Executing => claimed.push(Stored {
                    value: waiting.value.action,
                    ver: waiting.ver,
                }),
                _ => resumes.push(waiting),
            }
        }
        match &self.delivery {
            Delivery::InProcess => {
                report.redelivered = resumes.len();
                let resumes = resumes
                    .into_iter()
                    .map(|w| Stored {
                        value: w.value.action,
                        ver: w.ver,
                    })
                    .collect();
                let posted = self.deliver_stored(resumes, notices).await;
                report.notices.add(posted);
            }
            Delivery::Queue(queue) => {
                for waiting in resumes {
                    let action = &waiting.value.action;
                    let span = action_span!("hand_over", action);
                    self.hand_over(queue.as_ref(), waiting, &mut report)
                        .instrument(span)
                        .await?;
                }
                let posted = self.deliver_stored(vec![], notices).await;
                report.notices.add(posted);
            }
        }
        // A call still running after the grace: its message was consumed, and its outcome is
        // now the reconcile index's to watch, from when its execution goes stale (the loop
        // below, in this same sweep, if it already has).
        for action in &claimed {
            self.dequeue(action).await;
        }

        let until = keys::due_until(self.now());
        let due = self.due_in(keys::RECONCILE_INDEX, &until, budget).await?;
        for item in &due {
            let action = decode::<Action>(item)?;
            let span = action_span!("reconcile", &action.value);
            self.reconcile(action, &mut report).instrument(span).await?;
        }

        let now = self.now();
        let due = self
            .due_in(keys::RUNNING_INDEX, &keys::due_until(now), budget)
            .await?;
        for item in &due {
            // The index entry names the run; its item carries only part of the conversation.
            let named = decode::<RunNamed>(item)?.value;
            let Some(run) = self.load_run(&named.tenant, &named.id).await? else {
                continue;
            };
            let span = tracing::info_span!("take_over", tenant = %run.value.tenant, run_id = %run.value.id);
            match self.take_over(run, now).instrument(span).await? {
                Some(TakenOver::Redriven(run)) => report.redriven.push(run),
                Some(TakenOver::Failed(run)) => report.abandoned.push(run),
                None => {}
            }
        }

        let worked = !report.expired.is_empty()
            || !report.reminded.is_empty()
            || !report.escalated.is_empty()
            || !report.notices.is_empty()
            || report.redelivered > 0
            || !report.resent.is_empty()
            || !report.resumes_given_up.is_empty()
            || !report.reconciled.is_empty()
            || !report.lost_reads.is_empty()
            || !report.to_recovery_owner.is_empty()
            || !report.abandoned.is_empty()
            || !report.redriven.is_empty();
        if worked {
            tracing::info!(
                expired = report.expired.len(),
                reminded = report.reminded.len(),
                escalated = report.escalated.len(),
                notices_sent = report.notices.sent,
                notices_retrying = report.notices.retrying,
                notices_failed = report.notices.failed,
                redelivered = report.redelivered,
                resent = report.resent.len(),
                resumes_given_up = report.resumes_given_up.len(),
                reconciled = report.reconciled.len(),
                lost_reads = report.lost_reads.len(),
                unowned = report.unowned.len(),
                to_recovery_owner = report.to_recovery_owner.len(),
                abandoned = report.abandoned.len(),
                redriven = report.redriven.len(),
                "swept"
            );
        }
        Ok(report)
    }

    /// Hands a resume message nothing acted on within its grace or lease over to the queue
    /// again, and gives its action's outbox entry the next, longer lease, in one compare-and-set
    /// that holds the re-send's audit event. The first hand-over shares the writer's
    /// deduplication id, so the queue drops it if the writer's message went out; each re-send
    /// has its own, so it gets through though the first died in the dead-letter queue. Past
    /// the last, the entry leaves the index and the message is left to a person.
    async fn hand_over(
        &self,
        queue: &dyn ResumeQueue,
        waiting: Stored<AwaitingResume>,
        report: &mut SweepReport,
    ) -> Result<(), EngineError> {
        let AwaitingResume {
            action,
            handed_over,
        } = waiting.value;
        let key = action.key();
        let now = self.now();
        let log =
            |event: AuditEvent| AuditEntry::new(&action.run_id, Actor::system("sweep"), event, now);
        let mut tx = Tx::new();
        if handed_over >= MOST_HANDOVERS {
            let resent = handed_over - 1;
            tx.update_action(self.index_shards, &action, waiting.ver);
            let event = AuditEvent::ResumeGivenUp {
                action_id: action.id.clone(),
                version: action.version,
                resent,
            };
            tx.audit(&action.tenant, log(event));
            if self.commit_first(tx).await?.is_some() {
                tracing::error!(%key, resent, "nothing acted on the resume message; left to the dead-letter queue and a person");
                report.resumes_given_up.push(key);
            }
            return Ok(());
        }
        let mut message = resume_message(&action);
        message.resent = handed_over;
        if let Err(error) = queue.publish(&message).await {
            tracing::warn!(%key, %error, "not handed over; the sweep tries again");
            return Ok(());
        }
        let (pk, sk) = (
            keys::run_pk(&action.tenant, &action.run_id),
            keys::action_sk(&action.id, action.version),
        );
        let lease = resend_lease(handed_over + 1);
        let index = keys::outbox(self.index_shards, now + lease, &key);
        if handed_over > 0 {
            let event = AuditEvent::ResumeResent {
                action_id: action.id.clone(),
                version: action.version,
                resent: handed_over,
            };
            tx.audit(&action.tenant, log(event));
        }
        let leased = AwaitingResume {
            action,
            handed_over: handed_over + 1,
        };
        tx.update(pk, sk, Some(index), &leased, waiting.ver);
        if self.commit_first(tx).await?.is_none() {
            tracing::debug!(%key, "acted on, or handed over by another sweep, meanwhile");
            return Ok(());
        }
        report.redelivered += 1;
        if handed_over > 0 {
            tracing::warn!(%key, resent = handed_over, next = %keys::sortable(now + lease), "nothing acted on the resume message within its lease; sent again");
            report.resent.push(key);
        }
        Ok(())
    }

    /// Up to `budget` entries of a sharded index due by `until`: each shard in turn, from
    /// the one this sweep starts at round to the one before it.
    async fn due_in(
        &self,
        index: &str,
        until: &str,
        budget: usize,
    ) -> Result<Vec<Item>, EngineError> {
        let shards = keys::shard_pks(index, self.index_shards);
        let first = self.sweeps.load(Ordering::Relaxed) as usize % shards.len();
        let mut due = Vec::new();
        for pk in shards.iter().cycle().skip(first).take(shards.len()) {
            let left = budget.saturating_sub(due.len());
            if left == 0 {
                break;
            }
            let page = self.store.query_index(pk, "", until, None, left).await?;
            due.extend(page.items);
        }
        Ok(due)
    }

    /// A tenant's approvals that wait with a deadline before `now` plus the reminder lead: the
    /// overdue ones expire, the others get their reminder if they have none yet. The pending
    /// index sorts by deadline, so the overdue come first.
    async fn due_approvals(
        &self,
        tenant: &TenantId,
        budget: usize,
        report: &mut SweepReport,
        outbox: &mut Outgoing,
    ) -> Result<(), EngineError> {
        let now = self.now();
        let lead = self.notifies().then_some(self.remind_before);
        let until = lead
            .and_then(|lead| now.checked_add_signed(lead))
            .unwrap_or(now);
        let index = keys::pending_index(tenant);
        let (mut done, mut pages) = (0, 0);
        let mut after: Option<String> = None;
        loop {
            let page = self
                .store
                .query_index(
                    &index,
                    "",
                    &keys::due_until(until),
                    after.as_deref(),
                    budget,
                )
                .await?;
            pages += 1;
            for item in &page.items {
                if done >= budget {
                    return Ok(());
                }
                let approval = decode_approval(item)?;
                let span = |name: &'static str| {
                    tracing::info_span!(
                        "due",
                        step = name,
                        tenant = %approval.value.tenant,
                        approval_id = %approval.value.id,
                        run_id = %approval.value.run_id,
                        action_id = %approval.value.action_id,
                        version = %approval.value.action_version
                    )
                };
                if approval.value.is_overdue(now) {
                    let span = span("expire");
                    if let Some((expired, entries)) =
                        self.expire(approval, now).instrument(span).await?
                    {
                        report.expired.push(expired);
                        outbox.extend(entries);
                        done += 1;
                    }
                } else if let Some(lead) = lead {
                    let span = span("remind");
                    if let Some((reminded, entries)) =
                        self.remind(approval, now, lead).instrument(span).await?
                    {
                        report.reminded.push(reminded);
                        outbox.extend(entries);
                        done += 1;
                    }
                }
            }
            match page.next {
                Some(next) if done < budget && pages < DUE_PAGES => after = Some(next),
                _ => return Ok(()),
            }
        }
    }

    /// The approvals whose next escalation step is due: each goes to its next role, with its
    /// audit event and notices, in one transaction.
    async fn due_escalations(
        &self,
        budget: usize,
        report: &mut SweepReport,
        outbox: &mut Outgoing,
    ) -> Result<(), EngineError> {
        let now = self.now();
        let due = self
            .due_in(keys::ESCALATE_INDEX, &keys::due_until(now), budget)
            .await?;
        for item in &due {
            let marker: Stored<EscalationDue> = decode(item)?;
            let span = tracing::info_span!(
                "escalate",
                tenant = %marker.value.tenant,
                approval_id = %marker.value.approval_id
            );
            if let Some((escalated, entries)) = self.escalate(marker, now).instrument(span).await? {
                report.escalated.push(escalated);
                outbox.extend(entries);
            }
        }
        Ok(())
    }

    /// Escalates one approval whose step is due; drops the marker of one that no longer waits
    /// or has no step left. `None` when nothing was escalated.
    async fn escalate(
        &self,
        marker: Stored<EscalationDue>,
        now: DateTime<Utc>,
    ) -> Result<Option<(ApprovalId, Outgoing)>, EngineError> {
        let EscalationDue {
            tenant,
            approval_id,
        } = &marker.value;
        let (pk, sk) = (
            keys::approval_pk(tenant, approval_id),
            keys::ESCALATION_SK.to_string(),
        );
        let stored = self.load_approval(tenant, approval_id).await?;
        let mut tx = Tx::new();
        let Some(mut approval) = stored else {
            tx.delete(pk, sk, Condition::VersionIs(marker.ver));
            let _ = self.commit(tx).await;
            return Ok(None);
        };
        let Some(role) = approval.value.escalate(now) else {
            // Decided, expired or overdue: nobody needs asking any more.
            if approval.value.next_escalation().is_none() || approval.value.is_overdue(now) {
                tx.delete(pk, sk, Condition::VersionIs(marker.ver));
                match self.commit(tx).await {
                    Ok(_) | Err(StoreError::ConditionFailed { .. }) => {}
                    Err(error) => return Err(error.into()),
                }
            }
            return Ok(None);
        };
        let a = &approval.value;
        tx.update_approval(a, approval.ver);
        let event = AuditEvent::Escalated {
            approval_id: a.id.clone(),
            to: role.clone(),
        };
        tx.audit(
            &a.tenant,
            AuditEntry::new(&a.run_id, Actor::system("sweep"), event, now),
        );
        self.notify_later(&mut tx, a, NoticeKind::Escalated, now);
        match a.next_escalation() {
            Some((at, _)) => tx.update(
                pk,
                sk,
                Some(keys::escalation(self.index_shards, at, tenant, approval_id)),
                &marker.value,
                marker.ver,
            ),
            None => tx.delete(pk, sk, Condition::VersionIs(marker.ver)),
        }
        let Some(entries) = self.commit_first(tx).await? else {
            return Ok(None);
        };
        tracing::info!(to = %role, "escalated");
        Ok(Some((approval.value.id, entries)))
    }

    /// Commits what the sweep wrote for one record: its outbox entries, or `None` when a
    /// condition failed (a decision, or another sweep, got there first).
    async fn commit_first(&self, tx: Tx) -> Result<Option<Outgoing>, EngineError> {
        match self.commit(tx).await {
            Ok(entries) => Ok(Some(entries)),
            Err(StoreError::ConditionFailed { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Marks an approval reminded and writes its reminder notices, in one transaction; `None`
    /// if it needs no reminder, or another sweep or a decision got there first.
    async fn remind(
        &self,
        mut approval: Stored<Approval>,
        now: DateTime<Utc>,
        lead: Duration,
    ) -> Result<Option<(ApprovalId, Outgoing)>, EngineError> {
        if !approval.value.remind(now, lead) {
            return Ok(None);
        }
        let a = &approval.value;
        let mut tx = Tx::new();
        tx.update_approval(a, approval.ver);
        self.notify_later(&mut tx, a, NoticeKind::Reminder, now);
        let Some(entries) = self.commit_first(tx).await? else {
            return Ok(None);
        };
        tracing::info!("reminder due");
        Ok(Some((approval.value.id, entries)))
    }

    /// Expires one overdue approval; `None` if it was decided or expired in the meantime.
    async fn expire(
        &self,
        mut approval: Stored<Approval>,
        now: DateTime<Utc>,
    ) -> Result<Option<(ApprovalId, Outgoing)>, EngineError> {
        if !approval.value.expire(now) {
            return Ok(None);
        }
        let mut tx = Tx::new();
        self.write_expiry(
            &mut tx,
            &approval.value,
            Condition::VersionIs(approval.ver),
            Actor::system("sweep"),
            now,
        );
        // None: decided or expired by someone else in the meantime.
        let Some(entries) = self.commit_first(tx).await? else {
            return Ok(None);
        };
        tracing::info!("expired");
        self.unschedule_wakeups(&approval.value).await;
        Ok(Some((approval.value.id, entries)))
    }

    /// Takes over a run whose lease ran out (the process driving it stopped before it
    /// finished): re-drives it from its stored conversation when that cannot run anything
    /// twice ([`Run::redrive`]), else fails it. `None` if the run moved on in the meantime (its
    /// driver was only slow, or it was cancelled): every write here is compare-and-set on the
    /// run as read, and so is the driver's next. Actions it left executing come back through
    /// the reconcile index on their own.
    async fn take_over(
        &self,
        run: Stored<Run>,
        now: DateTime<Utc>,
    ) -> Result<Option<TakenOver>, EngineError> {
        if run.value.status != RunStatus::Running {
            return Ok(None);
        }
        // A process that cannot run the agent's tools leaves the run to one that can.
        if let Ok(agent) = self.agent_of(&run.value)
            && let Err(error) = agent.runs_here()
        {
            tracing::info!(%error, "left for a process that has the agent's environment");
            return Ok(None);
        }
        let (tenant, run_id) = (run.value.tenant.clone(), run.value.id.clone());
        let actions = self.actions_of(&tenant, &run_id).await?;
        let mut redriven = run.clone();
        let why = match self.agent_of(&run.value) {
            Ok(agent) if agent.model.is_some() => redriven
                .value
                .redrive(actions.iter().map(|a| a.tool_use_id.as_str()), now)
                .err(),
            _ => Some(NotRedriven::NotDriven),
        };
        let Some(why) = why else {
            return self.redrive(redriven, now).await;
        };
        let mut run = run;
        let error = format!("{ABANDONED}; not driven again: {why}");
        if run.value.fail(error.clone(), now).is_err() {
            return Ok(None);
        }
        if !self
            .write_taken_over(&mut run, AuditEvent::Failed { error }, now)
            .await?
        {
            return Ok(None);
        }
        tracing::warn!(%why, "failed a run whose lease ran out");
        Ok(Some(TakenOver::Failed(run_id)))
    }

    /// Writes a run the sweep took over with the event that says how, compare-and-set on the
    /// run as read: false when it moved on meanwhile.
    async fn write_taken_over(
        &self,
        run: &mut Stored<Run>,
        event: AuditEvent,
        now: DateTime<Utc>,
    ) -> Result<bool, EngineError> {
        let mut tx = Tx::new();
        tx.audit(
            &run.value.tenant,
            AuditEntry::new(&run.value.id, Actor::system("sweep"), event, now),
        );
        tx.run(self.index_shards, run);
        Ok(self.commit_first(tx).await?.is_some())
    }

    /// Writes the run re-driven, with its `resumed` event saying why, then drives it: here in
    /// the embedded mode, through a drive message with a queue. A message that is not sent
    /// leaves the run to the next take-over once its new lease runs out.
    async fn redrive(
        &self,
        mut run: Stored<Run>,
        now: DateTime<Utc>,
    ) -> Result<Option<TakenOver>, EngineError> {
        let (tenant, run_id) = (run.value.tenant.clone(), run.value.id.clone());
        let why = format!(
            "the process driving this run stopped during a model turn: driven again from its \
             stored conversation ({} of {MOST_REDRIVES})",
            run.value.redriven
        );
        let event = AuditEvent::Resumed {
            results: 0,
            why: Some(why),
        };
        if !self.write_taken_over(&mut run, event, now).await? {
            return Ok(None);
        }
        tracing::warn!(
            redriven = run.value.redriven,
            "driving again a run whose lease ran out"
        );
        let message = DriveMessage {
            tenant,
            run_id: run_id.clone(),
            drive: run.value.drives,
        };
        match &self.delivery {
            Delivery::InProcess => {
                if let Err(error) = self.drive_run(&message).await {
                    tracing::warn!(%error, "the run stopped again; the sweep takes it over once its lease runs out");
                }
            }
            Delivery::Queue(queue) => {
                if let Err(error) = queue.publish_drive(&message).await {
                    tracing::warn!(%error, "not sent; the sweep takes the run over again once its lease runs out");
                }
            }
        }
        Ok(Some(TakenOver::Redriven(run_id)))
    }

    /// Asks the tool what became of an unknown (or long-executing) call. Never calls it again,
    /// and never asks a tool that cannot tell ([`Engine::settle_unaskable`]).
    async fn reconcile(
        &self,
        action: Stored<Action>,
        report: &mut SweepReport,
    ) -> Result<(), EngineError> {
        let key = action.value.key();
        let run = self
            .load_run(&action.value.tenant, &action.value.run_id)
            .await?;
        // The run's agent holds the tool that can say what became of the call, listed first if
        // only a listing gives it; a server that is down leaves the call to a later sweep.
        let agent = run.as_ref().and_then(|run| self.agent_of(&run.value).ok());
        if let Some(agent) = agent
            && let Err(error) = agent.knowing(&action.value.tool).await
        {
            tracing::info!(%key, %error, "its tool is not listed here yet; a later sweep looks again");
        }
        let tool = agent.and_then(|agent| agent.tools.get(&action.value.tool).cloned());
        // Only a process that can run the tool asks it, or gives up on it.
        if let Some(Err(missing)) = tool.as_ref().map(|tool| tool.runs_here()) {
            tracing::info!(%key, %missing, "left for a process that has the agent's environment");
            return Ok(());
        }
        if let Some(run) = run.clone()
            && action.value.status == ActionStatus::Unknown
            && tool.as_ref().is_some_and(|tool| !tool.reconciles())
        {
            return self.settle_unaskable(run, action, report).await;
        }
        let patience = tool.as_ref().and_then(|tool| tool.gives_up_after());
        let answer = match tool {
            Some(tool) => {
                let call = ToolCall {
                    tenant: &action.value.tenant,
                    run_id: &action.value.run_id,
                    args: &action.value.args,
                    idempotency_key: &key,
                };
                tool.reconcile(call).await
            }
            None => None,
        };
        let now = self.now();
        let settled = matches!(
            answer,
            Some(ToolOutcome::Succeeded { .. } | ToolOutcome::Failed { .. })
        );
        let asked_long_enough = patience.is_some_and(|patience| {
            Duration::from_std(patience).is_ok_and(|p| now - action.value.updated_at >= p)
        });
        if let (Some(patience), Some(run)) = (patience, &run)
            && !settled
            && action.value.status == ActionStatus::Unknown
            && asked_long_enough
            && let Some(outbox) = self.give_up_reconciling(run, &action, patience).await?
        {
            report.notices.add(self.deliver(outbox).await);
            report.to_recovery_owner.push(key);
            return Ok(());
        }
        match (answer, run) {
            (
                Some(outcome @ (ToolOutcome::Succeeded { .. } | ToolOutcome::Failed { .. })),
                Some(run),
            ) => {
                let (_, outbox) = self.record_outcome(run, action, outcome, true).await?;
                self.deliver(outbox).await;
                report.reconciled.push(key);
            }
            (_, Some(run)) if action.value.status == ActionStatus::Executing => {
                let detail = match action.value.caller_claim() {
                    Some(claim) => format!(
                        "{} claimed it to run in its caller's process and reported no outcome before its lease ended",
                        claim.claimant
                    ),
                    None => format!(
                        "no outcome was recorded within {} minutes",
                        STALE_EXECUTION.num_minutes()
                    ),
                };
                let settles = self.who_settles(&run.value, &action.value);
                let (_, outbox) = self
                    .record_outcome(run, action, ToolOutcome::Unknown { detail }, false)
                    .await?;
                report.notices.add(self.deliver(outbox).await);
                match settles {
                    Settles::Nobody => report.lost_reads.push(key),
                    Settles::Owner => report.to_recovery_owner.push(key),
                    Settles::NoOwnerYet => {
                        report.unowned.push(key.clone());
                        report.unknown.push(key);
                    }
                    Settles::Sweep => report.unknown.push(key),
                }
            }
            _ => {
                self.look_again_later(&action, now).await;
                report.unknown.push(key);
            }
        }
        Ok(())
    }

    /// An unknown outcome no tool can settle, looked at again: a read's fails (nothing took
    /// effect); another's goes to the agent's recovery owner, once the agent names one, and
    /// waits for one until then. The tool is never asked.
    async fn settle_unaskable(
        &self,
        run: Stored<Run>,
        action: Stored<Action>,
        report: &mut SweepReport,
    ) -> Result<(), EngineError> {
        let key = action.value.key();
        match self.who_settles(&run.value, &action.value) {
            Settles::Nobody => {
                let failed = lost_read(&action.value, "its answer was lost");
                let (_, outbox) = self.record_outcome(run, action, failed, true).await?;
                report.notices.add(self.deliver(outbox).await);
                report.lost_reads.push(key);
            }
            Settles::Owner => {
                let detail = "its outcome was lost and its tool cannot be asked";
                if let Some(outbox) = self.to_recovery_owner(&run, &action, detail).await? {
                    report.notices.add(self.deliver(outbox).await);
                    report.to_recovery_owner.push(key);
                }
            }
            Settles::NoOwnerYet => {
                tracing::warn!(%key, agent = %run.value.agent, "outcome unknown, its tool cannot be asked and no recovery owner is named: a person must name one");
                self.look_again_later(&action, self.now()).await;
                report.unowned.push(key.clone());
                report.unknown.push(key);
            }
            Settles::Sweep => {
                self.look_again_later(&action, self.now()).await;
                report.unknown.push(key);
            }
        }
        Ok(())
    }

    /// Leaves an unknown outcome in the reconcile index, due again [`RECHECK`] after `now`.
    async fn look_again_later(&self, action: &Stored<Action>, now: DateTime<Utc>) {
        let mut tx = Tx::new();
        let (pk, sk) = (
            keys::run_pk(&action.value.tenant, &action.value.run_id),
            keys::action_sk(&action.value.id, action.value.version),
        );
        let due = reconcile_key(self.index_shards, &action.value, now + RECHECK);
        tx.update(pk, sk, Some(due), &action.value, action.ver);
        if let Err(error) = self.commit(tx).await {
            tracing::debug!(%error, key = %action.value.key(), "someone else moved this action");
        }
    }
}
