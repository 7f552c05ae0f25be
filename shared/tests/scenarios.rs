//! The engine's scenarios, end to end over a real item store: the expense agent proposes, people
//! decide (sometimes from another process, sometimes late), and the approved call runs once.
//!
//! Each scenario is a function of the harness, instantiated per backend at the bottom. The race
//! scenarios run on both stores too; on DynamoDB they need the local stack's serial mode, since
//! moto is not safe under concurrency otherwise.

#[macro_use]
mod harness;
#[path = "harness/dynamodb.rs"]
mod dynamodb_backend;
mod support;

use std::future::Future;
use std::slice::from_ref;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration as StdDuration;

use chrono::Duration;
use shared::domain::action::{ActionStatus, ToolOutcome};
use shared::domain::approval::{ApprovalStatus, Choice, DecisionEffect};
use shared::domain::audit::AuditEvent;
use shared::domain::identity::Actor;
use shared::domain::ids::{ActionVersion, PersonId, Role, TenantId};
use shared::domain::run::RunStatus;
use shared::engine::records::keys;
use shared::engine::{Delivery, ErrorKind, ResumeReport};
use shared::example::expense::task_for;

use serde_json::json;

use dynamodb_backend::DynamoDb;
use harness::{
    AnswerLost, Counted, Embedded, Gate, Hangs, Harness, Process, QueueDown, ReconcilesTogether,
    RecordingQueue, Script, Slow, Stalls, acme, addressed, approve, decision, edit, event_names,
    paid, reject, results_after_turn, resume_message, scripted_task, start_of_test, told_about,
};

fn person(name: &str) -> PersonId {
    PersonId::parse(name).unwrap()
}

fn finance() -> Role {
    Role::parse("finance").unwrap()
}

fn v(n: u32) -> ActionVersion {
    ActionVersion::new(n).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The walkthrough claims
// ---------------------------------------------------------------------------------------------

async fn given_c101_a_small_taxi_when_the_agent_runs_then_it_is_paid_42_without_a_person(
    h: &Harness,
) {
    let p = h.process().await;

    let report = h.start(&p, "c-101").await;

    assert_eq!(report.status, RunStatus::Done);
    assert!(report.approvals.is_empty());
    let payments = paid(&h.payments().await);
    assert_eq!(payments.len(), 1);
    assert_eq!((payments[0].0.as_str(), payments[0].1), ("c-101", 4_200));
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let pay = history
        .actions
        .iter()
        .find(|a| a.tool == "reimburse")
        .expect("a reimburse action");
    assert_eq!(pay.status, ActionStatus::Succeeded);
    assert_eq!(pay.authorized_by, [Actor::Policy { version: 1 }]);
    assert_eq!(payments[0].2, pay.key());
    assert!(p.pending(&acme()).await.unwrap().is_empty());
}

async fn given_c102_lodging_over_the_limit_when_the_agent_runs_then_it_pauses_on_reimbursing_250(
    h: &Harness,
) {
    let p = h.process().await;

    let (report, approval) = h.start_paused(&p, "c-102").await;

    assert_eq!(report.status, RunStatus::AwaitingApproval);
    assert_eq!(approval.tool, "reimburse");
    assert_eq!(approval.args.str("claim_id"), Some("c-102"));
    assert_eq!(approval.args.int("amount_cents"), Some(25_000));
    assert_eq!(approval.args_hash, approval.args.hash());
    assert_eq!(approval.action_version, ActionVersion::FIRST);
    assert_eq!(approval.quorum, 1);
    assert_eq!(approval.approver_role, finance());
    assert_eq!(approval.requested_by, [person("ben")]);
    assert_eq!(approval.policy_version, 1);
    assert_eq!(approval.expires_at, start_of_test() + Duration::hours(24));
    let pending: Vec<_> = p.pending(&acme()).await.unwrap();
    assert_eq!(pending, from_ref(&approval));
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval);
    assert!(h.payments().await.is_empty());
}

async fn given_c101_was_paid_when_the_agent_runs_c103_then_it_pauses_on_declining_a_duplicate(
    h: &Harness,
) {
    let p = h.process().await;
    assert_eq!(h.start(&p, "c-101").await.status, RunStatus::Done);

    let (report, approval) = h.start_paused(&p, "c-103").await;

    assert_eq!(report.status, RunStatus::AwaitingApproval);
    assert_eq!(approval.tool, "decline");
    assert_eq!(approval.args.str("claim_id"), Some("c-103"));
    let reason = approval.args.str("reason").unwrap();
    assert!(reason.contains("c-101"), "{reason}");
    assert!(approval.explanation.contains("duplicate"));
    assert_eq!(approval.quorum, 1);
    let payments = paid(&h.payments().await);
    assert_eq!(payments.len(), 1, "only c-101 is paid: {payments:?}");
}

async fn given_c104_with_no_time_to_decide_when_the_sweep_runs_then_it_expires_and_nothing_is_paid(
    h: &Harness,
) {
    let p = h.process().await;
    let mut task = task_for(&h.claims, "c-104").unwrap();
    task.approval_ttl = Some(StdDuration::ZERO);
    let report = p.start(task).await.unwrap();
    assert_eq!(report.status, RunStatus::AwaitingApproval);
    let approval = report.approvals[0].clone();
    assert_eq!(approval.args.int("amount_cents"), Some(39_000));
    assert_eq!(approval.expires_at, approval.created_at);

    let swept = h.process().await.sweep(100).await.unwrap();

    assert_eq!(swept.expired, from_ref(&approval.id));
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::Expired);
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    assert!(h.payments().await.is_empty());
    assert!(p.pending(&acme()).await.unwrap().is_empty());
    let again = p.sweep(100).await.unwrap();
    assert!(again.expired.is_empty(), "expired once: {again:?}");
}

async fn given_a_time_to_decide_longer_than_the_policy_allows_when_a_run_starts_then_it_is_refused_as_bad_input(
    h: &Harness,
) {
    let p = h.process().await;
    let with_ttl = |ttl: StdDuration| {
        let mut task = task_for(&h.claims, "c-102").unwrap();
        task.approval_ttl = Some(ttl);
        task
    };

    // The expense policy gives a day to decide and states no longer maximum: a caller may
    // shorten the day, never lengthen it.
    for too_long in [
        StdDuration::from_secs(86_400 + 1),
        StdDuration::from_secs(90 * 86_400),
        StdDuration::from_secs(u64::MAX),
    ] {
        let refused = p.start(with_ttl(too_long)).await.unwrap_err();

        assert_eq!(refused.code(), "bad_input", "{refused}");
        assert_eq!(refused.kind(), ErrorKind::BadInput);
        assert!(refused.to_string().contains("longer than"), "{refused}");
    }
    assert!(p.pending(&acme()).await.unwrap().is_empty());

    let longest = p
        .start(with_ttl(StdDuration::from_secs(86_400)))
        .await
        .unwrap();
    assert_eq!(
        longest.approvals[0].expires_at,
        start_of_test() + Duration::days(1)
    );
}

// ---------------------------------------------------------------------------------------------
// Deciding
// ---------------------------------------------------------------------------------------------

