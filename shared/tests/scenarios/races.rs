//! Races: two processes, each with its own connection, many rounds, on both stores. On DynamoDB
//! the local stack must be in its serial mode (moto behind a lock, one request at a time): its
//! transactions are then judged in a stricter order than DynamoDB's serializable one.
//!
//! Each race is one round on a fresh store; `races_on!` runs it the given number of rounds.

use super::*;

/// Two sweeps recording one unknown outcome at once is a race too.
pub async fn given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once(
    h: Harness,
    _round: usize,
) {
    super::crashes::given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once(&h).await;
}

pub use super::history::{
    given_limits_of_usd_500_and_six_calls_when_sixteen_processes_propose_usd_100_at_once_then_five_run_one_waits_and_ten_are_denied,
    given_no_limit_on_calls_an_hour_when_sixteen_processes_propose_usd_600_at_once_then_all_sixteen_wait_on_finance,
};

/// One round of a race: a fresh store, and two processes over it whose `reimburse` calls are
/// counted together.
struct Round {
    h: Harness,
    calls: Arc<AtomicUsize>,
    a: Arc<Process>,
    b: Arc<Process>,
}

impl Round {
    async fn of(h: Harness) -> Self {
        let calls = Arc::new(AtomicUsize::new(0));
        let a = Arc::new(h.counted_process(&calls).await);
        let b = Arc::new(h.counted_process(&calls).await);
        Self { h, calls, a, b }
    }

    /// A round in which c-102 pauses, then dana through `a` and erin through `b` decide on it at
    /// once with `dana` and `erin`: the round, the paused run, its approval and both outcomes.
    async fn c102_decided_at_once(
        h: Harness,
        dana: DecisionRequest,
        erin: DecisionRequest,
    ) -> (
        Self,
        RunReport,
        Approval,
        [Result<DecisionReport, EngineError>; 2],
    ) {
        let round = Self::of(h).await;
        let (report, approval) = round.h.start_paused(&round.a, "c-102").await;
        let (one, other) = at_once(
            deciding(&round.a, round.h.person("dana"), &approval.id, dana),
            deciding(&round.b, round.h.person("erin"), &approval.id, erin),
        )
        .await;
        (round, report, approval, [one, other])
    }
}

pub async fn given_a_paused_run_when_approve_and_reject_race_from_two_processes_then_exactly_one_wins_and_nothing_runs_twice(
    h: Harness,
    round: usize,
) {
    let (Round { h, calls, a, b }, report, approval, results) =
        Round::c102_decided_at_once(h, approve("d-approve"), reject("d-reject", "not this one"))
            .await;

    let winners: Vec<&DecisionReport> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let losers: Vec<&EngineError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(winners.len(), 1, "round {round}: {results:?}");
    assert_eq!(losers.len(), 1, "round {round}: {results:?}");
    assert_eq!(losers[0].code(), "already_decided", "round {round}");
    let approved = winners[0].approval.status == ApprovalStatus::Approved;
    let expected_calls = usize::from(approved);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        expected_calls,
        "round {round}"
    );
    assert_eq!(h.payments().await.len(), expected_calls, "round {round}");
    let stored = a.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.decisions.len(), 1, "round {round}");
    assert_eq!(h.run(&b, &report.run_id).await.status, RunStatus::Done);
    // Either outcome is fine; the winner is only printed, so a run shows both sides raced.
    let won = if approved { "approve" } else { "reject" };
    println!("round {round}: {won} won");
}

