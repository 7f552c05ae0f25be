//! The resume queue on SQS FIFO: deduplicated by `action_id:version` (a re-send by the sweep by
//! that and its number), grouped by run so one run resumes in order. Consumers receive, resume,
//! then delete.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::DisplayErrorContext;

use crate::ports::queue::{DriveMessage, QueueError, QueueMessage, ResumeMessage, ResumeQueue};

#[derive(Clone)]
pub struct SqsQueue {
    client: Client,
    url: String,
}

/// One received message: the resume or drive message (or why it could not be read) and its
/// receipt.
#[derive(Debug, Clone)]
pub struct Received {
    pub message_id: String,
    pub receipt_handle: String,
    pub message: Result<QueueMessage, String>,
}

impl SqsQueue {
    pub fn new(client: Client, url: impl Into<String>) -> Self {
        Self {
            client,
            url: url.into(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Waits up to `wait` for at most `max` messages.
    pub async fn receive(&self, max: i32, wait: Duration) -> Result<Vec<Received>, QueueError> {
        let output = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max.clamp(1, 10))
            .wait_time_seconds(wait.as_secs().min(20) as i32)
            .send()
            .await
            .map_err(|e| QueueError(DisplayErrorContext(&e).to_string()))?;
        Ok(output
            .messages()
            .iter()
            .map(|m| Received {
                message_id: m.message_id().unwrap_or_default().to_string(),
                receipt_handle: m.receipt_handle().unwrap_or_default().to_string(),
                message: parse(m.body().unwrap_or_default()),
            })
            .collect())
    }

    pub async fn delete(&self, receipt_handle: &str) -> Result<(), QueueError> {
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(receipt_handle)
            .send()
            .await
            .map_err(|e| QueueError(DisplayErrorContext(&e).to_string()))?;
        Ok(())
    }
}

/// Reads a message body; a body that is neither a resume nor a drive message is reported,
/// never guessed at.
pub fn parse(body: &str) -> Result<QueueMessage, String> {
    QueueMessage::parse(body)
}

#[async_trait]
impl ResumeQueue for SqsQueue {
    async fn publish(&self, message: &ResumeMessage) -> Result<(), QueueError> {
        self.send(&QueueMessage::Resume(message.clone())).await
    }

    async fn publish_drive(&self, message: &DriveMessage) -> Result<(), QueueError> {
        self.send(&QueueMessage::Drive(message.clone())).await
    }
}

impl SqsQueue {
    async fn send(&self, message: &QueueMessage) -> Result<(), QueueError> {
        let body = serde_json::to_string(message).expect("queue messages serialize");
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .message_group_id(message.group())
            .message_deduplication_id(message.deduplication_id())
            .send()
            .await
            .map_err(|e| QueueError(DisplayErrorContext(&e).to_string()))?;
        Ok(())
    }
}
