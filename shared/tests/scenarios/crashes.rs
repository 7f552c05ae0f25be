//! Processes that die: a payment in flight, a run mid-turn; the sweep settles stale executions
//! and expired leases, and never pays blindly.

use super::*;
use shared::engine::WaitingOn;
use shared::ports::queue::DriveMessage;

/// Starts c-102 on a process whose reimburse is wrapped in `around`, and has dana approve it
/// on a task of its own: the run, its approval, and the task deciding.
async fn approving_on(
    h: &Harness,
    around: impl Around,
) -> (
    shared::engine::RunReport,
    Approval,
    tokio::task::JoinHandle<Result<DecisionReport, EngineError>>,
) {
    let process = Arc::new(h.reimbursing_through(around).await);
    let (report, approval) = h.start_paused(&process, "c-102").await;
    let decide = tokio::spawn(deciding(
        &process,
        h.person("dana"),
        &approval.id,
        approve("d-1"),
    ));
    (report, approval, decide)
}

/// The actions among the entries of `index`, every shard, by their item's sort key.
async fn actions_in(p: &Process, index: &str) -> Vec<String> {
    let entries = p.index_shards(index, IndexShards::DEFAULT).await;
    entries
        .into_iter()
        .flatten()
        .filter(|item| item.sk.starts_with(keys::ACTION_PREFIX))
        .map(|item| item.sk)
        .collect()
}

/// Starts c-102, has dana approve it on a process whose reimburse hangs, and kills that process
/// once the call is in flight. The action is left `executing`.
async fn approve_on_a_process_that_dies_while_paying(
    h: &Harness,
    hang: fn(Arc<AtomicUsize>) -> Hangs,
) -> (shared::engine::RunReport, Approval) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let (report, approval, decide) = approving_on(h, hang(in_flight.clone())).await;
    while in_flight.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(StdDuration::from_millis(5)).await;
    }
    decide.abort();
    let _ = decide.await;
    let reader = h.process().await;
    let history = reader.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(
        action_of(&history, &approval).status,
        ActionStatus::Executing
    );
    (report, approval)
}