async fn given_a_paused_run_when_the_process_restarts_and_a_new_engine_approves_then_the_run_finishes_and_the_claim_is_paid(
    h: &Harness,
) {
    let first = h.process().await;
    let (report, approval) = h.start_paused(&first, "c-102").await;
    drop(first);

    let second = h.process().await;
    let pending = second.pending(&acme()).await.unwrap();
    assert_eq!(pending.len(), 1);
    let decided = second
        .decide(&h.person("dana"), &pending[0].id, approve("d-1"))
        .await
        .unwrap();

    assert_eq!(decided.approval.status, ApprovalStatus::Approved);
    assert!(!decided.replayed);
    assert_eq!(decided.run.map(|r| r.status), Some(RunStatus::Done));
    let run = h.run(&second, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    assert_eq!(
        run.answer.as_deref(),
        Some("Reimbursed $250.00 for claim c-102.")
    );
    assert_eq!(
        paid(&h.payments().await),
        [(
            "c-102".to_string(),
            25_000,
            format!("{}:1", approval.action_id)
        )]
    );
    assert!(second.pending(&acme()).await.unwrap().is_empty());
}

async fn given_an_approval_when_the_same_decision_id_is_sent_twice_then_it_resumes_once_and_the_second_call_replays_the_outcome(
    h: &Harness,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = |calls: &Arc<AtomicUsize>| {
        let calls = calls.clone();
        move |tools| Counted::wrap(tools, "reimburse", calls)
    };
    let first = h.process_with(counted(&calls), Delivery::InProcess).await;
    let (report, approval) = h.start_paused(&first, "c-102").await;
    let dana = h.person("dana");

    let once = first
        .decide(&dana, &approval.id, approve("d-1"))
        .await
        .unwrap();
    // The same submission again, as a retried request that lands on another process.
    let second = h.process_with(counted(&calls), Delivery::InProcess).await;
    let twice = second
        .decide(&dana, &approval.id, approve("d-1"))
        .await
        .unwrap();

    assert!(!once.replayed);
    assert!(twice.replayed);
    assert_eq!(twice.decision, once.decision);
    assert_eq!(twice.approval.status, ApprovalStatus::Approved);
    assert_eq!(twice.approval.decisions.len(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(h.payments().await.len(), 1);
    let history = second.history(&acme(), &report.run_id).await.unwrap();
    let names = event_names(&history.entries);
    assert_eq!(names.iter().filter(|n| **n == "decision").count(), 1);
    let executed_payments = history
        .entries
        .iter()
        .filter(|e| matches!(&e.event, AuditEvent::Executed { action_id, .. } if *action_id == approval.action_id))
        .count();
    assert_eq!(executed_payments, 1);
}

async fn given_a_decision_whose_resume_was_never_delivered_when_its_decision_id_is_replayed_then_the_run_resumes_exactly_once(
    h: &Harness,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = |calls: &Arc<AtomicUsize>| {
        let calls = calls.clone();
        move |tools| Counted::wrap(tools, "reimburse", calls)
    };
    // The first attempt commits the decision, then cannot deliver its resume message.
    let first = h
        .process_with(counted(&calls), Delivery::Queue(Arc::new(QueueDown)))
        .await;
    let (report, approval) = h.start_paused(&first, "c-102").await;
    let dana = h.person("dana");
    let committed = first
        .decide(&dana, &approval.id, approve("d-1"))
        .await
        .unwrap();
    assert!(!committed.replayed);
    assert_eq!(
        h.run(&first, &report.run_id).await.status,
        RunStatus::AwaitingApproval
    );

    // The client retries the same submission against a process that can deliver.
    let working = h.process_with(counted(&calls), Delivery::InProcess).await;
    let replayed = working
        .decide(&dana, &approval.id, approve("d-1"))
        .await
        .unwrap();

    assert!(replayed.replayed);
    assert_eq!(replayed.run.map(|r| r.status), Some(RunStatus::Done));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(h.payments().await.len(), 1);
    let again = working
        .decide(&dana, &approval.id, approve("d-1"))
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(working.sweep(100).await.unwrap().redelivered, 0);
    let history = working.history(&acme(), &report.run_id).await.unwrap();
    let names = event_names(&history.entries);
    assert_eq!(names.iter().filter(|n| **n == "resumed").count(), 1);
    assert_eq!(names.iter().filter(|n| **n == "decision").count(), 1);
}

async fn given_a_recorded_decision_when_its_decision_id_comes_with_another_choice_then_it_conflicts(
    h: &Harness,
) {
    let p = h.process().await;
    let (_, approval) = h.start_paused(&p, "c-102").await;
    let dana = h.person("dana");
    p.decide(&dana, &approval.id, approve("d-1")).await.unwrap();

    let refused = p
        .decide(&dana, &approval.id, reject("d-1", "changed my mind"))
        .await
        .unwrap_err();

    assert_eq!(refused.code(), "decision_id_reused");
    assert_eq!(refused.kind(), ErrorKind::Conflict);
    assert_eq!(h.payments().await.len(), 1);
}

async fn given_an_approval_when_a_reviewer_lowers_the_amount_then_version_two_runs_and_version_one_can_no_longer_be_approved(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, approval) = h.start_paused(&p, "c-102").await;

    let edited = p
        .decide(&h.person("dana"), &approval.id, edit("d-edit", 200))
        .await
        .unwrap();

    assert_eq!(
        edited.decision.effect,
        DecisionEffect::Edited { new_version: v(2) }
    );
    assert_eq!(edited.approval.status, ApprovalStatus::Superseded);
    let next = edited.next_approval.expect("the new version's approval");
    assert_eq!(edited.approval.superseded_by.as_ref(), Some(&next.id));
    assert_eq!(next.action_id, approval.action_id);
    assert_eq!(next.action_version, v(2));
    assert_eq!(next.args.int("amount_cents"), Some(20_000));
    assert_ne!(next.args_hash, approval.args_hash);
    assert_eq!(next.previous.as_ref().map(|p| p.version), Some(v(1)));
    // One finance approver is the whole quorum, and the editor's edit is their approval.
    assert_eq!(next.status, ApprovalStatus::Approved);

    let late = p
        .decide(&h.person("erin"), &approval.id, approve("d-late"))
        .await
        .unwrap_err();

    assert_eq!(late.code(), "superseded");
    assert_eq!(late.kind(), ErrorKind::Conflict);
    assert_eq!(
        paid(&h.payments().await),
        [(
            "c-102".to_string(),
            20_000,
            format!("{}:2", approval.action_id)
        )]
    );
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done);
    let versions: Vec<(u32, ActionStatus)> = history
        .actions
        .iter()
        .filter(|a| a.id == approval.action_id)
        .map(|a| (a.version.get(), a.status))
        .collect();
    assert_eq!(
        versions,
        [(1, ActionStatus::Superseded), (2, ActionStatus::Succeeded)]
    );
}

async fn given_a_two_person_claim_when_a_reviewer_lowers_it_then_the_new_version_still_needs_a_second_person(
    h: &Harness,
) {
    let p = h.process().await;
    let (_, approval) = h.start_paused(&p, "c-105").await;
    assert_eq!(approval.args.int("amount_cents"), Some(75_000));

    let edited = p
        .decide(&h.person("dana"), &approval.id, edit("d-edit", 600))
        .await
        .unwrap();
    let next = edited.next_approval.expect("the new version's approval");

    assert_eq!(next.status, ApprovalStatus::AwaitingApproval);
    assert_eq!(p.pending(&acme()).await.unwrap(), from_ref(&next));
    assert_eq!(next.quorum, 2);
    assert_eq!(next.still_needed(), 1);
    let erin = h.person("erin");
    let stale = p
        .decide(&erin, &next.id, approve("d-stale"))
        .await
        .unwrap_err();
    assert_eq!(stale.code(), "stale_version");
    let twice = p
        .decide(
            &h.person("dana"),
            &next.id,
            decision("d-dana-2", v(2), Choice::Approve),
        )
        .await
        .unwrap_err();
    assert_eq!(twice.code(), "already_approved_by_you");
    assert!(h.payments().await.is_empty());

    let approved = p
        .decide(&erin, &next.id, decision("d-erin", v(2), Choice::Approve))
        .await
        .unwrap();

    assert_eq!(approved.approval.status, ApprovalStatus::Approved);
    assert_eq!(
        paid(&h.payments().await),
        [(
            "c-105".to_string(),
            60_000,
            format!("{}:2", approval.action_id)
        )]
    );
}

async fn given_an_approval_when_a_reviewer_raises_the_amount_then_the_edit_is_refused_and_nothing_changes(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, approval) = h.start_paused(&p, "c-102").await;

    let refused = p
        .decide(&h.person("dana"), &approval.id, edit("d-raise", 300))
        .await
        .unwrap_err();

    assert_eq!(refused.code(), "edit_refused");
    assert_eq!(refused.kind(), ErrorKind::PolicyRefused);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored, approval);
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert!(!event_names(&history.entries).contains(&"decision"));
    assert_eq!(
        history
            .actions
            .iter()
            .filter(|a| a.id == approval.action_id)
            .count(),
        1
    );
    assert_eq!(p.pending(&acme()).await.unwrap(), [approval]);
    assert!(h.payments().await.is_empty());
}

async fn given_a_claim_above_500_when_the_same_approver_approves_twice_then_it_still_waits_and_a_second_approver_pays_it(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, approval) = h.start_paused(&p, "c-105").await;
    assert_eq!(approval.quorum, 2);
    let dana = h.person("dana");

    let counted = p
        .decide(&dana, &approval.id, approve("d-dana-1"))
        .await
        .unwrap();
    assert_eq!(
        counted.decision.effect,
        DecisionEffect::Counted { still_needed: 1 }
    );
    assert_eq!(counted.approval.status, ApprovalStatus::AwaitingApproval);

    let again = p
        .decide(&dana, &approval.id, approve("d-dana-2"))
        .await
        .unwrap_err();
    assert_eq!(again.code(), "already_approved_by_you");
    assert_eq!(again.kind(), ErrorKind::Conflict);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::AwaitingApproval);
    assert_eq!(stored.still_needed(), 1);
    assert_eq!(
        h.run(&p, &report.run_id).await.status,
        RunStatus::AwaitingApproval
    );
    assert!(h.payments().await.is_empty());

    let approved = p
        .decide(&h.person("erin"), &approval.id, approve("d-erin"))
        .await
        .unwrap();

    assert_eq!(approved.approval.status, ApprovalStatus::Approved);
    assert_eq!(h.run(&p, &report.run_id).await.status, RunStatus::Done);
    assert_eq!(
        paid(&h.payments().await),
        [(
            "c-105".to_string(),
            75_000,
            format!("{}:1", approval.action_id)
        )]
    );
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let authorized = history.entries.iter().find_map(|e| match &e.event {
        AuditEvent::Executing {
            action_id,
            authorized_by,
            ..
        } if *action_id == approval.action_id => Some(authorized_by.clone()),
        _ => None,
    });
    assert_eq!(
        authorized,
        Some(vec![
            Actor::person(&person("dana")),
            Actor::person(&person("erin"))
        ])
    );
}

async fn given_an_approval_when_a_reviewer_lowers_the_amount_below_the_threshold_then_version_two_runs_on_policy_and_the_editor(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, approval) = h.start_paused(&p, "c-102").await;

    let edited = p
        .decide(&h.person("dana"), &approval.id, edit("d-edit", 60))
        .await
        .unwrap();

    assert_eq!(edited.approval.status, ApprovalStatus::Superseded);
    assert!(edited.next_approval.is_none(), "$60 needs nobody");
    assert_eq!(
        paid(&h.payments().await),
        [(
            "c-102".to_string(),
            6_000,
            format!("{}:2", approval.action_id)
        )]
    );
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done);
    let v2 = history
        .actions
        .iter()
        .find(|a| a.id == approval.action_id && a.version == v(2))
        .expect("version 2");
    assert_eq!(v2.status, ActionStatus::Succeeded);
    assert_eq!(
        v2.authorized_by,
        [Actor::person(&person("dana")), Actor::Policy { version: 1 }]
    );
    let late = p
        .decide(&h.person("erin"), &approval.id, approve("d-late"))
        .await
        .unwrap_err();
    assert_eq!(late.code(), "superseded");
}

// ---------------------------------------------------------------------------------------------
// A turn with several calls (a scripted model)
// ---------------------------------------------------------------------------------------------

async fn given_a_turn_with_a_read_and_a_payment_when_the_payment_is_approved_then_both_results_go_back_together_after_the_pause(
    h: &Harness,
) {
    let script = Script::default().then_call(&[
        ("get_claim", json!({"claim_id": "c-102"})),
        (
            "reimburse",
            json!({"claim_id": "c-102", "amount_cents": 25_000}),
        ),
    ]);
    let p = h.scripted_process(script).await;
    let report = p.start(scripted_task("ben")).await.unwrap();
    assert_eq!(report.status, RunStatus::AwaitingApproval);
    let paused = h.run(&p, &report.run_id).await;
    let held: Vec<bool> = paused
        .paused
        .as_ref()
        .unwrap()
        .calls
        .iter()
        .map(|c| c.result.is_some())
        .collect();
    assert_eq!(held, [true, false], "the read ran and is held");
    assert_eq!(
        paused.messages.len(),
        2,
        "nothing went back to the model yet"
    );

    p.decide(&h.person("dana"), &report.approvals[0].id, approve("d-1"))
        .await
        .unwrap();

    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    assert_eq!(run.messages.len(), 4, "task, calls, results, answer");
    let results = results_after_turn(&run, 0);
    let ids: Vec<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["toolu_0_0", "toolu_0_1"]);
    assert!(results[0].1.content.contains("\"id\":\"c-102\""));
    assert!(results[1].1.content.contains("\"paid_cents\":25000"));
    assert!(results.iter().all(|(_, r)| !r.is_error));
}

