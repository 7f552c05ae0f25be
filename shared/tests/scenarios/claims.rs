//! Calls their caller runs (`executor = "caller"`, the refund tool of examples/helpdesk): once
//! approved, one claimant claims the call, runs it with the exact approved arguments and key, and
//! reports its outcome; a claim that goes quiet past its lease is an unknown outcome for the
//! recovery owner, never a second claim.

use std::path::PathBuf;

use super::*;
use shared::agents::{self, Definition};
use shared::domain::approval::ApprovalKind;
use shared::domain::ids::AgentName;
use shared::domain::run::GateVia;
use shared::engine::{CallState, CallStatus, Executor, GateCall, Reported, WaitingOn};

fn helpdesk_example() -> Vec<Definition> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/helpdesk"));
    agents::load_paths(&[dir]).expect("examples/helpdesk loads")
}

async fn caller_process(h: &Harness) -> Process {
    h.process_of_definitions(&helpdesk_example()).await
}

/// `sam` asks the helpdesk agent, through the gate API, to refund `cents` of order A-1001.
fn refund(call_id: &str, cents: i64) -> GateCall {
    GateCall {
        tenant: acme(),
        agent: AgentName::parse("helpdesk").unwrap(),
        requested_by: person("sam"),
        tool: "refund".into(),
        args: json!({"order_id": "A-1001", "amount_cents": cents}),
        call_id: Some(call_id.into()),
        conversation: Some("thread-42".into()),
        via: GateVia::Api,
        standing: Default::default(),
    }
}

fn sam(h: &Harness) -> Identity {
    h.person("sam")
}

fn refunded(text: &str) -> Reported {
    Reported {
        succeeded: true,
        result: json!(text),
    }
}

/// A refund above USD 100, proposed and approved by mia: approved, waiting for its caller.
async fn approved_refund(h: &Harness, p: &Process) -> CallState {
    let proposed = p.gate_call(refund("call_big", 12_500)).await.unwrap();
    assert_eq!(
        proposed.status,
        CallStatus::AwaitingApproval,
        "{proposed:?}"
    );
    let approval = proposed.approval.unwrap();
    h.decided(p, "mia", &approval.id, approve("d-1")).await;
    let state = p.call_state(&acme(), &proposed.run_id).await.unwrap();
    assert_eq!(
        state.status,
        CallStatus::Approved,
        "never run here: {state:?}"
    );
    state
}

async fn given_a_small_refund_the_caller_runs_when_it_claims_and_reports_then_it_ran_once_under_the_key(
    h: &Harness,
) {
    let p = caller_process(h).await;

    let proposed = p.gate_call(refund("call_small", 4_000)).await.unwrap();
    let claimed = p
        .claim_call(&sam(h), &proposed.run_id, "worker-1")
        .await
        .unwrap();
    let again = p
        .claim_call(&sam(h), &proposed.run_id, "worker-1")
        .await
        .unwrap();
    let who = sam(h);
    let report =
        |reported: Reported| p.report_outcome(&who, &proposed.run_id, "worker-1", reported);
    let settled = report(refunded("refunded 4000 cents")).await.unwrap();
    let repeated = report(refunded("refunded 4000 cents")).await.unwrap();
    let different = report(Reported {
        succeeded: false,
        result: json!("card declined"),
    })
    .await
    .unwrap_err();

    assert_eq!(
        proposed.status,
        CallStatus::Approved,
        "allowed by policy: {proposed:?}"
    );
    assert_eq!(proposed.executor, Executor::Caller);
    assert_eq!(claimed.status, CallStatus::Running);
    let claim = claimed.claim.clone().expect("the claim");
    assert_eq!(claim.claimant, "worker-1");
    assert_eq!(claim.lease_expires_at, p.now() + Duration::minutes(5));
    assert_eq!(
        claimed.key(),
        Some(format!("{}:1", claimed.action_id.clone().unwrap()))
    );
    assert_eq!(again.claim, claimed.claim, "the same claim");
    assert_eq!(settled.status, CallStatus::Succeeded);
    assert_eq!(settled.result.unwrap().content, "refunded 4000 cents");
    assert_eq!(repeated.status, CallStatus::Succeeded);
    assert_refusal(&different, "outcome_recorded", ErrorKind::Conflict);
    let history = p.history(&acme(), &proposed.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done);
    assert_eq!(
        event_names(&history.entries),
        [
            "started",
            "proposed",
            "paused",
            "executing",
            "executed",
            "resumed",
            "done"
        ]
    );
    let executing = history
        .entries
        .iter()
        .find(|e| matches!(e.event, AuditEvent::Executing { .. }))
        .unwrap();
    assert_eq!(executing.actor, Actor::person(&person("sam")));
}

