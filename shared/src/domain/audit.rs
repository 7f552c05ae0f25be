//! The append-only audit log: every event is written in the same transaction as the change it
//! explains, with its place in the log, and never changed. Most sit in audit items written once;
//! a few are held by the record whose change they are (a run's `started` and final events, a
//! claim's `executing`, a decision's `decision`), whose later writes carry them unchanged.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::action::{Action, ActionStatus, ToolOutcome};
use super::approval::{Choice, DecisionEffect};
use super::args::{Args, ArgsHash};
use super::conversation::{StopReason, TurnUsage};
use super::identity::Actor;
use super::ids::{ActionId, ActionVersion, ApprovalId, PersonId, Role, RunId};
use super::names::serde_name;
use super::policy::{LogOnly, Verdict};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at: DateTime<Utc>,
    pub run_id: RunId,
    pub actor: Actor,
    #[serde(flatten)]
    pub event: AuditEvent,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AuditEvent {
    Started {
        task: String,
        requested_by: PersonId,
        policy_version: u32,
    },
    /// The agent proposed a call and policy ruled on it.
    Proposed {
        action_id: ActionId,
        version: ActionVersion,
        tool: String,
        args: Args,
        args_hash: ArgsHash,
        explanation: String,
        verdict: Box<Verdict>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval_id: Option<ApprovalId>,
        /// The policy rules that made the verdict, by name.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rules: Vec<String>,
        /// What the log-only rules would have made of it, where the policy has some.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        log_only: Option<LogOnly>,
    },
    /// A proposed call answered before policy ruled on it (no such tool, or arguments that
    /// do not match the tool's schema or are past their share), or one a person must approve
    /// while its requester already has as many approvals open as one may. Nothing went to a
    /// person or the tool; `args` is kept where it fits its share.
    Refused {
        action_id: ActionId,
        tool: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        args: Option<Args>,
        why: String,
    },
    Paused {
        approvals: Vec<ApprovalId>,
    },
    /// A notice (`approval_requested` or `reminder`) reached a destination (its host).
    Notified {
        approval_id: ApprovalId,
        notice: String,
        destination: String,
    },
    /// A notice was given up on: the destination refused it, or kept failing `attempts` times.
    NotificationFailed {
        approval_id: ApprovalId,
        notice: String,
        destination: String,
        attempts: u32,
        error: String,
    },
    Decision {
        approval_id: ApprovalId,
        action_id: ActionId,
        version: ActionVersion,
        args_hash: ArgsHash,
        #[serde(flatten)]
        choice: Choice,
        effect: DecisionEffect,
    },
    Superseded {
        approval_id: ApprovalId,
        action_id: ActionId,
        version: ActionVersion,
        by_version: ActionVersion,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        new_approval_id: Option<ApprovalId>,
    },
    Expired {
        approval_id: ApprovalId,
        action_id: ActionId,
        version: ActionVersion,
    },
    Cancelled {
        approvals: Vec<ApprovalId>,
    },
    /// Nobody decided in time: people of one more role may decide the approval now.
    Escalated {
        approval_id: ApprovalId,
        to: Role,
    },
    /// A person commented on an approval without deciding it.
    Commented {
        approval_id: ApprovalId,
        text: String,
    },
    /// Nothing acted on the resume message of a settled action within its lease (the workers
    /// that received it died, or it went to the dead-letter queue): the sweep sent it again,
    /// its `resent`-th re-send.
    ResumeResent {
        action_id: ActionId,
        version: ActionVersion,
        resent: u32,
    },
    /// The sweep stopped sending a resume message nothing acted on: the run waits until a
    /// person moves the message back from the dead-letter queue.
    ResumeGivenUp {
        action_id: ActionId,
        version: ActionVersion,
        resent: u32,
    },
    Executing {
        action_id: ActionId,
        version: ActionVersion,
        args_hash: ArgsHash,
        authorized_by: Vec<Actor>,
    },
    Executed {
        action_id: ActionId,
        version: ActionVersion,
        authorized_by: Vec<Actor>,
        succeeded: bool,
        result: String,
    },
    Unknown {
        action_id: ActionId,
        version: ActionVersion,
        detail: String,
    },
    Reconciled {
        action_id: ActionId,
        version: ActionVersion,
        succeeded: bool,
        result: String,
    },
    /// An unknown outcome no tool can settle went to the agent's recovery owner, a person.
    RecoveryRequested {
        approval_id: ApprovalId,
        action_id: ActionId,
        version: ActionVersion,
        owner: Role,
    },
    /// A model API answered a turn of the run (an offline model's turns are not recorded).
    ModelTurn {
        #[serde(flatten)]
        usage: TurnUsage,
        stop_reason: StopReason,
    },
    /// The paused turn is complete and its results went back to the model; or, with `why`,
    /// the sweep drives again a run whose driver stopped during a model turn.
    Resumed {
        results: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        why: Option<String>,
    },
    Done {
        answer: String,
    },
    Failed {
        error: String,
    },
}

