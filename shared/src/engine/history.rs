//! Reading what happened: pending approvals, one approval, a run's full history.

use serde::Serialize;

use super::records::{Stored, decode, keys};
use super::{Engine, EngineError};
use crate::domain::action::{Action, ActionStatus};
use crate::domain::approval::{Approval, ApprovalStatus};
use crate::domain::audit::AuditEntry;
use crate::domain::ids::{ApprovalId, RunId, TenantId};
use crate::domain::run::Run;
use crate::ports::store::query_all;

/// One run's history, reconstructed from the audit log and the records.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct History {
    pub run: Run,
    /// Every action version, in the order they were proposed.
    pub actions: Vec<Action>,
    pub approvals: Vec<Approval>,
    /// The audit log, oldest first.
    pub entries: Vec<AuditEntry>,
}

impl Engine {
    /// Approvals that wait on a decision in this tenant, soonest deadline first. Overdue ones
    /// the sweep has not expired yet are included: deciding them expires them.
    pub async fn pending(&self, tenant: &TenantId) -> Result<Vec<Approval>, EngineError> {
        let index = keys::pending_index(tenant);
        let mut approvals = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .store
                .query_index(&index, "", "\u{10FFFF}", after.as_deref(), 500)
                .await?;
            for item in &page.items {
                approvals.push(decode::<Approval>(item)?.value);
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(approvals),
            }
        }
    }

    pub async fn approval(
        &self,
        tenant: &TenantId,
        id: &ApprovalId,
    ) -> Result<Approval, EngineError> {
        let stored = self.load_approval(tenant, id).await?;
        stored
            .map(|s| s.value)
            .ok_or_else(|| EngineError::not_found(format!("approval {id}")))
    }

    pub async fn run(&self, tenant: &TenantId, id: &RunId) -> Result<Run, EngineError> {
        let stored = self.load_run(tenant, id).await?;
        stored
            .map(|s| s.value)
            .ok_or_else(|| EngineError::not_found(format!("run {id}")))
    }

    pub async fn history(&self, tenant: &TenantId, id: &RunId) -> Result<History, EngineError> {
        let items = query_all(self.store.as_ref(), &keys::run_pk(tenant, id), "").await?;
        let mut run = None;
        let mut actions: Vec<Action> = Vec::new();
        let mut entries = Vec::new();
        for item in &items {
            if item.sk == keys::RUN_SK {
                run = Some(decode::<Run>(item)?.value);
            } else if item.sk.starts_with(keys::ACTION_PREFIX) {
                actions.push(decode::<Action>(item)?.value);
            } else if item.sk.starts_with(keys::AUDIT_PREFIX) {
                entries.push(decode::<AuditEntry>(item)?.value);
            }
        }
        let run = run.ok_or_else(|| EngineError::not_found(format!("run {id}")))?;
        actions.sort_by_key(|a| (a.proposed_at, a.version));
        let mut approvals = Vec::new();
        for approval_id in actions.iter().filter_map(|a| a.approval_id.as_ref()) {
            if let Some(stored) = self.load_approval(tenant, approval_id).await? {
                approvals.push(stored.value);
            }
        }
        Ok(History {
            run,
            actions,
            approvals,
            entries,
        })
    }

    /// The history of one approval: its run's history, with the log narrowed to the events about
    /// this approval's action (every version) and the run's own milestones.
    pub async fn history_of_approval(
        &self,
        tenant: &TenantId,
        id: &ApprovalId,
    ) -> Result<History, EngineError> {
        let approval = self.approval(tenant, id).await?;
        let mut history = self.history(tenant, &approval.run_id).await?;
        history.entries.retain(|e| match e.event.action() {
            Some((action, _)) => *action == approval.action_id,
            None => {
                e.event.approval_id().is_none_or(|a| *a == approval.id)
                    && e.event.approval_id().is_some()
                    || matches!(
                        e.event.name(),
                        "started" | "paused" | "resumed" | "done" | "failed" | "cancelled"
                    )
            }
        });
        history.actions.retain(|a| a.id == approval.action_id);
        history
            .approvals
            .retain(|a| a.action_id == approval.action_id);
        Ok(history)
    }

    /// The open approvals a run waits on, with their item versions.
    pub(super) async fn open_approvals_of(
        &self,
        run: &Run,
    ) -> Result<Vec<Stored<Approval>>, EngineError> {
        let items = query_all(
            self.store.as_ref(),
            &keys::run_pk(&run.tenant, &run.id),
            keys::ACTION_PREFIX,
        )
        .await?;
        let mut open = Vec::new();
        for item in &items {
            let action = decode::<Action>(item)?.value;
            let Some(approval_id) = action
                .approval_id
                .filter(|_| action.status == ActionStatus::AwaitingApproval)
            else {
                continue;
            };
            if let Some(approval) = self.load_approval(&run.tenant, &approval_id).await?
                && approval.value.status == ApprovalStatus::AwaitingApproval
            {
                open.push(approval);
            }
        }
        Ok(open)
    }

    pub(super) async fn pending_of_run(&self, run: &Run) -> Result<Vec<Approval>, EngineError> {
        Ok(self
            .open_approvals_of(run)
            .await?
            .into_iter()
            .map(|s| s.value)
            .collect())
    }
}
