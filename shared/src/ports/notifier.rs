//! The notifier: tells the people who may decide an approval that it waits, or that its deadline
//! is near. Notices go through the outbox, so one is never lost and never sent before the change
//! that calls for it is stored; a notifier may still receive one twice, with the same key.

use async_trait::async_trait;

use crate::domain::notice::Notice;

/// Where notices go. Each destination gets its own copy, retried on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// Stable across processes with the same configuration; stored in the outbox instead of
    /// the address, which may carry a secret.
    pub id: String,
    /// What the audit log names it by, such as the receiver's host.
    pub label: String,
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

    /// Sends one notice to one destination, by its id. Bounded in time.
    async fn send(&self, destination: &str, notice: &Notice) -> Result<(), NotifyError>;
}