async fn given_a_refund_approved_through_a_queue_when_its_resume_message_comes_then_nothing_runs_and_it_leaves_the_outbox(
    h: &Harness,
) {
    let queue = Arc::new(RecordingQueue::default());
    let p = h
        .process_of_definitions_with(&helpdesk_example(), Delivery::Queue(queue.clone()))
        .await;
    let proposed = p.gate_call(refund("call_q", 12_500)).await.unwrap();
    let approval = proposed.approval.unwrap();
    h.decided(&p, "mia", &approval.id, approve("d-1")).await;
    let [message] = queue.published().try_into().expect("one resume message");

    let report = p.resume(&message).await.unwrap();
    let again = p.resume(&message).await.unwrap();

    assert!(matches!(report, ResumeReport::Ignored { .. }), "{report:?}");
    assert!(matches!(again, ResumeReport::Ignored { .. }), "{again:?}");
    let state = p.call_state(&acme(), &proposed.run_id).await.unwrap();
    assert_eq!(
        state.status,
        CallStatus::Approved,
        "waits for its caller: {state:?}"
    );
    h.clock.advance(Duration::hours(1));
    assert!(
        p.sweep(100).await.unwrap().resent.is_empty(),
        "no longer due in the outbox"
    );
    let history = p.history(&acme(), &proposed.run_id).await.unwrap();
    assert!(!event_names(&history.entries).contains(&"executing"));
    let run = p.run_state(&acme(), &proposed.run_id).await.unwrap();
    assert_eq!(
        run.waiting_on,
        [WaitingOn::CallerClaim {
            action_id: state.action_id.clone().unwrap(),
            version: v(1),
            tool: "refund".into(),
        }],
        "the run says its caller claims the call, not that a resume is due"
    );
}

async fn given_an_approved_refund_when_two_claimants_claim_at_once_then_one_wins_and_runs_it(
    h: &Harness,
) {
    let p = Arc::new(caller_process(h).await);
    let proposed = p.gate_call(refund("call_big", 12_500)).await.unwrap();
    let early = p
        .claim_call(&sam(h), &proposed.run_id, "worker-1")
        .await
        .unwrap_err();
    assert_refusal(&early, "not_claimable", ErrorKind::Conflict);
    approved_refund(h, &p).await;

    let claiming = |claimant: &'static str| {
        let (p, who, run) = (p.clone(), sam(h), proposed.run_id.clone());
        async move { p.claim_call(&who, &run, claimant).await }
    };
    let (one, two) = at_once(claiming("worker-1"), claiming("worker-2")).await;

    let (won, lost) = match (one, two) {
        (Ok(won), Err(lost)) | (Err(lost), Ok(won)) => (won, lost),
        other => panic!("one claim wins: {other:?}"),
    };
    assert_refusal(&lost, "claimed", ErrorKind::Conflict);
    assert_eq!(won.status, CallStatus::Running);
    assert_eq!(won.args.unwrap().int("amount_cents"), Some(12_500));
    let winner = won.claim.unwrap().claimant;
    let settled = p
        .report_outcome(&sam(h), &proposed.run_id, &winner, refunded("refunded"))
        .await
        .unwrap();
    assert_eq!(settled.status, CallStatus::Succeeded);
    let loser = if winner == "worker-1" {
        "worker-2"
    } else {
        "worker-1"
    };
    let late = p
        .report_outcome(&sam(h), &proposed.run_id, loser, refunded("refunded"))
        .await
        .unwrap_err();
    assert_refusal(&late, "claimed", ErrorKind::Conflict);
}

