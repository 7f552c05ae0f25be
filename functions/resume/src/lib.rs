//! The resume function: one SQS FIFO batch of resume messages, each keyed `action_id:version`,
//! and drive messages, each a run `POST /runs` accepted (or the sweep drives again) to drive
//! until it is done, failed or paused. Messages of one run share a group and arrive in order;
//! when one fails, it and every later message of the batch are reported as failures, so
//! nothing overtakes it. The one that failed is counted (`countersign_resume_failures_total`,
//! a metric line); those held back behind it are not. Each message's work is logged in a span
//! carrying the trace id of the invocation that sent it, so its lines join the sender's.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use shared::adapters::sqs;
use shared::engine::{Engine, ResumeReport};
use tracing::Instrument;

/// Resumes each message in order; the response names the messages SQS must deliver again.
pub async fn handle(engine: &Engine, event: SqsEvent) -> SqsBatchResponse {
    let mut failures = Vec::new();
    for record in event.records {
        let id = record.message_id.clone().unwrap_or_default();
        if !failures.is_empty() {
            failures.push(id);
            continue;
        }
        let span = message_span(&id, &record);
        let body = record.body.as_deref().unwrap_or_default();
        if !resume(engine, body, &span).instrument(span.clone()).await {
            failures.push(id);
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

/// Resumes one message, logging what came of it in `span`, which it names the message's run in
/// once it is read: false when SQS must deliver it again, then counted as a resume failure
/// under its run's agent (a body that is no message names no run to count under).
async fn resume(engine: &Engine, body: &str, span: &tracing::Span) -> bool {
    let message = match sqs::parse(body) {
        Ok(message) => message,
        Err(error) => {
            tracing::warn!(%error, "will be delivered again");
            return false;
        }
    };
    let (tenant, run_id) = message.run();
    span.record("tenant", tracing::field::display(tenant));
    span.record("run_id", tracing::field::display(run_id));
    match shared::agents::consume_queued(engine, &message).await {
        Ok(ResumeReport::Ignored { reason }) => tracing::info!(%reason, "nothing to do"),
        Ok(report) => tracing::info!(outcome = ?report, "resumed"),
        Err(error) => {
            tracing::warn!(%error, "will be delivered again");
            return false;
        }
    }
    true
}

/// The span of one message's work: its id, the trace id of the invocation that sent it (SQS's
/// `AWSTraceHeader`) where that was traced, and once the message is read its run's tenant and id.
fn message_span(id: &str, record: &SqsMessage) -> tracing::Span {
    let trace_id = record
        .attributes
        .get(sqs::TRACE_HEADER)
        .and_then(|header| sqs::trace_id(header));
    tracing::info_span!(
        "message",
        message_id = id,
        trace_id,
        tenant = tracing::field::Empty,
        run_id = tracing::field::Empty,
    )
}
