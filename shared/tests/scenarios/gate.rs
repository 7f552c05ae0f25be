//! The gate: calls from an agent Countersign does not drive, one at a time, each the one action
//! of a run of its own; a repeated identical call attaches to the first.

use super::*;
use shared::domain::ids::{AgentName, RunId};
use shared::domain::run::GateVia;
use shared::engine::{ATTACHABLE, CallState, CallStatus, GLANCE, GateCall, REREAD};

/// `ben` asks the expense agent for `tool` with `args`, through the MCP gateway.
fn call(tool: &str, args: serde_json::Value) -> GateCall {
    GateCall {
        tenant: acme(),
        agent: AgentName::parse("expense").unwrap(),
        requested_by: person("ben"),
        tool: tool.into(),
        args,
        call_id: None,
        conversation: None,
        via: GateVia::Mcp,
        standing: Default::default(),
    }
}

fn pay_c102() -> GateCall {
    call(
        "reimburse",
        json!({"claim_id": "c-102", "amount_cents": 25_000}),
    )
}

fn decline_c103() -> GateCall {
    call(
        "decline",
        json!({"claim_id": "c-103", "reason": "duplicate"}),
    )
}

/// A caller waiting up to 20 s on `call`'s outcome: the state it got, and when.
fn waiting(
    p: &Arc<Process>,
    call: &CallState,
) -> tokio::task::JoinHandle<(Result<CallState, EngineError>, tokio::time::Instant)> {
    let (p, run) = (p.clone(), call.run_id.clone());
    tokio::spawn(async move {
        let state = p
            .wait_for_call(&acme(), &run, StdDuration::from_secs(20))
            .await;
        (state, tokio::time::Instant::now())
    })
}

async fn gated(p: &Process, call: GateCall) -> CallState {
    p.gate_call(call).await.expect("the gate takes the call")
}

async fn given_an_allowed_call_from_outside_when_it_is_made_then_it_runs_once_and_its_result_comes_back(
    h: &Harness,
) {
    let p = h.process().await;

    let state = gated(&p, call("get_claim", json!({"claim_id": "c-102"}))).await;

    assert_eq!(state.status, CallStatus::Succeeded, "{state:?}");
    assert!(!state.attached);
    assert!(
        state
            .result
            .as_ref()
            .unwrap()
            .content
            .contains("\"id\":\"c-102\"")
    );
    let history = p.history(&acme(), &state.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done);
    assert_eq!(history.run.requested_by, person("ben"));
    assert_eq!(
        event_names(&history.entries),
        ["started", "proposed", "executing", "executed", "done"]
    );
}