async fn given_two_approvals_in_one_turn_when_the_first_is_decided_then_the_run_waits_for_the_second_and_resumes_once_with_both(
    h: &Harness,
) {
    let script = Script::default().then_call(&[
        (
            "reimburse",
            json!({"claim_id": "c-102", "amount_cents": 25_000}),
        ),
        (
            "decline",
            json!({"claim_id": "c-106", "reason": "no itemised receipt"}),
        ),
    ]);
    let p = h.scripted_process(script).await;
    let report = p.start(scripted_task("ben")).await.unwrap();
    assert_eq!(report.approvals.len(), 2);
    let pay = report
        .approvals
        .iter()
        .find(|a| a.tool == "reimburse")
        .unwrap();
    let decline = report
        .approvals
        .iter()
        .find(|a| a.tool == "decline")
        .unwrap();

    let first = p
        .decide(&h.person("dana"), &pay.id, approve("d-pay"))
        .await
        .unwrap();

    let waiting = first.run.expect("the run, resumed in process");
    assert_eq!(waiting.status, RunStatus::AwaitingApproval);
    let still: Vec<_> = waiting.approvals.iter().map(|a| a.id.clone()).collect();
    assert_eq!(still, from_ref(&decline.id));
    assert_eq!(h.payments().await.len(), 1);
    assert_eq!(h.run(&p, &report.run_id).await.messages.len(), 2);

    p.decide(
        &h.person("erin"),
        &decline.id,
        reject("d-decline", "the receipt came in"),
    )
    .await
    .unwrap();

    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    let results = results_after_turn(&run, 0);
    assert_eq!(results.len(), 2);
    assert!(results[0].1.content.contains("\"paid_cents\":25000"));
    assert!(results[1].1.content.starts_with("Not executed:"));
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let resumed = event_names(&history.entries)
        .into_iter()
        .filter(|n| *n == "resumed")
        .count();
    assert_eq!(resumed, 1);
}

/// Starts c-102, has dana approve it on a process whose reimburse hangs, and kills that process
/// once the call is in flight. The action is left `executing`.
async fn approve_on_a_process_that_dies_while_paying(
    h: &Harness,
    hang: fn(
        shared::ports::tools::Toolbox,
        &str,
        Arc<AtomicUsize>,
    ) -> shared::ports::tools::Toolbox,
) -> (
    shared::engine::RunReport,
    shared::domain::approval::Approval,
) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let dying = {
        let in_flight = in_flight.clone();
        Arc::new(
            h.process_with(
                move |tools| hang(tools, "reimburse", in_flight),
                Delivery::InProcess,
            )
            .await,
        )
    };
    let (report, approval) = h.start_paused(&dying, "c-102").await;
    let decide = {
        let (dying, dana, id) = (dying.clone(), h.person("dana"), approval.id.clone());
        tokio::spawn(async move { dying.decide(&dana, &id, approve("d-1")).await })
    };
    while in_flight.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(StdDuration::from_millis(5)).await;
    }
    decide.abort();
    let _ = decide.await;
    let history = h
        .process()
        .await
        .history(&acme(), &report.run_id)
        .await
        .unwrap();
    let status = history
        .actions
        .iter()
        .find(|a| a.id == approval.action_id)
        .map(|a| a.status);
    assert_eq!(status, Some(ActionStatus::Executing));
    (report, approval)
}

async fn given_a_process_that_died_before_paying_when_the_sweep_finds_the_stale_execution_then_it_asks_the_tool_and_never_pays_blindly(
    h: &Harness,
) {
    let (report, approval) =
        approve_on_a_process_that_dies_while_paying(h, Hangs::before_effect).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let sweeper = {
        let calls = calls.clone();
        h.process_with(
            move |tools| Counted::wrap(tools, "reimburse", calls),
            Delivery::InProcess,
        )
        .await
    };
    let early = sweeper.sweep(100).await.unwrap();
    assert!(
        early.reconciled.is_empty() && early.unknown.is_empty(),
        "{early:?}"
    );
    h.clock.advance(Duration::minutes(16));

    let swept = sweeper.sweep(100).await.unwrap();

    assert_eq!(swept.reconciled, [format!("{}:1", approval.action_id)]);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the sweep asks, it never calls"
    );
    assert!(h.payments().await.is_empty());
    let history = sweeper.history(&acme(), &report.run_id).await.unwrap();
    let action = history
        .actions
        .iter()
        .find(|a| a.id == approval.action_id)
        .unwrap();
    assert_eq!(action.status, ActionStatus::Failed);
    assert_eq!(history.run.status, RunStatus::Done);
    let told = told_about(&history.run, "reimburse");
    assert!(told.is_error);
    assert!(
        told.content.contains("nothing was recorded"),
        "{}",
        told.content
    );
}

async fn given_a_process_that_died_after_paying_when_the_sweep_finds_the_stale_execution_then_it_records_the_payment_it_finds(
    h: &Harness,
) {
    let (report, approval) =
        approve_on_a_process_that_dies_while_paying(h, Hangs::after_effect).await;
    let key = format!("{}:1", approval.action_id);
    assert_eq!(
        paid(&h.payments().await),
        [("c-102".to_string(), 25_000, key.clone())]
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let sweeper = {
        let calls = calls.clone();
        h.process_with(
            move |tools| Counted::wrap(tools, "reimburse", calls),
            Delivery::InProcess,
        )
        .await
    };
    h.clock.advance(Duration::minutes(16));

    let swept = sweeper.sweep(100).await.unwrap();

    assert_eq!(swept.reconciled, from_ref(&key));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        paid(&h.payments().await),
        [("c-102".to_string(), 25_000, key)]
    );
    let run = h.run(&sweeper, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    assert_eq!(
        run.answer.as_deref(),
        Some("Reimbursed $250.00 for claim c-102.")
    );
}

async fn given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once(
    h: &Harness,
) {
    let (report, approval) =
        approve_on_a_process_that_dies_while_paying(h, Hangs::before_effect).await;
    let together = Arc::new(tokio::sync::Barrier::new(2));
    let sweeper = || {
        let together = together.clone();
        h.process_with(
            move |tools| ReconcilesTogether::wrap(tools, "reimburse", together),
            Delivery::InProcess,
        )
    };
    let (a, b) = (sweeper().await, sweeper().await);
    h.clock.advance(Duration::minutes(16));

    let (one, other) = tokio::join!(a.sweep(100), b.sweep(100));

    let key = format!("{}:1", approval.action_id);
    for swept in [one, other] {
        let swept = swept.unwrap_or_else(|e| panic!("{}: {e}", e.code()));
        assert_eq!(swept.unknown, from_ref(&key));
    }
    let history = a.history(&acme(), &report.run_id).await.unwrap();
    let action = history
        .actions
        .iter()
        .find(|x| x.id == approval.action_id)
        .unwrap();
    assert_eq!(action.status, ActionStatus::Unknown);
    let names = event_names(&history.entries);
    assert_eq!(names.iter().filter(|n| **n == "unknown").count(), 1);
    assert_eq!(history.run.status, RunStatus::AwaitingApproval);
}

async fn given_a_slow_payment_the_sweep_reconciled_as_not_paid_when_the_call_lands_afterwards_then_it_does_not_pay(
    h: &Harness,
) {
    let gate = Gate::new();
    let slow = {
        let gate = gate.clone();
        Arc::new(
            h.process_with(
                move |tools| Slow::wrap(tools, "reimburse", gate),
                Delivery::InProcess,
            )
            .await,
        )
    };
    let (report, approval) = h.start_paused(&slow, "c-102").await;
    let decide = {
        let (slow, dana, id) = (slow.clone(), h.person("dana"), approval.id.clone());
        tokio::spawn(async move { slow.decide(&dana, &id, approve("d-1")).await })
    };
    gate.call_in_flight().await;
    h.clock.advance(Duration::minutes(16));
    let sweeper = h.process().await;
    let key = format!("{}:1", approval.action_id);
    let swept = sweeper.sweep(100).await.unwrap();
    assert_eq!(swept.reconciled, from_ref(&key));
    let run = h.run(&sweeper, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    assert!(told_about(&run, "reimburse").is_error);

    // The slow call lands after the sweep told the model nothing was paid.
    gate.open();
    decide.await.unwrap().unwrap();

    let late = gate.outcomes();
    assert!(
        matches!(late.as_slice(), [ToolOutcome::Failed { .. }]),
        "{late:?}"
    );
    assert!(h.payments().await.is_empty(), "a voided call never pays");
    let history = sweeper.history(&acme(), &report.run_id).await.unwrap();
    let action = history
        .actions
        .iter()
        .find(|a| a.id == approval.action_id)
        .unwrap();
    assert_eq!(action.status, ActionStatus::Failed);
    let about_payment: Vec<&str> = history
        .entries
        .iter()
        .filter(|e| {
            e.event
                .action()
                .is_some_and(|(id, _)| *id == approval.action_id)
        })
        .map(|e| e.event.name())
        .collect();
    assert_eq!(
        about_payment,
        ["proposed", "decision", "executing", "reconciled"]
    );
}

async fn given_an_allowed_payment_slower_than_the_lease_when_the_sweep_settles_it_and_fails_the_run_then_the_late_call_pays_nothing_and_its_process_reports_a_conflict(
    h: &Harness,
) {
    let gate = Gate::new();
    let script = Script::default().then_call(&[(
        "reimburse",
        json!({"claim_id": "c-101", "amount_cents": 4_200}),
    )]);
    let slow = {
        let gate = gate.clone();
        Arc::new(
            h.process_of(
                Arc::new(script),
                move |tools| Slow::wrap(tools, "reimburse", gate),
                Delivery::InProcess,
            )
            .await,
        )
    };
    let start = {
        let slow = slow.clone();
        tokio::spawn(async move { slow.start(scripted_task("ana")).await })
    };
    gate.call_in_flight().await;
    h.clock.advance(Duration::minutes(16));
    let swept = h.process().await.sweep(100).await.unwrap();
    assert_eq!(swept.reconciled.len(), 1, "{swept:?}");
    assert_eq!(swept.abandoned.len(), 1, "{swept:?}");

    gate.open();
    let started = start.await.unwrap();

    // The process reads the sweep's record of its call, then finds its run failed: a conflict.
    let refused = started.unwrap_err();
    assert_eq!(refused.code(), "run_finished", "{refused}");
    assert_eq!(refused.kind(), ErrorKind::Conflict);
    assert!(refused.to_string().ends_with("is failed"), "{refused}");
    let late = gate.outcomes();
    assert!(
        matches!(late.as_slice(), [ToolOutcome::Failed { .. }]),
        "{late:?}"
    );
    assert!(h.payments().await.is_empty());
    let history = slow.history(&acme(), &swept.abandoned[0]).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Failed);
    let payment = &history.actions[0];
    assert_eq!(payment.status, ActionStatus::Failed);
    let told = payment.result.as_ref().unwrap();
    assert!(
        told.content.contains("nothing was recorded"),
        "{}",
        told.content
    );
}

/// Starts a run on a process whose model never answers, and kills that process mid-turn.
async fn start_on_a_process_that_dies_while_driving(h: &Harness) {
    let model = Stalls::at_once();
    let dying = Arc::new(
        h.process_of(model.clone(), |tools| tools, Delivery::InProcess)
            .await,
    );
    let start = tokio::spawn(async move { dying.start(scripted_task("ana")).await });
    model.until_stalled(1).await;
    start.abort();
    let _ = start.await;
}

async fn given_a_process_that_died_while_driving_a_run_when_its_lease_runs_out_then_the_sweep_fails_it_and_a_run_within_its_lease_is_left_alone(
    h: &Harness,
) {
    let sweeper = h.process().await;
    start_on_a_process_that_dies_while_driving(h).await;
    h.clock.advance(Duration::minutes(14));
    assert!(sweeper.sweep(100).await.unwrap().abandoned.is_empty());
    h.clock.advance(Duration::minutes(2));
    // A second run starts now and dies the same way; its lease has 15 minutes to go.
    start_on_a_process_that_dies_while_driving(h).await;

    let swept = sweeper.sweep(100).await.unwrap();

    assert_eq!(swept.abandoned.len(), 1, "{swept:?}");
    let history = sweeper.history(&acme(), &swept.abandoned[0]).await.unwrap();
    assert_eq!(history.run.created_at, start_of_test(), "the first run");
    assert_eq!(history.run.status, RunStatus::Failed);
    let last = history.entries.last().unwrap();
    assert_eq!(last.actor, Actor::system("sweep"));
    let AuditEvent::Failed { error } = &last.event else {
        panic!("{:?}", last.event)
    };
    assert!(
        error.contains("the process driving this run stopped before it finished"),
        "{error}"
    );
    assert_eq!(history.run.error.as_ref(), Some(error));
    let again = sweeper.sweep(100).await.unwrap();
    assert!(
        again.abandoned.is_empty(),
        "the second run is within its lease"
    );

    h.clock.advance(Duration::minutes(16));
    let later = sweeper.sweep(100).await.unwrap();
    assert_eq!(later.abandoned.len(), 1, "{later:?}");
    assert_ne!(later.abandoned, swept.abandoned);
    assert_eq!(
        h.run(&sweeper, &later.abandoned[0]).await.status,
        RunStatus::Failed
    );
}

async fn given_a_run_that_resumed_on_a_process_that_died_when_its_lease_runs_out_then_the_sweep_fails_it_but_never_while_it_waited_on_a_person(
    h: &Harness,
) {
    let script = Script::default().then_call(&[(
        "reimburse",
        json!({"claim_id": "c-102", "amount_cents": 25_000}),
    )]);
    let model = Stalls::after(script, 1);
    let dying = Arc::new(
        h.process_of(model.clone(), |tools| tools, Delivery::InProcess)
            .await,
    );
    let report = dying.start(scripted_task("ben")).await.unwrap();
    assert_eq!(report.status, RunStatus::AwaitingApproval);
    let sweeper = h.process().await;
    h.clock.advance(Duration::hours(2));
    assert!(
        sweeper.sweep(100).await.unwrap().abandoned.is_empty(),
        "a run waiting on a person holds no lease"
    );

    let decide = {
        let (dying, dana, id) = (
            dying.clone(),
            h.person("dana"),
            report.approvals[0].id.clone(),
        );
        tokio::spawn(async move { dying.decide(&dana, &id, approve("d-1")).await })
    };
    model.until_stalled(1).await;
    decide.abort();
    let _ = decide.await;
    assert_eq!(
        h.run(&sweeper, &report.run_id).await.status,
        RunStatus::Running
    );
    h.clock.advance(Duration::minutes(14));
    assert!(
        sweeper.sweep(100).await.unwrap().abandoned.is_empty(),
        "resuming renewed the lease"
    );
    h.clock.advance(Duration::minutes(2));

    let swept = sweeper.sweep(100).await.unwrap();

    assert_eq!(swept.abandoned, from_ref(&report.run_id));
    let history = sweeper.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Failed);
    assert_eq!(event_names(&history.entries).last(), Some(&"failed"));
    assert_eq!(
        h.payments().await.len(),
        1,
        "the approved payment ran before"
    );
}