async fn given_a_refund_a_finance_manager_lowers_when_claimed_then_version_2_with_the_lower_amount_and_its_key(
    h: &Harness,
) {
    let p = caller_process(h).await;
    let proposed = p.gate_call(refund("call_big", 12_500)).await.unwrap();

    h.decided(&p, "mia", &proposed.approval.unwrap().id, edit("d-e", 75))
        .await;
    let claimed = p
        .claim_call(&sam(h), &proposed.run_id, "worker-1")
        .await
        .unwrap();

    assert_eq!(claimed.version, Some(2));
    assert_eq!(
        claimed.args.as_ref().unwrap().int("amount_cents"),
        Some(7_500)
    );
    assert_eq!(
        claimed.key(),
        Some(format!("{}:2", claimed.action_id.unwrap()))
    );
}

async fn given_a_claim_that_goes_quiet_past_its_lease_when_swept_then_unknown_for_the_recovery_owner_and_never_claimed_again(
    h: &Harness,
) {
    let p = caller_process(h).await;
    let state = approved_refund(h, &p).await;
    p.claim_call(&sam(h), &state.run_id, "worker-1")
        .await
        .unwrap();

    h.clock.advance(Duration::minutes(6));
    p.sweep(100).await.unwrap();

    let lost = p.call_state(&acme(), &state.run_id).await.unwrap();
    assert_eq!(lost.status, CallStatus::Unknown, "{lost:?}");
    let recovery = p
        .pending(&acme())
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.kind == ApprovalKind::Recovery)
        .expect("a question for the recovery owner");
    assert_eq!(
        recovery.approver_role,
        Role::parse("finance_manager").unwrap()
    );
    assert_eq!(recovery.action_id, lost.action_id.clone().unwrap());
    let second = p
        .claim_call(&sam(h), &state.run_id, "worker-2")
        .await
        .unwrap_err();
    assert_refusal(&second, "not_claimable", ErrorKind::Conflict);

    // The caller's report arrives after all: it is the answer, and the recovery is closed.
    let late = p
        .report_outcome(
            &sam(h),
            &state.run_id,
            "worker-1",
            refunded("refunded late"),
        )
        .await
        .unwrap();

    assert_eq!(late.status, CallStatus::Succeeded, "{late:?}");
    let closed = p.approval(&acme(), &recovery.id).await.unwrap();
    assert_eq!(closed.status, ApprovalStatus::Answered);
    let history = p.history(&acme(), &state.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done);
    let reconciled = history
        .entries
        .iter()
        .find(|e| matches!(e.event, AuditEvent::Reconciled { .. }))
        .expect("audited as reconciled");
    assert_eq!(reconciled.actor, Actor::person(&person("sam")));
    assert!(p.pending(&acme()).await.unwrap().is_empty());
}

async fn given_a_rejected_or_expired_refund_when_claimed_then_refused(h: &Harness) {
    let p = caller_process(h).await;
    let rejected = p.gate_call(refund("call_r", 12_500)).await.unwrap();
    h.decided(
        &p,
        "mia",
        &rejected.approval.unwrap().id,
        reject("d-r", "Not this order."),
    )
    .await;
    let expired = p.gate_call(refund("call_x", 13_000)).await.unwrap();
    h.clock.advance(Duration::minutes(31));
    p.sweep(100).await.unwrap();

    for (run, status) in [(&rejected.run_id, "rejected"), (&expired.run_id, "expired")] {
        let refused = p.claim_call(&sam(h), run, "worker-1").await.unwrap_err();
        assert_refusal(&refused, "not_claimable", ErrorKind::Conflict);
        assert!(refused.to_string().contains(status), "{refused}");
    }
}

async fn given_an_approved_refund_whose_run_is_cancelled_when_claimed_then_refused_as_cancelled(
    h: &Harness,
) {
    let p = caller_process(h).await;
    let state = approved_refund(h, &p).await;

    p.cancel(&sam(h), &state.run_id).await.unwrap();
    let refused = p
        .claim_call(&sam(h), &state.run_id, "worker-1")
        .await
        .unwrap_err();

    assert_refusal(&refused, "not_claimable", ErrorKind::Conflict);
    let after = p.call_state(&acme(), &state.run_id).await.unwrap();
    assert_eq!(after.status, CallStatus::Cancelled);
}

