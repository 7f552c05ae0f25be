//! The resume function: one SQS FIFO batch of resume messages, each keyed `action_id:version`,
//! and drive messages, each a run `POST /runs` accepted (or the sweep drives again) to drive
//! until it is done, failed or paused. Messages of one run share a group and arrive in order;
//! when one fails, it and every later message of the batch are reported as failures, so
//! nothing overtakes it. The one that failed is counted (`countersign_resume_failures_total`,
//! a metric line); those held back behind it are not.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use shared::adapters::sqs;
use shared::engine::{Engine, ResumeReport};

/// Resumes each message in order; the response names the messages SQS must deliver again.
pub async fn handle(engine: &Engine, event: SqsEvent) -> SqsBatchResponse {
    let mut failures = Vec::new();
    for record in event.records {
        let id = record.message_id.clone().unwrap_or_default();
        if !failures.is_empty() {
            failures.push(id);
            continue;
        }
        let message = sqs::parse(record.body.as_deref().unwrap_or_default());
        let outcome = match &message {
            Ok(message) => match shared::agents::prepare_queued(engine, message).await {
                Ok(()) => engine.consume(message).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
            Err(why) => Err(why.clone()),
        };
        match outcome {
            Ok(ResumeReport::Ignored { reason }) => {
                tracing::info!(message = %id, %reason, "nothing to do")
            }
            Ok(report) => tracing::info!(message = %id, outcome = ?report, "resumed"),
            Err(error) => {
                tracing::warn!(message = %id, %error, "will be delivered again");
                // Under its run's agent; a body that is no message names no run to count under.
                if let Ok(message) = &message {
                    let (tenant, run) = message.run();
                    engine.count_resume_failure(tenant, run).await;
                }
                failures.push(id);
            }
        }
    }
    let mut response = SqsBatchResponse::default();
    response.batch_item_failures = failures
        .into_iter()
        .map(|item_identifier| {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = item_identifier;
            failure
        })
        .collect();
    response
}
