//! The cap on a requester's open approvals: a call a person must approve, from a requester who
//! already has as many approvals waiting as one may, is not proposed (its proposer is told,
//! the audit says so, no reviewer is asked); each approval that stops waiting makes room again;
//! and calls proposed at once from two processes never open more than the cap between them
//! (in races.rs).

use super::*;
use shared::domain::ids::AgentName;
use shared::domain::run::GateVia;
use shared::engine::GateCall;
use shared::engine::records::open_slots;

/// A process whose requesters may each have `cap` approvals open, its model playing `script`.
pub async fn capped(h: &Harness, cap: u32, script: Script) -> Process {
    h.process_configured(
        Arc::new(script),
        |store| store,
        |b| b.max_open_approvals(cap),
    )
    .await
}

/// [`capped`], its decisions handing their resumes to a queue that only records them, as on
/// AWS: what settles an approval is the decision's transaction, not the resume after it.
pub async fn capped_queued(h: &Harness, cap: u32, script: Script) -> Process {
    let queue = Delivery::Queue(Arc::new(RecordingQueue::default()));
    h.process_configured(
        Arc::new(script),
        |store| store,
        |b| b.max_open_approvals(cap).delivery(queue),
    )
    .await
}

/// How many approvals `name` has open, as stored: their slots.
pub async fn open_of(p: &Process, name: &str) -> u32 {
    let pk = keys::requester_pk(&acme(), &person(name));
    open_slots(p.store.as_ref(), &pk, None).await.unwrap()
}

/// One reimbursement of `cents` on `claim` through the gate, as `name`, under the caller's own
/// id `call_id`.
pub fn gated_payment(name: &str, call_id: &str, claim: &str, cents: i64) -> GateCall {
    GateCall {
        tenant: acme(),
        agent: AgentName::parse("expense").unwrap(),
        requested_by: person(name),
        tool: "reimburse".into(),
        args: json!({"claim_id": claim, "amount_cents": cents}),
        call_id: Some(call_id.into()),
        conversation: None,
        via: GateVia::Api,
        standing: Default::default(),
    }
}

/// ben's run of a script that pays c-102 $250, paused on its one approval.
async fn bens_paused(p: &Process) -> RunReport {
    let report = p.start(scripted_task("ben")).await.unwrap();
    assert_eq!(report.status, RunStatus::AwaitingApproval, "{report:?}");
    assert_eq!(report.approvals.len(), 1);
    report
}

fn pays_c102() -> Script {
    Script::default().then_call(&[reimburse("c-102", 25_000)])
}

async fn given_a_requester_at_the_cap_when_their_agent_proposes_another_call_then_it_is_not_proposed_the_model_is_told_and_only_the_audit_keeps_it(
    h: &Harness,
) {
    let p = capped(h, 1, pays_c102()).await;
    let first = bens_paused(&p).await;

    let second = p.start(scripted_task("ben")).await.unwrap();

    assert_eq!(second.status, RunStatus::Done, "{second:?}");
    let run = h.run(&p, &second.run_id).await;
    let told = told_about(&run, "reimburse");
    assert!(!told.is_error, "not proposed is an answer, not an error");
    assert!(
        told.content
            .starts_with("Not executed: not proposed: too many open approvals (ben has 1 waiting"),
        "{}",
        told.content
    );
    let pending = p.pending(&acme()).await.unwrap();
    assert_eq!(pending.len(), 1, "nobody is asked about the second");
    assert_eq!(pending[0].run_id, first.run_id);
    let history = p.history(&acme(), &second.run_id).await.unwrap();
    assert!(history.actions.is_empty() && history.approvals.is_empty());
    assert_eq!(
        times(&history.entries, ["refused", "proposed", "paused"]),
        [1, 0, 0]
    );
    assert_eq!(open_of(&p, "ben").await, 1);
    // Another requester's share is their own.
    let chens = p.start(scripted_task("chen")).await.unwrap();
    assert_eq!(chens.status, RunStatus::AwaitingApproval);
    assert_eq!(open_of(&p, "chen").await, 1);
}

async fn given_room_for_one_when_a_turn_proposes_two_calls_a_person_must_approve_then_the_first_waits_and_the_second_is_not_proposed(
    h: &Harness,
) {
    let script =
        Script::default().then_call(&[reimburse("c-102", 25_000), reimburse("c-104", 39_000)]);
    let p = capped(h, 1, script).await;

    let report = p.start(scripted_task("ben")).await.unwrap();

    assert_eq!(report.status, RunStatus::AwaitingApproval);
    assert_eq!(report.approvals.len(), 1, "{report:?}");
    assert_eq!(report.approvals[0].args.str("claim_id"), Some("c-102"));
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(
        times(&history.entries, ["refused", "proposed", "paused"]),
        [1, 1, 1]
    );
    assert_eq!(open_of(&p, "ben").await, 1);
    // Decided, the run resumes with both answers: the payment, and the call not proposed.
    h.decided(&p, "dana", &report.approvals[0].id, approve("d-1"))
        .await;
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    let told = results_after_turn(&run, 0);
    assert_eq!(told.len(), 2, "{told:?}");
    assert!(
        told[1]
            .1
            .content
            .contains("not proposed: too many open approvals"),
        "{told:?}"
    );
    assert_eq!(open_of(&p, "ben").await, 0);
}

