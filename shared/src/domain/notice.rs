//! Notices: what a notification tells the people who may decide an approval, and when.

use serde::{Deserialize, Serialize};

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
}

impl NoticeKind {
    /// The name the audit log and receivers see.
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeKind::ApprovalRequested => "approval_requested",
            NoticeKind::Reminder => "reminder",
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
}
