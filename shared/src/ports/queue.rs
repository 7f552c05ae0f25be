//! The resume queue: wakes a paused run once a decision settles one of its actions.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::domain::ids::{ActionId, ActionVersion, OutboxId, RunId, TenantId, idempotency_key};

/// "Action `action_id:version` of this run is settled: resume it." Keyed for deduplication.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeMessage {
    pub tenant: TenantId,
    pub run_id: RunId,
    pub action_id: ActionId,
    pub version: ActionVersion,
    /// The outbox entry that carries this message. The consumer deletes it in the write that
    /// acts on the message, so the writer need not delete it after publishing. Absent in a
    /// message whose writer deleted its entry itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbox: Option<OutboxId>,
}

impl ResumeMessage {
    /// The deduplication key: `action_id:version`.
    pub fn key(&self) -> String {
        idempotency_key(&self.action_id, self.version)
    }

    /// Messages of one run are delivered in order.
    pub fn group(&self) -> &str {
        self.run_id.as_str()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the resume queue is unavailable: {0}")]
pub struct QueueError(pub String);

#[async_trait]
pub trait ResumeQueue: Send + Sync {
    async fn publish(&self, message: &ResumeMessage) -> Result<(), QueueError>;
}
