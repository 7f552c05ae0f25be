//! Executing exactly once: resume messages delivered again, the outbox, a queue that is down,
//! and the audit that traces it all.

use shared::ports::store::{Condition, Item, ItemStore, Page, Query, StoreError, Write};

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

/// The outbox index's entries, whatever they are due, and the outbox items of the run.
async fn outbox_of(p: &Process, run: &RunReport) -> (Vec<shared::ports::store::Item>, usize) {
    let index = p
        .index_shards(keys::OUTBOX_INDEX, IndexShards::DEFAULT)
        .await;
    let items = p
        .store
        .query(
            &keys::run_pk(&run.tenant, &run.run_id),
            keys::OUTBOX_PREFIX,
            None,
            100,
        )
        .await
        .unwrap()
        .items;
    (index.into_iter().flatten().collect(), items.len())
}

async fn given_an_approval_through_a_queue_then_the_action_itself_waits_in_the_outbox_index_until_its_claim_and_the_sweep_sends_a_lost_message_again_which_runs_once(
    h: &Harness,
) {
    let (decider, queue, report, approval) = approved_through_a_queue(h).await;

    // No outbox item: the approved action's own item is the pending delivery.
    let (index, items) = outbox_of(&decider, &report).await;
    assert_eq!(items, 0, "no outbox item for the resume message");
    assert_eq!(index.len(), 1, "{index:?}");
    let waiting = shared::engine::records::decode::<Action>(&index[0]).unwrap();
    assert_eq!(index[0].sk, keys::action_sk(&approval.action_id, v(1)));
    assert_eq!(waiting.value.status, ActionStatus::Approved);

    // The message is lost. Within the grace its writer may still be at it; after, the sweep
    // sends it again, once, and leaves the action in the index until its lease runs out.
    assert_eq!(decider.sweep(100).await.unwrap().redelivered, 0);
    h.clock.advance(Duration::minutes(1));
    let sweeper = h
        .process_with(|tools| tools, Delivery::Queue(queue.clone()))
        .await;
    assert_eq!(sweeper.sweep(100).await.unwrap().redelivered, 1);
    assert_eq!(
        sweeper.sweep(100).await.unwrap().redelivered,
        0,
        "sent once"
    );
    assert_eq!(queue.published(), vec![resume_message(&approval); 2]);
    let (index, _) = outbox_of(&sweeper, &report).await;
    assert_eq!(index.len(), 1, "{index:?}");
    assert!(
        index[0].gsi1.as_ref().unwrap().sk
            > keys::due_until(shared::ports::clock::Clock::now(h.clock.as_ref())),
        "due again when its lease runs out: {index:?}"
    );

    // The message sent again claims the action (at its version after the sweep's write) and
    // runs it; the lost one, should it turn up, finds it claimed.
    let consumer = h.process().await;
    let resumed = consumer.resume(&queue.published()[1]).await.unwrap();
    assert!(
        matches!(resumed, ResumeReport::Continued { .. }),
        "{resumed:?}"
    );
    let again = consumer.resume(&queue.published()[0]).await.unwrap();
    assert!(matches!(again, ResumeReport::Ignored { .. }), "{again:?}");
    assert_eq!(
        h.run(&consumer, &report.run_id).await.status,
        RunStatus::Done
    );
    assert_eq!(h.payments().await.len(), 1, "ran once");
    assert!(outbox_of(&consumer, &report).await.0.is_empty());
    h.clock.advance(Duration::minutes(1));
    assert_eq!(consumer.sweep(100).await.unwrap().redelivered, 0);
}

