//! The resume handler on a recorded SQS FIFO batch, over the embedded store.

#[path = "../../../shared/tests/harness/mod.rs"]
mod harness;

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
use harness::{Embedded, Harness, RecordingQueue, approve};
use shared::domain::run::RunStatus;
use shared::engine::Delivery;
use shared::ports::queue::{DriveMessage, QueueMessage, ResumeMessage};
use shared::testing::JsonLog;

const BATCH: &str = include_str!("fixtures/sqs-fifo-batch.json");

/// The first records of the recorded batch, carrying these bodies in order.
fn batch(bodies: &[String]) -> SqsEvent {
    let mut event: serde_json::Value = serde_json::from_str(BATCH).unwrap();
    let records = event["Records"].as_array_mut().unwrap();
    records.truncate(bodies.len());
    for (record, body) in records.iter_mut().zip(bodies) {
        record["body"] = serde_json::Value::String(body.clone());
    }
    serde_json::from_value(event).unwrap()
}

fn body(message: &ResumeMessage) -> String {
    serde_json::to_string(message).unwrap()
}

fn failed_ids(response: &aws_lambda_events::event::sqs::SqsBatchResponse) -> Vec<&str> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect()
}

/// Pauses c-102, approves it, and returns the resume message the decision queued.
async fn approved_c102(h: &Harness) -> (harness::Process, ResumeMessage) {
    let queue = Arc::new(RecordingQueue::default());
    let decider = h.process_with(|t| t, Delivery::Queue(queue.clone())).await;
    let (_, approval) = h.start_paused(&decider, "c-102").await;
    h.decided(&decider, "dana", &approval.id, approve("d-1"))
        .await;
    let message = queue
        .published()
        .pop()
        .expect("the decision queued a resume message");
    (decider, message)
}

/// A fresh store where c-102 waits to resume after Dana's approval, the message that resumes
/// it, and another process to take the message.
async fn approved_c102_and_a_worker() -> (Harness, ResumeMessage, harness::Process) {
    let h = Harness::new(Embedded::fresh()).await;
    let (_, message) = approved_c102(&h).await;
    let worker = h.process().await;
    (h, message, worker)
}

#[tokio::test]
async fn a_batch_with_one_resume_message_resumes_the_run_and_reports_no_failure() {
    let (h, message, worker) = approved_c102_and_a_worker().await;

    let response = resume::handle(&worker, batch(&[body(&message)])).await;

    assert!(response.batch_item_failures.is_empty());
    assert_eq!(
        h.run(&worker, &message.run_id).await.status,
        RunStatus::Done
    );
    assert_eq!(h.payments().await.len(), 1);
}

#[tokio::test]
async fn the_same_message_twice_in_a_batch_pays_once_and_fails_nothing() {
    let (h, message, worker) = approved_c102_and_a_worker().await;

    let response = resume::handle(&worker, batch(&[body(&message), body(&message)])).await;

    assert!(response.batch_item_failures.is_empty());
    assert_eq!(h.payments().await.len(), 1);
}

#[tokio::test]
async fn after_a_failure_it_and_every_later_message_are_reported_and_not_processed() {
    let (h, message, worker) = approved_c102_and_a_worker().await;

    let response = resume::handle(
        &worker,
        batch(&["not json".into(), body(&message), body(&message)]),
    )
    .await;

    assert_eq!(
        failed_ids(&response),
        [
            "0c1a8f4e-0001-4d35-9a5e-1c0b3c1c2a01",
            "0c1a8f4e-0002-4d35-9a5e-1c0b3c1c2a02",
            "0c1a8f4e-0003-4d35-9a5e-1c0b3c1c2a03"
        ]
    );
    assert_eq!(
        h.run(&worker, &message.run_id).await.status,
        RunStatus::AwaitingApproval,
        "nothing overtook the failure"
    );
    assert!(h.payments().await.is_empty());
}

