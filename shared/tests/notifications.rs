//! Notifications through the outbox, against a webhook receiver on loopback: a pause posts one
//! notice per approval after it is stored, failed posts are retried by the sweep with growing
//! delays, two sweeps never post the same notice, a reminder goes out once an hour before the
//! deadline, a receiver that never answers holds nothing up, and without a webhook nothing
//! changes. The audit log records every notice sent or given up on.

#[macro_use]
mod harness;
// The webhook receiver and friends: only this binary has axum to build them with (the
// functions' tests include the harness too).
#[path = "harness/dynamodb.rs"]
mod dynamodb_backend;
#[path = "harness/notices.rs"]
mod notices;
mod support;

use std::slice::from_ref;
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use chrono::{DateTime, Duration, Utc};
use serde_json::json;
use shared::adapters::webhook::Webhooks;
use shared::domain::approval::ApprovalStatus;
use shared::domain::audit::AuditEvent;
use shared::domain::identity::Actor;
use shared::domain::ids::RunId;
use shared::domain::run::RunStatus;
use shared::engine::records::{IndexShards, OutboxEntry, OutboxMessage, decode, keys};
use shared::engine::{EngineBuilder, MAX_NOTICE_ATTEMPTS, SweepReport};
use shared::example::expense::{OfflineExpenseAgent, task_for};
use shared::ports::clock::Clock;
use shared::ports::scheduler::Wake;
use tokio::sync::Barrier;

use dynamodb_backend::DynamoDb;
use harness::{
    Embedded, Harness, Process, Script, acme, approve, assert_recorded, paid, scripted_task,
};
use notices::{Answer, ReadsTogether, Receiver, RecordingScheduler, Scheduled};

/// Posts in these tests give up quickly: the receiver is on loopback.
const QUICK: StdDuration = StdDuration::from_millis(500);

async fn fresh() -> Harness {
    Harness::new(Embedded::fresh()).await
}

async fn posting_to(h: &Harness, receiver: &Receiver) -> Process {
    h.notifying(receiver.webhooks(QUICK)).await
}

/// The moment `hours:minutes` after the test started.
fn at(hours: i64, minutes: i64) -> DateTime<Utc> {
    harness::start_of_test() + Duration::hours(hours) + Duration::minutes(minutes)
}

/// Every outbox item still waiting, whatever it is due (the outbox index also holds actions
/// whose resume message is due).
async fn outbox(p: &Process) -> Vec<OutboxEntry> {
    let shards = p
        .index_shards(keys::OUTBOX_INDEX, IndexShards::DEFAULT)
        .await;
    shards
        .iter()
        .flatten()
        .filter(|item| item.sk.starts_with(keys::OUTBOX_PREFIX))
        .map(|item| decode::<OutboxEntry>(item).unwrap().value)
        .collect()
}