async fn given_a_process_that_died_before_paying_when_the_sweep_finds_the_stale_execution_then_it_asks_the_tool_and_never_pays_blindly(
    h: &Harness,
) {
    let (report, approval) =
        approve_on_a_process_that_dies_while_paying(h, Hangs::before_effect).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let sweeper = h.counted_process(&calls).await;
    // The claim kept the outbox entry its decision gave the action; the sweep sends nothing
    // again for a claimed action, and moves it to the reconcile index until it goes stale.
    let claimed = [keys::action_sk(&approval.action_id, v(1))];
    assert_eq!(actions_in(&sweeper, keys::OUTBOX_INDEX).await, claimed);
    assert!(actions_in(&sweeper, keys::RECONCILE_INDEX).await.is_empty());
    let early = sweeper.sweep(100).await.unwrap();
    assert!(
        early.reconciled.is_empty() && early.unknown.is_empty() && early.redelivered == 0,
        "{early:?}"
    );
    assert!(actions_in(&sweeper, keys::OUTBOX_INDEX).await.is_empty());
    assert_eq!(actions_in(&sweeper, keys::RECONCILE_INDEX).await, claimed);
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
    assert_eq!(action_of(&history, &approval).status, ActionStatus::Failed);
    assert_eq!(history.run.status, RunStatus::Done);
    assert_told_error(&history.run, "reimburse", "nothing was recorded");
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
    let sweeper = h.counted_process(&calls).await;
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

pub(crate) async fn given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once(
    h: &Harness,
) {
    let (report, approval) =
        approve_on_a_process_that_dies_while_paying(h, Hangs::before_effect).await;
    let together = Arc::new(tokio::sync::Barrier::new(2));
    let sweeper = || {
        h.reimbursing_through(ReconcilesTogether {
            together: together.clone(),
        })
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
    assert_eq!(action_of(&history, &approval).status, ActionStatus::Unknown);
    assert_eq!(times(&history.entries, ["unknown"]), [1]);
    assert_eq!(history.run.status, RunStatus::AwaitingApproval);
}

async fn given_a_slow_payment_the_sweep_reconciled_as_not_paid_when_the_call_lands_afterwards_then_it_does_not_pay_and_another_call_still_can(
    h: &Harness,
) {
    let gate = Gate::new();
    let (report, approval, decide) = approving_on(h, Slow { gate: gate.clone() }).await;
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
    assert_eq!(action_of(&history, &approval).status, ActionStatus::Failed);
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

    // The claim stays open: voiding that call on it holds back no other. Another run pays it,
    // once, and the voided call is still void.
    let (p, _, again) = h.paused_on("c-102").await;
    h.decided(&p, "dana", &again.id, approve("d-2")).await;
    let other_key = format!("{}:1", again.action_id);
    assert_eq!(
        paid(&h.payments().await),
        [("c-102".to_string(), 25_000, other_key)]
    );
    let ledger = h.ledger().await;
    let voided = ledger.call(&acme(), "c-102", &key).await.unwrap();
    assert!(
        matches!(
            voided,
            Some(shared::example::expense::KeyState::Void { .. })
        ),
        "{voided:?}"
    );
}

async fn given_an_allowed_payment_slower_than_the_lease_when_the_sweep_settles_it_and_fails_the_run_then_the_late_call_pays_nothing_and_its_process_reports_a_conflict(
    h: &Harness,
) {
    let gate = Gate::new();
    let script = Script::default().then_call(&[reimburse("c-101", 4_200)]);
    let slow = {
        let gate = gate.clone();
        Arc::new(
            h.process_of(
                Arc::new(script),
                on_reimburse(Slow { gate }),
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
    assert_refusal(&refused, "run_finished", ErrorKind::Conflict);
    assert!(refused.to_string().ends_with("is failed"), "{refused}");
    let late = gate.outcomes();
    assert!(
        matches!(late.as_slice(), [ToolOutcome::Failed { .. }]),
        "{late:?}"
    );
    assert!(h.payments().await.is_empty());
    let history = slow.history(&acme(), &swept.abandoned[0]).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Failed);
    // Its model's call ran after the conversation was stored: never replayed.
    let error = history.run.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("an action of it was created after its conversation was last stored"),
        "{error}"
    );
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

async fn given_a_process_that_died_during_a_model_turn_when_its_lease_runs_out_then_the_sweep_drives_it_again_from_its_conversation_and_a_run_within_its_lease_is_left_alone(
    h: &Harness,
) {
    let sweeper = h.scripted_process(Script::default()).await;
    start_on_a_process_that_dies_while_driving(h).await;
    h.clock.advance(Duration::minutes(14));
    let early = sweeper.sweep(100).await.unwrap();
    assert!(
        early.redriven.is_empty() && early.abandoned.is_empty(),
        "{early:?}"
    );
    h.clock.advance(Duration::minutes(2));
    // A second run starts now and dies the same way; its lease has 15 minutes to go.
    start_on_a_process_that_dies_while_driving(h).await;

    let swept = sweeper.sweep(100).await.unwrap();

    assert!(swept.abandoned.is_empty(), "{swept:?}");
    assert_eq!(swept.redriven.len(), 1, "{swept:?}");
    let history = sweeper.history(&acme(), &swept.redriven[0]).await.unwrap();
    assert_eq!(history.run.created_at, start_of_test(), "the first run");
    assert_eq!(history.run.status, RunStatus::Done);
    assert_eq!(history.run.answer.as_deref(), Some("The script is over."));
    assert_eq!(
        event_names(&history.entries),
        ["started", "resumed", "done"]
    );
    let resumed = &history.entries[1];
    assert_eq!(resumed.actor, Actor::system("sweep"));
    let AuditEvent::Resumed { why: Some(why), .. } = &resumed.event else {
        panic!("{:?}", resumed.event)
    };
    assert!(
        why.contains("the process driving this run stopped during a model turn")
            && why.contains("(1 of 3)"),
        "{why}"
    );
    let again = sweeper.sweep(100).await.unwrap();
    assert!(
        again.redriven.is_empty() && again.abandoned.is_empty(),
        "the second run is within its lease: {again:?}"
    );
}

async fn given_a_run_whose_drivers_keep_stopping_when_it_was_driven_again_three_times_then_the_sweep_fails_it(
    h: &Harness,
) {
    let queue = Arc::new(RecordingQueue::default());
    let sweeper = h
        .process_configured(
            Arc::new(Script::default()),
            |store| store,
            |b| b.delivery(Delivery::Queue(queue.clone())),
        )
        .await;
    start_on_a_process_that_dies_while_driving(h).await;
    for n in 1..=3 {
        h.clock.advance(Duration::minutes(16));
        let swept = sweeper.sweep(100).await.unwrap();
        assert_eq!(swept.redriven.len(), 1, "re-drive {n}: {swept:?}");
    }
    // Each re-drive was sent for the lease after the dead process's, none taken since.
    let drives = queue.drives();
    assert_eq!(drives.len(), 3, "{drives:?}");
    assert!(drives.iter().all(|d| d.drive == 1), "{drives:?}");

    h.clock.advance(Duration::minutes(16));
    let swept = sweeper.sweep(100).await.unwrap();

    assert!(swept.redriven.is_empty(), "{swept:?}");
    assert_eq!(swept.abandoned, from_ref(&drives[0].run_id));
    let run = h.run(&sweeper, &drives[0].run_id).await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap();
    assert!(
        error.contains("stopped before it finished") && error.contains("3 times already"),
        "{error}"
    );
}

async fn given_a_drive_message_delivered_twice_when_both_are_consumed_then_the_run_is_driven_once_and_pays_once(
    h: &Harness,
) {
    let script = Script::default().then_call(&[reimburse("c-101", 4_200)]);
    let queue = Arc::new(RecordingQueue::default());
    let p = h
        .process_configured(
            Arc::new(script),
            |store| store,
            |b| b.delivery(Delivery::Queue(queue.clone())),
        )
        .await;
    let accepted = p.accept(scripted_task("ana")).await.unwrap();
    assert_eq!(accepted.status, RunStatus::Running);
    assert_eq!(
        h.run(&p, &accepted.run_id).await.status,
        RunStatus::Running,
        "stored before anything of it ran"
    );
    let message = DriveMessage {
        tenant: accepted.tenant.clone(),
        run_id: accepted.run_id.clone(),
        drive: 0,
    };

    let first = p.drive_run(&message).await.unwrap();
    let second = h.process().await.drive_run(&message).await.unwrap();

    let ResumeReport::Continued { run } = first else {
        panic!("{first:?}")
    };
    assert_eq!(run.status, RunStatus::Done);
    assert!(
        matches!(&second, ResumeReport::Ignored { reason } if reason.contains("the run is done")),
        "{second:?}"
    );
    assert_eq!(h.payments().await.len(), 1);
}

async fn given_a_run_accepted_and_then_driven_when_it_is_read_then_it_waits_on_its_model_then_on_its_approval_then_on_nothing(
    h: &Harness,
) {
    let queue = Arc::new(RecordingQueue::default());
    let p = h
        .process_with(|tools| tools, Delivery::Queue(queue.clone()))
        .await;
    let task = task_for(&h.claims, "c-102").unwrap();
    let accepted = p.accept(task).await.unwrap();
    let (tenant, id) = (&accepted.tenant, &accepted.run_id);

    let running = p.run_state(tenant, id).await.unwrap();

    assert_eq!(running.run.status, RunStatus::Running);
    assert_eq!(running.waiting_on, [WaitingOn::ModelTurn]);
    let message = DriveMessage {
        tenant: tenant.clone(),
        run_id: id.clone(),
        drive: 0,
    };
    h.process().await.drive_run(&message).await.unwrap();
    let paused = p.run_state(tenant, id).await.unwrap();
    assert_eq!(paused.run.status, RunStatus::AwaitingApproval);
    let approval = &paused.run.approvals[0];
    assert_eq!(
        paused.waiting_on,
        [WaitingOn::Approval {
            approval_id: approval.id.clone(),
            tool: "reimburse".into(),
            approver_role: finance(),
            quorum: 1,
            expires_at: approval.expires_at,
        }]
    );
    let other = TenantId::parse("globex").unwrap();
    let refused = p.run_state(&other, id).await.unwrap_err();
    assert_refusal(&refused, "not_found", ErrorKind::NotFound);

    h.decided(&p, "dana", &approval.id, approve("d-1")).await;
    let resume = queue.published().pop().unwrap();
    h.process().await.resume(&resume).await.unwrap();
    let done = p.run_state(tenant, id).await.unwrap();
    assert_eq!(done.run.status, RunStatus::Done);
    assert!(done.waiting_on.is_empty(), "{done:?}");
}

async fn given_a_run_that_resumed_on_a_process_that_died_when_its_lease_runs_out_then_the_sweep_drives_it_again_but_never_while_it_waited_on_a_person(
    h: &Harness,
) {
    let script = Script::default().then_call(&[reimburse("c-102", 25_000)]);
    let model = Stalls::after(script.clone(), 1);
    let dying = Arc::new(
        h.process_of(model.clone(), |tools| tools, Delivery::InProcess)
            .await,
    );
    let report = dying.start(scripted_task("ben")).await.unwrap();
    assert_eq!(report.status, RunStatus::AwaitingApproval);
    let sweeper = h.scripted_process(script).await;
    h.clock.advance(Duration::hours(2));
    let waiting = sweeper.sweep(100).await.unwrap();
    assert!(
        waiting.abandoned.is_empty() && waiting.redriven.is_empty(),
        "a run waiting on a person holds no lease"
    );

    let decide = tokio::spawn(deciding(
        &dying,
        h.person("dana"),
        &report.approvals[0].id,
        approve("d-1"),
    ));
    model.until_stalled(1).await;
    decide.abort();
    let _ = decide.await;
    assert_eq!(
        h.run(&sweeper, &report.run_id).await.status,
        RunStatus::Running
    );
    h.clock.advance(Duration::minutes(14));
    assert!(
        sweeper.sweep(100).await.unwrap().redriven.is_empty(),
        "resuming renewed the lease"
    );
    h.clock.advance(Duration::minutes(2));

    let swept = sweeper.sweep(100).await.unwrap();

    // The payment's result was stored with the resume: replaying the next turn pays nothing.
    assert_eq!(swept.redriven, from_ref(&report.run_id));
    let history = sweeper.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done);
    assert_eq!(
        event_names(&history.entries).last_chunk::<2>(),
        Some(&["resumed", "done"])
    );
    assert_eq!(
        h.payments().await.len(),
        1,
        "the approved payment ran before, and only then"
    );
}

/// Takes steps (the first is 1) until every shard of `index` holds an entry, at most 40: ids
/// are random, so how many that takes varies. How many it took.
async fn until_every_shard_holds_one(
    p: &Process,
    index: &str,
    shards: IndexShards,
    mut step: impl AsyncFnMut(usize),
) -> usize {
    let mut steps = 0;
    while per_shard(p, index, shards).await.contains(&0) {
        assert!(
            steps < 40,
            "40 steps and still a shard of {index} without an entry"
        );
        steps += 1;
        step(steps).await;
    }
    steps
}

async fn given_overdue_runs_and_outbox_entries_in_every_shard_of_the_index_when_the_sweep_runs_then_it_finds_them_all(
    h: &Harness,
) {
    let shards = IndexShards::new(3).unwrap();
    let sharded = |b: shared::engine::EngineBuilder| b.index_shards(shards);
    let model = Stalls::at_once();
    let dying = Arc::new(
        h.process_configured(model.clone(), |store| store, sharded)
            .await,
    );
    let sweeper = h
        .process_configured(
            model.clone(),
            |store| store,
            |b| sharded(b).delivery(Delivery::Queue(Arc::new(RecordingQueue::default()))),
        )
        .await;
    // Runs whose process dies while driving them, until every shard holds one.
    let died = until_every_shard_holds_one(&sweeper, keys::RUNNING_INDEX, shards, async |n| {
        let start = {
            let dying = dying.clone();
            tokio::spawn(async move { dying.start(scripted_task("ana")).await })
        };
        model.until_stalled(n).await;
        start.abort();
        let _ = start.await;
    })
    .await;
    // Approved payments whose resume message never left, until every shard holds one.
    let down = h
        .process_configured(
            Arc::new(shared::example::expense::OfflineExpenseAgent),
            |store| store,
            |b| sharded(b).delivery(Delivery::Queue(Arc::new(QueueDown))),
        )
        .await;
    let approved = until_every_shard_holds_one(&sweeper, keys::OUTBOX_INDEX, shards, async |_| {
        let (_, approval) = h.start_paused(&down, "c-102").await;
        h.decided(&down, "dana", &approval.id, approve("d-1")).await;
    })
    .await;
    let unsharded = sweeper
        .store
        .query_index(keys::OUTBOX_INDEX, "", "\u{10FFFF}", None, 10)
        .await
        .unwrap();
    assert!(
        unsharded.items.is_empty(),
        "nothing under the unsharded key"
    );
    h.clock.advance(Duration::minutes(16));
    let leased = per_shard(&sweeper, keys::RUNNING_INDEX, shards).await;

    let swept = sweeper.sweep(100).await.unwrap();

    // Each died during a model turn: driven again, under a new lease in its own shard.
    assert_eq!(swept.redriven.len(), died, "{swept:?}");
    assert_eq!(swept.redelivered, approved, "{swept:?}");
    assert_eq!(
        per_shard(&sweeper, keys::RUNNING_INDEX, shards).await,
        leased
    );
    let again = sweeper.sweep(100).await.unwrap();
    assert!(
        again.redriven.is_empty() && again.abandoned.is_empty(),
        "{again:?}"
    );
}

/// A Slack click on the local server: its decision is recorded, and its run's resume is left
/// for after Slack's answer. A retry of the click leaves the same resume; delivered twice, it
/// pays once.
async fn given_a_decision_whose_resume_is_deferred_when_it_is_delivered_after_a_retry_then_the_run_finishes_and_pays_once(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    let dana = h.person("dana");

    let (decided, first) = p.decide_deferred(&dana, &approval.id, approve("d-1")).await;
    let decided = decided.unwrap();
    assert_eq!(decided.decision.effect, DecisionEffect::Approved);
    assert!(
        decided.run.is_none(),
        "the run was not resumed: {decided:?}"
    );
    assert!(!first.is_empty());
    assert!(
        h.payments().await.is_empty(),
        "nothing paid before delivery"
    );
    let waiting = h.run(&p, &report.run_id).await;
    assert_eq!(waiting.status, RunStatus::AwaitingApproval);

    let (again, retried) = p.decide_deferred(&dana, &approval.id, approve("d-1")).await;
    assert!(again.unwrap().replayed);
    assert!(
        !retried.is_empty(),
        "the replay leaves the resume still due"
    );

    assert_eq!(p.deliver_deferred(retried).await, Vec::<String>::new());
    assert_eq!(p.deliver_deferred(first).await, Vec::<String>::new());
    let key = format!("{}:1", approval.action_id);
    assert_eq!(
        paid(&h.payments().await),
        [("c-102".to_string(), 25_000, key)]
    );
    assert_eq!(h.run(&p, &report.run_id).await.status, RunStatus::Done);
}

/// The process stops after the decision and before its deferred resume ran: the settled action
/// waits in the outbox index, and the sweep resumes the run.
async fn given_a_deferred_resume_that_never_ran_when_the_sweep_runs_then_it_resumes_the_run_once(
    h: &Harness,
) {
    let p = h.process().await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    let (decided, deferred) = p
        .decide_deferred(&h.person("dana"), &approval.id, approve("d-1"))
        .await;
    decided.unwrap();
    drop(deferred);
    assert!(h.payments().await.is_empty());

    let sweeper = h.process().await;
    let swept = sweeper.sweep(100).await.unwrap();

    assert_eq!(swept.redelivered, 1, "{swept:?}");
    let key = format!("{}:1", approval.action_id);
    assert_eq!(
        paid(&h.payments().await),
        [("c-102".to_string(), 25_000, key)]
    );
    assert_eq!(
        h.run(&sweeper, &report.run_id).await.status,
        RunStatus::Done
    );
    let again = sweeper.sweep(100).await.unwrap();
    assert_eq!(again.redelivered, 0, "{again:?}");
}

// Only an embedded engine resumes in process, and so only it defers a resume.
on_backend!(
    embedded_deferred,
    Embedded::fresh(),
    [
        given_a_decision_whose_resume_is_deferred_when_it_is_delivered_after_a_retry_then_the_run_finishes_and_pays_once,
        given_a_deferred_resume_that_never_ran_when_the_sweep_runs_then_it_resumes_the_run_once,
    ]
);

async fn given_a_store_that_refuses_to_record_a_payment_that_ran_when_it_is_refused_then_the_call_is_held_as_unknown_at_once_with_the_true_reason_and_settled_once(
    h: &Harness,
) {
    let refusing = h
        .process_configured(
            Arc::new(shared::example::expense::OfflineExpenseAgent),
            // Once, as DynamoDB refuses a write past the table's rate.
            |store| {
                RefusesWrites::an_action_once(store, |body| {
                    body.contains(r#""tool":"reimburse""#)
                        && body.contains(r#""status":"succeeded""#)
                })
            },
            |builder| builder,
        )
        .await;
    let (report, approval) = h.start_paused(&refusing, "c-102").await;

    let decided = refusing
        .decide(&h.person("dana"), &approval.id, approve("d-1"))
        .await
        .expect("the decision is recorded");

    assert_eq!(h.payments().await.len(), 1, "the payment ran once");
    let reader = h.process().await;
    let history = reader.history(&acme(), &report.run_id).await.unwrap();
    let action = action_of(&history, &approval);
    assert_eq!(action.status, ActionStatus::Unknown, "{decided:?}");
    let detail = history
        .entries
        .iter()
        .find_map(|e| match &e.event {
            AuditEvent::Unknown { detail, .. } => Some(detail.clone()),
            _ => None,
        })
        .expect("an unknown event");
    assert!(
        detail.contains("could not be stored")
            && detail.contains("ProvisionedThroughputExceededException"),
        "{detail}"
    );
    assert_eq!(
        actions_in(&reader, keys::RECONCILE_INDEX).await,
        [keys::action_sk(&approval.action_id, v(1))],
        "held for reconciliation at once, not left executing"
    );

    // The sweep asks the tool, which finds the payment by its key: recorded once, run done.
    h.clock.advance(Duration::minutes(6));
    let swept = reader.sweep(100).await.unwrap();
    assert_eq!(swept.reconciled, [format!("{}:1", approval.action_id)]);
    let run = h.run(&reader, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    assert_eq!(h.payments().await.len(), 1, "never paid twice");
}

on_both_stores!([
    given_a_store_that_refuses_to_record_a_payment_that_ran_when_it_is_refused_then_the_call_is_held_as_unknown_at_once_with_the_true_reason_and_settled_once,
    given_a_process_that_died_before_paying_when_the_sweep_finds_the_stale_execution_then_it_asks_the_tool_and_never_pays_blindly,
    given_a_process_that_died_after_paying_when_the_sweep_finds_the_stale_execution_then_it_records_the_payment_it_finds,
    given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once,
    given_a_slow_payment_the_sweep_reconciled_as_not_paid_when_the_call_lands_afterwards_then_it_does_not_pay_and_another_call_still_can,
    given_an_allowed_payment_slower_than_the_lease_when_the_sweep_settles_it_and_fails_the_run_then_the_late_call_pays_nothing_and_its_process_reports_a_conflict,
    given_a_process_that_died_during_a_model_turn_when_its_lease_runs_out_then_the_sweep_drives_it_again_from_its_conversation_and_a_run_within_its_lease_is_left_alone,
    given_a_run_whose_drivers_keep_stopping_when_it_was_driven_again_three_times_then_the_sweep_fails_it,
    given_a_drive_message_delivered_twice_when_both_are_consumed_then_the_run_is_driven_once_and_pays_once,
    given_a_run_accepted_and_then_driven_when_it_is_read_then_it_waits_on_its_model_then_on_its_approval_then_on_nothing,
    given_a_run_that_resumed_on_a_process_that_died_when_its_lease_runs_out_then_the_sweep_drives_it_again_but_never_while_it_waited_on_a_person,
    given_overdue_runs_and_outbox_entries_in_every_shard_of_the_index_when_the_sweep_runs_then_it_finds_them_all,
]);
