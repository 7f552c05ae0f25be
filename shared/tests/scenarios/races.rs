//! Races: two processes, each with its own connection, many rounds, on both stores. On DynamoDB
//! the local stack must be in its serial mode (moto behind a lock, one request at a time): its
//! transactions are then judged in a stricter order than DynamoDB's serializable one.

use super::*;
use harness::Process;
use shared::domain::approval::DecisionRequest;
use shared::domain::identity::Identity;
use shared::domain::ids::ApprovalId;
use shared::engine::{DecisionReport, EngineError};
use tokio::sync::Barrier;

/// Two sweeps recording one unknown outcome at once is a race too.
pub async fn given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once<
    F: Fn() -> Fut,
    Fut: Future<Output = Harness>,
>(
    fresh: F,
    _rounds: usize,
) {
    let h = fresh().await;
    super::crashes::given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once(&h).await;
}

/// Two decisions on one approval, from two processes, released at the same moment.
async fn race(
    one: (Arc<Process>, Identity, DecisionRequest),
    other: (Arc<Process>, Identity, DecisionRequest),
    approval: &ApprovalId,
) -> [Result<DecisionReport, EngineError>; 2] {
    let barrier = Arc::new(Barrier::new(2));
    let spawn = |(process, who, request): (Arc<Process>, Identity, DecisionRequest)| {
        let (barrier, approval) = (barrier.clone(), approval.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            process.decide(&who, &approval, request).await
        })
    };
    let (a, b) = (spawn(one), spawn(other));
    [a.await.unwrap(), b.await.unwrap()]
}

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
        let a = counted_process(&h, &calls).await;
        let b = counted_process(&h, &calls).await;
        Self { h, calls, a, b }
    }
}

async fn counted_process(h: &Harness, calls: &Arc<AtomicUsize>) -> Arc<Process> {
    let calls = calls.clone();
    Arc::new(
        h.process_with(
            move |tools| Counted::wrap(tools, "reimburse", calls),
            Delivery::InProcess,
        )
        .await,
    )
}

pub async fn given_a_paused_run_when_approve_and_reject_race_from_two_processes_then_exactly_one_wins_and_nothing_runs_twice<
    F: Fn() -> Fut,
    Fut: Future<Output = Harness>,
>(
    fresh: F,
    rounds: usize,
) {
    let mut approvals_won = 0;
    for round in 0..rounds {
        let Round { h, calls, a, b } = Round::of(fresh().await).await;
        let (report, approval) = h.start_paused(&a, "c-102").await;

        let results = race(
            (a.clone(), h.person("dana"), approve("d-approve")),
            (
                b.clone(),
                h.person("erin"),
                reject("d-reject", "not this one"),
            ),
            &approval.id,
        )
        .await;

        let winners: Vec<&DecisionReport> =
            results.iter().filter_map(|r| r.as_ref().ok()).collect();
        let losers: Vec<&EngineError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        assert_eq!(losers.len(), 1, "round {round}: {results:?}");
        assert_eq!(losers[0].code(), "already_decided", "round {round}");
        let approved = winners[0].approval.status == ApprovalStatus::Approved;
        approvals_won += usize::from(approved);
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
    }
    // Either outcome is fine; the count is only printed, so a run shows both sides raced.
    println!("approve won {approvals_won} of {rounds} rounds");
}

pub async fn given_one_approver_needed_when_two_approve_at_once_from_two_processes_then_the_claim_is_paid_once<
    F: Fn() -> Fut,
    Fut: Future<Output = Harness>,