pub async fn given_one_approver_needed_when_two_approve_at_once_from_two_processes_then_the_claim_is_paid_once(
    h: Harness,
    round: usize,
) {
    let (Round { h, calls, .. }, _, _, results) =
        Round::c102_decided_at_once(h, approve("d-dana"), approve("d-erin")).await;

    let won = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(won, 1, "round {round}: {results:?}");
    let lost = results.iter().find_map(|r| r.as_ref().err()).unwrap();
    assert_eq!(lost.code(), "already_decided", "round {round}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "round {round}");
    assert_eq!(h.payments().await.len(), 1, "round {round}");
}

pub async fn given_an_approved_payment_when_two_processes_receive_its_resume_message_at_once_then_the_tool_runs_once(
    h: Harness,
    round: usize,
) {
    let (_, queue, report, _) = approved_through_a_queue(&h).await;
    let published = queue.published();

    let Round { h, calls, a, b } = Round::of(h).await;
    let consume = |process: &Arc<Process>| {
        let (process, message) = (process.clone(), published[0].clone());
        async move { process.resume(&message).await }
    };
    let (one, other) = at_once(consume(&a), consume(&b)).await;
    let reports = [one.unwrap(), other.unwrap()];

    let continued = reports
        .iter()
        .filter(|r| matches!(r, ResumeReport::Continued { .. }))
        .count();
    assert_eq!(continued, 1, "round {round}: {reports:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "round {round}");
    assert_eq!(h.payments().await.len(), 1, "round {round}");
    assert_eq!(h.run(&a, &report.run_id).await.status, RunStatus::Done);
}

pub async fn given_two_approvals_in_one_turn_when_both_are_approved_at_once_from_two_processes_then_each_runs_once_and_the_run_resumes_once(
    h: Harness,
    round: usize,
) {
    let script =
        Script::default().then_call(&[reimburse("c-102", 25_000), reimburse("c-104", 39_000)]);
    let (a, b) = (
        Arc::new(h.scripted_process(script.clone()).await),
        Arc::new(h.scripted_process(script).await),
    );
    let report = a.start(scripted_task("ops")).await.unwrap();
    assert_eq!(report.approvals.len(), 2);
    let (first, second) = (&report.approvals[0].id, &report.approvals[1].id);

    let (one, other) = at_once(
        deciding(&a, h.person("dana"), first, approve("d-1")),
        deciding(&b, h.person("erin"), second, approve("d-1")),
    )
    .await;

    assert!(
        one.is_ok() && other.is_ok(),
        "round {round}: {one:?} {other:?}"
    );
    assert_eq!(h.payments().await.len(), 2, "round {round}");
    let history = a.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done, "round {round}");
    let names = event_names(&history.entries);
    assert_eq!(
        times(&history.entries, ["resumed", "executed"]),
        [1, 2],
        "round {round}: {names:?}"
    );
    let results = results_after_turn(&history.run, 0);
    assert_eq!(results.len(), 2, "round {round}");
    assert!(
        results
            .iter()
            .all(|(_, r)| r.content.contains("paid_cents")),
        "round {round}: {results:?}"
    );
}

pub async fn given_an_overdue_approval_when_the_sweep_and_a_late_approval_race_then_it_expires_once_and_nothing_is_paid(
    h: Harness,
    round: usize,
) {
    let Round { h, calls, a, b } = Round::of(h).await;
    let (report, approval) = h.start_paused(&a, "c-102").await;
    h.clock.advance(Duration::hours(25));

    let sweep = {
        let a = a.clone();
        async move { a.sweep(100).await }
    };
    let late = deciding(&b, h.person("dana"), &approval.id, approve("d-late"));
    let (swept, refused) = at_once(sweep, late).await;
    let (swept, refused) = (swept.unwrap(), refused.unwrap_err());

    assert_eq!(refused.code(), "expired", "round {round}");
    assert!(swept.expired.len() <= 1, "round {round}: {swept:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "round {round}");
    assert!(h.payments().await.is_empty(), "round {round}");
    let history = a.history(&acme(), &report.run_id).await.unwrap();
    let names = event_names(&history.entries);
    assert_eq!(
        times(&history.entries, ["expired", "resumed"]),
        [1, 1],
        "round {round}: {names:?}"
    );
    assert_eq!(history.run.status, RunStatus::Done, "round {round}");
}

pub async fn given_a_paused_run_when_its_requester_cancels_as_an_approver_approves_then_a_refused_approval_never_pays(
    h: Harness,
    round: usize,
) {
    let Round { h, calls, a, b } = Round::of(h).await;
    let (report, approval) = h.start_paused(&a, "c-102").await;

    let cancel = {
        let (a, ben, run) = (a.clone(), h.person("ben"), report.run_id.clone());
        async move { a.cancel(&ben, &run).await }
    };
    let approve_it = deciding(&b, h.person("dana"), &approval.id, approve("d-1"));
    let (cancelled, decided) = at_once(cancel, approve_it).await;

    let payments = h.payments().await.len();
    let history = a.history(&acme(), &report.run_id).await.unwrap();
    let action = action_of(&history, &approval);
    match (&cancelled, &decided) {
        (Ok(_), Err(refused)) => {
            assert_eq!(refused.code(), "cancelled", "round {round}");
            assert_eq!(action.status, ActionStatus::Cancelled, "round {round}");
            assert_eq!(payments, 0, "round {round}");
        }
        (Ok(_), Ok(_)) => {
            // Approved first, cancelled before or while it ran: it runs at most once.
            assert_eq!(history.run.status, RunStatus::Cancelled, "round {round}");
            assert!(payments <= 1, "round {round}");
            let ran = action.status == ActionStatus::Succeeded;
            assert_eq!(payments, usize::from(ran), "round {round}: {action:?}");
        }
        (Err(refused), Ok(_)) => {
            assert_eq!(refused.code(), "run_finished", "round {round}");
            assert_eq!(history.run.status, RunStatus::Done, "round {round}");
            assert_eq!(payments, 1, "round {round}");
        }
        (Err(_), Err(_)) => {
            panic!("round {round}: both refused: {cancelled:?} {decided:?}")
        }
    }
    assert!(calls.load(Ordering::SeqCst) <= 1, "round {round}");
}

pub async fn given_a_cap_of_three_when_two_processes_propose_eight_calls_for_one_requester_at_once_then_exactly_three_approvals_open(
    h: Harness,
    round: usize,
) {
    use super::open_approvals::{capped, gated_payment, open_of};
    let (a, b) = (
        Arc::new(capped(&h, 3, Script::default()).await),
        Arc::new(capped(&h, 3, Script::default()).await),
    );
    let barrier = Arc::new(Barrier::new(8));
    let proposals: Vec<_> = (0..8)
        .map(|n| {
            let process = [&a, &b][n % 2].clone();
            let barrier = barrier.clone();
            let call = gated_payment("ben", &format!("call-{n}"), "c-102", 25_000 + n as i64);
            tokio::spawn(async move {
                barrier.wait().await;
                process.gate_call(call).await
            })
        })
        .collect();
    let mut results = Vec::new();
    for proposal in proposals {
        results.push(proposal.await.unwrap());
    }

    let opened = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(opened, 3, "round {round}: {results:?}");
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(refused.code(), "too_many_open_approvals", "round {round}");
    }
    assert_eq!(a.pending(&acme()).await.unwrap().len(), 3, "round {round}");
    assert_eq!(open_of(&a, "ben").await, 3, "round {round}");
}

/// Every race, on one backend, `$rounds` rounds each on a fresh store; `$check`, if any, runs
/// first.
macro_rules! every_race {
    ($module:ident, $backend:expr, $rounds:expr $(, $check:expr)?) => {
        races_on!($module, $backend, { $($check;)? }, [
            // Its tool holds both sweeps until they meet: one round makes them race.
            given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once => 1,
            given_a_paused_run_when_approve_and_reject_race_from_two_processes_then_exactly_one_wins_and_nothing_runs_twice => $rounds,
            given_one_approver_needed_when_two_approve_at_once_from_two_processes_then_the_claim_is_paid_once => $rounds,
            given_an_approved_payment_when_two_processes_receive_its_resume_message_at_once_then_the_tool_runs_once => $rounds,
            given_two_approvals_in_one_turn_when_both_are_approved_at_once_from_two_processes_then_each_runs_once_and_the_run_resumes_once => $rounds,
            given_an_overdue_approval_when_the_sweep_and_a_late_approval_race_then_it_expires_once_and_nothing_is_paid => $rounds,
            given_a_paused_run_when_its_requester_cancels_as_an_approver_approves_then_a_refused_approval_never_pays => $rounds,
            given_a_cap_of_three_when_two_processes_propose_eight_calls_for_one_requester_at_once_then_exactly_three_approvals_open => $rounds,
            // Sixteen processes each round: a few rounds race them enough.
            given_limits_of_usd_500_and_six_calls_when_sixteen_processes_propose_usd_100_at_once_then_five_run_one_waits_and_ten_are_denied => 3,
            given_no_limit_on_calls_an_hour_when_sixteen_processes_propose_usd_600_at_once_then_all_sixteen_wait_on_finance => 3,
        ]);
    };
}

/// The races listed, each a test on one backend of as many rounds as it names.
macro_rules! races_on {
    ($module:ident, $backend:expr, $check:block, [$($race:ident => $rounds:expr),* $(,)?]) => {
        mod $module {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $race() {
                    $check
                    for round in 0..$rounds {
                        super::$race(Harness::new($backend).await, round).await;
                    }
                }
            )*
        }
    };
}

every_race!(races_on_embedded, Embedded::fresh(), 20);
// moto judges races only when it takes one request at a time: the local stack's serial mode.
every_race!(
    races_on_dynamodb,
    DynamoDb::fresh("race").await,
    10,
    support::aws::assert_serial().await
);
