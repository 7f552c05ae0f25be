//! What waits for delivery: outbox items (notices), resume messages, and what a committed
//! transaction hands over.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Stored, keys};
use crate::domain::action::Action;
use crate::domain::ids::{ApprovalId, OutboxId, RunId, TenantId};
use crate::domain::notice::NoticeKind;
use crate::ports::queue::ResumeMessage;

/// The message that resumes an action's run: `action_id:version` of that run is settled.
pub fn resume_message(action: &Action) -> ResumeMessage {
    ResumeMessage {
        tenant: action.tenant.clone(),
        run_id: action.run_id.clone(),
        action_id: action.id.clone(),
        version: action.version,
        resent: 0,
    }
}

/// What waits in an outbox item until it is delivered. (A resume message has no item of its
/// own: the decided action waits in the outbox index itself, [`resume_key`].)
///
/// [`resume_key`]: super::index::resume_key
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OutboxMessage {
    Notify(NotifyMessage),
}

/// A notice about one approval for one destination, and how its delivery is going.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NotifyMessage {
    pub approval_id: ApprovalId,
    pub notice: NoticeKind,
    /// The destination's id; its address stays in configuration.
    pub destination: String,
    /// The destination as the audit log names it.
    pub label: String,
    /// Attempts that failed so far.
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxEntry {
    pub id: OutboxId,
    pub tenant: TenantId,
    pub run_id: RunId,
    pub created_at: DateTime<Utc>,
    pub message: OutboxMessage,
}

impl OutboxEntry {
    pub fn key(&self) -> (String, String) {
        outbox_key(&self.tenant, &self.run_id, &self.id)
    }
}

/// Where an outbox entry is stored: with its run.
pub fn outbox_key(tenant: &TenantId, run: &RunId, id: &OutboxId) -> (String, String) {
    (
        keys::run_pk(tenant, run),
        format!("{}{id}", keys::OUTBOX_PREFIX),
    )
}

/// What a committed transaction hands over for delivery: the outbox items it wrote (notices),
/// and the actions whose resume message it made due, each at the item version it wrote.
#[derive(Debug, Default)]
pub struct Outgoing {
    pub notices: Vec<OutboxEntry>,
    pub resumes: Vec<Stored<Action>>,
}

impl Outgoing {
    pub fn extend(&mut self, more: Outgoing) {
        self.notices.extend(more.notices);
        self.resumes.extend(more.resumes);
    }
}