async fn given_a_requester_at_the_cap_when_an_approval_is_approved_rejected_expired_or_cancelled_then_each_makes_room_again(
    h: &Harness,
) {
    let p = capped_queued(h, 1, pays_c102()).await;
    let ben = h.person("ben");

    let approved = bens_paused(&p).await;
    h.decided(&p, "dana", &approved.approvals[0].id, approve("d-1"))
        .await;
    assert_eq!(open_of(&p, "ben").await, 0, "approved");

    let rejected = bens_paused(&p).await;
    h.decided(&p, "dana", &rejected.approvals[0].id, reject("d-2", "no"))
        .await;
    assert_eq!(open_of(&p, "ben").await, 0, "rejected");

    let cancelled = bens_paused(&p).await;
    p.cancel(&ben, &cancelled.run_id).await.unwrap();
    assert_eq!(open_of(&p, "ben").await, 0, "cancelled");

    bens_paused(&p).await;
    h.clock.advance(Duration::hours(24) + Duration::minutes(1));
    let swept = p.sweep(100).await.unwrap();
    assert_eq!(swept.expired.len(), 1);
    assert_eq!(open_of(&p, "ben").await, 0, "expired by the sweep");

    let late = bens_paused(&p).await;
    h.clock.advance(Duration::hours(24) + Duration::minutes(1));
    let refused = h
        .refused(&p, "dana", &late.approvals[0].id, approve("d-late"))
        .await;
    assert_eq!(refused.code(), "expired");
    assert_eq!(open_of(&p, "ben").await, 0, "expired by a late decision");

    bens_paused(&p).await;
}

async fn given_a_requester_at_the_cap_when_an_approval_is_edited_then_a_new_version_that_still_waits_keeps_its_place_and_one_approved_at_once_frees_it(
    h: &Harness,
) {
    // Above $500 two people must approve: an edit to $550 is one of them, so it still waits.
    let p = capped_queued(
        h,
        1,
        Script::default().then_call(&[reimburse("c-102", 60_000)]),
    )
    .await;
    let report = bens_paused(&p).await;

    let edited = h
        .decided(&p, "dana", &report.approvals[0].id, edit("d-1", 550))
        .await;

    let next = edited.next_approval.expect("the new version waits");
    assert_eq!(next.status, ApprovalStatus::AwaitingApproval);
    assert_eq!(
        open_of(&p, "ben").await,
        1,
        "the new version holds its place"
    );
    let refused = p.start(scripted_task("ben")).await.unwrap();
    assert_eq!(refused.status, RunStatus::Done, "still at the cap");
    h.decided(&p, "erin", &next.id, decision("d-2", v(2), Choice::Approve))
        .await;
    assert_eq!(open_of(&p, "ben").await, 0);

    // One approver needed: the editor's edit approves the new version at once.
    let p = capped_queued(h, 1, pays_c102()).await;
    let report = bens_paused(&p).await;
    let edited = h
        .decided(&p, "dana", &report.approvals[0].id, edit("d-3", 200))
        .await;
    assert!(
        edited
            .next_approval
            .is_none_or(|a| a.status == ApprovalStatus::Approved)
    );
    assert_eq!(open_of(&p, "ben").await, 0);
}

async fn given_a_requester_at_the_cap_when_a_call_comes_through_the_gate_then_it_is_refused_with_nothing_stored_and_the_same_call_is_proposed_once_there_is_room(
    h: &Harness,
) {
    let p = capped(h, 1, Script::default()).await;
    let first = p
        .gate_call(gated_payment("ben", "call-1", "c-102", 25_000))
        .await
        .unwrap();

    let refused = p
        .gate_call(gated_payment("ben", "call-2", "c-104", 39_000))
        .await
        .unwrap_err();

    assert_refusal(&refused, "too_many_open_approvals", ErrorKind::TooMany);
    assert!(
        refused.to_string().contains("ben has 1 waiting"),
        "{refused}"
    );
    assert_eq!(p.pending(&acme()).await.unwrap().len(), 1);
    assert_eq!(open_of(&p, "ben").await, 1);
    let approval = first.approval.expect("the first waits").id;
    h.decided(&p, "dana", &approval, reject("d-1", "no")).await;

    let again = p
        .gate_call(gated_payment("ben", "call-2", "c-104", 39_000))
        .await
        .unwrap();
    assert_eq!(again.status, shared::engine::CallStatus::AwaitingApproval);
    assert!(!again.attached, "proposed anew, not the refusal again");
    assert_eq!(open_of(&p, "ben").await, 1);
}

on_both_stores!([
    given_a_requester_at_the_cap_when_their_agent_proposes_another_call_then_it_is_not_proposed_the_model_is_told_and_only_the_audit_keeps_it,
    given_room_for_one_when_a_turn_proposes_two_calls_a_person_must_approve_then_the_first_waits_and_the_second_is_not_proposed,
    given_a_requester_at_the_cap_when_an_approval_is_approved_rejected_expired_or_cancelled_then_each_makes_room_again,
    given_a_requester_at_the_cap_when_an_approval_is_edited_then_a_new_version_that_still_waits_keeps_its_place_and_one_approved_at_once_frees_it,
    given_a_requester_at_the_cap_when_a_call_comes_through_the_gate_then_it_is_refused_with_nothing_stored_and_the_same_call_is_proposed_once_there_is_room,
]);
