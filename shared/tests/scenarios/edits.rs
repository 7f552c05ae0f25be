//! Edits and quorum: a lower amount is a new version, evaluated by policy again; two people
//! where policy needs two.

use super::*;

async fn given_an_approval_when_a_reviewer_lowers_the_amount_then_version_two_runs_and_version_one_can_no_longer_be_approved(
    h: &Harness,
) {
    let (p, report, approval, edited) = h.edited_by_dana("c-102", 200).await;

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

    let late = h.refused(&p, "erin", &approval.id, approve("d-late")).await;

    assert_refusal(&late, "superseded", ErrorKind::Conflict);
    assert_eq!(
        paid(&h.payments().await),
        [payment("c-102", 20_000, &approval, 2)]
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
    let (p, _, approval) = h.paused_on("c-105").await;
    assert_eq!(approval.args.int("amount_cents"), Some(75_000));

    let edited = h
        .decided(&p, "dana", &approval.id, edit("d-edit", 600))
        .await;
    let next = edited.next_approval.expect("the new version's approval");

    assert_eq!(next.status, ApprovalStatus::AwaitingApproval);
    assert_eq!(p.pending(&acme()).await.unwrap(), from_ref(&next));
    assert_eq!(next.quorum, 2);
    assert_eq!(next.still_needed(), 1);
    let erin = h.person("erin");
    let stale = h.refused(&p, &erin, &next.id, approve("d-stale")).await;
    assert_eq!(stale.code(), "stale_version");
    let twice = h
        .refused(
            &p,
            "dana",
            &next.id,
            decision("d-dana-2", v(2), Choice::Approve),
        )
        .await;
    assert_eq!(twice.code(), "already_approved_by_you");
    assert!(h.payments().await.is_empty());

    let approved = h
        .decided(
            &p,
            &erin,
            &next.id,
            decision("d-erin", v(2), Choice::Approve),
        )
        .await;

    assert_eq!(approved.approval.status, ApprovalStatus::Approved);
    assert_eq!(
        paid(&h.payments().await),
        [payment("c-105", 60_000, &approval, 2)]
    );
}

async fn given_an_approval_when_a_reviewer_raises_the_amount_then_the_edit_is_refused_and_nothing_changes(
    h: &Harness,
) {
    let (p, report, approval) = h.paused_on("c-102").await;

    let refused = h
        .refused(&p, "dana", &approval.id, edit("d-raise", 300))
        .await;

    assert_refusal(&refused, "edit_refused", ErrorKind::PolicyRefused);
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
    let (p, report, approval) = h.paused_on("c-105").await;
    assert_eq!(approval.quorum, 2);
    let dana = h.person("dana");

    let counted = h
        .decided(&p, &dana, &approval.id, approve("d-dana-1"))
        .await;
    assert_eq!(
        counted.decision.effect,
        DecisionEffect::Counted { still_needed: 1 }
    );
    assert_eq!(counted.approval.status, ApprovalStatus::AwaitingApproval);

    let again = h
        .refused(&p, &dana, &approval.id, approve("d-dana-2"))
        .await;
    assert_refusal(&again, "already_approved_by_you", ErrorKind::Conflict);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::AwaitingApproval);
    assert_eq!(stored.still_needed(), 1);
    assert_eq!(
        h.run(&p, &report.run_id).await.status,
        RunStatus::AwaitingApproval
    );
    assert!(h.payments().await.is_empty());

    let approved = h.decided(&p, "erin", &approval.id, approve("d-erin")).await;

    assert_eq!(approved.approval.status, ApprovalStatus::Approved);
    assert_eq!(h.run(&p, &report.run_id).await.status, RunStatus::Done);
    assert_eq!(
        paid(&h.payments().await),
        [payment("c-105", 75_000, &approval, 1)]
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
    let (p, report, approval, edited) = h.edited_by_dana("c-102", 60).await;

    assert_eq!(edited.approval.status, ApprovalStatus::Superseded);
    assert!(edited.next_approval.is_none(), "$60 needs nobody");
    assert_eq!(
        paid(&h.payments().await),
        [payment("c-102", 6_000, &approval, 2)]
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
    let late = h.refused(&p, "erin", &approval.id, approve("d-late")).await;
    assert_eq!(late.code(), "superseded");
}

// Each scenario on the embedded store and on DynamoDB (moto over HTTP).
on_both_stores!([
    given_an_approval_when_a_reviewer_lowers_the_amount_then_version_two_runs_and_version_one_can_no_longer_be_approved,
    given_a_two_person_claim_when_a_reviewer_lowers_it_then_the_new_version_still_needs_a_second_person,
    given_an_approval_when_a_reviewer_raises_the_amount_then_the_edit_is_refused_and_nothing_changes,
    given_a_claim_above_500_when_the_same_approver_approves_twice_then_it_still_waits_and_a_second_approver_pays_it,
    given_an_approval_when_a_reviewer_lowers_the_amount_below_the_threshold_then_version_two_runs_on_policy_and_the_editor,
]);