async fn given_a_resume_message_nothing_acts_on_when_each_lease_runs_out_then_the_sweep_sends_it_again_waiting_longer_each_time_and_after_the_last_leaves_it_to_a_person(
    h: &Harness,
) {
    let (_, queue, report, approval) = approved_through_a_queue(h).await;
    let sweeper = h
        .process_with(|tools| tools, Delivery::Queue(queue.clone()))
        .await;
    let key = format!("{}:1", approval.action_id);

    // Past the grace: handed over under the writer's deduplication id, which a queue drops if
    // the writer's message went out.
    h.clock.advance(Duration::minutes(1));
    let first = sweeper.sweep(100).await.unwrap();
    assert_eq!((first.redelivered, first.resent.len()), (1, 0), "{first:?}");
    // Its workers keep dying: each lease, twice the one before, ends in a re-send under a
    // deduplication id of its own.
    for hours in [1, 2, 4, 8] {
        h.clock
            .advance(Duration::hours(hours) - Duration::minutes(1));
        let early = sweeper.sweep(100).await.unwrap();
        assert_eq!(early.redelivered, 0, "within the lease of {hours} h");
        h.clock.advance(Duration::minutes(2));
        let swept = sweeper.sweep(100).await.unwrap();
        assert_eq!(swept.resent, from_ref(&key), "after {hours} h: {swept:?}");
    }
    let ids: Vec<String> = queue
        .published()
        .iter()
        .map(|m| m.deduplication_id())
        .collect();
    let fresh: Vec<String> = (1..=4).map(|n| format!("{key}#{n}")).collect();
    assert_eq!(ids[..2], [key.clone(), key.clone()]);
    assert_eq!(ids[2..], fresh[..]);
    assert!(queue.published().iter().all(|m| m.key() == key));

    // The last lease runs out: the sweep sends nothing more and says the run needs a person.
    h.clock.advance(Duration::hours(16) + Duration::minutes(1));
    let given_up = sweeper.sweep(100).await.unwrap();
    assert_eq!(given_up.resumes_given_up, from_ref(&key), "{given_up:?}");
    assert_eq!(queue.published().len(), 6, "nothing sent");
    assert!(outbox_of(&sweeper, &report).await.0.is_empty());
    h.clock.advance(Duration::days(3));
    assert_eq!(sweeper.sweep(100).await.unwrap().redelivered, 0);
    let history = sweeper.history(&acme(), &report.run_id).await.unwrap();
    let names = event_names(&history.entries);
    let resent: Vec<&AuditEntry> = history
        .entries
        .iter()
        .filter(|e| e.event.name() == "resume_resent")
        .collect();
    assert_eq!(resent.len(), 4, "{names:?}");
    assert!(resent.iter().all(|e| e.actor == Actor::system("sweep")));
    assert_eq!(
        history.entries.last().unwrap().event,
        AuditEvent::ResumeGivenUp {
            action_id: approval.action_id.clone(),
            version: v(1),
            resent: 4,
        }
    );
    assert!(
        h.payments().await.is_empty(),
        "the approved call has not run"
    );

    // A person moves the last message back from the dead-letter queue: the call runs once.
    let consumer = h.process().await;
    let last = queue.published().last().unwrap().clone();
    let resumed = consumer.resume(&last).await.unwrap();
    assert!(
        matches!(resumed, ResumeReport::Continued { .. }),
        "{resumed:?}"
    );
    for earlier in queue.published() {
        let again = consumer.resume(&earlier).await.unwrap();
        assert!(matches!(again, ResumeReport::Ignored { .. }), "{again:?}");
    }
    assert_eq!(
        paid(&h.payments().await),
        [("c-102".to_string(), 25_000, key)]
    );
}