async fn given_the_agent_calls_a_tool_the_policy_does_not_name_when_the_turn_runs_then_it_is_not_executed_and_the_model_is_told(
    h: &Harness,
) {
    let script = Script::default().then_call(&[
        ("wire_money", json!({"to": "ben", "amount_cents": 100})),
        ("get_claim", json!({"claim_id": "c-102"})),
    ]);
    let p = h.scripted_process(script).await;

    let report = p.start(scripted_task("ben")).await.unwrap();

    assert_eq!(report.status, RunStatus::Done);
    let run = h.run(&p, &report.run_id).await;
    let results = results_after_turn(&run, 0);
    assert_eq!(results.len(), 2);
    assert!(
        results[0]
            .1
            .content
            .starts_with("Not executed: policy denies"),
        "{}",
        results[0].1.content
    );
    assert!(!results[0].1.is_error);
    assert!(results[1].1.content.contains("\"id\":\"c-102\""));
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let wire = history
        .actions
        .iter()
        .find(|a| a.tool == "wire_money")
        .unwrap();
    assert_eq!(wire.status, ActionStatus::Rejected);
    assert!(history.entries.iter().all(
        |e| !matches!(&e.event, AuditEvent::Executing { action_id, .. } if *action_id == wire.id)
    ));
}

async fn given_a_run_that_needs_a_second_decision_after_the_first_when_both_are_decided_then_it_pauses_twice_and_finishes(
    h: &Harness,
) {
    let script = Script::default()
        .then_call(&[(
            "reimburse",
            json!({"claim_id": "c-102", "amount_cents": 25_000}),
        )])
        .then_call(&[(
            "decline",
            json!({"claim_id": "c-106", "reason": "no itemised receipt"}),
        )]);
    let p = h.scripted_process(script).await;
    let report = p.start(scripted_task("ben")).await.unwrap();
    let pay = report.approvals[0].clone();

    let first = p
        .decide(&h.person("dana"), &pay.id, approve("d-pay"))
        .await
        .unwrap();

    let waiting = first.run.expect("the run, resumed in process");
    assert_eq!(waiting.status, RunStatus::AwaitingApproval);
    assert_eq!(waiting.approvals.len(), 1);
    let decline = waiting.approvals[0].clone();
    assert_eq!(decline.tool, "decline");
    assert_eq!(p.pending(&acme()).await.unwrap(), from_ref(&decline));

    h.process()
        .await
        .decide(&h.person("erin"), &decline.id, approve("d-decline"))
        .await
        .unwrap();

    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    let settled = shared::example::expense::Ledger::new(p.store.clone())
        .all(&acme())
        .await
        .unwrap();
    let claims: Vec<&str> = settled.iter().map(|s| s.claim_id.as_str()).collect();
    assert_eq!(claims, ["c-102", "c-106"]);
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let names = event_names(&history.entries);
    assert_eq!(names.iter().filter(|n| **n == "paused").count(), 2);
    assert_eq!(names.iter().filter(|n| **n == "resumed").count(), 2);
}

async fn given_two_approvers_approve_paying_more_than_was_claimed_when_it_runs_then_the_tool_refuses_and_the_model_is_told(
    h: &Harness,
) {
    let script = Script::default().then_call(&[(
        "reimburse",
        json!({"claim_id": "c-102", "amount_cents": 60_000}),
    )]);
    let p = h.scripted_process(script).await;
    let report = p.start(scripted_task("ben")).await.unwrap();
    let approval = report.approvals[0].clone();
    assert_eq!(approval.quorum, 2);

    p.decide(&h.person("dana"), &approval.id, approve("d-dana"))
        .await
        .unwrap();
    p.decide(&h.person("erin"), &approval.id, approve("d-erin"))
        .await
        .unwrap();

    assert!(
        h.payments().await.is_empty(),
        "no approval skips a hard limit"
    );
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done);
    let action = history
        .actions
        .iter()
        .find(|a| a.id == approval.action_id)
        .unwrap();
    assert_eq!(action.status, ActionStatus::Failed);
    let told = told_about(&history.run, "reimburse");
    assert!(told.is_error);
    assert!(
        told.content.contains("never pay more than claimed"),
        "{}",
        told.content
    );
}

async fn given_an_agent_that_never_stops_calling_tools_when_it_reaches_the_turn_limit_then_the_run_fails(
    h: &Harness,
) {
    let script = (0..20).fold(Script::default(), |script, _| {
        script.then_call(&[("get_claim", json!({"claim_id": "c-101"}))])
    });
    let p = h.scripted_process(script).await;

    let report = p.start(scripted_task("ana")).await.unwrap();

    assert_eq!(report.status, RunStatus::Failed);
    let error = report.error.unwrap();
    assert!(error.contains("16 model turns"), "{error}");
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Failed);
    assert_eq!(event_names(&history.entries).last(), Some(&"failed"));
}

