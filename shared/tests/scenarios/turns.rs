//! Turns: several calls in one turn, calls the policy does not name, a second pause, a tool's
//! own refusal, the turn limit, the order of calls.

use super::*;
use shared::domain::conversation::Speaker;

// ---------------------------------------------------------------------------------------------
// A turn with several calls (a scripted model)
// ---------------------------------------------------------------------------------------------

async fn given_a_turn_with_a_read_and_a_payment_when_the_payment_is_approved_then_both_results_go_back_together_after_the_pause(
    h: &Harness,
) {
    let script = Script::default().then_call(&[
        ("get_claim", json!({"claim_id": "c-102"})),
        reimburse("c-102", 25_000),
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

    h.decided(&p, "dana", &report.approvals[0].id, approve("d-1"))
        .await;

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

async fn given_a_read_turn_then_a_paused_payment_when_it_is_approved_then_the_run_read_back_holds_the_whole_conversation_in_order(
    h: &Harness,
) {
    // The run's item holds no conversation: each write adds its new turns to its audit item.
    let script = Script::default()
        .then_call(&[("get_claim", json!({"claim_id": "c-102"}))])
        .then_call(&[(
            "reimburse",
            json!({"claim_id": "c-102", "amount_cents": 25_000}),
        )]);
    let p = h.scripted_process(script).await;
    let report = p.start(scripted_task("ben")).await.unwrap();
    let paused = h.run(&p, &report.run_id).await;
    assert_eq!(paused.messages.len(), 4, "task, read, its result, payment");
    assert_eq!(
        paused.messages[0].text(),
        "Settle the claims of the script."
    );

    p.decide(&h.person("dana"), &report.approvals[0].id, approve("d-1"))
        .await
        .unwrap();

    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    assert_eq!(
        &run.messages[..4],
        &paused.messages[..],
        "earlier turns unchanged"
    );
    let speakers: Vec<Speaker> = run.messages.iter().map(|m| m.role).collect();
    use Speaker::{Assistant, User};
    assert_eq!(
        speakers,
        [User, Assistant, User, Assistant, User, Assistant]
    );
    assert!(
        results_after_turn(&run, 0)[0]
            .1
            .content
            .contains("\"id\":\"c-102\"")
    );
    assert!(
        results_after_turn(&run, 1)[0]
            .1
            .content
            .contains("\"paid_cents\":25000")
    );
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(
        history.run.messages, run.messages,
        "the audit view reads the same"
    );
    let names = event_names(&history.entries);
    assert_eq!(names.first(), Some(&"started"));
    assert_eq!(names.last(), Some(&"done"));
}

async fn given_two_approvals_in_one_turn_when_the_first_is_decided_then_the_run_waits_for_the_second_and_resumes_once_with_both(
    h: &Harness,
) {
    let script = Script::default().then_call(&[
        reimburse("c-102", 25_000),
        decline("c-106", "no itemised receipt"),
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

    let first = h.decided(&p, "dana", &pay.id, approve("d-pay")).await;

    let waiting = first.run.expect("the run, resumed in process");
    assert_eq!(waiting.status, RunStatus::AwaitingApproval);
    let still: Vec<_> = waiting.approvals.iter().map(|a| a.id.clone()).collect();
    assert_eq!(still, from_ref(&decline.id));
    assert_eq!(h.payments().await.len(), 1);
    assert_eq!(h.run(&p, &report.run_id).await.messages.len(), 2);

    h.decided(
        &p,
        "erin",
        &decline.id,
        reject("d-decline", "the receipt came in"),
    )
    .await;

    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    let results = results_after_turn(&run, 0);
    assert_eq!(results.len(), 2);
    assert!(results[0].1.content.contains("\"paid_cents\":25000"));
    assert!(results[1].1.content.starts_with("Not executed:"));
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(times(&history.entries, ["resumed"]), [1]);
}

async fn given_the_agent_calls_a_tool_it_does_not_have_when_the_turn_runs_then_it_is_refused_before_policy_and_the_model_is_told(
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
    assert_eq!(
        results[0].1.content,
        "Not executed: there is no tool named wire_money."
    );
    assert!(results[1].1.content.contains("\"id\":\"c-102\""));
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert!(history.actions.iter().all(|a| a.tool != "wire_money"));
    assert_eq!(refusals(&history), ["there is no tool named wire_money"]);
}

/// Why each refused call of a run was refused, in order.
fn refusals(history: &History) -> Vec<String> {
    history
        .entries
        .iter()
        .filter_map(|e| match &e.event {
            AuditEvent::Refused { why, .. } => Some(why.clone()),
            _ => None,
        })
        .collect()
}

async fn given_a_payment_missing_its_amount_or_with_a_field_the_schema_forbids_when_proposed_then_no_person_sees_it_and_the_model_is_told_why(
    h: &Harness,
) {
    let script = Script::default().then_call(&[
        ("reimburse", json!({"claim_id": "c-102"})),
        (
            "reimburse",
            json!({"claim_id": "c-102", "amount_cents": 25_000, "pay_to": "ben-offshore"}),
        ),
    ]);
    let p = h.scripted_process(script).await;

    let report = p.start(scripted_task("ben")).await.unwrap();

    assert_eq!(report.status, RunStatus::Done, "{report:?}");
    assert!(report.approvals.is_empty());
    assert!(
        p.pending(&acme()).await.unwrap().is_empty(),
        "nobody is asked"
    );
    assert!(h.payments().await.is_empty(), "nothing is sent");
    let run = h.run(&p, &report.run_id).await;
    let results = results_after_turn(&run, 0);
    for (_, told) in &results {
        assert!(
            told.content
                .starts_with("Not executed: the arguments do not match the tool's schema: "),
            "{}",
            told.content
        );
    }
    assert!(results[0].1.content.contains("amount_cents"));
    assert!(results[1].1.content.contains("pay_to"));
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert!(history.actions.is_empty(), "no action was proposed");
    assert!(history.approvals.is_empty());
    let refused = refusals(&history);
    assert_eq!(refused.len(), 2);
    assert!(
        refused[0].contains("\"amount_cents\" is a required property"),
        "{refused:?}"
    );
}

async fn given_an_argument_of_450_kb_when_proposed_then_it_is_refused_as_too_large_and_nothing_of_it_is_stored(
    h: &Harness,
) {
    let document = "x".repeat(450 * 1024);
    let script = Script::default()
        .then_call(&[("decline", json!({"claim_id": "c-102", "reason": document}))]);
    let p = h.scripted_process(script).await;

    let report = p.start(scripted_task("ben")).await.unwrap();

    assert_eq!(report.status, RunStatus::Done, "{report:?}");
    assert!(
        report.approvals.is_empty(),
        "nothing is proposed to a person"
    );
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(
        results_after_turn(&run, 0)[0].1.content,
        "Not executed: the arguments are too large: 451 KiB of JSON, at most 32 KiB."
    );
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(
        refusals(&history),
        ["the arguments are too large: 451 KiB of JSON, at most 32 KiB"]
    );
    let refused_args = history.entries.iter().find_map(|e| match &e.event {
        AuditEvent::Refused { args, .. } => Some(args.clone()),
        _ => None,
    });
    assert_eq!(refused_args, Some(None), "the audit keeps no part of it");
}

async fn given_calls_whose_arguments_together_pass_the_turns_share_when_proposed_then_the_ones_past_it_are_refused(
    h: &Harness,
) {
    // Three declines of 30 KiB each: two fit the turn's 64 KiB, the third does not.
    let reason = "r".repeat(30 * 1024);
    let script = Script::default().then_call(&[
        decline("c-102", &reason),
        decline("c-103", &reason),
        decline("c-104", &reason),
    ]);
    let p = h.scripted_process(script).await;

    let report = p.start(scripted_task("ben")).await.unwrap();

    assert_eq!(report.status, RunStatus::AwaitingApproval);
    assert_eq!(report.approvals.len(), 2);
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let refused = refusals(&history);
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0].starts_with("the arguments are too large: 30"),
        "{refused:?}"
    );
    assert!(
        refused[0]
            .ends_with("at most 3.9 KiB left of the 64 KiB one reply's calls may carry together"),
        "{refused:?}"
    );
}

async fn given_a_run_that_needs_a_second_decision_after_the_first_when_both_are_decided_then_it_pauses_twice_and_finishes(
    h: &Harness,
) {
    let script = Script::default()
        .then_call(&[reimburse("c-102", 25_000)])
        .then_call(&[decline("c-106", "no itemised receipt")]);
    let p = h.scripted_process(script).await;
    let report = p.start(scripted_task("ben")).await.unwrap();
    let pay = report.approvals[0].clone();

    let first = h.decided(&p, "dana", &pay.id, approve("d-pay")).await;

    let waiting = first.run.expect("the run, resumed in process");
    assert_eq!(waiting.status, RunStatus::AwaitingApproval);
    assert_eq!(waiting.approvals.len(), 1);
    let decline = waiting.approvals[0].clone();
    assert_eq!(decline.tool, "decline");
    assert_eq!(p.pending(&acme()).await.unwrap(), from_ref(&decline));

    let other = h.process().await;
    h.decided(&other, "erin", &decline.id, approve("d-decline"))
        .await;

    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    let settled = shared::example::expense::Ledger::new(p.store.clone())
        .all(&acme())
        .await
        .unwrap();
    let claims: Vec<&str> = settled.iter().map(|s| s.claim_id.as_str()).collect();
    assert_eq!(claims, ["c-102", "c-106"]);
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(times(&history.entries, ["paused", "resumed"]), [2, 2]);
}

async fn given_two_approvers_approve_paying_more_than_was_claimed_when_it_runs_then_the_tool_refuses_and_the_model_is_told(
    h: &Harness,
) {
    let script = Script::default().then_call(&[reimburse("c-102", 60_000)]);
    let p = h.scripted_process(script).await;
    let report = p.start(scripted_task("ben")).await.unwrap();
    let approval = report.approvals[0].clone();
    assert_eq!(approval.quorum, 2);

    h.decided(&p, "dana", &approval.id, approve("d-dana")).await;
    h.decided(&p, "erin", &approval.id, approve("d-erin")).await;

    assert!(
        h.payments().await.is_empty(),
        "no approval skips a hard limit"
    );
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done);
    assert_eq!(action_of(&history, &approval).status, ActionStatus::Failed);
    assert_told_error(&history.run, "reimburse", "never pay more than claimed");
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
    let script = Script::default()
        .then_call(&reads)
        .then_call(&[reimburse("c-102", 25_000)]);
    let p = h.scripted_process(script).await;
    // The clock never moves: every action is proposed at the same instant.
    let report = p.start(scripted_task("ben")).await.unwrap();
    let approval = report.approvals[0].clone();
    h.decided(&p, "dana", &approval.id, edit("d-edit", 200))
        .await;

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

// Each scenario on the embedded store and on DynamoDB (moto over HTTP).
on_both_stores!([
    given_a_turn_with_a_read_and_a_payment_when_the_payment_is_approved_then_both_results_go_back_together_after_the_pause,
    given_a_read_turn_then_a_paused_payment_when_it_is_approved_then_the_run_read_back_holds_the_whole_conversation_in_order,
    given_two_approvals_in_one_turn_when_the_first_is_decided_then_the_run_waits_for_the_second_and_resumes_once_with_both,
    given_the_agent_calls_a_tool_it_does_not_have_when_the_turn_runs_then_it_is_refused_before_policy_and_the_model_is_told,
    given_a_payment_missing_its_amount_or_with_a_field_the_schema_forbids_when_proposed_then_no_person_sees_it_and_the_model_is_told_why,
    given_an_argument_of_450_kb_when_proposed_then_it_is_refused_as_too_large_and_nothing_of_it_is_stored,
    given_calls_whose_arguments_together_pass_the_turns_share_when_proposed_then_the_ones_past_it_are_refused,
    given_a_run_that_needs_a_second_decision_after_the_first_when_both_are_decided_then_it_pauses_twice_and_finishes,
    given_two_approvers_approve_paying_more_than_was_claimed_when_it_runs_then_the_tool_refuses_and_the_model_is_told,
    given_an_agent_that_never_stops_calling_tools_when_it_reaches_the_turn_limit_then_the_run_fails,
    given_many_calls_proposed_in_the_same_millisecond_when_the_history_is_read_then_actions_come_in_the_order_proposed_each_version_after_its_predecessor,
]);
