//! Executing exactly once: resume messages delivered again, the outbox, a queue that is down,
//! and the audit that traces it all.

use super::*;

// ---------------------------------------------------------------------------------------------
// Executing exactly once
// ---------------------------------------------------------------------------------------------

async fn given_a_payment_whose_outcome_is_unknown_when_the_resume_message_comes_again_then_the_tool_is_not_called_again_and_the_sweep_reconciles_it(
    h: &Harness,
) {
    let (calls, lost, report, approval) = paused_where_answers_are_lost(h).await;

    let decided = h.decided(&lost, "dana", &approval.id, approve("d-1")).await;

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
    let p = h.counted_process(&calls).await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    h.decided(&p, "dana", &approval.id, approve("d-1")).await;
    assert_eq!(h.run(&p, &report.run_id).await.status, RunStatus::Done);

    let again = p.resume(&resume_message(&approval)).await.unwrap();

    assert!(matches!(again, ResumeReport::Ignored { .. }), "{again:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(h.payments().await.len(), 1);
    assert_eq!(p.sweep(100).await.unwrap().redelivered, 0);
}

/// Every outbox entry still in the store, whatever it is due.
async fn outbox_entries(p: &Process) -> usize {
    per_shard(p, keys::OUTBOX_INDEX, IndexShards::DEFAULT)
        .await
        .iter()
        .sum()
}

async fn given_a_queued_resume_when_its_consumer_acts_on_it_then_its_outbox_entry_goes_with_that_write_and_the_sweep_sends_nothing_again(
    h: &Harness,
) {
    let (decider, queue, _, _) = approved_through_a_queue(h).await;
    let published = queue.published();

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

    let decided = h.decided(&down, "dana", &approval.id, approve("d-1")).await;
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
    let (p, _, approval, edited) = h.edited_by_dana("c-102", 200).await;
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

    assert_refusal(&refused, "run_finished", ErrorKind::Conflict);
    assert_eq!(h.run(&p, &report.run_id).await.status, RunStatus::Done);
}

// ---------------------------------------------------------------------------------------------
// The audit
// ---------------------------------------------------------------------------------------------

async fn given_an_approved_payment_when_its_approval_history_is_read_then_it_traces_proposal_decision_execution_and_outcome(
    h: &Harness,
) {
    let (p, report, approval) = h.paused_on("c-102").await;
    h.decided(&p, "dana", &approval.id, approve("d-1")).await;

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

// Each scenario on the embedded store and on DynamoDB (moto over HTTP).
on_both_stores!([
    given_a_payment_whose_outcome_is_unknown_when_the_resume_message_comes_again_then_the_tool_is_not_called_again_and_the_sweep_reconciles_it,
    given_a_finished_run_when_its_resume_message_is_delivered_again_then_nothing_runs_twice,
    given_a_queued_resume_when_its_consumer_acts_on_it_then_its_outbox_entry_goes_with_that_write_and_the_sweep_sends_nothing_again,
    given_the_resume_queue_is_down_when_a_payment_is_approved_then_the_decision_stands_and_the_sweep_publishes_it_later,
    given_an_edited_approval_when_either_approval_history_is_read_then_it_traces_both_versions_to_the_outcome,
    given_a_finished_run_when_its_requester_cancels_it_then_it_conflicts_as_run_finished,
    given_an_approved_payment_when_its_approval_history_is_read_then_it_traces_proposal_decision_execution_and_outcome,
]);
