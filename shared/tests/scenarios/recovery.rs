//! Recovery owners: a call whose outcome is unknown and whose tool cannot reconcile it goes to a
//! person of the agent's recovery owner role, at once, whoever let it run, who answers "it took
//! effect" or "it did not", with the identity, tenant and audit rules of every decision; the run
//! resumes with the answer. Without an owner, nothing asks the tool and the sweep says a person
//! must name one.

use super::*;
use async_trait::async_trait;
use shared::domain::approval::ApprovalKind;
use shared::ports::tools::{Tool, ToolCall};

/// A call whose request never reached the service, though the caller cannot tell: it reports
/// an unknown outcome and cannot be asked again.
struct LostBeforeEffect {
    calls: Arc<AtomicUsize>,
}

#[async_trait]
impl Around for LostBeforeEffect {
    async fn call(&self, _: &dyn Tool, _: ToolCall<'_>) -> ToolOutcome {
        self.calls.fetch_add(1, Ordering::SeqCst);
        ToolOutcome::Unknown {
            detail: "the connection dropped before any answer".into(),
        }
    }
}

fn answer(id: &str, took_effect: bool, note: &str) -> DecisionRequest {
    let note = Some(note.to_string());
    let choice = match took_effect {
        true => Choice::TookEffect { note },
        false => Choice::DidNotTakeEffect { note },
    };
    decision(id, ActionVersion::FIRST, choice)
}

/// c-102 paused, approved by dana, its payment's outcome lost: the recovery that opens.
pub(super) async fn lost_payment(h: &Harness, p: &Process) -> (Approval, Approval) {
    let (_, approval) = h.start_paused(p, "c-102").await;
    let decided = h.decided(p, "dana", &approval.id, approve("dana-1")).await;
    let run = decided.run.expect("resumed in this process");
    assert_eq!(run.status, RunStatus::AwaitingApproval, "{run:?}");
    let pending = p.pending(&acme()).await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    (approval, pending[0].clone())
}

async fn given_a_payment_whose_answer_was_lost_and_cannot_be_reconciled_when_its_owner_says_it_took_effect_then_the_run_finishes_paid_once(
    h: &Harness,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let p = h
        .process_recovering(on_reimburse(AnswerLost(Counted::new(&calls))), "finance")
        .await;
    let (approval, recovery) = lost_payment(h, &p).await;

    assert_eq!(recovery.kind, ApprovalKind::Recovery);
    assert_eq!(recovery.approver_role.as_str(), "finance");
    assert_eq!(
        (recovery.action_id.clone(), recovery.action_version),
        (approval.action_id.clone(), approval.action_version)
    );
    assert!(recovery.reason.contains("Did it?"), "{}", recovery.reason);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Nobody answering for months does not settle it: a recovery never expires.
    h.clock.advance(Duration::days(100));
    let swept = p.sweep(100).await.unwrap();
    assert!(swept.expired.is_empty(), "{swept:?}");
    assert_eq!(p.pending(&acme()).await.unwrap(), vec![recovery.clone()]);

    // The same rules as every decision: not the requester, only the role, the right answers.
    for (who, request, code) in [
        ("ben", answer("ben-1", true, "paid"), "own_request"),
        ("chen", answer("chen-1", true, "paid"), "missing_role"),
        ("erin", approve("erin-0"), "wrong_choice"),
        ("zoe", answer("zoe-1", true, "paid"), "not_found"),
    ] {
        assert_eq!(
            h.refused(&p, who, &recovery.id, request).await.code(),
            code,
            "{who}"
        );
    }

    let took_effect = || answer("erin-1", true, "The ledger shows the payment.");
    let answered = h.decided(&p, "erin", &recovery.id, took_effect()).await;
    assert_eq!(answered.approval.status, ApprovalStatus::Answered);
    let run = answered.run.expect("resumed in this process");
    assert_eq!(run.status, RunStatus::Done, "{run:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never sent again");
    assert_eq!(paid(&h.payments().await).len(), 1);

    let history = p.history(&acme(), &run.run_id).await.unwrap();
    let names = event_names(&history.entries);
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap();
    assert!(at("unknown") < at("recovery_requested"), "{names:?}");
    assert!(at("recovery_requested") < at("reconciled"), "{names:?}");
    let reconciled = &history.entries[at("reconciled")];
    assert_eq!(reconciled.actor.to_string(), "erin");
    assert_eq!(
        action_of(&history, &approval).status,
        ActionStatus::Succeeded
    );

    // Answering again with the same decision id replays; another answer conflicts.
    let again = h.decided(&p, "erin", &recovery.id, took_effect()).await;
    assert!(again.replayed);
    let late = h
        .refused(&p, "dana", &recovery.id, answer("dana-2", false, "no"))
        .await
        .code();
    assert_eq!(late, "already_decided");
}