/// The run's notice events, `(event, approval, notice, destination)`, oldest first.
async fn notices_of(p: &Process, run: &RunId) -> Vec<(&'static str, String, String, String)> {
    let history = p.history(&acme(), run).await.unwrap();
    history
        .entries
        .iter()
        .filter_map(|e| match &e.event {
            AuditEvent::Notified {
                approval_id,
                notice,
                destination,
            }
            | AuditEvent::NotificationFailed {
                approval_id,
                notice,
                destination,
                ..
            } => Some((
                e.event.name(),
                approval_id.to_string(),
                notice.clone(),
                destination.clone(),
            )),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// A pause notifies
// ---------------------------------------------------------------------------------------------

async fn given_a_webhook_when_a_run_pauses_then_one_slack_compatible_notice_is_posted_and_audited(
    h: &Harness,
) {
    let receiver = Receiver::ok().await;
    let p = posting_to(h, &receiver).await;

    let (report, approval) = h.start_paused(&p, "c-102").await;

    let requests = receiver.requests();
    assert_eq!(requests.len(), 1, "one notice for one approval");
    let posted = &requests[0];
    let key = posted.idempotency_key();
    assert!(key.starts_with("ob-"), "the outbox id: {key}");
    assert_eq!(posted.headers["content-type"], "application/json");
    let body = &posted.body;
    let text = body["text"].as_str().unwrap();
    assert!(text.contains("Approval needed: reimburse"), "{text}");
    let section = body["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "section")
        .expect("a section block");
    assert_eq!(section["text"]["type"], "mrkdwn");
    let details = section["text"]["text"].as_str().unwrap();
    for expected in [
        "*Tool:* `reimburse`".to_string(),
        format!("```{}```", approval.args.canonical()),
        "*Amount:* $250.00".into(),
        "Reimbursements above $75 need a finance approver.".into(),
        "the `finance` role, not ben; 1 of 1 approval still needed".into(),
        "2026-11-11T09:00:00Z".into(),
        format!("`{}`", approval.id),
    ] {
        assert!(details.contains(&expected), "{expected} in {details}");
    }
    let countersign = &body["countersign"];
    assert_eq!(countersign["notice"], "approval_requested");
    assert_eq!(countersign["idempotency_key"], key);
    assert_eq!(countersign["approval_id"], approval.id.as_str());
    assert_eq!(countersign["run_id"], report.run_id.as_str());
    assert_eq!(countersign["tenant"], "acme");
    assert_eq!(countersign["tool"], "reimburse");
    assert_eq!(countersign["args"], approval.args.as_value());
    assert_eq!(countersign["args_hash"], approval.args_hash.as_str());
    assert_eq!(countersign["version"], 1);
    assert_eq!(countersign["amount_cents"], 25_000);
    assert_eq!(countersign["approver_role"], "finance");
    assert_eq!(countersign["still_needed"], 1);
    assert_eq!(countersign["not_by"], json!(["ben"]));
    assert_eq!(countersign["expires_at"], "2026-11-11T09:00:00Z");

    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let notified = AuditEvent::Notified {
        approval_id: approval.id.clone(),
        notice: "approval_requested".into(),
        destination: receiver.host(),
    };
    assert_recorded(&history.entries, notified, Actor::system("notifier"));
    let names = harness::event_names(&history.entries);
    let paused = names.iter().position(|n| *n == "paused").unwrap();
    assert_eq!(names[paused + 1], "notified", "{names:?}");
    assert!(
        outbox(&p).await.is_empty(),
        "a sent notice leaves the outbox"
    );
}

async fn given_two_webhooks_when_a_run_pauses_on_two_approvals_then_each_gets_one_notice_per_approval(
    h: &Harness,
) {
    let (first, second) = (Receiver::ok().await, Receiver::ok().await);
    let urls = [first.url().to_string(), second.url().to_string()];
    let webhooks = Arc::new(Webhooks::new(&urls, QUICK).unwrap());
    let script = Script::default().then_call(&[
        (
            "reimburse",
            json!({"claim_id": "c-102", "amount_cents": 25_000}),
        ),
        (
            "reimburse",
            json!({"claim_id": "c-104", "amount_cents": 39_000}),
        ),
    ]);
    let p = h
        .process_configured(Arc::new(script), |s| s, |b| b.notifier(webhooks))
        .await;

    let report = p.start(scripted_task("ben")).await.unwrap();

    assert_eq!(report.approvals.len(), 2);
    let mut expected: Vec<String> = report.approvals.iter().map(|a| a.id.to_string()).collect();
    expected.sort();
    for receiver in [&first, &second] {
        let requests = receiver.requests();
        let mut approvals: Vec<String> = requests
            .iter()
            .map(|r| r.approval_id().to_string())
            .collect();
        approvals.sort();
        assert_eq!(approvals, expected, "one notice per approval");
    }
    let mut keys: Vec<String> = [first.requests(), second.requests()]
        .concat()
        .iter()
        .map(|r| r.idempotency_key().to_string())
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 4, "each notice has its own key");
    let audited = notices_of(&p, &report.run_id).await;
    assert_eq!(audited.len(), 4, "{audited:?}");
    for receiver in [&first, &second] {
        assert_eq!(audited.iter().filter(|n| n.3 == receiver.host()).count(), 2);
    }
}

// ---------------------------------------------------------------------------------------------
// Retries
// ---------------------------------------------------------------------------------------------

async fn given_a_receiver_that_fails_three_times_then_the_sweep_retries_after_1_2_and_4_minutes_and_records_it_once_sent(
    h: &Harness,
) {
    let receiver = Receiver::failing_first(3).await;
    let p = posting_to(h, &receiver).await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    assert_eq!(receiver.requests().len(), 1);
    assert!(notices_of(&p, &report.run_id).await.is_empty());
    let waiting = outbox(&p).await;
    assert_eq!(waiting.len(), 1, "a notice waits: {waiting:?}");
    let OutboxMessage::Notify(message) = &waiting[0].message;
    assert_eq!(message.attempts, 1);
    assert!(
        message.last_error.as_deref().unwrap().contains("503"),
        "{message:?}"
    );

    let sweeper = posting_to(h, &receiver).await;
    let mut posted_after = vec![0];
    for _ in 0..40 {
        h.clock.advance(Duration::seconds(15));
        let before = receiver.requests().len();
        let swept = sweeper.sweep(100).await.unwrap();
        if receiver.requests().len() > before {
            posted_after.push((h.clock.now() - harness::start_of_test()).num_seconds());
            let sent = receiver.requests().len() == 4;
            assert_eq!(swept.notices.sent, usize::from(sent), "{swept:?}");
            assert_eq!(swept.notices.retrying, usize::from(!sent), "{swept:?}");
            let audited = notices_of(&p, &report.run_id).await;
            assert_eq!(audited.len(), usize::from(sent), "notified only once sent");
        }
    }

    assert_eq!(
        posted_after,
        [0, 60, 180, 420],
        "waits of 1, 2 and 4 minutes"
    );
    let requests = receiver.requests();
    assert!(
        requests
            .iter()
            .all(|r| r.idempotency_key() == requests[0].idempotency_key()),
        "every attempt carries the same key"
    );
    let audited = notices_of(&p, &report.run_id).await;
    assert_eq!(
        audited,
        [(
            "notified",
            approval.id.to_string(),
            "approval_requested".into(),
            receiver.host()
        )]
    );
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let notified = history
        .entries
        .iter()
        .find(|e| e.event.name() == "notified");
    assert_eq!(notified.unwrap().at, at(0, 7));
    assert!(outbox(&p).await.is_empty());
}

async fn given_a_receiver_that_always_fails_then_the_notice_is_given_up_after_eight_attempts_and_audited(
    h: &Harness,
) {
    let receiver = Receiver::scripted(&[], Answer::Status(500)).await;
    let p = posting_to(h, &receiver).await;
    let (report, approval) = h.start_paused(&p, "c-102").await;

    for _ in 0..(3 * 12) {
        h.clock.advance(Duration::minutes(5));
        p.sweep(100).await.unwrap();
    }

    assert_eq!(receiver.requests().len(), MAX_NOTICE_ATTEMPTS as usize);
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let failed: Vec<&AuditEvent> = history
        .entries
        .iter()
        .map(|e| &e.event)
        .filter(|e| e.name() == "notification_failed")
        .collect();
    let [failed @ AuditEvent::NotificationFailed { error, .. }] = failed.as_slice() else {
        panic!("one failed notice: {failed:?}")
    };
    assert!(error.contains("500"), "{error}");
    let given_up = AuditEvent::NotificationFailed {
        approval_id: approval.id.clone(),
        notice: "approval_requested".into(),
        destination: receiver.host(),
        attempts: MAX_NOTICE_ATTEMPTS,
        error: error.clone(),
    };
    assert_eq!(*failed, &given_up);
    assert!(!harness::event_names(&history.entries).contains(&"notified"));
    assert!(
        outbox(&p).await.is_empty(),
        "a notice given up on is dropped"
    );
    assert_eq!(
        p.approval(&acme(), &approval.id).await.unwrap().status,
        ApprovalStatus::AwaitingApproval,
        "the approval itself is untouched"
    );
}

async fn given_a_receiver_that_refuses_the_notice_then_it_is_given_up_at_once(h: &Harness) {
    let receiver = Receiver::scripted(&[], Answer::Status(404)).await;
    let p = posting_to(h, &receiver).await;

    let (report, _) = h.start_paused(&p, "c-102").await;

    assert_eq!(receiver.requests().len(), 1);
    let audited = notices_of(&p, &report.run_id).await;
    assert_eq!(audited.len(), 1);
    assert_eq!(audited[0].0, "notification_failed");
    assert!(outbox(&p).await.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Two sweeps at once
// ---------------------------------------------------------------------------------------------

/// A process that sweeps with the others sharing `together`: none claims before all have read.
async fn sweeping_together(
    h: &Harness,
    receiver: &Receiver,
    index: &str,
    together: &Arc<Barrier>,
) -> Process {
    let notifier = receiver.webhooks(QUICK);
    let together = together.clone();
    h.process_configured(
        Arc::new(OfflineExpenseAgent),
        |store| ReadsTogether::wrap(store, index, together),
        |b: EngineBuilder| b.notifier(notifier),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_notice_due_again_when_two_sweeps_run_at_once_then_it_is_posted_once() {
    let h = &fresh().await;
    let receiver = Receiver::failing_first(1).await;
    let p = posting_to(h, &receiver).await;
    let (report, _) = h.start_paused(&p, "c-102").await;
    assert_eq!(receiver.requests().len(), 1);
    h.clock.advance(Duration::minutes(1));
    let together = Arc::new(Barrier::new(2));
    let one = sweeping_together(h, &receiver, keys::OUTBOX_INDEX, &together).await;
    let other = sweeping_together(h, &receiver, keys::OUTBOX_INDEX, &together).await;

    let one = tokio::spawn(async move { one.sweep(100).await });
    let other = tokio::spawn(async move { other.sweep(100).await });
    let (one, other) = (one.await.unwrap().unwrap(), other.await.unwrap().unwrap());

    assert_eq!(
        one.notices.sent + other.notices.sent,
        1,
        "{one:?} {other:?}"
    );
    assert_eq!(
        receiver.requests().len(),
        2,
        "the first failure and one retry"
    );
    assert_eq!(notices_of(&p, &report.run_id).await.len(), 1);
    assert!(outbox(&p).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_reminder_due_when_two_sweeps_run_at_once_then_it_is_sent_once() {
    let h = &fresh().await;
    let receiver = Receiver::ok().await;
    let p = posting_to(h, &receiver).await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    h.clock.set(at(23, 0));
    let together = Arc::new(Barrier::new(2));
    let pending = keys::pending_index(&acme());
    let one = sweeping_together(h, &receiver, &pending, &together).await;
    let other = sweeping_together(h, &receiver, &pending, &together).await;

    let one = tokio::spawn(async move { one.sweep(100).await });
    let other = tokio::spawn(async move { other.sweep(100).await });
    let (one, other) = (one.await.unwrap().unwrap(), other.await.unwrap().unwrap());

    let reminded = [one.reminded, other.reminded].concat();
    assert_eq!(reminded, from_ref(&approval.id));
    let notices = receiver.notices();
    assert_eq!(notices, ["approval_requested", "reminder"]);
    assert_eq!(notices_of(&p, &report.run_id).await.len(), 2);
}

// ---------------------------------------------------------------------------------------------
// Reminders
// ---------------------------------------------------------------------------------------------

async fn given_an_approval_due_in_24h_then_one_reminder_goes_out_at_23h_and_not_again(h: &Harness) {
    let receiver = Receiver::ok().await;
    let p = posting_to(h, &receiver).await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    assert_eq!(approval.expires_at, at(24, 0));

    h.clock.set(at(22, 59));
    let early = p.sweep(100).await.unwrap();
    assert!(early.reminded.is_empty(), "{early:?}");
    assert_eq!(receiver.requests().len(), 1);

    h.clock.set(at(23, 0));
    let due = p.sweep(100).await.unwrap();
    assert_eq!(due.reminded, from_ref(&approval.id));
    assert_eq!(due.notices.sent, 1);
    let requests = receiver.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].notice(), "reminder");
    assert_eq!(requests[1].approval_id(), approval.id.as_str());
    let headline = requests[1].body["blocks"][0]["text"]["text"]
        .as_str()
        .unwrap();
    assert!(headline.starts_with("Reminder"), "{headline}");
    assert_ne!(
        requests[1].idempotency_key(),
        requests[0].idempotency_key(),
        "a reminder is a notice of its own"
    );
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.reminded_at, Some(at(23, 0)));
    assert_eq!(stored.status, ApprovalStatus::AwaitingApproval);

    h.clock.set(at(23, 30));
    let later = p.sweep(100).await.unwrap();
    assert!(later.reminded.is_empty(), "{later:?}");
    assert_eq!(receiver.requests().len(), 2, "reminded once");

    let audited = notices_of(&p, &report.run_id).await;
    let kinds: Vec<&str> = audited.iter().map(|n| n.2.as_str()).collect();
    assert_eq!(kinds, ["approval_requested", "reminder"]);
}

async fn given_one_approval_decided_and_one_waiting_then_only_the_waiting_one_is_reminded(
    h: &Harness,
) {
    let receiver = Receiver::ok().await;
    let p = posting_to(h, &receiver).await;
    let (_, decided) = h.start_paused(&p, "c-102").await;
    let (_, waiting) = h.start_paused(&p, "c-104").await;
    h.clock.set(at(1, 0));
    h.decided(&p, "dana", &decided.id, approve("d-1")).await;

    h.clock.set(at(23, 0));
    let swept = p.sweep(100).await.unwrap();

    assert_eq!(swept.reminded, from_ref(&waiting.id));
    let reminders: Vec<String> = receiver
        .requests()
        .iter()
        .filter(|r| r.notice() == "reminder")
        .map(|r| r.approval_id().to_string())
        .collect();
    assert_eq!(reminders, [waiting.id.to_string()]);
    let stored = p.approval(&acme(), &decided.id).await.unwrap();
    assert_eq!(stored.reminded_at, None);
}

async fn given_a_webhook_when_a_run_pauses_then_a_reminder_wakeup_is_scheduled_and_dropped_once_decided(
    h: &Harness,
) {
    let receiver = Receiver::ok().await;
    let scheduler = Arc::new(RecordingScheduler::default());
    let notifier = receiver.webhooks(QUICK);
    let p = h
        .process_configured(
            Arc::new(OfflineExpenseAgent),
            |s| s,
            |b| b.notifier(notifier).scheduler(scheduler.clone()),
        )
        .await;
    let (_, approval) = h.start_paused(&p, "c-102").await;

    assert_eq!(
        scheduler.calls(),
        [
            Scheduled::Schedule(approval.id.clone(), Wake::Deadline, at(24, 0)),
            Scheduled::Schedule(approval.id.clone(), Wake::Reminder, at(23, 0)),
        ]
    );

    h.decided(&p, "dana", &approval.id, approve("d-1")).await;

    assert_eq!(
        scheduler.calls()[2..],
        [
            Scheduled::Unschedule(approval.id.clone(), Wake::Deadline),
            Scheduled::Unschedule(approval.id.clone(), Wake::Reminder),
        ]
    );
}

async fn given_a_reminder_lead_of_30m_then_the_reminder_goes_out_30m_before_the_deadline(
    h: &Harness,
) {
    let receiver = Receiver::ok().await;
    let notifier = receiver.webhooks(QUICK);
    let p = h
        .process_configured(
            Arc::new(OfflineExpenseAgent),
            |s| s,
            |b| {
                b.notifier(notifier)
                    .remind_before(StdDuration::from_secs(30 * 60))
            },
        )
        .await;
    let (_, approval) = h.start_paused(&p, "c-102").await;

    h.clock.set(at(23, 29));
    assert!(p.sweep(100).await.unwrap().reminded.is_empty());
    h.clock.set(at(23, 30));
    assert_eq!(p.sweep(100).await.unwrap().reminded, [approval.id]);
}

// ---------------------------------------------------------------------------------------------
// Nothing waits on a receiver
// ---------------------------------------------------------------------------------------------

async fn given_a_receiver_that_never_answers_then_the_pause_is_stored_first_and_the_decision_is_not_held_up(
    h: &Harness,
) {
    let receiver = Receiver::scripted(&[], Answer::Hang).await;
    let writer = h
        .notifying(receiver.webhooks(StdDuration::from_millis(300)))
        .await;
    let task = task_for(&h.claims, "c-102").unwrap();
    let started = Instant::now();
    let pausing = tokio::spawn(async move { writer.start(task).await });

    // The notice is on its way, and unanswered: the pause is already stored and can be decided.
    receiver.until_requests(1).await;
    let other = h.process().await;
    let pending = other.pending(&acme()).await.unwrap();
    assert_eq!(pending.len(), 1);
    let deciding = Instant::now();
    let decided = h
        .decided(&other, "dana", &pending[0].id, approve("d-1"))
        .await;
    assert!(deciding.elapsed() < StdDuration::from_secs(2));
    assert_eq!(decided.approval.status, ApprovalStatus::Approved);
    assert_eq!(decided.run.as_ref().unwrap().status, RunStatus::Done);

    let paused = pausing.await.unwrap().unwrap();
    assert!(
        started.elapsed() < StdDuration::from_secs(3),
        "the pause returned once the post timed out: {:?}",
        started.elapsed()
    );
    assert_eq!(paused.status, RunStatus::AwaitingApproval);
    assert_eq!(paid(&h.payments().await).len(), 1);

    // Its approval no longer waits, so the retry drops the notice instead of posting it.
    h.clock.advance(Duration::minutes(5));
    let sweeper = h
        .notifying(receiver.webhooks(StdDuration::from_millis(300)))
        .await;
    let swept = sweeper.sweep(100).await.unwrap();
    assert!(swept.notices.is_empty(), "{swept:?}");
    assert_eq!(receiver.requests().len(), 1);
    assert!(outbox(&sweeper).await.is_empty());
    assert!(notices_of(&sweeper, &paused.run_id).await.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Without a webhook
// ---------------------------------------------------------------------------------------------

/// Pauses on c-102, sweeps an hour before its deadline, approves it: the events it left, what
/// the sweep reported, and how often the approval was written.
async fn approve_c102_after_23h(h: &Harness, p: &Process) -> (Vec<&'static str>, SweepReport, u64) {
    let (report, approval) = h.start_paused(p, "c-102").await;
    h.clock.set(at(23, 0));
    let swept = p.sweep(100).await.unwrap();
    let item = p
        .store
        .get(&keys::approval_pk(&acme(), &approval.id), keys::APPROVAL_SK)
        .await
        .unwrap()
        .unwrap();
    h.decided(p, "dana", &approval.id, approve("d-1")).await;
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    (harness::event_names(&history.entries), swept, item.ver)
}

async fn given_no_webhook_then_no_notice_is_written_and_nothing_else_changes(h: &Harness) {
    let p = h.process().await;

    let (names, swept, approval_ver) = approve_c102_after_23h(h, &p).await;

    assert!(outbox(&p).await.is_empty(), "no outbox entry");
    assert_eq!(swept, SweepReport::default(), "no reminder");
    assert_eq!(
        approval_ver, 1,
        "the approval was not written for a reminder"
    );
    // The same run with a webhook, on a store of its own, leaves the same events and notices.
    let receiver = Receiver::ok().await;
    let other = &fresh().await;
    let with = posting_to(other, &receiver).await;
    let (mut expected, reminded, _) = approve_c102_after_23h(other, &with).await;
    assert_eq!(reminded.reminded.len(), 1);
    assert_eq!(receiver.requests().len(), 2);
    expected.retain(|name| *name != "notified");
    assert_eq!(names, expected, "the same events, less the notices");
}

async fn given_a_notifier_with_no_destination_then_it_is_as_if_there_were_none(h: &Harness) {
    let p = h
        .notifying(Arc::new(Webhooks::new(&[], QUICK).unwrap()))
        .await;

    let (names, swept, approval_ver) = approve_c102_after_23h(h, &p).await;

    assert!(outbox(&p).await.is_empty());
    assert_eq!(swept, SweepReport::default());
    assert_eq!(approval_ver, 1);
    assert!(!names.contains(&"notified"), "{names:?}");
}

// ---------------------------------------------------------------------------------------------
// The audit trail
// ---------------------------------------------------------------------------------------------

async fn given_notices_sent_then_the_run_history_shows_them_in_order_with_the_rest(h: &Harness) {
    let receiver = Receiver::ok().await;
    let p = posting_to(h, &receiver).await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    h.clock.set(at(23, 0));
    p.sweep(100).await.unwrap();
    h.clock.set(at(23, 10));
    h.decided(&p, "dana", &approval.id, approve("d-1")).await;

    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let names = harness::event_names(&history.entries);
    let tail: Vec<&str> = names
        .iter()
        .skip_while(|n| **n != "paused")
        .copied()
        .collect();
    assert_eq!(
        tail[..5],
        ["paused", "notified", "notified", "decision", "executing"],
        "{names:?}"
    );
    let json = serde_json::to_value(&history).unwrap();
    let reminder = json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "notified")
        .nth(1)
        .unwrap()
        .clone();
    assert_eq!(reminder["notice"], "reminder");
    assert_eq!(reminder["approval_id"], approval.id.as_str());
    assert_eq!(reminder["destination"], receiver.host());
    assert_eq!(reminder["at"], "2026-11-11T08:00:00Z");

    let traced = p.history_of_approval(&acme(), &approval.id).await.unwrap();
    let traced = harness::event_names(&traced.entries);
    assert_eq!(traced.iter().filter(|n| **n == "notified").count(), 2);
}

/// The scenarios that hold on any store, instantiated on one backend.
macro_rules! every_scenario {
    ($module:ident, $backend:expr) => {
        on_backend!(
            $module,
            $backend,
            [
                given_a_webhook_when_a_run_pauses_then_one_slack_compatible_notice_is_posted_and_audited,
                given_two_webhooks_when_a_run_pauses_on_two_approvals_then_each_gets_one_notice_per_approval,
                given_a_receiver_that_fails_three_times_then_the_sweep_retries_after_1_2_and_4_minutes_and_records_it_once_sent,
                given_a_receiver_that_always_fails_then_the_notice_is_given_up_after_eight_attempts_and_audited,
                given_a_receiver_that_refuses_the_notice_then_it_is_given_up_at_once,
                given_an_approval_due_in_24h_then_one_reminder_goes_out_at_23h_and_not_again,
                given_one_approval_decided_and_one_waiting_then_only_the_waiting_one_is_reminded,
                given_a_webhook_when_a_run_pauses_then_a_reminder_wakeup_is_scheduled_and_dropped_once_decided,
                given_a_reminder_lead_of_30m_then_the_reminder_goes_out_30m_before_the_deadline,
                given_a_receiver_that_never_answers_then_the_pause_is_stored_first_and_the_decision_is_not_held_up,
                given_no_webhook_then_no_notice_is_written_and_nothing_else_changes,
                given_a_notifier_with_no_destination_then_it_is_as_if_there_were_none,
                given_notices_sent_then_the_run_history_shows_them_in_order_with_the_rest,
            ]
        );
    };
}

every_scenario!(embedded, Embedded::fresh());
// The same on DynamoDB (moto over HTTP, the local stack). The two-sweeps races above stay on the
// embedded store: moto applies conditional writes without isolation.
every_scenario!(dynamodb, DynamoDb::fresh("notices").await);