>(
    fresh: F,
    rounds: usize,
) {
    for round in 0..rounds {
        let Round { h, calls, a, b } = Round::of(fresh().await).await;
        let (_, approval) = h.start_paused(&a, "c-102").await;

        let results = race(
            (a.clone(), h.person("dana"), approve("d-dana")),
            (b.clone(), h.person("erin"), approve("d-erin")),
            &approval.id,
        )
        .await;

        let won = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(won, 1, "round {round}: {results:?}");
        let lost = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert_eq!(lost.code(), "already_decided", "round {round}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "round {round}");
        assert_eq!(h.payments().await.len(), 1, "round {round}");
    }
}

pub async fn given_an_approved_payment_when_two_processes_receive_its_resume_message_at_once_then_the_tool_runs_once<
    F: Fn() -> Fut,
    Fut: Future<Output = Harness>,
>(
    fresh: F,
    rounds: usize,
) {
    for round in 0..rounds {
        let h = fresh().await;
        let queue = Arc::new(RecordingQueue::default());
        let decider = h
            .process_with(|tools| tools, Delivery::Queue(queue.clone()))
            .await;
        let (report, approval) = h.start_paused(&decider, "c-102").await;
        decider
            .decide(&h.person("dana"), &approval.id, approve("d-1"))
            .await
            .unwrap();
        let published = queue.published();
        assert_eq!(
            addressed(&published),
            [resume_message(&approval)],
            "round {round}"
        );

        let calls = Arc::new(AtomicUsize::new(0));
        let (a, b) = (
            counted_process(&h, &calls).await,
            counted_process(&h, &calls).await,
        );
        let barrier = Arc::new(Barrier::new(2));
        let consume = |process: Arc<Process>| {
            let (barrier, message) = (barrier.clone(), published[0].clone());
            tokio::spawn(async move {
                barrier.wait().await;
                process.resume(&message).await
            })
        };
        let (one, other) = (consume(a.clone()), consume(b.clone()));
        let reports = [one.await.unwrap().unwrap(), other.await.unwrap().unwrap()];

        let continued = reports
            .iter()
            .filter(|r| matches!(r, ResumeReport::Continued { .. }))
            .count();
        assert_eq!(continued, 1, "round {round}: {reports:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "round {round}");
        assert_eq!(h.payments().await.len(), 1, "round {round}");
        assert_eq!(h.run(&a, &report.run_id).await.status, RunStatus::Done);
    }
}

pub async fn given_two_approvals_in_one_turn_when_both_are_approved_at_once_from_two_processes_then_each_runs_once_and_the_run_resumes_once<
    F: Fn() -> Fut,
    Fut: Future<Output = Harness>,
>(
    fresh: F,
    rounds: usize,
) {
    for round in 0..rounds {
        let h = fresh().await;
        let script = Script::default().then_call(&[
            (
                "reimburse",
                json!({"claim_id": "c-102", "amount_cents": 25_000}),
            ),
            (
                "reimburse",
                json!({"claim_id": "c-104", "amount_cents": 39_000}),
            ),
        ]);
        let (a, b) = (
            Arc::new(h.scripted_process(script.clone()).await),
            Arc::new(h.scripted_process(script).await),
        );
        let report = a.start(scripted_task("ops")).await.unwrap();
        assert_eq!(report.approvals.len(), 2);
        let (first, second) = (
            report.approvals[0].id.clone(),
            report.approvals[1].id.clone(),
        );

        let barrier = Arc::new(Barrier::new(2));
        let decide = |process: Arc<Process>, who: Identity, approval: ApprovalId| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                process.decide(&who, &approval, approve("d-1")).await
            })
        };
        let one = decide(a.clone(), h.person("dana"), first);
        let other = decide(b.clone(), h.person("erin"), second);
        let (one, other) = (one.await.unwrap(), other.await.unwrap());

        assert!(
            one.is_ok() && other.is_ok(),
            "round {round}: {one:?} {other:?}"
        );
        assert_eq!(h.payments().await.len(), 2, "round {round}");
        let history = a.history(&acme(), &report.run_id).await.unwrap();
        assert_eq!(history.run.status, RunStatus::Done, "round {round}");
        let names = event_names(&history.entries);
        let count = |name: &str| names.iter().filter(|n| **n == name).count();
        assert_eq!(count("resumed"), 1, "round {round}: {names:?}");
        assert_eq!(count("executed"), 2, "round {round}: {names:?}");
        let results = results_after_turn(&history.run, 0);
        assert_eq!(results.len(), 2, "round {round}");
        assert!(
            results
                .iter()
                .all(|(_, r)| r.content.contains("paid_cents")),
            "round {round}: {results:?}"
        );
    }
}

pub async fn given_an_overdue_approval_when_the_sweep_and_a_late_approval_race_then_it_expires_once_and_nothing_is_paid<
    F: Fn() -> Fut,
    Fut: Future<Output = Harness>,