async fn given_a_payment_that_never_reached_the_ledger_when_its_owner_says_it_did_not_take_effect_then_the_model_is_told_and_nothing_is_paid(
    h: &Harness,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let lost = on_reimburse(LostBeforeEffect {
        calls: calls.clone(),
    });
    let p = h.process_recovering(lost, "finance").await;
    let (_, recovery) = lost_payment(h, &p).await;

    let answered = h
        .decided(
            &p,
            "erin",
            &recovery.id,
            answer("erin-1", false, "No payment in the ledger."),
        )
        .await;
    let run = answered.run.expect("resumed in this process");
    assert_eq!(run.status, RunStatus::Done, "{run:?}");
    assert_told_error(
        &h.run(&p, &run.run_id).await,
        "reimburse",
        "did not take effect, as erin confirmed",
    );
    assert!(h.payments().await.is_empty());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

async fn given_a_payment_policy_allows_without_a_person_when_its_answer_is_lost_then_the_recovery_owner_is_asked_at_once(
    h: &Harness,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let p = h
        .process_recovering(on_reimburse(AnswerLost(Counted::new(&calls))), "finance")
        .await;

    let report = h.start(&p, "c-101").await;

    let pending = p.pending(&acme()).await.unwrap();
    let [recovery] = pending.as_slice() else {
        panic!("one question for the recovery owner: {pending:?} {report:?}");
    };
    assert_eq!(recovery.kind, ApprovalKind::Recovery);
    assert_eq!(recovery.tool, "reimburse");
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert!(
        event_names(&history.entries).contains(&"recovery_requested"),
        "{:?}",
        event_names(&history.entries)
    );
    let swept = p.sweep(100).await.unwrap();
    assert!(swept.unknown.is_empty(), "a person answers it: {swept:?}");

    h.decided(
        &p,
        "erin",
        &recovery.id,
        answer("erin-1", true, "The ledger shows it."),
    )
    .await;
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(
        action_of(&history, recovery).status,
        ActionStatus::Succeeded
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never sent again");
}

async fn given_an_agent_without_a_recovery_owner_when_an_outcome_its_tool_cannot_tell_is_unknown_then_nothing_asks_the_tool_and_once_an_owner_is_named_the_sweep_asks_that_role(
    h: &Harness,
) {
    let (calls, p, _, approval) = paused_where_answers_are_lost(h).await;
    h.decided(&p, "dana", &approval.id, approve("dana-1")).await;

    assert!(p.pending(&acme()).await.unwrap().is_empty());
    let key = format!("{}:1", approval.action_id);
    let history = p.history(&acme(), &approval.run_id).await.unwrap();
    let detail = history.entries.iter().find_map(|e| match &e.event {
        AuditEvent::Unknown { detail, .. } => Some(detail.clone()),
        _ => None,
    });
    assert_eq!(
        detail.as_deref(),
        Some(
            "the connection dropped after the request was sent; its tool cannot be asked and \
             agent expense names no recovery_owner to answer"
        )
    );
    h.clock.advance(Duration::minutes(6));
    let swept = p.sweep(100).await.unwrap();
    assert_eq!(swept.unknown, from_ref(&key), "{swept:?}");
    assert_eq!(swept.unowned, from_ref(&key), "nobody named to settle it");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // The definition names finance as its recovery owner: the next sweep asks that role.
    let named = h
        .process_recovering(on_reimburse(AnswerLost(Counted::new(&calls))), "finance")
        .await;
    h.clock.advance(Duration::minutes(6));
    let swept = named.sweep(100).await.unwrap();
    assert_eq!(swept.to_recovery_owner, from_ref(&key), "{swept:?}");
    assert!(swept.unknown.is_empty());
    let pending = named.pending(&acme()).await.unwrap();
    let [recovery] = pending.as_slice() else {
        panic!("{pending:?}");
    };
    let answered = h
        .decided(
            &named,
            "erin",
            &recovery.id,
            answer("erin-1", true, "The ledger shows the payment."),
        )
        .await;
    let run = answered.run.expect("resumed in this process");
    assert_eq!(run.status, RunStatus::Done, "{run:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never sent again");
}

// Each scenario on the embedded store and on DynamoDB (moto over HTTP).
on_both_stores!([
    given_a_payment_whose_answer_was_lost_and_cannot_be_reconciled_when_its_owner_says_it_took_effect_then_the_run_finishes_paid_once,
    given_a_payment_that_never_reached_the_ledger_when_its_owner_says_it_did_not_take_effect_then_the_model_is_told_and_nothing_is_paid,
    given_a_payment_policy_allows_without_a_person_when_its_answer_is_lost_then_the_recovery_owner_is_asked_at_once,
    given_an_agent_without_a_recovery_owner_when_an_outcome_its_tool_cannot_tell_is_unknown_then_nothing_asks_the_tool_and_once_an_owner_is_named_the_sweep_asks_that_role,
]);