async fn given_many_calls_proposed_in_the_same_millisecond_when_the_history_is_read_then_actions_come_in_the_order_proposed_each_version_after_its_predecessor(
    h: &Harness,
) {
    let reads = [
        ("get_claim", json!({"claim_id": "c-101"})),
        ("get_claim", json!({"claim_id": "c-102"})),
        ("get_claim", json!({"claim_id": "c-103"})),
        ("get_policy", json!({"category": "taxi"})),
        ("get_policy", json!({"category": "lodging"})),
        ("find_similar_claims", json!({"claim_id": "c-103"})),
        ("get_claim", json!({"claim_id": "c-104"})),
        ("get_claim", json!({"claim_id": "c-105"})),
    ];
    let script = Script::default().then_call(&reads).then_call(&[(
        "reimburse",
        json!({"claim_id": "c-102", "amount_cents": 25_000}),
    )]);
    let p = h.scripted_process(script).await;
    // The clock never moves: every action is proposed at the same instant.
    let report = p.start(scripted_task("ben")).await.unwrap();
    let approval = report.approvals[0].clone();
    p.decide(&h.person("dana"), &approval.id, edit("d-edit", 200))
        .await
        .unwrap();

    let history = p.history(&acme(), &report.run_id).await.unwrap();

    assert!(
        history
            .actions
            .iter()
            .all(|a| a.proposed_at == start_of_test())
    );
    let order: Vec<(String, u32)> = history
        .actions
        .iter()
        .map(|a| (a.tool_use_id.clone(), a.version.get()))
        .collect();
    let mut expected: Vec<(String, u32)> = (0..reads.len())
        .map(|n| (format!("toolu_0_{n}"), 1))
        .collect();
    expected.extend([("toolu_1_0".to_string(), 1), ("toolu_1_0".to_string(), 2)]);
    assert_eq!(order, expected);
    assert_eq!(history.run.status, RunStatus::Done);
}

// ---------------------------------------------------------------------------------------------
// Who may decide
// ---------------------------------------------------------------------------------------------

async fn given_bens_own_claim_when_ben_approves_it_then_he_is_refused_as_own_request(h: &Harness) {
    let p = h.process().await;
    let (_, approval) = h.start_paused(&p, "c-102").await;
    let mut ben = h.person("ben");
    // Even holding the approver role, the claimant never approves his own claim.
    ben.roles.insert(finance());

    let refused = p
        .decide(&ben, &approval.id, approve("d-ben"))
        .await
        .unwrap_err();

    assert_eq!(refused.code(), "own_request");
    assert_eq!(refused.kind(), ErrorKind::Forbidden);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::AwaitingApproval);
    assert!(stored.decisions.is_empty());
    assert!(h.payments().await.is_empty());
}

async fn given_an_approver_who_lost_the_finance_role_when_they_approve_then_they_are_forbidden(
    h: &Harness,
) {
    let p = h.process().await;
    let (_, approval) = h.start_paused(&p, "c-102").await;
    assert!(h.person("dana").has_role(&finance()));
    // Authentication now says dana is no longer in finance.
    let mut dana = h.person("dana");
    dana.roles.remove(&finance());

    let refused = p
        .decide(&dana, &approval.id, approve("d-1"))
        .await
        .unwrap_err();

    assert_eq!(refused.code(), "missing_role");
    assert_eq!(refused.kind(), ErrorKind::Forbidden);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::AwaitingApproval);
    assert!(stored.decisions.is_empty());
    assert!(h.payments().await.is_empty());
}

async fn given_an_approval_of_acme_when_a_globex_approver_decides_it_then_it_is_not_found(
    h: &Harness,
) {
    let p = h.process().await;
    let (_, approval) = h.start_paused(&p, "c-102").await;
    let zoe = h.person("zoe");
    assert_eq!(zoe.tenant, TenantId::parse("globex").unwrap());
    assert!(zoe.has_role(&finance()));

    let refused = p
        .decide(&zoe, &approval.id, approve("d-zoe"))
        .await
        .unwrap_err();

    assert_eq!(refused.code(), "not_found");
    assert_eq!(refused.kind(), ErrorKind::NotFound);
    assert!(p.pending(&zoe.tenant).await.unwrap().is_empty());
    assert_eq!(
        p.approval(&zoe.tenant, &approval.id)
            .await
            .unwrap_err()
            .code(),
        "not_found"
    );
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::AwaitingApproval);
    assert!(h.payments().await.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Expiry, rejection, cancellation: answers, not errors
// ---------------------------------------------------------------------------------------------

async fn given_an_overdue_approval_when_someone_approves_it_then_it_is_refused_as_expired_nothing_is_paid_and_the_model_is_told(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    h.clock.advance(Duration::hours(24) + Duration::minutes(1));

    let refused = p
        .decide(&h.person("dana"), &approval.id, approve("d-late"))
        .await
        .unwrap_err();

    assert_eq!(refused.code(), "expired");
    assert_eq!(refused.kind(), ErrorKind::Conflict);
    assert!(h.payments().await.is_empty());
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::Expired);
    assert!(stored.decisions.is_empty());
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    let told = told_about(&run, "reimburse");
    assert!(!told.is_error);
    assert!(
        told.content
            .starts_with("Not executed: nobody decided before the deadline"),
        "{}",
        told.content
    );
    let again = p
        .decide(&h.person("erin"), &approval.id, approve("d-later"))
        .await
        .unwrap_err();
    assert_eq!(again.code(), "expired");
    assert!(h.payments().await.is_empty());
}

async fn given_an_overdue_approval_when_someone_without_the_approver_role_decides_it_then_it_expires_booked_to_the_deadline_not_to_them(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    h.clock.advance(Duration::hours(24) + Duration::minutes(1));
    let ana = h.person("ana");
    assert!(!ana.has_role(&finance()));

    let refused = p
        .decide(&ana, &approval.id, approve("d-ana"))
        .await
        .unwrap_err();

    assert_eq!(refused.code(), "expired");
    assert_eq!(refused.kind(), ErrorKind::Conflict);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::Expired);
    assert!(stored.decisions.is_empty());
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let expiries: Vec<&Actor> = history
        .entries
        .iter()
        .filter(|e| matches!(e.event, AuditEvent::Expired { .. }))
        .map(|e| &e.actor)
        .collect();
    assert_eq!(expiries, [&Actor::system("deadline")]);
    assert!(
        history
            .entries
            .iter()
            .all(|e| e.actor != Actor::person(&ana.person)),
        "ana appears nowhere in the record: {:?}",
        event_names(&history.entries)
    );
    assert!(h.payments().await.is_empty());
}

async fn given_a_rejected_payment_when_the_run_resumes_then_the_model_reads_a_plain_not_executed_result_and_finishes(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, approval) = h.start_paused(&p, "c-102").await;

    let decided = p
        .decide(
            &h.person("dana"),
            &approval.id,
            reject("d-no", "the receipt is missing"),
        )
        .await
        .unwrap();

    assert_eq!(decided.approval.status, ApprovalStatus::Rejected);
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    let told = told_about(&run, "reimburse");
    assert!(!told.is_error, "a rejection is an answer, not an error");
    assert!(
        told.content.starts_with("Not executed:"),
        "{}",
        told.content
    );
    assert!(told.content.contains("the receipt is missing"));
    assert!(told.content.contains("Do not retry"));
    let answer = run.answer.unwrap();
    assert!(answer.starts_with("Nothing was settled"), "{answer}");
    assert!(h.payments().await.is_empty());
}

async fn given_an_unanswered_payment_when_the_sweep_expires_it_then_the_model_reads_a_plain_not_executed_result_and_finishes(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    h.clock.advance(Duration::hours(25));

    let swept = h.process().await.sweep(100).await.unwrap();

    assert_eq!(swept.expired, [approval.id]);
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    let told = told_about(&run, "reimburse");
    assert!(!told.is_error, "an expiry is an answer, not an error");
    assert!(
        told.content.starts_with("Not executed:"),
        "{}",
        told.content
    );
    assert!(told.content.contains("expired"));
    assert!(h.payments().await.is_empty());
}

async fn given_a_cancelled_run_when_an_approver_decides_its_approval_then_it_conflicts_as_cancelled(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, approval) = h.start_paused(&p, "c-102").await;

    let cancelled = p.cancel(&h.person("ben"), &report.run_id).await.unwrap();
    assert_eq!(cancelled.status, RunStatus::Cancelled);

    let refused = h
        .process()
        .await
        .decide(&h.person("dana"), &approval.id, approve("d-1"))
        .await
        .unwrap_err();

    assert_eq!(refused.code(), "cancelled");
    assert_eq!(refused.kind(), ErrorKind::Conflict);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::Cancelled);
    assert!(p.pending(&acme()).await.unwrap().is_empty());
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Cancelled);
    assert!(event_names(&history.entries).contains(&"cancelled"));
    assert!(h.payments().await.is_empty());
}

async fn given_a_run_waiting_on_a_person_when_someone_unrelated_cancels_it_then_they_may_not(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, _) = h.start_paused(&p, "c-102").await;

    let refused = p
        .cancel(&h.person("chen"), &report.run_id)
        .await
        .unwrap_err();

    assert_eq!(refused.code(), "may_not_cancel");
    assert_eq!(
        h.run(&p, &report.run_id).await.status,
        RunStatus::AwaitingApproval
    );
}

// ---------------------------------------------------------------------------------------------
// Executing exactly once
// ---------------------------------------------------------------------------------------------

async fn given_a_payment_whose_outcome_is_unknown_when_the_resume_message_comes_again_then_the_tool_is_not_called_again_and_the_sweep_reconciles_it(
    h: &Harness,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let lost = {
        let calls = calls.clone();
        h.process_with(
            move |tools| AnswerLost::wrap(tools, "reimburse", calls),
            Delivery::InProcess,
        )
        .await
    };
    let (report, approval) = h.start_paused(&lost, "c-102").await;

    let decided = lost
        .decide(&h.person("dana"), &approval.id, approve("d-1"))
        .await
        .unwrap();

    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        decided.run.map(|r| r.status),
        Some(RunStatus::AwaitingApproval)
    );
    let key = format!("{}:1", approval.action_id);
    let action = |history: &shared::engine::History| {
        history
            .actions
            .iter()
            .find(|a| a.id == approval.action_id)
            .cloned()
            .unwrap()
    };
    let history = lost.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(action(&history).status, ActionStatus::Unknown);
    assert!(event_names(&history.entries).contains(&"unknown"));

    // The message is delivered again: the call may have committed, so it is never retried.
    let again = lost.resume(&resume_message(&approval)).await.unwrap();
    assert!(matches!(again, ResumeReport::Ignored { .. }), "{again:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // A sweep whose tool cannot tell yet leaves it unknown.
    let unsure = lost.sweep(100).await.unwrap();
    assert_eq!(unsure.unknown, from_ref(&key));
    assert!(unsure.reconciled.is_empty());
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Later, a process whose tool reads the ledger back settles it.
    h.clock.advance(Duration::minutes(10));
    let knowing = h.process().await;
    let settled = knowing.sweep(100).await.unwrap();

    assert_eq!(settled.reconciled, from_ref(&key));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let history = knowing.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done);
    assert_eq!(action(&history).status, ActionStatus::Succeeded);
    assert!(event_names(&history.entries).contains(&"reconciled"));
    assert_eq!(
        paid(&h.payments().await),
        [("c-102".to_string(), 25_000, key)]
    );
    assert!(knowing.sweep(100).await.unwrap().reconciled.is_empty());
}

