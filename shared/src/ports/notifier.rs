//! The notifier: tells the people who may decide an approval that it waits, or that its deadline
//! is near. Notices go through the outbox, so one is never lost and never sent before the change
//! that calls for it is stored; a notifier may still receive one twice, with the same key.

use async_trait::async_trait;

use crate::domain::notice::{Notice, Posted};

/// Where notices go. Each destination gets its own copy, retried on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// Stable across processes with the same configuration; stored in the outbox instead of
    /// the address, which may carry a secret.
    pub id: String,
    /// What the audit log names it by, such as the receiver's host.
    pub label: String,
    /// Whether the messages posted here are updated in place with the approval's outcome
    /// (decided, expired, cancelled, the action's result): it gets `outcome` notices too.
    pub follows_up: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotifyError {
    /// Sending again later may work: a timeout, a dropped connection, a 5xx or 429.
    #[error("{0}")]
    Transient(String),
    /// Sending again will not work: the receiver refused the notice, or the destination is
    /// no longer configured.
    #[error("{0}")]
    Permanent(String),
}

#[async_trait]
pub trait Notifier: Send + Sync {
    /// The destinations configured now: a notice is written for each.
    fn destinations(&self) -> Vec<Destination>;

    /// Sends one notice to one destination, by its id. Bounded in time. A destination that
    /// follows up returns the message it posted, which later `outcome` notices update.
    async fn send(&self, destination: &str, notice: &Notice)
    -> Result<Option<Posted>, NotifyError>;
}

/// Several notifiers as one: every destination of each, and each notice sent by the notifier
/// whose destination it is (webhooks and a Slack channel together).
pub struct Several(pub Vec<std::sync::Arc<dyn Notifier>>);

#[async_trait]
impl Notifier for Several {
    fn destinations(&self) -> Vec<Destination> {
        self.0.iter().flat_map(|n| n.destinations()).collect()
    }

    async fn send(
        &self,
        destination: &str,
        notice: &Notice,
    ) -> Result<Option<Posted>, NotifyError> {
        for notifier in &self.0 {
            if notifier.destinations().iter().any(|d| d.id == destination) {
                return notifier.send(destination, notice).await;
            }
        }
        Err(NotifyError::Permanent(format!(
            "no destination {destination} is configured any more"
        )))
    }
}
