//! Expiry, rejection, cancellation: answers, not errors.

use super::*;

// ---------------------------------------------------------------------------------------------
// Expiry, rejection, cancellation: answers, not errors
// ---------------------------------------------------------------------------------------------

async fn given_an_overdue_approval_when_someone_approves_it_then_it_is_refused_as_expired_nothing_is_paid_and_the_model_is_told(
    h: &Harness,
) {
    let (p, report, approval) = h.paused_on("c-102").await;
    h.clock.advance(Duration::hours(24) + Duration::minutes(1));

    let refused = h.refused(&p, "dana", &approval.id, approve("d-late")).await;

    assert_refusal(&refused, "expired", ErrorKind::Conflict);
    assert_undecided(h, &p, &approval, ApprovalStatus::Expired).await;
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    let told = told_not_executed(&run, "reimburse");
    assert!(
        told.starts_with("Not executed: nobody decided before the deadline"),
        "{told}"
    );
    let again = h
        .refused(&p, "erin", &approval.id, approve("d-later"))
        .await;
    assert_eq!(again.code(), "expired");
    assert!(h.payments().await.is_empty());
}

async fn given_an_overdue_approval_when_someone_without_the_approver_role_decides_it_then_it_expires_booked_to_the_deadline_not_to_them(
    h: &Harness,
) {
    let (p, report, approval) = h.paused_on("c-102").await;
    h.clock.advance(Duration::hours(24) + Duration::minutes(1));
    let ana = h.person("ana");
    assert!(!ana.has_role(&finance()));

    let refused = h.refused(&p, &ana, &approval.id, approve("d-ana")).await;

    assert_refusal(&refused, "expired", ErrorKind::Conflict);
    assert_undecided(h, &p, &approval, ApprovalStatus::Expired).await;
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
}

async fn given_a_rejected_payment_when_the_run_resumes_then_the_model_reads_a_plain_not_executed_result_and_finishes(
    h: &Harness,
) {
    let (p, report, approval) = h.paused_on("c-102").await;

    let decided = h
        .decided(
            &p,
            "dana",
            &approval.id,
            reject("d-no", "the receipt is missing"),
        )
        .await;

    assert_eq!(decided.approval.status, ApprovalStatus::Rejected);
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    let told = told_not_executed(&run, "reimburse");
    assert!(told.contains("the receipt is missing"), "{told}");
    assert!(told.contains("Do not retry"), "{told}");
    let answer = run.answer.unwrap();
    assert!(answer.starts_with("Nothing was settled"), "{answer}");
    assert!(h.payments().await.is_empty());
}

async fn given_an_unanswered_payment_when_the_sweep_expires_it_then_the_model_reads_a_plain_not_executed_result_and_finishes(
    h: &Harness,
) {
    let (p, report, approval) = h.paused_on("c-102").await;
    h.clock.advance(Duration::hours(25));

    let swept = h.process().await.sweep(100).await.unwrap();

    assert_eq!(swept.expired, [approval.id]);
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    let told = told_not_executed(&run, "reimburse");
    assert!(told.contains("expired"), "{told}");
    assert!(h.payments().await.is_empty());
}

async fn given_a_cancelled_run_when_an_approver_decides_its_approval_then_it_conflicts_as_cancelled(
    h: &Harness,
) {
    let (p, report, approval) = h.paused_on("c-102").await;

    let cancelled = p.cancel(&h.person("ben"), &report.run_id).await.unwrap();
    assert_eq!(cancelled.status, RunStatus::Cancelled);

    let other = h.process().await;
    let refused = h
        .refused(&other, "dana", &approval.id, approve("d-1"))
        .await;

    assert_refusal(&refused, "cancelled", ErrorKind::Conflict);
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

// Each scenario on the embedded store and on DynamoDB (moto over HTTP).
on_both_stores!([
    given_an_overdue_approval_when_someone_approves_it_then_it_is_refused_as_expired_nothing_is_paid_and_the_model_is_told,
    given_an_overdue_approval_when_someone_without_the_approver_role_decides_it_then_it_expires_booked_to_the_deadline_not_to_them,
    given_a_rejected_payment_when_the_run_resumes_then_the_model_reads_a_plain_not_executed_result_and_finishes,
    given_an_unanswered_payment_when_the_sweep_expires_it_then_the_model_reads_a_plain_not_executed_result_and_finishes,
    given_a_cancelled_run_when_an_approver_decides_its_approval_then_it_conflicts_as_cancelled,
    given_a_run_waiting_on_a_person_when_someone_unrelated_cancels_it_then_they_may_not,
]);