async fn given_a_finished_run_when_its_resume_message_is_delivered_again_then_nothing_runs_twice(
    h: &Harness,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let p = {
        let calls = calls.clone();
        h.process_with(
            move |tools| Counted::wrap(tools, "reimburse", calls),
            Delivery::InProcess,
        )
        .await
    };
    let (report, approval) = h.start_paused(&p, "c-102").await;
    p.decide(&h.person("dana"), &approval.id, approve("d-1"))
        .await
        .unwrap();
    assert_eq!(h.run(&p, &report.run_id).await.status, RunStatus::Done);

    let again = p.resume(&resume_message(&approval)).await.unwrap();

    assert!(matches!(again, ResumeReport::Ignored { .. }), "{again:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(h.payments().await.len(), 1);
    assert_eq!(p.sweep(100).await.unwrap().redelivered, 0);
}

/// Every outbox entry still in the store, whatever it is due.
async fn outbox_entries(p: &Process) -> usize {
    p.store
        .query_index(keys::OUTBOX_INDEX, "", "\u{10FFFF}", None, 100)
        .await
        .unwrap()
        .items
        .len()
}

async fn given_a_queued_resume_when_its_consumer_acts_on_it_then_its_outbox_entry_goes_with_that_write_and_the_sweep_sends_nothing_again(
    h: &Harness,
) {
    let queue = Arc::new(RecordingQueue::default());
    let decider = h
        .process_with(|tools| tools, Delivery::Queue(queue.clone()))
        .await;
    let (_, approval) = h.start_paused(&decider, "c-102").await;
    decider
        .decide(&h.person("dana"), &approval.id, approve("d-1"))
        .await
        .unwrap();
    let published = queue.published();
    assert_eq!(addressed(&published), [resume_message(&approval)]);

    // The writer published and left the entry: until a consumer acts, it is what the sweep
    // would deliver again once the grace period is over.
    assert_eq!(
        outbox_entries(&decider).await,
        1,
        "waiting for its consumer"
    );

    let consumer = h.process().await;
    let resumed = consumer.resume(&published[0]).await.unwrap();
    assert!(
        matches!(resumed, ResumeReport::Continued { .. }),
        "{resumed:?}"
    );
    assert_eq!(outbox_entries(&decider).await, 0, "consumed with the claim");
    h.clock.advance(Duration::minutes(1));
    assert_eq!(decider.sweep(100).await.unwrap().redelivered, 0);
    assert_eq!(queue.published().len(), 1, "sent once");
    assert_eq!(h.payments().await.len(), 1);
}

async fn given_the_resume_queue_is_down_when_a_payment_is_approved_then_the_decision_stands_and_the_sweep_publishes_it_later(
    h: &Harness,
) {
    let down = h
        .process_with(|tools| tools, Delivery::Queue(Arc::new(QueueDown)))
        .await;
    let (report, approval) = h.start_paused(&down, "c-102").await;

    let decided = down
        .decide(&h.person("dana"), &approval.id, approve("d-1"))
        .await
        .unwrap();
    assert_eq!(decided.approval.status, ApprovalStatus::Approved);
    assert!(decided.run.is_none(), "another process resumes it");

    let queue = Arc::new(RecordingQueue::default());
    let sweeper = h
        .process_with(|tools| tools, Delivery::Queue(queue.clone()))
        .await;
    assert_eq!(
        sweeper.sweep(100).await.unwrap().redelivered,
        0,
        "its writer may still publish it"
    );
    h.clock.advance(Duration::minutes(1));
    assert_eq!(sweeper.sweep(100).await.unwrap().redelivered, 1);
    assert_eq!(
        sweeper.sweep(100).await.unwrap().redelivered,
        0,
        "published once"
    );
    assert_eq!(addressed(&queue.published()), [resume_message(&approval)]);

    let consumer = h.process().await;
    let message = &queue.published()[0];
    let resumed = consumer.resume(message).await.unwrap();
    assert!(
        matches!(resumed, ResumeReport::Continued { .. }),
        "{resumed:?}"
    );
    let again = consumer.resume(message).await.unwrap();
    assert!(matches!(again, ResumeReport::Ignored { .. }), "{again:?}");

    assert_eq!(
        h.run(&consumer, &report.run_id).await.status,
        RunStatus::Done
    );
    assert_eq!(h.payments().await.len(), 1);
}

async fn given_an_edited_approval_when_either_approval_history_is_read_then_it_traces_both_versions_to_the_outcome(
    h: &Harness,
) {
    let p = h.process().await;
    let (_, approval) = h.start_paused(&p, "c-102").await;
    let edited = p
        .decide(&h.person("dana"), &approval.id, edit("d-edit", 200))
        .await
        .unwrap();
    let next = edited.next_approval.unwrap();

    let from_old = p.history_of_approval(&acme(), &approval.id).await.unwrap();
    let from_new = p.history_of_approval(&acme(), &next.id).await.unwrap();

    assert_eq!(
        event_names(&from_old.entries),
        [
            "started",
            "proposed",
            "paused",
            "decision",
            "superseded",
            "proposed",
            "decision",
            "executing",
            "executed",
            "resumed",
            "done"
        ]
    );
    assert_eq!(from_new.entries, from_old.entries);
    let versions: Vec<u32> = from_old
        .entries
        .iter()
        .filter_map(|e| e.event.action().map(|(_, v)| v.get()))
        .collect();
    assert_eq!(versions, [1, 1, 1, 2, 2, 2, 2]);
    let approvals: Vec<_> = from_old
        .approvals
        .iter()
        .map(|a| (a.action_version.get(), a.status))
        .collect();
    assert_eq!(approvals.len(), 2);
    assert!(approvals.contains(&(1, ApprovalStatus::Superseded)));
    assert!(approvals.contains(&(2, ApprovalStatus::Approved)));
}

async fn given_a_finished_run_when_its_requester_cancels_it_then_it_conflicts_as_run_finished(
    h: &Harness,
) {
    let p = h.process().await;
    let report = h.start(&p, "c-101").await;
    assert_eq!(report.status, RunStatus::Done);

    let refused = p
        .cancel(&h.person("ana"), &report.run_id)
        .await
        .unwrap_err();

    assert_eq!(refused.code(), "run_finished");
    assert_eq!(refused.kind(), ErrorKind::Conflict);
    assert_eq!(h.run(&p, &report.run_id).await.status, RunStatus::Done);
}

// ---------------------------------------------------------------------------------------------
// The audit
// ---------------------------------------------------------------------------------------------

async fn given_an_approved_payment_when_its_approval_history_is_read_then_it_traces_proposal_decision_execution_and_outcome(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    p.decide(&h.person("dana"), &approval.id, approve("d-1"))
        .await
        .unwrap();

    let history = h
        .process()
        .await
        .history_of_approval(&acme(), &approval.id)
        .await
        .unwrap();

    assert_eq!(history.run.id, report.run_id);
    assert_eq!(
        event_names(&history.entries),
        [
            "started",
            "proposed",
            "paused",
            "decision",
            "executing",
            "executed",
            "resumed",
            "done"
        ]
    );
    let dana = Actor::person(&person("dana"));
    for entry in &history.entries {
        match &entry.event {
            AuditEvent::Proposed {
                approval_id,
                args_hash,
                tool,
                ..
            } => {
                assert_eq!(approval_id.as_ref(), Some(&approval.id));
                assert_eq!(*args_hash, approval.args_hash);
                assert_eq!(tool, "reimburse");
                assert_eq!(entry.actor, Actor::Agent);
            }
            AuditEvent::Paused { approvals } => assert_eq!(approvals, from_ref(&approval.id)),
            AuditEvent::Decision {
                approval_id,
                version,
                args_hash,
                effect,
                ..
            } => {
                assert_eq!(*approval_id, approval.id);
                assert_eq!(*version, ActionVersion::FIRST);
                assert_eq!(*args_hash, approval.args_hash);
                assert_eq!(*effect, DecisionEffect::Approved);
                assert_eq!(entry.actor, dana);
            }
            AuditEvent::Executing {
                action_id,
                args_hash,
                authorized_by,
                ..
            } => {
                assert_eq!(*action_id, approval.action_id);
                assert_eq!(*args_hash, approval.args_hash);
                assert_eq!(authorized_by, from_ref(&dana));
            }
            AuditEvent::Executed {
                action_id,
                succeeded,
                result,
                ..
            } => {
                assert_eq!(*action_id, approval.action_id);
                assert!(*succeeded);
                assert!(result.contains("\"paid_cents\":25000"), "{result}");
            }
            _ => {}
        }
    }
    assert_eq!(history.actions.len(), 1);
    assert_eq!(history.actions[0].status, ActionStatus::Succeeded);
    assert_eq!(history.approvals.len(), 1);
    assert_eq!(history.approvals[0].status, ApprovalStatus::Approved);
}

/// Every scenario, instantiated on one backend.
macro_rules! every_scenario {
    ($module:ident, $backend:expr) => {
        on_backend!(
            $module,
            $backend,
            [
                given_c101_a_small_taxi_when_the_agent_runs_then_it_is_paid_42_without_a_person,
                given_c102_lodging_over_the_limit_when_the_agent_runs_then_it_pauses_on_reimbursing_250,
                given_c101_was_paid_when_the_agent_runs_c103_then_it_pauses_on_declining_a_duplicate,
                given_c104_with_no_time_to_decide_when_the_sweep_runs_then_it_expires_and_nothing_is_paid,
                given_a_time_to_decide_longer_than_the_policy_allows_when_a_run_starts_then_it_is_refused_as_bad_input,
                given_a_paused_run_when_the_process_restarts_and_a_new_engine_approves_then_the_run_finishes_and_the_claim_is_paid,
                given_an_approval_when_the_same_decision_id_is_sent_twice_then_it_resumes_once_and_the_second_call_replays_the_outcome,
                given_a_decision_whose_resume_was_never_delivered_when_its_decision_id_is_replayed_then_the_run_resumes_exactly_once,
                given_a_recorded_decision_when_its_decision_id_comes_with_another_choice_then_it_conflicts,
                given_an_approval_when_a_reviewer_lowers_the_amount_then_version_two_runs_and_version_one_can_no_longer_be_approved,
                given_a_two_person_claim_when_a_reviewer_lowers_it_then_the_new_version_still_needs_a_second_person,
                given_an_approval_when_a_reviewer_raises_the_amount_then_the_edit_is_refused_and_nothing_changes,
                given_an_approval_when_a_reviewer_lowers_the_amount_below_the_threshold_then_version_two_runs_on_policy_and_the_editor,
                given_a_turn_with_a_read_and_a_payment_when_the_payment_is_approved_then_both_results_go_back_together_after_the_pause,
                given_two_approvals_in_one_turn_when_the_first_is_decided_then_the_run_waits_for_the_second_and_resumes_once_with_both,
                given_a_process_that_died_before_paying_when_the_sweep_finds_the_stale_execution_then_it_asks_the_tool_and_never_pays_blindly,
                given_a_process_that_died_after_paying_when_the_sweep_finds_the_stale_execution_then_it_records_the_payment_it_finds,
                given_a_slow_payment_the_sweep_reconciled_as_not_paid_when_the_call_lands_afterwards_then_it_does_not_pay,
                given_an_allowed_payment_slower_than_the_lease_when_the_sweep_settles_it_and_fails_the_run_then_the_late_call_pays_nothing_and_its_process_reports_a_conflict,
                given_a_process_that_died_while_driving_a_run_when_its_lease_runs_out_then_the_sweep_fails_it_and_a_run_within_its_lease_is_left_alone,
                given_a_run_that_resumed_on_a_process_that_died_when_its_lease_runs_out_then_the_sweep_fails_it_but_never_while_it_waited_on_a_person,
                given_the_agent_calls_a_tool_the_policy_does_not_name_when_the_turn_runs_then_it_is_not_executed_and_the_model_is_told,
                given_an_agent_that_never_stops_calling_tools_when_it_reaches_the_turn_limit_then_the_run_fails,
                given_many_calls_proposed_in_the_same_millisecond_when_the_history_is_read_then_actions_come_in_the_order_proposed_each_version_after_its_predecessor,
                given_a_run_that_needs_a_second_decision_after_the_first_when_both_are_decided_then_it_pauses_twice_and_finishes,
                given_two_approvers_approve_paying_more_than_was_claimed_when_it_runs_then_the_tool_refuses_and_the_model_is_told,
                given_a_claim_above_500_when_the_same_approver_approves_twice_then_it_still_waits_and_a_second_approver_pays_it,
                given_bens_own_claim_when_ben_approves_it_then_he_is_refused_as_own_request,
                given_an_approver_who_lost_the_finance_role_when_they_approve_then_they_are_forbidden,
                given_an_approval_of_acme_when_a_globex_approver_decides_it_then_it_is_not_found,
                given_an_overdue_approval_when_someone_approves_it_then_it_is_refused_as_expired_nothing_is_paid_and_the_model_is_told,
                given_an_overdue_approval_when_someone_without_the_approver_role_decides_it_then_it_expires_booked_to_the_deadline_not_to_them,
                given_a_rejected_payment_when_the_run_resumes_then_the_model_reads_a_plain_not_executed_result_and_finishes,
                given_an_unanswered_payment_when_the_sweep_expires_it_then_the_model_reads_a_plain_not_executed_result_and_finishes,
                given_a_cancelled_run_when_an_approver_decides_its_approval_then_it_conflicts_as_cancelled,
                given_a_run_waiting_on_a_person_when_someone_unrelated_cancels_it_then_they_may_not,
                given_a_payment_whose_outcome_is_unknown_when_the_resume_message_comes_again_then_the_tool_is_not_called_again_and_the_sweep_reconciles_it,
                given_a_finished_run_when_its_resume_message_is_delivered_again_then_nothing_runs_twice,
                given_an_approved_payment_when_its_approval_history_is_read_then_it_traces_proposal_decision_execution_and_outcome,
                given_the_resume_queue_is_down_when_a_payment_is_approved_then_the_decision_stands_and_the_sweep_publishes_it_later,
                given_a_queued_resume_when_its_consumer_acts_on_it_then_its_outbox_entry_goes_with_that_write_and_the_sweep_sends_nothing_again,
                given_an_edited_approval_when_either_approval_history_is_read_then_it_traces_both_versions_to_the_outcome,
                given_a_finished_run_when_its_requester_cancels_it_then_it_conflicts_as_run_finished,
            ]
        );
    };
}

every_scenario!(embedded, Embedded::fresh());
// The same scenarios on DynamoDB (moto over HTTP).
every_scenario!(dynamodb, DynamoDb::fresh("scenario").await);

// ---------------------------------------------------------------------------------------------
// Races: two processes, each with its own connection, many rounds, on both stores. On DynamoDB
// the local stack must be in its serial mode (moto behind a lock, one request at a time): its
// transactions are then judged in a stricter order than DynamoDB's serializable one.
// ---------------------------------------------------------------------------------------------

mod races {
    use super::*;
    use harness::Process;
    use shared::domain::approval::DecisionRequest;
    use shared::domain::identity::Identity;
    use shared::domain::ids::ApprovalId;
    use shared::engine::{DecisionReport, EngineError};
    use tokio::sync::Barrier;

    /// Two sweeps recording one unknown outcome at once is a race too.
    pub async fn given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once<
        F: Fn() -> Fut,
        Fut: Future<Output = Harness>,
    >(
        fresh: F,
        _rounds: usize,
    ) {
        let h = fresh().await;
        super::given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once(&h).await;
    }

    /// Two decisions on one approval, from two processes, released at the same moment.
    async fn race(
        one: (Arc<Process>, Identity, DecisionRequest),
        other: (Arc<Process>, Identity, DecisionRequest),
        approval: &ApprovalId,
    ) -> [Result<DecisionReport, EngineError>; 2] {
        let barrier = Arc::new(Barrier::new(2));
        let spawn = |(process, who, request): (Arc<Process>, Identity, DecisionRequest)| {
            let (barrier, approval) = (barrier.clone(), approval.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                process.decide(&who, &approval, request).await
            })
        };
        let (a, b) = (spawn(one), spawn(other));
        [a.await.unwrap(), b.await.unwrap()]
    }

    async fn counted_process(h: &Harness, calls: &Arc<AtomicUsize>) -> Arc<Process> {
        let calls = calls.clone();
        Arc::new(
            h.process_with(
                move |tools| Counted::wrap(tools, "reimburse", calls),
                Delivery::InProcess,
            )
            .await,
        )
    }

    pub async fn given_a_paused_run_when_approve_and_reject_race_from_two_processes_then_exactly_one_wins_and_nothing_runs_twice<
        F: Fn() -> Fut,
        Fut: Future<Output = Harness>,
    >(
        fresh: F,
        rounds: usize,
    ) {
        let mut approvals_won = 0;
        for round in 0..rounds {
            let h = fresh().await;
            let calls = Arc::new(AtomicUsize::new(0));
            let (a, b) = (
                counted_process(&h, &calls).await,
                counted_process(&h, &calls).await,
            );
            let (report, approval) = h.start_paused(&a, "c-102").await;

            let results = race(
                (a.clone(), h.person("dana"), approve("d-approve")),
                (
                    b.clone(),
                    h.person("erin"),
                    reject("d-reject", "not this one"),
                ),
                &approval.id,
            )
            .await;

            let winners: Vec<&DecisionReport> =
                results.iter().filter_map(|r| r.as_ref().ok()).collect();
            let losers: Vec<&EngineError> =
                results.iter().filter_map(|r| r.as_ref().err()).collect();
            assert_eq!(winners.len(), 1, "round {round}: {results:?}");
            assert_eq!(losers.len(), 1, "round {round}: {results:?}");
            assert_eq!(losers[0].code(), "already_decided", "round {round}");
            let approved = winners[0].approval.status == ApprovalStatus::Approved;
            approvals_won += usize::from(approved);
            let expected_calls = usize::from(approved);
            assert_eq!(
                calls.load(Ordering::SeqCst),
                expected_calls,
                "round {round}"
            );
            assert_eq!(h.payments().await.len(), expected_calls, "round {round}");
            let stored = a.approval(&acme(), &approval.id).await.unwrap();
            assert_eq!(stored.decisions.len(), 1, "round {round}");
            assert_eq!(h.run(&b, &report.run_id).await.status, RunStatus::Done);
        }
        // Either outcome is fine; the count is only printed, so a run shows both sides raced.
        println!("approve won {approvals_won} of {rounds} rounds");
    }

    pub async fn given_one_approver_needed_when_two_approve_at_once_from_two_processes_then_the_claim_is_paid_once<
        F: Fn() -> Fut,
        Fut: Future<Output = Harness>,
    >(
        fresh: F,
        rounds: usize,
    ) {
        for round in 0..rounds {
            let h = fresh().await;
            let calls = Arc::new(AtomicUsize::new(0));
            let (a, b) = (
                counted_process(&h, &calls).await,
                counted_process(&h, &calls).await,
            );
            let (_, approval) = h.start_paused(&a, "c-102").await;

            let results = race(
                (a.clone(), h.person("dana"), approve("d-dana")),
                (b.clone(), h.person("erin"), approve("d-erin")),
                &approval.id,
            )
            .await;

            let won = results.iter().filter(|r| r.is_ok()).count();
            assert_eq!(won, 1, "round {round}: {results:?}");
            let lost = results.iter().find_map(|r| r.as_ref().err()).unwrap();
            assert_eq!(lost.code(), "already_decided", "round {round}");
            assert_eq!(calls.load(Ordering::SeqCst), 1, "round {round}");
            assert_eq!(h.payments().await.len(), 1, "round {round}");
        }
    }

    pub async fn given_an_approved_payment_when_two_processes_receive_its_resume_message_at_once_then_the_tool_runs_once<
        F: Fn() -> Fut,
        Fut: Future<Output = Harness>,
    >(
        fresh: F,
        rounds: usize,
    ) {
        for round in 0..rounds {
            let h = fresh().await;
            let queue = Arc::new(RecordingQueue::default());
            let decider = h
                .process_with(|tools| tools, Delivery::Queue(queue.clone()))
                .await;
            let (report, approval) = h.start_paused(&decider, "c-102").await;
            decider
                .decide(&h.person("dana"), &approval.id, approve("d-1"))
                .await
                .unwrap();
            let published = queue.published();
            assert_eq!(
                addressed(&published),
                [resume_message(&approval)],
                "round {round}"
            );

            let calls = Arc::new(AtomicUsize::new(0));
            let (a, b) = (
                counted_process(&h, &calls).await,
                counted_process(&h, &calls).await,
            );
            let barrier = Arc::new(Barrier::new(2));
            let consume = |process: Arc<Process>| {
                let (barrier, message) = (barrier.clone(), published[0].clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    process.resume(&message).await
                })
            };
            let (one, other) = (consume(a.clone()), consume(b.clone()));
            let reports = [one.await.unwrap().unwrap(), other.await.unwrap().unwrap()];

            let continued = reports
                .iter()
                .filter(|r| matches!(r, ResumeReport::Continued { .. }))
                .count();
            assert_eq!(continued, 1, "round {round}: {reports:?}");
            assert_eq!(calls.load(Ordering::SeqCst), 1, "round {round}");
            assert_eq!(h.payments().await.len(), 1, "round {round}");
            assert_eq!(h.run(&a, &report.run_id).await.status, RunStatus::Done);
        }
    }

    pub async fn given_two_approvals_in_one_turn_when_both_are_approved_at_once_from_two_processes_then_each_runs_once_and_the_run_resumes_once<
        F: Fn() -> Fut,
        Fut: Future<Output = Harness>,
    >(
        fresh: F,
        rounds: usize,
    ) {
        for round in 0..rounds {
            let h = fresh().await;
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
            let (a, b) = (
                Arc::new(h.scripted_process(script.clone()).await),
                Arc::new(h.scripted_process(script).await),
            );
            let report = a.start(scripted_task("ops")).await.unwrap();
            assert_eq!(report.approvals.len(), 2);
            let (first, second) = (
                report.approvals[0].id.clone(),
                report.approvals[1].id.clone(),
            );

            let barrier = Arc::new(Barrier::new(2));
            let decide = |process: Arc<Process>, who: Identity, approval: ApprovalId| {
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    process.decide(&who, &approval, approve("d-1")).await
                })
            };
            let one = decide(a.clone(), h.person("dana"), first);
            let other = decide(b.clone(), h.person("erin"), second);
            let (one, other) = (one.await.unwrap(), other.await.unwrap());

            assert!(
                one.is_ok() && other.is_ok(),
                "round {round}: {one:?} {other:?}"
            );
            assert_eq!(h.payments().await.len(), 2, "round {round}");
            let history = a.history(&acme(), &report.run_id).await.unwrap();
            assert_eq!(history.run.status, RunStatus::Done, "round {round}");
            let names = event_names(&history.entries);
            let count = |name: &str| names.iter().filter(|n| **n == name).count();
            assert_eq!(count("resumed"), 1, "round {round}: {names:?}");
            assert_eq!(count("executed"), 2, "round {round}: {names:?}");
            let results = results_after_turn(&history.run, 0);
            assert_eq!(results.len(), 2, "round {round}");
            assert!(
                results
                    .iter()
                    .all(|(_, r)| r.content.contains("paid_cents")),
                "round {round}: {results:?}"
            );
        }
    }

    pub async fn given_an_overdue_approval_when_the_sweep_and_a_late_approval_race_then_it_expires_once_and_nothing_is_paid<
        F: Fn() -> Fut,
        Fut: Future<Output = Harness>,
    >(
        fresh: F,
        rounds: usize,
    ) {
        for round in 0..rounds {
            let h = fresh().await;
            let calls = Arc::new(AtomicUsize::new(0));
            let (a, b) = (
                counted_process(&h, &calls).await,
                counted_process(&h, &calls).await,
            );
            let (report, approval) = h.start_paused(&a, "c-102").await;
            h.clock.advance(Duration::hours(25));

            let barrier = Arc::new(Barrier::new(2));
            let sweep = {
                let (barrier, a) = (barrier.clone(), a.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    a.sweep(100).await
                })
            };
            let late = {
                let (barrier, b, dana, id) = (
                    barrier.clone(),
                    b.clone(),
                    h.person("dana"),
                    approval.id.clone(),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    b.decide(&dana, &id, approve("d-late")).await
                })
            };
            let swept = sweep.await.unwrap().unwrap();
            let refused = late.await.unwrap().unwrap_err();

            assert_eq!(refused.code(), "expired", "round {round}");
            assert!(swept.expired.len() <= 1, "round {round}: {swept:?}");
            assert_eq!(calls.load(Ordering::SeqCst), 0, "round {round}");
            assert!(h.payments().await.is_empty(), "round {round}");
            let history = a.history(&acme(), &report.run_id).await.unwrap();
            let names = event_names(&history.entries);
            let count = |name: &str| names.iter().filter(|n| **n == name).count();
            assert_eq!(count("expired"), 1, "round {round}: {names:?}");
            assert_eq!(count("resumed"), 1, "round {round}: {names:?}");
            assert_eq!(history.run.status, RunStatus::Done, "round {round}");
        }
    }

    pub async fn given_a_paused_run_when_its_requester_cancels_as_an_approver_approves_then_a_refused_approval_never_pays<
        F: Fn() -> Fut,
        Fut: Future<Output = Harness>,
    >(
        fresh: F,
        rounds: usize,
    ) {
        for round in 0..rounds {
            let h = fresh().await;
            let calls = Arc::new(AtomicUsize::new(0));
            let (a, b) = (
                counted_process(&h, &calls).await,
                counted_process(&h, &calls).await,
            );
            let (report, approval) = h.start_paused(&a, "c-102").await;

            let barrier = Arc::new(Barrier::new(2));
            let cancel = {
                let (barrier, a, ben, run) = (
                    barrier.clone(),
                    a.clone(),
                    h.person("ben"),
                    report.run_id.clone(),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    a.cancel(&ben, &run).await
                })
            };
            let approve_it = {
                let (barrier, b, dana, id) = (
                    barrier.clone(),
                    b.clone(),
                    h.person("dana"),
                    approval.id.clone(),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    b.decide(&dana, &id, approve("d-1")).await
                })
            };
            let cancelled = cancel.await.unwrap();
            let decided = approve_it.await.unwrap();

            let payments = h.payments().await.len();
            let history = a.history(&acme(), &report.run_id).await.unwrap();
            let action = history
                .actions
                .iter()
                .find(|x| x.id == approval.action_id)
                .unwrap();
            match (&cancelled, &decided) {
                (Ok(_), Err(refused)) => {
                    assert_eq!(refused.code(), "cancelled", "round {round}");
                    assert_eq!(action.status, ActionStatus::Cancelled, "round {round}");
                    assert_eq!(payments, 0, "round {round}");
                }
                (Ok(_), Ok(_)) => {
                    // Approved first, cancelled before or while it ran: it runs at most once.
                    assert_eq!(history.run.status, RunStatus::Cancelled, "round {round}");
                    assert!(payments <= 1, "round {round}");
                    let ran = action.status == ActionStatus::Succeeded;
                    assert_eq!(payments, usize::from(ran), "round {round}: {action:?}");
                }
                (Err(refused), Ok(_)) => {
                    assert_eq!(refused.code(), "run_finished", "round {round}");
                    assert_eq!(history.run.status, RunStatus::Done, "round {round}");
                    assert_eq!(payments, 1, "round {round}");
                }
                (Err(_), Err(_)) => {
                    panic!("round {round}: both refused: {cancelled:?} {decided:?}")
                }
            }
            assert!(calls.load(Ordering::SeqCst) <= 1, "round {round}");
        }
    }
}

