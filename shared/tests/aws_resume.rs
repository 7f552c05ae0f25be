//! Resuming through the real queue on the local AWS stack: DynamoDB for state, SQS FIFO for
//! resume messages. A crash between the decision's transaction and its publish is healed by the
//! sweep, so is a message that killed workers drove into the dead-letter queue, and a message
//! delivered twice changes nothing. A run accepted without being driven goes through the same
//! queue as a drive message.

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
use shared::ports::queue::{DriveMessage, QueueError, QueueMessage, ResumeMessage, ResumeQueue};
use shared::ports::store::ItemStore;
use support::aws::{FreshStack, queue_attributes};

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

    async fn publish_drive(&self, _: &DriveMessage) -> Result<(), QueueError> {
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
        .and_then(|definition| wiring.build(&definition))
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

/// Dana approves the reimbursement `paused` waits on.
async fn dana_approves(engine: &Engine, paused: &RunReport, decision: &str) {
    let dana = expense::default_directory().identify("dana").unwrap();
    engine
        .decide(&dana, &paused.approvals[0].id, approve(decision))
        .await
        .unwrap();
}

/// What a resume worker does: receive, resume (or drive), delete.
async fn consume(queue: &SqsQueue, engine: &Engine) -> Vec<ResumeReport> {
    let mut reports = Vec::new();
    for received in queue.receive(10, Duration::from_secs(1)).await.unwrap() {
        reports.push(engine.consume(&received.message.unwrap()).await.unwrap());
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

/// How long a received message stays invisible on these tests' queues, instead of
/// template.yaml's 960 s.
const VISIBILITY_SECONDS: u32 = 1;

/// A worker receives the message and is killed before it writes anything: the message stays
/// in the queue and comes back after its visibility timeout.
async fn received_and_dropped(queue: &SqsQueue, key: &str) {
    let wait = Duration::from_secs(u64::from(VISIBILITY_SECONDS) + 3);
    let received = queue.receive(1, wait).await.unwrap();
    let keys: Vec<String> = received
        .iter()
        .map(|r| r.message.as_ref().unwrap().key())
        .collect();
    assert_eq!(keys, [key], "the message came back to the next worker");
}

/// How many messages wait in the queue at `url`.
async fn waiting_in(stack: &FreshStack, url: &str) -> usize {
    let sqs = aws_sdk_sqs::Client::new(&stack.config);
    let name = aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages;
    queue_attributes(&sqs, url, name.clone()).await[&name]
        .parse()
        .unwrap()
}

#[tokio::test]
async fn given_a_resume_message_five_killed_workers_received_when_it_reached_the_dead_letter_queue_then_the_sweep_sends_it_again_and_the_approved_call_runs_once()
 {
    let stack = FreshStack::new("dead-lettered-resume").await;
    let (dlq_url, receives) = stack.dead_letter_queue(VISIBILITY_SECONDS).await;
    assert_eq!(receives, 5, "template.yaml's maxReceiveCount");
    let aws = stack.aws();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let engine = engine(aws.store.clone(), aws.queue.clone(), clock.clone());
    let paused = paused_on_c102(&engine).await;
    dana_approves(&engine, &paused, "d-dead").await;
    let key = format!("{}:1", paused.approvals[0].action_id);

    // Two workers take the message and die before their first write.
    received_and_dropped(&aws.queue, &key).await;
    received_and_dropped(&aws.queue, &key).await;
    // The sweep, a minute on, finds nothing acted on the message: it hands it over again under
    // its writer's deduplication id, which the queue drops (the first is still there).
    clock.advance(TimeDelta::minutes(1));
    let swept = engine.sweep(100).await.unwrap();
    assert_eq!((swept.redelivered, swept.resent.len()), (1, 0), "{swept:?}");
    // Three more workers take it and die; the next receive moves it to the dead-letter queue.
    for _ in 0..3 {
        received_and_dropped(&aws.queue, &key).await;
    }
    tokio::time::sleep(Duration::from_secs(u64::from(VISIBILITY_SECONDS) + 1)).await;
    assert!(consume(&aws.queue, &engine).await.is_empty());
    assert_eq!(waiting_in(&stack, &dlq_url).await, 1, "dead-lettered");
    assert!(
        Ledger::new(aws.store.clone())
            .payments(&paused.tenant)
            .await
            .unwrap()
            .is_empty(),
        "the approved call has not run"
    );

    // When the hand-over's lease runs out, the sweep sends the message again, under a
    // deduplication id of its own, and a worker resumes the run with it.
    clock.advance(TimeDelta::hours(2));
    let swept = engine.sweep(100).await.unwrap();
    assert_eq!(swept.resent, std::slice::from_ref(&key), "{swept:?}");
    let reports = consume(&aws.queue, &engine).await;
    assert!(
        matches!(&reports[..], [ResumeReport::Continued { run }] if run.status == RunStatus::Done),
        "{reports:?}"
    );
    let payments = Ledger::new(aws.store.clone())
        .payments(&paused.tenant)
        .await
        .unwrap();
    assert_eq!(payments.len(), 1, "{payments:?}");
    assert_eq!(payments[0].idempotency_key, key, "run with its key");
    let history = engine
        .history(&paused.tenant, &paused.run_id)
        .await
        .unwrap();
    let events: Vec<&str> = history.entries.iter().map(|e| e.event.name()).collect();
    assert!(
        events.ends_with(&["resume_resent", "executing", "executed", "resumed", "done"]),
        "the log says the resume needed healing: {events:?}"
    );
    // The dead letter stays for the alarm; nothing more is sent once the run went on.
    assert_eq!(waiting_in(&stack, &dlq_url).await, 1);
    clock.advance(TimeDelta::days(3));
    engine.sweep(100).await.unwrap();
    assert!(consume(&aws.queue, &engine).await.is_empty());
}

#[tokio::test]
async fn given_a_resume_message_delivered_twice_or_after_the_dedup_window_then_nothing_changes() {
    let stack = FreshStack::new("delivered-twice").await;
    let aws = stack.aws();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let engine = engine(aws.store.clone(), aws.queue.clone(), clock);

    let paused = paused_on_c102(&engine).await;
    dana_approves(&engine, &paused, "d-twice").await;
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
        resent: 0,
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
async fn given_messages_of_one_run_then_they_share_a_group_keyed_by_action_and_version_and_a_resend_is_not_dropped_as_a_copy()
 {
    let stack = FreshStack::new("fifo-keys").await;
    let aws = stack.aws();
    let message = ResumeMessage {
        tenant: shared::domain::ids::TenantId::parse("acme").unwrap(),
        run_id: shared::domain::ids::RunId::parse("run-fifo").unwrap(),
        action_id: shared::domain::ids::ActionId::parse("act-fifo").unwrap(),
        version: ActionVersion::FIRST.next(),
        resent: 0,
    };
    let resent = ResumeMessage {
        resent: 1,
        ..message.clone()
    };
    aws.queue.publish(&message).await.unwrap();
    aws.queue.publish(&message).await.unwrap();
    aws.queue.publish(&resent).await.unwrap();
    let received = aws.queue.receive(10, Duration::from_secs(1)).await.unwrap();
    let messages: Vec<&QueueMessage> = received
        .iter()
        .map(|r| r.message.as_ref().unwrap())
        .collect();
    assert_eq!(
        messages,
        [
            &QueueMessage::Resume(message.clone()),
            &QueueMessage::Resume(resent.clone())
        ],
        "the same action_id:version within the window is one message; the sweep's re-send of it is another"
    );
    assert_eq!(message.key(), "act-fifo:2");
    assert_eq!(resent.key(), "act-fifo:2");
}

#[tokio::test]
async fn given_a_run_accepted_on_dynamodb_when_its_drive_message_is_sent_twice_through_sqs_then_a_worker_drives_it_once()
 {
    let stack = FreshStack::new("drive-message").await;
    let aws = stack.aws();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let engine = engine(aws.store.clone(), aws.queue.clone(), clock.clone());
    let task = expense::task_for(&expense::default_claims(), "c-101").unwrap();
    let accepted = engine.accept(task).await.unwrap();
    assert_eq!(accepted.status, RunStatus::Running);
    let message = DriveMessage {
        tenant: accepted.tenant.clone(),
        run_id: accepted.run_id.clone(),
        drive: 0,
    };

    engine.send_drive(&message).await.unwrap();
    engine.send_drive(&message).await.unwrap();
    let reports = consume(&aws.queue, &engine).await;

    // The queue dropped the repeat (same run:drive:0 within its window); the worker drove it.
    let [ResumeReport::Continued { run }] = reports.as_slice() else {
        panic!("{reports:?}")
    };
    assert_eq!(run.status, RunStatus::Done);
    let again = engine.drive_run(&message).await.unwrap();
    assert!(
        matches!(again, ResumeReport::Ignored { .. }),
        "a late copy drives nothing: {again:?}"
    );
    let payments = Ledger::new(aws.store.clone())
        .payments(&accepted.tenant)
        .await
        .unwrap();
    assert_eq!(payments.len(), 1);
}