>(
    fresh: F,
    rounds: usize,
) {
    for round in 0..rounds {
        let Round { h, calls, a, b } = Round::of(fresh().await).await;
        let (report, approval) = h.start_paused(&a, "c-102").await;
        h.clock.advance(Duration::hours(25));

        let barrier = Arc::new(Barrier::new(2));
        let sweep = {
            let (barrier, a) = (barrier.clone(), a.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                a.sweep(100).await
            })
        };
        let late = {
            let (barrier, b, dana, id) = (
                barrier.clone(),
                b.clone(),
                h.person("dana"),
                approval.id.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                b.decide(&dana, &id, approve("d-late")).await
            })
        };
        let swept = sweep.await.unwrap().unwrap();
        let refused = late.await.unwrap().unwrap_err();

        assert_eq!(refused.code(), "expired", "round {round}");
        assert!(swept.expired.len() <= 1, "round {round}: {swept:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 0, "round {round}");
        assert!(h.payments().await.is_empty(), "round {round}");
        let history = a.history(&acme(), &report.run_id).await.unwrap();
        let names = event_names(&history.entries);
        let count = |name: &str| names.iter().filter(|n| **n == name).count();
        assert_eq!(count("expired"), 1, "round {round}: {names:?}");
        assert_eq!(count("resumed"), 1, "round {round}: {names:?}");
        assert_eq!(history.run.status, RunStatus::Done, "round {round}");
    }
}

pub async fn given_a_paused_run_when_its_requester_cancels_as_an_approver_approves_then_a_refused_approval_never_pays<
    F: Fn() -> Fut,
    Fut: Future<Output = Harness>,
>(
    fresh: F,
    rounds: usize,
) {
    for round in 0..rounds {
        let Round { h, calls, a, b } = Round::of(fresh().await).await;
        let (report, approval) = h.start_paused(&a, "c-102").await;

        let barrier = Arc::new(Barrier::new(2));
        let cancel = {
            let (barrier, a, ben, run) = (
                barrier.clone(),
                a.clone(),
                h.person("ben"),
                report.run_id.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                a.cancel(&ben, &run).await
            })
        };
        let approve_it = {
            let (barrier, b, dana, id) = (
                barrier.clone(),
                b.clone(),
                h.person("dana"),
                approval.id.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                b.decide(&dana, &id, approve("d-1")).await
            })
        };
        let cancelled = cancel.await.unwrap();
        let decided = approve_it.await.unwrap();

        let payments = h.payments().await.len();
        let history = a.history(&acme(), &report.run_id).await.unwrap();
        let action = history
            .actions
            .iter()
            .find(|x| x.id == approval.action_id)
            .unwrap();
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
}

/// Every race, on one backend, `$rounds` rounds each on a fresh store; `$check`, if any, runs
/// first.
macro_rules! every_race {
    ($module:ident, $backend:expr, $rounds:expr $(, $check:expr)?) => {
        races_on!($module, $backend, $rounds, { $($check;)? }, [
            given_a_stale_execution_when_two_sweeps_record_its_unknown_outcome_at_once_then_neither_fails_and_it_is_recorded_once,
            given_a_paused_run_when_approve_and_reject_race_from_two_processes_then_exactly_one_wins_and_nothing_runs_twice,
            given_one_approver_needed_when_two_approve_at_once_from_two_processes_then_the_claim_is_paid_once,
            given_an_approved_payment_when_two_processes_receive_its_resume_message_at_once_then_the_tool_runs_once,
            given_two_approvals_in_one_turn_when_both_are_approved_at_once_from_two_processes_then_each_runs_once_and_the_run_resumes_once,
            given_an_overdue_approval_when_the_sweep_and_a_late_approval_race_then_it_expires_once_and_nothing_is_paid,
            given_a_paused_run_when_its_requester_cancels_as_an_approver_approves_then_a_refused_approval_never_pays,
        ]);
    };
}

/// The races listed, each a test on one backend.
macro_rules! races_on {
    ($module:ident, $backend:expr, $rounds:expr, $check:block, [$($race:ident),* $(,)?]) => {
        mod $module {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $race() {
                    $check
                    super::$race(|| async { Harness::new($backend).await }, $rounds).await;
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