async fn given_a_gated_call_when_it_is_made_again_before_and_after_its_approval_then_one_approval_and_one_payment_and_the_outcome_comes_back(
    h: &Harness,
) {
    let p = h.process().await;

    let first = gated(&p, pay_c102()).await;
    assert_eq!(first.status, CallStatus::AwaitingApproval, "{first:?}");
    let approval = first.approval.clone().expect("who must decide, by when");
    assert_eq!(approval.approver_role, finance());
    assert_eq!(approval.requested_by, [person("ben")]);
    assert!(h.payments().await.is_empty(), "nothing ran");

    let again = gated(&p, pay_c102()).await;
    assert!(again.attached);
    assert_eq!(again.run_id, first.run_id);
    assert_eq!(again.approval.as_ref().map(|a| &a.id), Some(&approval.id));
    assert_eq!(p.pending(&acme()).await.unwrap().len(), 1, "one approval");

    let other = h.process().await;
    h.decided(&other, "dana", &approval.id, approve("d-1"))
        .await;

    let after = gated(&p, pay_c102()).await;
    assert!(after.attached);
    assert_eq!(after.status, CallStatus::Succeeded, "{after:?}");
    assert_eq!(after.version, Some(1));
    assert!(
        after
            .result
            .unwrap()
            .content
            .contains("\"paid_cents\":25000")
    );
    let payments = h.payments().await;
    assert_eq!(payments.len(), 1, "paid once");
    assert_eq!(
        payments[0].idempotency_key,
        format!("{}:1", after.action_id.clone().unwrap())
    );
    let run = h.run(&p, &first.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
}

async fn given_two_identical_calls_at_once_when_both_are_taken_then_they_are_one_call(h: &Harness) {
    let (a, b) = (h.process().await, h.process().await);

    let (one, two) = tokio::join!(gated(&a, pay_c102()), gated(&b, pay_c102()));

    assert_eq!(one.run_id, two.run_id);
    assert!(one.attached != two.attached, "{one:?} {two:?}");
    assert_eq!(a.pending(&acme()).await.unwrap().len(), 1);
}

async fn given_a_call_with_the_callers_own_id_when_it_comes_again_then_it_is_the_same_call_and_with_other_arguments_a_conflict(
    h: &Harness,
) {
    let p = h.process().await;
    let with_id = |args| GateCall {
        call_id: Some("call_7f3".into()),
        conversation: Some("thread-42".into()),
        via: GateVia::Api,
        ..call("get_claim", args)
    };

    let first = gated(&p, with_id(json!({"claim_id": "c-101"}))).await;
    let again = gated(&p, with_id(json!({"claim_id": "c-101"}))).await;
    let other = p
        .gate_call(with_id(json!({"claim_id": "c-103"})))
        .await
        .unwrap_err();
    let other_tool = p
        .gate_call(GateCall {
            tool: "get_policy".into(),
            ..with_id(json!({"claim_id": "c-101"}))
        })
        .await
        .unwrap_err();

    h.clock.advance(ATTACHABLE * 2);
    let later = gated(&p, with_id(json!({"claim_id": "c-101"}))).await;

    assert_eq!(again.run_id, first.run_id);
    assert!(again.attached);
    assert_eq!(later.run_id, first.run_id, "for good");
    assert!(later.attached);
    assert_eq!(again.call_id.as_deref(), Some("call_7f3"));
    assert_eq!(again.conversation.as_deref(), Some("thread-42"));
    assert!(again.result.unwrap().content.contains("\"id\":\"c-101\""));
    assert_refusal(&other, "call_id_reused", ErrorKind::Conflict);
    assert_refusal(&other_tool, "call_id_reused", ErrorKind::Conflict);
    let history = p.history(&acme(), &first.run_id).await.unwrap();
    assert_eq!(history.actions.len(), 1, "no second call");
    assert!(
        history
            .run
            .task
            .starts_with("get_claim through the gate API (conversation thread-42): "),
        "reviewers read the conversation with the task: {}",
        history.run.task
    );
}

async fn given_calls_that_do_not_fit_or_that_policy_denies_or_a_person_rejects_then_each_is_told_why_and_nothing_runs(
    h: &Harness,
) {
    let p = h.process().await;

    let refused = gated(&p, call("reimburse", json!({"claim_id": "c-102"}))).await;
    assert_eq!(refused.status, CallStatus::Refused, "{refused:?}");
    assert!(
        refused
            .result
            .unwrap()
            .content
            .contains("do not match the tool's schema")
    );

    let unknown_tool = gated(&p, call("wire_money", json!({"to": "ben"}))).await;
    assert_eq!(unknown_tool.status, CallStatus::Refused);

    let decline = gated(&p, decline_c103()).await;
    assert_eq!(decline.status, CallStatus::AwaitingApproval);
    let approval = decline.approval.unwrap();
    h.decided(
        &p,
        "dana",
        &approval.id,
        reject("d-r", "It is not a duplicate."),
    )
    .await;
    let rejected = p.call_state(&acme(), &decline.run_id).await.unwrap();
    assert_eq!(rejected.status, CallStatus::Rejected);
    let told = rejected.result.unwrap().content;
    assert!(told.contains("It is not a duplicate."), "{told}");
    assert!(h.payments().await.is_empty());
    assert!(p.pending(&acme()).await.unwrap().is_empty());
}

async fn given_a_gated_call_a_reviewer_lowers_when_it_is_read_then_version_2_ran_with_the_lowered_arguments(
    h: &Harness,
) {
    let p = h.process().await;
    let first = gated(&p, pay_c102()).await;

    h.decided(&p, "dana", &first.approval.unwrap().id, edit("d-e", 200))
        .await;

    let state = p.call_state(&acme(), &first.run_id).await.unwrap();
    assert_eq!(state.status, CallStatus::Succeeded, "{state:?}");
    assert_eq!(state.version, Some(2));
    assert_eq!(state.args.unwrap().int("amount_cents"), Some(20_000));
    assert_eq!(h.payments().await.len(), 1);
}

async fn given_a_caller_waiting_on_a_call_when_another_process_decides_it_then_the_wait_ends_with_the_outcome_within_the_stores_promise(
    h: &Harness,
) {
    let p = Arc::new(h.process().await);
    let first = gated(&p, pay_c102()).await;
    let approval = first.approval.clone().unwrap();
    let waiter = waiting(&p, &first);
    tokio::time::sleep(StdDuration::from_millis(100)).await;
    let other = h.process().await;
    h.decided(&other, "dana", &approval.id, approve("d-1"))
        .await;
    let decided = tokio::time::Instant::now();

    let (state, seen) = waiter.await.unwrap();
    let state = state.unwrap();
    assert_eq!(state.status, CallStatus::Succeeded, "{state:?}");
    // The embedded store tells a waiter of another process's commit at a glance; DynamoDB
    // cannot cheaply, and the waiter reads again every second.
    let lag = seen.saturating_duration_since(decided);
    let promise = match h.backend() {
        "embedded" => GLANCE * 6,
        _ => REREAD + StdDuration::from_millis(500),
    };
    assert!(lag < promise, "seen {lag:?} after, on {}", h.backend());

    // Nobody decides the next one: the wait ends with it still waiting.
    let decline = gated(&p, decline_c103()).await;
    let waited = p
        .wait_for_call(&acme(), &decline.run_id, StdDuration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(waited.status, CallStatus::AwaitingApproval);
}

async fn given_a_caller_waiting_on_a_call_when_this_process_decides_it_then_the_waiter_is_woken_before_any_re_read(
    h: &Harness,
) {
    let p = Arc::new(h.process().await);
    let first = gated(&p, pay_c102()).await;
    let approval = first.approval.clone().unwrap();
    let started = tokio::time::Instant::now();
    let waiter = waiting(&p, &first);
    tokio::time::sleep(StdDuration::from_millis(50)).await;

    h.decided(&p, "dana", &approval.id, approve("d-1")).await;

    let (state, seen) = waiter.await.unwrap();
    let took = seen - started;
    assert_eq!(state.unwrap().status, CallStatus::Succeeded);
    assert!(took < REREAD, "woken, not re-read: {took:?}");
}

async fn given_an_approved_call_known_by_its_arguments_when_the_same_call_comes_after_the_window_then_it_is_a_new_call(
    h: &Harness,
) {
    let p = h.process().await;
    let first = gated(&p, pay_c102()).await;
    h.decided(&p, "dana", &first.approval.unwrap().id, approve("d-1"))
        .await;
    h.clock.advance(Duration::minutes(30));
    let within = gated(&p, pay_c102()).await;
    assert_eq!(within.run_id, first.run_id, "attached within the window");
    assert_eq!(within.status, CallStatus::Succeeded);

    h.clock.advance(ATTACHABLE);
    let after = gated(&p, pay_c102()).await;

    assert_ne!(after.run_id, first.run_id);
    assert!(!after.attached);
    assert_eq!(
        after.status,
        CallStatus::AwaitingApproval,
        "policy rules on it again"
    );
    assert_eq!(h.payments().await.len(), 1, "paid once");
}

async fn given_an_allowed_read_when_what_it_reads_changed_and_it_is_made_again_then_it_runs_again_and_reads_afresh(
    h: &Harness,
) {
    let p = h.process().await;
    let read = || call("get_claim", json!({"claim_id": "c-102"}));
    let before = gated(&p, read()).await;
    assert!(
        before
            .result
            .unwrap()
            .content
            .contains("\"status\":\"open\"")
    );
    let payment = gated(&p, pay_c102()).await;
    h.decided(&p, "dana", &payment.approval.unwrap().id, approve("d-1"))
        .await;

    let after = gated(&p, read()).await;

    assert!(!after.attached, "{after:?}");
    assert_ne!(after.run_id, before.run_id);
    assert_eq!(after.status, CallStatus::Succeeded);
    let told = after.result.unwrap().content;
    assert!(told.contains("\"status\":\"paid $250.00\""), "{told}");
    let history = p.history(&acme(), &after.run_id).await.unwrap();
    assert_eq!(
        event_names(&history.entries),
        ["started", "proposed", "executing", "executed", "done"],
        "ruled on and run again"
    );
}

async fn given_a_refused_call_when_it_is_made_again_then_it_is_a_new_call_checked_again(
    h: &Harness,
) {
    let p = h.process().await;
    let unfit = || call("reimburse", json!({"claim_id": "c-102"}));
    let first = gated(&p, unfit()).await;
    assert_eq!(first.status, CallStatus::Refused, "{first:?}");

    let again = gated(&p, unfit()).await;

    assert!(!again.attached, "{again:?}");
    assert_ne!(again.run_id, first.run_id);
    assert_eq!(again.status, CallStatus::Refused);
}

/// A process whose `get_claim` goes through `around`, and whose agent names finance as its
/// recovery owner.
async fn reading_through(h: &Harness, around: impl harness::Around) -> Process {
    let on_get_claim = |tools| harness::wrap(tools, "get_claim", around);
    h.process_recovering(on_get_claim, "finance").await
}

fn read_c102() -> GateCall {
    call("get_claim", json!({"claim_id": "c-102"}))
}

async fn given_an_allowed_read_whose_answer_is_lost_when_its_tool_cannot_be_asked_then_it_fails_and_the_same_read_runs_again(
    h: &Harness,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let p = reading_through(h, AnswerLost(Counted::new(&calls))).await;

    let lost = gated(&p, read_c102()).await;

    assert_eq!(lost.status, CallStatus::Failed, "{lost:?}");
    let told = lost.result.unwrap();
    assert!(told.is_error);
    assert_eq!(
        told.content,
        "The call failed: the connection dropped after the request was sent; get_claim only \
         reads, so nothing took effect and nothing is left to reconcile: it may be called again"
    );
    assert!(
        p.pending(&acme()).await.unwrap().is_empty(),
        "nobody is asked whether a read took effect"
    );
    h.clock.advance(Duration::days(2));
    let swept = p.sweep(100).await.unwrap();
    assert!(
        swept.unknown.is_empty() && swept.to_recovery_owner.is_empty(),
        "{swept:?}"
    );
    let again = gated(&p, read_c102()).await;
    assert!(!again.attached, "{again:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

async fn given_a_read_left_running_by_a_process_that_died_when_the_sweep_finds_it_then_it_fails_and_nothing_is_left_unknown(
    h: &Harness,
) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let dying = Arc::new(reading_through(h, Hangs::before_effect(in_flight.clone())).await);
    let read = || GateCall {
        call_id: Some("read-1".into()),
        ..read_c102()
    };
    let taking = {
        let dying = dying.clone();
        tokio::spawn(async move { dying.gate_call(read()).await })
    };
    while in_flight.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(StdDuration::from_millis(5)).await;
    }
    taking.abort();
    let _ = taking.await;
    let sweeper = h.process_recovering(|tools| tools, "finance").await;
    h.clock.advance(Duration::minutes(16));

    let swept = sweeper.sweep(100).await.unwrap();

    assert_eq!(swept.lost_reads.len(), 1, "{swept:?}");
    assert!(
        swept.unknown.is_empty() && swept.to_recovery_owner.is_empty(),
        "{swept:?}"
    );
    assert!(sweeper.pending(&acme()).await.unwrap().is_empty());
    let failed = gated(&sweeper, read()).await;
    assert!(failed.attached, "known by its id");
    assert_eq!(failed.status, CallStatus::Failed, "{failed:?}");
    let told = failed.result.unwrap().content;
    assert!(
        told.contains("get_claim only reads, so nothing took effect"),
        "{told}"
    );
    assert_eq!(in_flight.load(Ordering::SeqCst), 1, "never sent again");
}

/// A process whose caller dies once its call's run is stored, before the call is proposed:
/// the write that would record its one action never lands, and the caller is answered an error.
async fn dies_before_proposing(h: &Harness, call: GateCall) -> RunId {
    let dying = h
        .process_configured(
            Arc::new(shared::example::expense::OfflineExpenseAgent),
            |store| RefusesWrites::an_action_once(store, |_| true),
            |builder| builder,
        )
        .await;
    dying
        .gate_call(call.clone())
        .await
        .expect_err("the proposal is not written");
    let stored = h
        .process()
        .await
        .call_named(&acme(), &call.agent, call.call_id.as_deref().unwrap())
        .await
        .unwrap()
        .expect("its run is stored");
    let history = dying.history(&acme(), &stored).await.unwrap();
    assert!(history.actions.is_empty(), "{history:?}");
    assert_eq!(history.run.status, RunStatus::Running);
    stored
}

async fn given_a_caller_that_died_before_its_stored_call_was_proposed_when_it_asks_again_then_the_call_is_proposed_once_and_waits_on_a_person(
    h: &Harness,
) {
    let pay = GateCall {
        call_id: Some("toolu_pay".into()),
        ..pay_c102()
    };
    let stored = dies_before_proposing(h, pay.clone()).await;
    let p = h.process().await;

    let again = gated(&p, pay.clone()).await;

    assert_eq!(again.run_id, stored, "the stored call, not a new one");
    assert_eq!(again.status, CallStatus::AwaitingApproval, "{again:?}");
    let approval = again.approval.clone().expect("who must decide");
    let once_more = gated(&h.process().await, pay).await;
    assert!(once_more.attached);
    assert_eq!(once_more.approval.map(|a| a.id), Some(approval.id));
    assert_eq!(p.pending(&acme()).await.unwrap().len(), 1, "one approval");
    assert_eq!(p.history(&acme(), &stored).await.unwrap().actions.len(), 1);
}

async fn given_a_stored_allowed_payment_nobody_proposed_when_two_retries_take_it_at_once_then_it_is_paid_once(
    h: &Harness,
) {
    let pay = GateCall {
        call_id: Some("toolu_small".into()),
        ..call(
            "reimburse",
            json!({"claim_id": "c-101", "amount_cents": 4_000}),
        )
    };
    let stored = dies_before_proposing(h, pay.clone()).await;
    let (a, b) = (h.process().await, h.process().await);

    let (one, two) = tokio::join!(gated(&a, pay.clone()), gated(&b, pay.clone()));

    for state in [&one, &two] {
        assert_eq!(state.run_id, stored);
        assert!(state.action_id.is_some(), "{state:?}");
    }
    let history = a.history(&acme(), &stored).await.unwrap();
    assert_eq!(history.actions.len(), 1, "{:?}", history.actions);
    let payments = h.payments().await;
    assert_eq!(payments.len(), 1, "paid once: {payments:?}");
    let after = gated(&a, pay).await;
    assert_eq!(after.status, CallStatus::Succeeded, "{after:?}");
    assert_eq!(h.payments().await.len(), 1, "asked again, paid once");
}

on_both_stores!([
    given_a_caller_that_died_before_its_stored_call_was_proposed_when_it_asks_again_then_the_call_is_proposed_once_and_waits_on_a_person,
    given_a_stored_allowed_payment_nobody_proposed_when_two_retries_take_it_at_once_then_it_is_paid_once,
    given_an_allowed_call_from_outside_when_it_is_made_then_it_runs_once_and_its_result_comes_back,
    given_a_gated_call_when_it_is_made_again_before_and_after_its_approval_then_one_approval_and_one_payment_and_the_outcome_comes_back,
    given_two_identical_calls_at_once_when_both_are_taken_then_they_are_one_call,
    given_a_call_with_the_callers_own_id_when_it_comes_again_then_it_is_the_same_call_and_with_other_arguments_a_conflict,
    given_calls_that_do_not_fit_or_that_policy_denies_or_a_person_rejects_then_each_is_told_why_and_nothing_runs,
    given_a_gated_call_a_reviewer_lowers_when_it_is_read_then_version_2_ran_with_the_lowered_arguments,
    given_a_caller_waiting_on_a_call_when_another_process_decides_it_then_the_wait_ends_with_the_outcome_within_the_stores_promise,
    given_a_caller_waiting_on_a_call_when_this_process_decides_it_then_the_waiter_is_woken_before_any_re_read,
    given_an_approved_call_known_by_its_arguments_when_the_same_call_comes_after_the_window_then_it_is_a_new_call,
    given_an_allowed_read_when_what_it_reads_changed_and_it_is_made_again_then_it_runs_again_and_reads_afresh,
    given_a_refused_call_when_it_is_made_again_then_it_is_a_new_call_checked_again,
    given_an_allowed_read_whose_answer_is_lost_when_its_tool_cannot_be_asked_then_it_fails_and_the_same_read_runs_again,
    given_a_read_left_running_by_a_process_that_died_when_the_sweep_finds_it_then_it_fails_and_nothing_is_left_unknown,
]);