/// Every race, on one backend, `$rounds` rounds each on a fresh store; `$check`, if any, runs
/// first.
macro_rules! every_race {
    ($module:ident, $backend:expr, $rounds:expr $(, $check:expr)?) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once() {
                $($check;)?
                races::given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once(|| async { Harness::new($backend).await }, $rounds).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn given_a_paused_run_when_approve_and_reject_race_from_two_processes_then_exactly_one_wins_and_nothing_runs_twice() {
                $($check;)?
                races::given_a_paused_run_when_approve_and_reject_race_from_two_processes_then_exactly_one_wins_and_nothing_runs_twice(|| async { Harness::new($backend).await }, $rounds).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn given_one_approver_needed_when_two_approve_at_once_from_two_processes_then_the_claim_is_paid_once() {
                $($check;)?
                races::given_one_approver_needed_when_two_approve_at_once_from_two_processes_then_the_claim_is_paid_once(|| async { Harness::new($backend).await }, $rounds).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn given_an_approved_payment_when_two_processes_receive_its_resume_message_at_once_then_the_tool_runs_once() {
                $($check;)?
                races::given_an_approved_payment_when_two_processes_receive_its_resume_message_at_once_then_the_tool_runs_once(|| async { Harness::new($backend).await }, $rounds).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn given_two_approvals_in_one_turn_when_both_are_approved_at_once_from_two_processes_then_each_runs_once_and_the_run_resumes_once() {
                $($check;)?
                races::given_two_approvals_in_one_turn_when_both_are_approved_at_once_from_two_processes_then_each_runs_once_and_the_run_resumes_once(|| async { Harness::new($backend).await }, $rounds).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn given_an_overdue_approval_when_the_sweep_and_a_late_approval_race_then_it_expires_once_and_nothing_is_paid() {
                $($check;)?
                races::given_an_overdue_approval_when_the_sweep_and_a_late_approval_race_then_it_expires_once_and_nothing_is_paid(|| async { Harness::new($backend).await }, $rounds).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn given_a_paused_run_when_its_requester_cancels_as_an_approver_approves_then_a_refused_approval_never_pays() {
                $($check;)?
                races::given_a_paused_run_when_its_requester_cancels_as_an_approver_approves_then_a_refused_approval_never_pays(|| async { Harness::new($backend).await }, $rounds).await;
            }
        }
    };
}

every_race!(races_on_embedded, Embedded::fresh(), 20);
// moto judges races only when it takes one request at a time: the local stack's serial mode.
every_race!(
    races_on_dynamodb,
    DynamoDb::fresh("race").await,
    10,
    support::aws::assert_serial().await
);
