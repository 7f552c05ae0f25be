//! Notices: what a notification tells the people who may decide an approval, and when.

use serde::{Deserialize, Serialize};

use super::action::ActionStatus;
use super::approval::Approval;
use super::money::Amount;

/// Why a notice goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    /// An approval opened: a run paused on it, or an edit proposed a version that needs people.
    ApprovalRequested,
    /// The approval still waits and its deadline is near.
    Reminder,
    /// Nobody decided in time: the approval went to one more role.
    Escalated,
    /// The approval was decided, expired, superseded or cancelled, or its action ran: the
    /// messages posted about it are updated in place (only where a destination follows up).
    Outcome,
}

impl NoticeKind {
    /// The name the audit log and receivers see.
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeKind::ApprovalRequested => "approval_requested",
            NoticeKind::Reminder => "reminder",
            NoticeKind::Escalated => "escalated",
            NoticeKind::Outcome => "outcome",
        }
    }
}

impl std::fmt::Display for NoticeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One notice about one approval, as the approval stands when it is sent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Notice {
    /// The same on every attempt to send this notice to one destination: receivers dedupe on it.
    pub key: String,
    pub kind: NoticeKind,
    pub approval: Approval,
    /// The amount policy gates this tool by, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<Amount>,
    /// Policy lets a reviewer lower the amount with an edit.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub editable: bool,
    /// An outcome notice: the messages to update in place.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub posted: Vec<Posted>,
    /// An outcome notice: where the approval's action version stands, and what it returned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<ActionOutcome>,
}

/// A message a notifier posted and can update later: Slack's channel and message `ts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Posted {
    /// The destination that posted it.
    pub destination: String,
    pub channel: String,
    pub ts: String,
}

/// The approved action's state when an outcome notice is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActionOutcome {
    pub status: ActionStatus,
    /// What the agent was told of the call (the tool's result, or why it did not run).
    pub result: Option<String>,
}
