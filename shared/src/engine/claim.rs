//! A call its caller runs (`executor = "caller"`): once approved, one claimant of the caller's
//! process claims it (`approved → executing`, with a lease), runs it with the exact approved
//! arguments and the key `action_id:version`, and reports what it did. A claim whose outcome is
//! not reported before its lease ends is an unknown outcome, for the recovery owner (the
//! sweep's reconcile finds it at the lease's end); a report after that, while nobody has
//! answered, is the answer.

use serde_json::Value;

use super::gate::CallState;
use super::records::{Stored, Tx};
use super::{CAS_ATTEMPTS, Engine, EngineError, History};
use crate::domain::action::{Action, ActionStatus, CallerClaim, ToolOutcome};
use crate::domain::approval::{Approval, ApprovalKind, ApprovalStatus};
use crate::domain::audit::AuditEvent;
use crate::domain::gate::{GateRefusal, takes_outcome};
use crate::domain::identity::{Actor, Identity};
use crate::domain::ids::RunId;
use crate::ports::store::StoreError;

/// The longest name a claimant may give itself.
const MAX_CLAIMANT: usize = 200;

/// What running a claimed call did, as its claimant reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reported {
    pub succeeded: bool,
    /// A string or any JSON value: what the agent is told.
    pub result: Value,
}

impl Reported {
    fn outcome(&self) -> ToolOutcome {
        match (self.succeeded, &self.result) {
            (true, result) => ToolOutcome::Succeeded {
                result: result.clone(),
            },
            (false, Value::String(error)) => ToolOutcome::Failed {
                error: error.clone(),
            },
            (false, other) => ToolOutcome::Failed {
                error: other.to_string(),
            },
        }
    }
}

fn checked_claimant(claimant: &str) -> Result<(), EngineError> {
    match claimant.is_empty() || claimant.len() > MAX_CLAIMANT {
        true => Err(EngineError::BadInput(format!(
            "a claimant has 1 to {MAX_CLAIMANT} characters"
        ))),
        false => Ok(()),
    }
}