async fn given_another_person_when_they_claim_or_report_then_refused_and_nothing_changes(
    h: &Harness,
) {
    let p = caller_process(h).await;
    let state = approved_refund(h, &p).await;
    let ben = h.person("ben");

    let claim = p
        .claim_call(&ben, &state.run_id, "worker-1")
        .await
        .unwrap_err();
    p.claim_call(&sam(h), &state.run_id, "worker-1")
        .await
        .unwrap();
    let report = p
        .report_outcome(&ben, &state.run_id, "worker-1", refunded("x"))
        .await
        .unwrap_err();

    assert_refusal(&claim, "not_requester", ErrorKind::Forbidden);
    assert_refusal(&report, "not_requester", ErrorKind::Forbidden);
    let after = p.call_state(&acme(), &state.run_id).await.unwrap();
    assert_eq!(after.status, CallStatus::Running);
}

async fn given_a_tool_the_agent_lacks_when_proposed_then_refused_and_nothing_waits(h: &Harness) {
    let p = caller_process(h).await;

    let refused = p
        .gate_call(GateCall {
            tool: "wire_money".into(),
            ..refund("call_w", 100)
        })
        .await
        .unwrap();

    assert_eq!(refused.status, CallStatus::Refused);
    assert!(
        refused
            .result
            .unwrap()
            .content
            .contains("no tool named wire_money"),
        "told why"
    );
    assert!(p.pending(&acme()).await.unwrap().is_empty());
}

async fn given_an_approved_refund_when_its_caller_claims_and_reports_then_each_line_names_the_call_and_its_approval(
    h: &Harness,
) {
    let p = caller_process(h).await;
    let approved = approved_refund(h, &p).await;
    let history = p.history(&acme(), &approved.run_id).await.unwrap();
    let approval = history.approvals[0].id.clone();

    let log = shared::testing::JsonLog::capture();
    p.claim_call(&sam(h), &approved.run_id, "worker-1")
        .await
        .unwrap();
    p.report_outcome(&sam(h), &approved.run_id, "worker-1", refunded("ok"))
        .await
        .unwrap();
    let lines = log.lines();

    for said in ["claimed by its caller", "outcome reported by its caller"] {
        let line = lines
            .iter()
            .find(|l| l["message"] == said)
            .unwrap_or_else(|| panic!("{said} in {lines:?}"));
        assert_eq!(line["tenant"], "acme", "{line}");
        assert_eq!(line["run_id"], approved.run_id.to_string(), "{line}");
        assert_eq!(
            line["action_id"],
            approved.action_id.as_ref().unwrap().to_string(),
            "{line}"
        );
        assert_eq!(line["approval_id"], approval.to_string(), "{line}");
    }
}

on_both_stores!([
    given_an_approved_refund_when_its_caller_claims_and_reports_then_each_line_names_the_call_and_its_approval,
    given_a_small_refund_the_caller_runs_when_it_claims_and_reports_then_it_ran_once_under_the_key,
    given_an_approved_refund_when_two_claimants_claim_at_once_then_one_wins_and_runs_it,
    given_a_refund_a_finance_manager_lowers_when_claimed_then_version_2_with_the_lower_amount_and_its_key,
    given_a_claim_that_goes_quiet_past_its_lease_when_swept_then_unknown_for_the_recovery_owner_and_never_claimed_again,
    given_a_rejected_or_expired_refund_when_claimed_then_refused,
    given_another_person_when_they_claim_or_report_then_refused_and_nothing_changes,
    given_a_tool_the_agent_lacks_when_proposed_then_refused_and_nothing_waits,
    given_a_refund_approved_through_a_queue_when_its_resume_message_comes_then_nothing_runs_and_it_leaves_the_outbox,
    given_an_approved_refund_whose_run_is_cancelled_when_claimed_then_refused_as_cancelled,
]);