impl AuditEntry {
    pub fn new(run: &RunId, actor: Actor, event: AuditEvent, at: DateTime<Utc>) -> Self {
        Self {
            at,
            run_id: run.clone(),
            actor,
            event,
        }
    }
}

impl AuditEvent {
    /// An action version proposed (by the agent, or by an edit) and what policy said of it.
    pub fn proposed(action: &Action, verdict: Verdict, approval_id: Option<ApprovalId>) -> Self {
        AuditEvent::Proposed {
            action_id: action.id.clone(),
            version: action.version,
            tool: action.tool.clone(),
            args: action.args.clone(),
            args_hash: action.args_hash.clone(),
            explanation: action.explanation.clone(),
            verdict: Box::new(verdict),
            approval_id,
            rules: action.rules.clone(),
            log_only: action.log_only.clone(),
        }
    }

    /// An action version claimed to run, and who let it.
    pub fn executing(action: &Action, authorized_by: &[Actor]) -> Self {
        AuditEvent::Executing {
            action_id: action.id.clone(),
            version: action.version,
            args_hash: action.args_hash.clone(),
            authorized_by: authorized_by.to_vec(),
        }
    }

    /// What a call came back with, as recorded on its action.
    pub fn outcome(action: &Action, outcome: &ToolOutcome) -> Self {
        let result = action
            .result
            .as_ref()
            .map(|r| r.content.clone())
            .unwrap_or_default();
        match outcome {
            ToolOutcome::Unknown { detail } => AuditEvent::Unknown {
                action_id: action.id.clone(),
                version: action.version,
                detail: super::action::kept(detail.clone()),
            },
            _ => AuditEvent::Executed {
                action_id: action.id.clone(),
                version: action.version,
                authorized_by: action.authorized_by.clone(),
                succeeded: action.status == ActionStatus::Succeeded,
                result,
            },
        }
    }

    pub fn name(&self) -> &'static str {
        serde_name(self)
    }

    /// The approval this event is about, if any: how one approval is traced through the log.
    pub fn approval_id(&self) -> Option<&ApprovalId> {
        match self {
            AuditEvent::Proposed { approval_id, .. } => approval_id.as_ref(),
            AuditEvent::Notified { approval_id, .. }
            | AuditEvent::NotificationFailed { approval_id, .. }
            | AuditEvent::Decision { approval_id, .. }
            | AuditEvent::Superseded { approval_id, .. }
            | AuditEvent::Expired { approval_id, .. }
            | AuditEvent::Commented { approval_id, .. }
            | AuditEvent::Escalated { approval_id, .. }
            | AuditEvent::RecoveryRequested { approval_id, .. } => Some(approval_id),
            _ => None,
        }
    }

    /// The action version this event is about, if any.
    pub fn action(&self) -> Option<(&ActionId, ActionVersion)> {
        match self {
            AuditEvent::Refused { action_id, .. } => Some((action_id, ActionVersion::FIRST)),
            AuditEvent::Proposed {
                action_id, version, ..
            }
            | AuditEvent::Decision {
                action_id, version, ..
            }
            | AuditEvent::Superseded {
                action_id, version, ..
            }
            | AuditEvent::Expired {
                action_id, version, ..
            }
            | AuditEvent::ResumeResent {
                action_id, version, ..
            }
            | AuditEvent::ResumeGivenUp {
                action_id, version, ..
            }
            | AuditEvent::Executing {
                action_id, version, ..
            }
            | AuditEvent::Executed {
                action_id, version, ..
            }
            | AuditEvent::Unknown {
                action_id, version, ..
            }
            | AuditEvent::Reconciled {
                action_id, version, ..
            }
            | AuditEvent::RecoveryRequested {
                action_id, version, ..
            } => Some((action_id, *version)),
            _ => None,
        }
    }
}
