//! Resuming through the real queue on the local AWS stack: DynamoDB for state, SQS FIFO for
//! resume messages. A crash between the decision's transaction and its publish is healed by the
//! sweep, and a message delivered twice changes nothing.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{TimeDelta, Utc};
use shared::adapters::sqs::SqsQueue;
use shared::agents::{self, Wiring};
use shared::domain::approval::{Choice, DecisionRequest};
use shared::domain::ids::{ActionVersion, DecisionId};
use shared::domain::run::RunStatus;
use shared::engine::{Delivery, Engine, ResumeReport, RunReport};
use shared::example::expense::{self, Ledger, OfflineExpenseAgent};
use shared::ports::clock::{Clock, ManualClock};
use shared::ports::queue::{QueueError, ResumeMessage, ResumeQueue};
use shared::ports::store::ItemStore;
use support::aws::FreshStack;

/// The process dies after its transaction commits and before the message reaches SQS.
struct CrashBeforePublish {
    attempts: AtomicUsize,
}

#[async_trait]
impl ResumeQueue for CrashBeforePublish {
    async fn publish(&self, _: &ResumeMessage) -> Result<(), QueueError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        Err(QueueError("the process stopped before publishing".into()))
    }
}

fn engine(
    store: Arc<dyn ItemStore>,
    queue: Arc<dyn ResumeQueue>,
    clock: Arc<ManualClock>,
) -> Engine {
    let clock: Arc<dyn Clock> = clock;
    let wiring = Wiring::new(store.clone(), clock.clone(), expense::default_claims());
    let agent = agents::shipped_one(expense::AGENT)
        .and_then(|definition| definition.build(&wiring))
        .unwrap()
        .with_model(Arc::new(OfflineExpenseAgent));
    Engine::builder(store)
        .agent(agent)
        .clock(clock)
        .delivery(Delivery::Queue(queue))
        .build()
}

fn approve(id: &str) -> DecisionRequest {
    DecisionRequest {
        decision_id: DecisionId::parse(id).unwrap(),
        action_version: ActionVersion::FIRST,
        choice: Choice::Approve,
    }
}

/// Starts claim c-102, which pauses on its reimbursement.
async fn paused_on_c102(engine: &Engine) -> RunReport {
    let task = expense::task_for(&expense::default_claims(), "c-102").unwrap();
    let paused = engine.start(task).await.unwrap();
    assert_eq!(paused.status, RunStatus::AwaitingApproval);
    paused
}

/// What a resume worker does: receive, resume, delete.
async fn consume(queue: &SqsQueue, engine: &Engine) -> Vec<ResumeReport> {
    let mut reports = Vec::new();
    for received in queue.receive(10, Duration::from_secs(1)).await.unwrap() {
        reports.push(engine.resume(&received.message.unwrap()).await.unwrap());
        queue.delete(&received.receipt_handle).await.unwrap();
    }
    reports
}

#[tokio::test]
async fn given_a_crash_between_the_decision_and_its_publish_when_the_sweep_runs_then_the_run_resumes_exactly_once()
 {
    let stack = FreshStack::new("crash-before-publish").await;
    let aws = stack.aws();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let crashing = Arc::new(CrashBeforePublish {
        attempts: AtomicUsize::new(0),
    });
    let before = engine(aws.store.clone(), crashing.clone(), clock.clone());

    let paused = paused_on_c102(&before).await;
    let dana = expense::default_directory().identify("dana").unwrap();
    let decided = before
        .decide(&dana, &paused.approvals[0].id, approve("d-crash"))
        .await
        .unwrap();
    assert_eq!(
        crashing.attempts.load(Ordering::SeqCst),
        1,
        "the decision committed, then the publish was lost"
    );
    assert!(
        decided.run.is_none(),
        "a queued resume does not run in the deciding process"
    );
    assert!(
        aws.queue
            .receive(10, Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty(),
        "nothing reached the queue"
    );

    // Another process, after the outbox grace period: the sweep publishes the straggler.
    clock.advance(TimeDelta::seconds(31));
    let after = engine(stack.aws().store, stack.aws().queue, clock.clone());
    let swept = after.sweep(100).await.unwrap();
    assert_eq!(swept.redelivered, 1);
    let reports = consume(&aws.queue, &after).await;
    assert!(
        matches!(&reports[..], [ResumeReport::Continued { run }] if run.status == RunStatus::Done),
        "{reports:?}"
    );

    let again = after.sweep(100).await.unwrap();
    assert_eq!(again.redelivered, 0, "a delivered entry leaves the outbox");
    let payments = Ledger::new(aws.store.clone())
        .payments(&paused.tenant)
        .await
        .unwrap();
    assert_eq!(payments.len(), 1);
    assert_eq!(payments[0].claim_id, "c-102");
}

#[tokio::test]
async fn given_a_resume_message_delivered_twice_or_after_the_dedup_window_then_nothing_changes() {
    let stack = FreshStack::new("delivered-twice").await;
    let aws = stack.aws();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let engine = engine(aws.store.clone(), aws.queue.clone(), clock);

    let paused = paused_on_c102(&engine).await;
    let dana = expense::default_directory().identify("dana").unwrap();
    engine
        .decide(&dana, &paused.approvals[0].id, approve("d-twice"))
        .await
        .unwrap();
    let first = consume(&aws.queue, &engine).await;
    assert!(
        matches!(&first[..], [ResumeReport::Continued { .. }]),
        "{first:?}"
    );

    // The same message again: SQS dedups within five minutes, but not after a delete on the
    // local stack, nor after the window in AWS. The consumer must not care.
    let message = ResumeMessage {
        tenant: paused.tenant.clone(),
        run_id: paused.run_id.clone(),
        action_id: paused.approvals[0].action_id.clone(),
        version: ActionVersion::FIRST,
    };
    aws.queue.publish(&message).await.unwrap();
    let second = consume(&aws.queue, &engine).await;
    assert!(
        matches!(&second[..], [ResumeReport::Ignored { .. }]),
        "{second:?}"
    );
    assert!(matches!(
        engine.resume(&message).await.unwrap(),
        ResumeReport::Ignored { .. }
    ));

    let payments = Ledger::new(aws.store.clone())
        .payments(&paused.tenant)
        .await
        .unwrap();
    assert_eq!(payments.len(), 1, "paid once");
    let history = engine
        .history(&paused.tenant, &paused.run_id)
        .await
        .unwrap();
    let executions = history
        .entries
        .iter()
        .filter(|e| e.event.name() == "executing")
        .count();
    assert_eq!(
        executions, 4,
        "three reads and one payment, each claimed once"
    );
}

#[tokio::test]
async fn given_messages_of_one_run_then_they_share_a_group_keyed_by_action_and_version() {
    let stack = FreshStack::new("fifo-keys").await;
    let aws = stack.aws();
    let message = ResumeMessage {
        tenant: shared::domain::ids::TenantId::parse("acme").unwrap(),
        run_id: shared::domain::ids::RunId::parse("run-fifo").unwrap(),
        action_id: shared::domain::ids::ActionId::parse("act-fifo").unwrap(),
        version: ActionVersion::FIRST.next(),
    };
    aws.queue.publish(&message).await.unwrap();
    aws.queue.publish(&message).await.unwrap();
    let received = aws.queue.receive(10, Duration::from_secs(1)).await.unwrap();
    assert_eq!(
        received.len(),
        1,
        "the same action_id:version within the window is one message"
    );
    assert_eq!(received[0].message.as_ref().unwrap(), &message);
    assert_eq!(message.key(), "act-fifo:2");
}
