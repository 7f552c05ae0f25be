//! `countersign worker`: resumes and drives runs from the SQS queue the way the resume function
//! does.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use shared::ports::queue::QueueMessage;

use crate::Output;
use crate::fail::Failure;
use crate::local::Local;
use crate::render;

/// How long one receive waits for messages: long polling while serving, a moment with `--once`.
fn wait(once: bool) -> Duration {
    if once {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(20)
    }
}

pub async fn run(local: &Local, once: bool) -> Result<Output, Failure> {
    let Some(aws) = &local.aws else {
        return Err(Failure::usage(
            "the embedded store resumes runs in the deciding process; a worker needs COUNTERSIGN_STORE=dynamodb",
        ));
    };
    let mut text = String::new();
    let mut resumed = Vec::new();
    loop {
        let batch = aws
            .queue
            .receive(10, wait(once))
            .await
            .map_err(|e| Failure::from(shared::engine::EngineError::Unavailable(e.0)))?;
        if batch.is_empty() && once {
            break;
        }
        // A FIFO group resumes in order: after a failure, leave the rest of its group queued.
        let mut stalled: BTreeSet<String> = BTreeSet::new();
        for received in batch {
            let message = match received.message {
                Ok(message) => message,
                Err(why) => {
                    tracing::error!(message_id = %received.message_id, %why, "left for the dead-letter queue");
                    continue;
                }
            };
            if stalled.contains(message.group()) {
                continue;
            }
            match shared::agents::consume_queued(&local.engine, &message).await {
                Ok(report) => {
                    if let Err(error) = aws.queue.delete(&received.receipt_handle).await {
                        tracing::warn!(%error, "resumed, but the message stays; the next delivery changes nothing");
                    }
                    let line = match &report {
                        shared::engine::ResumeReport::Continued { run }
                        | shared::engine::ResumeReport::Held { run } => render::run(run, None),
                        shared::engine::ResumeReport::Ignored { reason } => {
                            format!("{}: nothing to do ({reason})\n", message.key())
                        }
                        shared::engine::ResumeReport::Unknown { key } => {
                            format!("{key}: outcome unknown; the sweep reconciles it\n")
                        }
                    };
                    let did = match &message {
                        QueueMessage::Resume(_) => "resumed",
                        QueueMessage::Drive(_) => "drove",
                    };
                    let said = format!("{did} {}\n{line}", message.key());
                    text.push_str(&said);
                    if !once {
                        print!("{}", render::terminal(&said));
                    }
                    resumed.push(json!({"message": message, "report": report}));
                }
                Err(error) => {
                    tracing::warn!(key = %message.key(), %error, "resume failed; the message comes back after its visibility timeout");
                    stalled.insert(message.group().to_string());
                }
            }
        }
    }
    if resumed.is_empty() {
        text.push_str("Nothing was queued.\n");
    }
    Ok(Output {
        text,
        json: json!({"resumed": resumed}),
    })
}
