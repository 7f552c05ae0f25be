//! The resume queue on SQS FIFO: deduplicated by `action_id:version` (a re-send by the sweep by
//! that and its number), grouped by run so one run resumes in order. Consumers receive, resume,
//! then delete. Each message carries the X-Ray trace of the invocation that sent it, so the
//! resume function's work joins the sender's trace.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{
    MessageSystemAttributeName, MessageSystemAttributeNameForSends, MessageSystemAttributeValue,
};

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
    /// The sender's X-Ray trace header, if it was traced.
    pub trace_header: Option<String>,
}

/// The message system attribute that carries the sender's X-Ray trace header, which Lambda reads
/// to link the consumer's trace to the sender's. AWS X-Ray developer guide, "Amazon SQS and AWS X-Ray":
/// "Traces from upstream message producers are automatically linked to traces from downstream Lambda consumer nodes".
pub const TRACE_HEADER: &str = "AWSTraceHeader";

/// The X-Ray trace header of this invocation, which the Lambda runtime sets in
/// `_X_AMZN_TRACE_ID` for each one; none outside Lambda or without tracing.
fn invocation_trace_header() -> Option<String> {
    std::env::var("_X_AMZN_TRACE_ID")
        .ok()
        .filter(|header| !header.is_empty())
}

/// The trace id (`Root=…`) of an X-Ray trace header such as
/// `Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1`.
pub fn trace_id(header: &str) -> Option<&str> {
    header
        .split(';')
        .find_map(|part| part.trim().strip_prefix("Root="))
        .filter(|root| !root.is_empty())
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
            .message_system_attribute_names(MessageSystemAttributeName::AwsTraceHeader)
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
                trace_header: m
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::AwsTraceHeader))
                    .cloned(),
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
        let trace = invocation_trace_header()
            .map(|header| {
                MessageSystemAttributeValue::builder()
                    .data_type("String")
                    .string_value(header)
                    .build()
                    .map_err(|e| QueueError(e.to_string()))
            })
            .transpose()?;
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .message_group_id(message.group())
            .message_deduplication_id(message.deduplication_id())
            .set_message_system_attributes(
                trace.map(|trace| {
                    [(MessageSystemAttributeNameForSends::AwsTraceHeader, trace)].into()
                }),
            )
            .send()
            .await
            .map_err(|e| QueueError(DisplayErrorContext(&e).to_string()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_id_is_the_root_of_a_trace_header_wherever_it_stands() {
        let root = "1-5759e988-bd862e3fe1be46a994272793";
        assert_eq!(
            trace_id(&format!("Root={root};Parent=53995c3f42cd8ad8;Sampled=1")),
            Some(root)
        );
        assert_eq!(trace_id(&format!("Sampled=0; Root={root}")), Some(root));
        assert_eq!(trace_id("Parent=53995c3f42cd8ad8;Sampled=1"), None);
        assert_eq!(trace_id("Root=;Sampled=1"), None);
    }
}