#[tokio::test]
async fn a_message_whose_run_is_of_an_agent_not_configured_here_is_reported_and_counted_as_one_resume_failure_each_delivery()
 {
    let h = Harness::new(Embedded::fresh()).await;
    let (decider, message) = approved_c102(&h).await;
    let without_the_agent = h.process_of_definitions(&[]).await;

    let first = resume::handle(&without_the_agent, batch(&[body(&message)])).await;
    let again = resume::handle(&without_the_agent, batch(&[body(&message), body(&message)])).await;

    assert_eq!(failed_ids(&first).len(), 1);
    assert_eq!(failed_ids(&again).len(), 2);
    let figures = decider.figures(None).await.unwrap();
    let expense = figures
        .agents
        .iter()
        .find(|a| a.agent.as_str() == "expense")
        .unwrap();
    assert_eq!(
        expense.resume_failures, 2,
        "one per delivery that failed; the message held back behind a failure is not counted"
    );
    assert_eq!(
        h.run(&decider, &message.run_id).await.status,
        RunStatus::AwaitingApproval
    );
}

#[tokio::test]
async fn a_drive_message_for_an_accepted_run_drives_it_once_though_delivered_twice() {
    let h = Harness::new(Embedded::fresh()).await;
    let queue = Arc::new(RecordingQueue::default());
    let starter = h.process_with(|t| t, Delivery::Queue(queue.clone())).await;
    let accepted = starter
        .accept(shared::example::expense::task_for(&h.claims, "c-101").unwrap())
        .await
        .unwrap();
    let drive = DriveMessage {
        tenant: accepted.tenant.clone(),
        run_id: accepted.run_id.clone(),
        drive: 0,
    };
    let drive = serde_json::to_string(&QueueMessage::Drive(drive)).unwrap();
    let worker = h.process().await;

    let response = resume::handle(&worker, batch(&[drive.clone(), drive])).await;

    assert!(failed_ids(&response).is_empty(), "{response:?}");
    assert_eq!(
        h.run(&worker, &accepted.run_id).await.status,
        RunStatus::Done
    );
    assert_eq!(h.payments().await.len(), 1);
}

#[tokio::test]
async fn given_a_message_from_a_traced_invocation_when_it_resumes_then_the_lines_of_its_work_carry_the_trace_and_the_runs_ids()
 {
    let (_h, message, worker) = approved_c102_and_a_worker().await;
    let root = "1-5759e988-bd862e3fe1be46a994272793";
    let mut event = batch(&[body(&message)]);
    event.records[0].attributes.insert(
        "AWSTraceHeader".into(),
        format!("Root={root};Parent=53995c3f42cd8ad8;Sampled=1"),
    );

    let log = JsonLog::capture();
    let response = resume::handle(&worker, event).await;
    let lines = log.lines();

    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    assert!(lines.len() >= 2, "{lines:?}");
    for line in &lines {
        assert_eq!(line["trace_id"], root, "{line}");
        assert_eq!(line["message_id"], "0c1a8f4e-0001-4d35-9a5e-1c0b3c1c2a01");
        assert_eq!(line["run_id"], message.run_id.to_string());
        assert_eq!(line["tenant"], "acme");
    }
    let history = worker
        .history(&harness::acme(), &message.run_id)
        .await
        .unwrap();
    // Logged deep inside the engine, once the approved payment ran and the run drove on.
    let done = lines
        .iter()
        .find(|l| l["message"] == "done")
        .expect("a line of the run's end");
    assert_eq!(done["tenant"], "acme");
    assert_eq!(done["run_id"], message.run_id.to_string());
    assert_eq!(done["action_id"], message.action_id.to_string());
    assert_eq!(done["approval_id"], history.approvals[0].id.to_string());
}

#[tokio::test]
async fn given_a_message_from_an_untraced_sender_then_its_lines_carry_no_trace() {
    let (_h, message, worker) = approved_c102_and_a_worker().await;

    let log = JsonLog::capture();
    resume::handle(&worker, batch(&[body(&message)])).await;
    let lines = log.lines();

    assert!(!lines.is_empty());
    assert!(
        lines.iter().all(|l| l.get("trace_id").is_none()),
        "{lines:?}"
    );
}
