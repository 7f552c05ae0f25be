//! Cancelling a run: its open approvals are cancelled with it, so a later decision conflicts.

use tracing::Instrument;

use super::RunReport;
use super::records::{Tx, keys};
use super::{AWAITING_ACTION_VER, CAS_ATTEMPTS, Engine, EngineError};
use crate::domain::action::{ActionStatus, NotExecuted};
use crate::domain::audit::{AuditEntry, AuditEvent};
use crate::domain::identity::{Actor, Identity};
use crate::domain::ids::RunId;
use crate::ports::store::{Condition, StoreError};

impl Engine {
    /// Cancels a run that has not finished. Its requester may, and so may anyone who could
    /// decide one of its open approvals.
    pub async fn cancel(&self, who: &Identity, run_id: &RunId) -> Result<RunReport, EngineError> {
        let span =
            tracing::info_span!("cancel", tenant = %who.tenant, run_id = %run_id, by = %who.person);
        self.cancel_run(who, run_id).instrument(span).await
    }

    async fn cancel_run(&self, who: &Identity, run_id: &RunId) -> Result<RunReport, EngineError> {
        for _ in 0..CAS_ATTEMPTS {
            let what = || format!("run {run_id}");
            let run = self.load_run(&who.tenant, run_id).await?;
            let mut run = run.ok_or_else(|| EngineError::not_found(what()))?;
            self.readable(&who.tenant, &run.value.agent, what())?;
            if run.value.status.is_finished() {
                return Err(EngineError::RunFinished {
                    run: run_id.to_string(),
                    status: run.value.status,
                });
            }
            let open = self.open_approvals_of(&run.value).await?;
            let may = run.value.requesters().contains(&who.person)
                || open
                    .iter()
                    .any(|a| a.value.deciding_roles().any(|role| who.has_role(role)));
            if !may {
                return Err(EngineError::MayNotCancel {
                    who: who.person.to_string(),
                    run: run_id.to_string(),
                });
            }

            let now = self.now();
            run.value
                .cancel(now)
                .map_err(|e| EngineError::Corrupt(e.to_string()))?;
            let mut tx = Tx::new();
            let tenant = run.value.tenant.clone();
            let mut cancelled = Vec::new();
            for mut approval in open {
                approval.value.cancel(now);
                let mut action = approval.value.awaiting_action();
                let told = NotExecuted::Cancelled {
                    by: who.person.as_str(),
                }
                .told();
                action
                    .close(ActionStatus::Cancelled, told, now)
                    .expect("a waiting action can be cancelled");
                tx.update(
                    keys::run_pk(&tenant, run_id),
                    keys::action_sk(&action.id, action.version),
                    None,
                    &action,
                    AWAITING_ACTION_VER,
                );
                tx.settle_approval(&approval.value, Condition::VersionIs(approval.ver));
                self.follow_up_later(&mut tx, (&tenant, run_id, &approval.value.id), now);
                cancelled.push(approval.value);
            }
            let event = AuditEvent::Cancelled {
                approvals: cancelled.iter().map(|a| a.id.clone()).collect(),
            };
            tx.audit(
                &tenant,
                AuditEntry::new(run_id, Actor::person(&who.person), event, now),
            );
            tx.run(self.index_shards, &mut run);
            match self.commit(tx).await {
                Ok(_) => {
                    tracing::info!(approvals = cancelled.len(), "cancelled");
                    for approval in &cancelled {
                        self.unschedule_wakeups(approval).await;
                    }
                    return Ok(RunReport::of(&run.value, vec![]));
                }
                Err(StoreError::ConditionFailed { .. }) => continue,
                Err(error) => return Err(error.into()),
            }
        }
        Err(EngineError::Contended)
    }
}
