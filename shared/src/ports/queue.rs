//! The resume queue: wakes a paused run once a decision settles one of its actions.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::domain::ids::{ActionId, ActionVersion, RunId, TenantId, idempotency_key};

/// "Action `action_id:version` of this run is settled: resume it." Keyed for deduplication.
/// Until its resume acts on it, the action's own item waits in the outbox index as the message's
/// pending delivery; the write that acts on it (the claim, or the result held) takes it out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeMessage {
    pub tenant: TenantId,
    pub run_id: RunId,
    pub action_id: ActionId,
    pub version: ActionVersion,
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