async fn given_an_approval_through_a_queue_when_its_consumer_claims_it_and_the_outcome_is_unknown_then_the_action_moves_from_the_outbox_index_to_the_reconcile_index(
    h: &Harness,
) {
    let (_, queue, report, approval) = approved_through_a_queue(h).await;
    // A tool whose answer is lost leaves the action claimed: executing, then unknown.
    let calls = Arc::new(AtomicUsize::new(0));
    let lost = h
        .reimbursing_through(AnswerLost(Counted::new(&calls)))
        .await;

    let resumed = lost.resume(&queue.published()[0]).await.unwrap();

    assert!(
        matches!(resumed, ResumeReport::Unknown { .. }),
        "{resumed:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(outbox_of(&lost, &report).await.0.is_empty());
    let reconciling = lost
        .index_shards(keys::RECONCILE_INDEX, IndexShards::DEFAULT)
        .await;
    let claimed: Vec<&str> = reconciling
        .iter()
        .flatten()
        .map(|i| i.sk.as_str())
        .collect();
    assert_eq!(claimed, [keys::action_sk(&approval.action_id, v(1))]);
}

/// A store where, just before the first claim of an action (its write to `executing`), another
/// process rewrites the action's item, its version one on, as the sweep does when it hands the
/// message over again (there with a new lease in the outbox index; here out of it).
struct TakenOutBeforeTheClaim {
    inner: Arc<dyn ItemStore>,
    done: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl ItemStore for TakenOutBeforeTheClaim {
    async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, StoreError> {
        self.inner.get(pk, sk).await
    }

    async fn page(&self, query: Query<'_>) -> Result<Page, StoreError> {
        self.inner.page(query).await
    }

    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        let claim = writes.iter().find_map(|w| match w {
            Write::Put { item, .. }
                if item.sk.starts_with(keys::ACTION_PREFIX)
                    && item.body.contains("\"status\":\"executing\"") =>
            {
                Some((item.pk.clone(), item.sk.clone()))
            }
            _ => None,
        });
        if let Some((pk, sk)) = claim
            && !self.done.swap(true, Ordering::SeqCst)
        {
            let stored = self.inner.get(&pk, &sk).await?.expect("the action");
            let taken_out = Item {
                gsi1: None,
                ver: stored.ver + 1,
                ..stored.clone()
            };
            let condition = Condition::VersionIs(stored.ver);
            self.inner
                .transact(vec![Write::Put {
                    item: taken_out,
                    condition,
                }])
                .await?;
        }
        self.inner.transact(writes).await
    }
}

async fn given_an_approved_action_taken_out_of_the_outbox_index_between_its_read_and_its_claim_when_the_message_is_consumed_then_it_is_claimed_at_its_new_version_and_runs_once(
    h: &Harness,
) {
    let (_, queue, report, _) = approved_through_a_queue(h).await;
    let consumer = h
        .process_configured(
            Arc::new(shared::example::expense::OfflineExpenseAgent),
            |inner| {
                Arc::new(TakenOutBeforeTheClaim {
                    inner,
                    done: Default::default(),
                })
            },
            |b| b,
        )
        .await;

    let resumed = consumer.resume(&queue.published()[0]).await.unwrap();

    assert!(
        matches!(resumed, ResumeReport::Continued { .. }),
        "{resumed:?}"
    );
    assert_eq!(
        h.run(&consumer, &report.run_id).await.status,
        RunStatus::Done
    );
    assert_eq!(h.payments().await.len(), 1, "ran once");
    let again = consumer.resume(&queue.published()[0]).await.unwrap();
    assert!(matches!(again, ResumeReport::Ignored { .. }), "{again:?}");
    assert_eq!(h.payments().await.len(), 1);
}

async fn given_a_rejection_through_a_queue_when_its_resume_holds_the_result_then_the_action_leaves_the_outbox_index(
    h: &Harness,
) {
    let queue = Arc::new(RecordingQueue::default());
    let decider = h
        .process_with(|tools| tools, Delivery::Queue(queue.clone()))
        .await;
    let (report, approval) = h.start_paused(&decider, "c-102").await;
    h.decided(
        &decider,
        "dana",
        &approval.id,
        reject("d-1", "not this one"),
    )
    .await;
    let (index, items) = outbox_of(&decider, &report).await;
    assert_eq!((index.len(), items), (1, 0), "{index:?}");
    assert_eq!(
        shared::engine::records::decode::<Action>(&index[0])
            .unwrap()
            .value
            .status,
        ActionStatus::Rejected
    );

    let consumer = h.process().await;
    let resumed = consumer.resume(&queue.published()[0]).await.unwrap();

    assert!(
        matches!(resumed, ResumeReport::Continued { .. }),
        "{resumed:?}"
    );
    assert!(outbox_of(&consumer, &report).await.0.is_empty());
    let again = consumer.resume(&queue.published()[0]).await.unwrap();
    assert!(matches!(again, ResumeReport::Ignored { .. }), "{again:?}");
    h.clock.advance(Duration::minutes(1));
    assert_eq!(consumer.sweep(100).await.unwrap().redelivered, 0);
    assert!(h.payments().await.is_empty());
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
    assert_eq!(queue.published(), [resume_message(&approval)]);

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
        shared::testing::APPROVED_RUN_EVENTS
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
    given_an_approval_through_a_queue_then_the_action_itself_waits_in_the_outbox_index_until_its_claim_and_the_sweep_sends_a_lost_message_again_which_runs_once,
    given_an_approval_through_a_queue_when_its_consumer_claims_it_and_the_outcome_is_unknown_then_the_action_moves_from_the_outbox_index_to_the_reconcile_index,
    given_a_resume_message_nothing_acts_on_when_each_lease_runs_out_then_the_sweep_sends_it_again_waiting_longer_each_time_and_after_the_last_leaves_it_to_a_person,
    given_a_rejection_through_a_queue_when_its_resume_holds_the_result_then_the_action_leaves_the_outbox_index,
    given_an_approved_action_taken_out_of_the_outbox_index_between_its_read_and_its_claim_when_the_message_is_consumed_then_it_is_claimed_at_its_new_version_and_runs_once,
    given_an_edited_approval_when_either_approval_history_is_read_then_it_traces_both_versions_to_the_outcome,
    given_a_finished_run_when_its_requester_cancels_it_then_it_conflicts_as_run_finished,
    given_an_approved_payment_when_its_approval_history_is_read_then_it_traces_proposal_decision_execution_and_outcome,
]);