/// A status as the caller reads it, for a refusal's words.
fn word(state: &CallState) -> String {
    serde_json::to_value(state.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl Engine {
    /// Claims an approved call its caller runs, for `claimant` of `who`'s process: the first
    /// claimant wins; the same claimant again gets the same claim while it holds (a retry after
    /// a lost answer). A call settled or gone unknown is not claimable, whoever asks.
    #[tracing::instrument(name = "claim", skip_all, fields(
        tenant = %who.tenant,
        run_id = %run,
        action_id = tracing::field::Empty,
        approval_id = tracing::field::Empty,
    ))]
    pub async fn claim_call(
        &self,
        who: &Identity,
        run: &RunId,
        claimant: &str,
    ) -> Result<CallState, EngineError> {
        checked_claimant(claimant)?;
        for _ in 0..CAS_ATTEMPTS {
            let (history, action) = self.requesters_call(who, run).await?;
            let state = self.state_of(&history);
            let call = run.to_string();
            // A cancelled run's approved call is never claimed.
            let lease = match history.run.status.is_finished() {
                true => None,
                false => self.caller_lease(&history.run, &action.value.tool),
            };
            match (action.value.status, action.value.caller_claim(), lease) {
                (ActionStatus::Approved, None, Some(lease)) => {
                    let now = self.now();
                    let lease = chrono::Duration::from_std(lease)
                        .map_err(|e| EngineError::Corrupt(e.to_string()))?;
                    let mut claimed = action.value.clone();
                    let mut tx = Tx::new();
                    let logged = tx.log_slot(&claimed.tenant, &claimed.run_id);
                    let claim = CallerClaim {
                        claimant: claimant.to_string(),
                        lease_expires_at: now + lease,
                    };
                    claimed
                        .claim_for_caller(now, Actor::person(&who.person), logged, claim)
                        .map_err(|e| EngineError::Corrupt(e.to_string()))?;
                    tx.claim_action(self.index_shards, &action, false, &claimed);
                    match self.commit(tx).await {
                        Ok(_) => {
                            tracing::info!(%claimant, key = %claimed.key(), "claimed by its caller");
                            return self.call_state(&who.tenant, run).await;
                        }
                        // Another claimant, or a cancel, moved it first: read it again.
                        Err(StoreError::ConditionFailed { .. }) => continue,
                        Err(error) => return Err(error.into()),
                    }
                }
                // A retry after a lost answer; once its outcome is in, there is nothing to run.
                (ActionStatus::Executing, Some(claim), _) if claim.claimant == claimant => {
                    return Ok(state);
                }
                (ActionStatus::Executing, Some(_), _) => {
                    return Err(GateRefusal::Claimed { call }.into());
                }
                _ => {
                    return Err(GateRefusal::NotClaimable {
                        call,
                        status: word(&state),
                    }
                    .into());
                }
            }
        }
        Err(EngineError::Contended)
    }

    /// Records what running a claimed call did, as its claimant reports it; the run ends with
    /// it. The same report again answers the call as it stands; a late report, after the lease
    /// ended and before the recovery owner answered, is the answer.
    #[tracing::instrument(name = "report", skip_all, fields(
        tenant = %who.tenant,
        run_id = %run,
        action_id = tracing::field::Empty,
        approval_id = tracing::field::Empty,
    ))]
    pub async fn report_outcome(
        &self,
        who: &Identity,
        run: &RunId,
        claimant: &str,
        reported: Reported,
    ) -> Result<CallState, EngineError> {
        checked_claimant(claimant)?;
        let outcome = reported.outcome();
        for _ in 0..CAS_ATTEMPTS {
            let (history, action) = self.requesters_call(who, run).await?;
            let state = self.state_of(&history);
            let call = run.to_string();
            let Some(claim) = action.value.caller_claim() else {
                return Err(GateRefusal::NotClaimable {
                    call,
                    status: word(&state),
                }
                .into());
            };
            if claim.claimant != claimant {
                return Err(GateRefusal::Claimed { call }.into());
            }
            if !takes_outcome(action.value.status) {
                return match action.value.already_records(&outcome) {
                    true => Ok(state),
                    false => Err(GateRefusal::OutcomeRecorded {
                        call,
                        status: word(&state),
                    }
                    .into()),
                };
            }
            let late = action.value.status == ActionStatus::Unknown;
            let closing = match late {
                true => self.open_recovery_of(&history, &action).await?,
                false => None,
            };
            let stored_run = self
                .load_run(&who.tenant, run)
                .await?
                .ok_or_else(|| EngineError::not_found(format!("call {run}")))?;
            let by = Actor::person(&who.person);
            let (_, outbox) = self
                .record_outcome_as(stored_run, action, outcome.clone(), late, by, closing)
                .await?;
            self.deliver(outbox).await;
            let after = self.call_state(&who.tenant, run).await?;
            // Settled by this report, or by another write first: either way, read again.
            if !matches!(
                after.status,
                super::CallStatus::Running | super::CallStatus::Unknown
            ) {
                tracing::info!(%claimant, status = %word(&after), late, "outcome reported by its caller");
                return Ok(after);
            }
        }
        Err(EngineError::Contended)
    }

    /// The call `run` and its latest action version, if `who` is its requester.
    async fn requesters_call(
        &self,
        who: &Identity,
        run: &RunId,
    ) -> Result<(History, Stored<Action>), EngineError> {
        let history = self.history(&who.tenant, run).await?;
        if history.run.gate.is_none() {
            return Err(EngineError::not_found(format!("call {run}")));
        }
        if history.run.requested_by != who.person {
            return Err(GateRefusal::NotRequester {
                call: run.to_string(),
            }
            .into());
        }
        let Some(latest) = history.actions.last() else {
            let state = self.state_of(&history);
            return Err(GateRefusal::NotClaimable {
                call: run.to_string(),
                status: word(&state),
            }
            .into());
        };
        let action = self
            .load_action(&who.tenant, run, &latest.id, latest.version)
            .await?
            .ok_or_else(|| EngineError::not_found(format!("call {run}")))?;
        // The claim's or the report's span names the call it is about.
        let span = tracing::Span::current();
        span.record("action_id", tracing::field::display(&action.value.id));
        if let Some(approval) = &action.value.approval_id {
            span.record("approval_id", tracing::field::display(approval));
        }
        Ok((history, action))
    }

    /// The recovery of `action` nobody has answered yet, as stored: the log names it.
    async fn open_recovery_of(
        &self,
        history: &History,
        action: &Stored<Action>,
    ) -> Result<Option<Stored<Approval>>, EngineError> {
        let asked = history.entries.iter().rev().find_map(|e| match &e.event {
            AuditEvent::RecoveryRequested {
                approval_id,
                action_id,
                version,
                ..
            } if *action_id == action.value.id && *version == action.value.version => {
                Some(approval_id)
            }
            _ => None,
        });
        let Some(asked) = asked else {
            return Ok(None);
        };
        let recovery = self.load_approval(&action.value.tenant, asked).await?;
        Ok(recovery.filter(|r| {
            r.value.kind == ApprovalKind::Recovery
                && r.value.status == ApprovalStatus::AwaitingApproval
        }))
    }
}
