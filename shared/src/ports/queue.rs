//! The resume queue: wakes a paused run once a decision settles one of its actions, and drives
//! a run accepted by `POST /runs` (or re-driven by the sweep) outside the request.

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
    /// Which re-send this is: 0 for the writer's message (and the sweep's first hand-over of
    /// it), n for the sweep's n-th re-send after nothing acted on the message within its lease.
    #[serde(default, skip_serializing_if = "is_first")]
    pub resent: u32,
}

fn is_first(resent: &u32) -> bool {
    *resent == 0
}

impl ResumeMessage {
    /// The message's key, `action_id:version`: the same for every send of it.
    pub fn key(&self) -> String {
        idempotency_key(&self.action_id, self.version)
    }

    /// What a queue deduplicates this send by: the key for the writer's message, so the sweep
    /// handing it over again is dropped if the writer's went out; the key and the re-send's
    /// number for a re-send, which must get through though the first one died in the
    /// dead-letter queue (SQS drops a repeated id for five minutes, wherever the first went).
    pub fn deduplication_id(&self) -> String {
        match self.resent {
            0 => self.key(),
            n => format!("{}#{n}", self.key()),
        }
    }

    /// Messages of one run are delivered in order.
    pub fn group(&self) -> &str {
        self.run_id.as_str()
    }
}

/// "Drive run R": take its lease (the `drive`-th) and run its model turns. Sent by the start
/// function once the run is accepted (`drive` 0) and by the sweep when it re-drives a run whose
/// driver stopped; a message for a lease already taken is ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriveMessage {
    pub tenant: TenantId,
    pub run_id: RunId,
    /// How many drivers took the run before this one: the message drives it only while that
    /// is still so.
    pub drive: u32,
}

impl DriveMessage {
    /// What a queue deduplicates this send by: one id per lease of the run.
    pub fn deduplication_id(&self) -> String {
        format!("{}:drive:{}", self.run_id, self.drive)
    }

    /// In the run's group, with its resume messages.
    pub fn group(&self) -> &str {
        self.run_id.as_str()
    }
}

/// A message of the resume queue: either kind, told apart by the drive message's `drive`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum QueueMessage {
    Resume(ResumeMessage),
    Drive(DriveMessage),
}

impl QueueMessage {
    /// Reads a message body; one that is neither kind is reported, never guessed at.
    pub fn parse(body: &str) -> Result<Self, String> {
        let value: serde_json::Value =
            serde_json::from_str(body).map_err(|e| format!("not a queue message: {e}"))?;
        // Chosen by that one field, so a refusal names the field at fault.
        if value.get("drive").is_some() {
            serde_json::from_value(value)
                .map(Self::Drive)
                .map_err(|e| format!("not a drive message: {e}"))
        } else {
            serde_json::from_value(value)
                .map(Self::Resume)
                .map_err(|e| format!("not a resume message: {e}"))
        }
    }

    /// The run it wakes, and its tenant.
    pub fn run(&self) -> (&TenantId, &RunId) {
        match self {
            Self::Resume(m) => (&m.tenant, &m.run_id),
            Self::Drive(m) => (&m.tenant, &m.run_id),
        }
    }

    /// Messages of one run are delivered in order.
    pub fn group(&self) -> &str {
        match self {
            Self::Resume(m) => m.group(),
            Self::Drive(m) => m.group(),
        }
    }

    pub fn deduplication_id(&self) -> String {
        match self {
            Self::Resume(m) => m.deduplication_id(),
            Self::Drive(m) => m.deduplication_id(),
        }
    }

    /// How logs and reports name it: `action_id:version`, or `run:drive:n`.
    pub fn key(&self) -> String {
        match self {
            Self::Resume(m) => m.key(),
            Self::Drive(m) => m.deduplication_id(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the resume queue is unavailable: {0}")]
pub struct QueueError(pub String);

#[async_trait]
pub trait ResumeQueue: Send + Sync {
    async fn publish(&self, message: &ResumeMessage) -> Result<(), QueueError>;

    /// Sends a run to be driven by the queue's consumer.
    async fn publish_drive(&self, message: &DriveMessage) -> Result<(), QueueError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(resent: u32) -> ResumeMessage {
        ResumeMessage {
            tenant: TenantId::parse("acme").unwrap(),
            run_id: RunId::parse("run-1").unwrap(),
            action_id: ActionId::parse("act-1").unwrap(),
            version: ActionVersion::FIRST,
            resent,
        }
    }

    #[test]
    fn a_resend_keeps_the_key_and_group_and_is_deduplicated_by_an_id_of_its_own() {
        let (first, second) = (message(0), message(2));
        assert_eq!(
            (first.key(), second.key()),
            ("act-1:1".into(), "act-1:1".into())
        );
        assert_eq!(first.group(), second.group());
        assert_eq!(first.deduplication_id(), "act-1:1");
        assert_eq!(second.deduplication_id(), "act-1:1#2");
    }

    #[test]
    fn the_writers_message_reads_as_before_and_a_resend_says_which_it_is() {
        let first = serde_json::to_value(message(0)).unwrap();
        assert!(first.get("resent").is_none(), "{first}");
        let old = r#"{"tenant":"acme","run_id":"run-1","action_id":"act-1","version":1}"#;
        assert_eq!(
            serde_json::from_str::<ResumeMessage>(old).unwrap(),
            message(0)
        );
        let again = serde_json::to_string(&message(3)).unwrap();
        assert_eq!(
            serde_json::from_str::<ResumeMessage>(&again).unwrap(),
            message(3)
        );
    }

    #[test]
    fn a_drive_message_is_told_from_a_resume_message_and_keyed_by_its_lease() {
        let old = r#"{"tenant":"acme","run_id":"run-1","action_id":"act-1","version":1}"#;
        assert_eq!(
            QueueMessage::parse(old).unwrap(),
            QueueMessage::Resume(message(0))
        );
        let drive = DriveMessage {
            tenant: TenantId::parse("acme").unwrap(),
            run_id: RunId::parse("run-1").unwrap(),
            drive: 2,
        };
        let body = serde_json::to_string(&QueueMessage::Drive(drive.clone())).unwrap();
        assert_eq!(body, r#"{"tenant":"acme","run_id":"run-1","drive":2}"#);
        let read = QueueMessage::parse(&body).unwrap();
        assert_eq!(read, QueueMessage::Drive(drive));
        assert_eq!(read.deduplication_id(), "run-1:drive:2");
        assert_eq!(read.group(), message(0).group());
        let bad = QueueMessage::parse(r#"{"tenant":"acme","run_id":"run-1","drive":"x"}"#);
        assert!(bad.unwrap_err().contains("not a drive message"));
        let neither = QueueMessage::parse(r#"{"tenant":"acme"}"#).unwrap_err();
        assert!(neither.contains("not a resume message"), "{neither}");
    }
}
