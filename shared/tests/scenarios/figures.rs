//! What an operator sees: the approvals waiting and the oldest one's wait, the unknown
//! outcomes, read from the store by any process; and the counts of decisions, executions and
//! rulings, kept by the embedded store with the transactions that record them and printed
//! by a function's DynamoDB store as metric lines once they commit.

use super::*;
use shared::adapters::emf::{Emf, Printed, rule_broken};
use shared::domain::ids::AgentName;
use shared::domain::policy::VerdictKind;
use shared::engine::{AgentFigures, Figures};
use shared::ports::counters::{
    DecisionOutcome, ExecutionOutcome, ModelOutcome, RuleMode, TokenKind,
};

/// The expense agent's figures for acme, as `p` reads them.
async fn expense(p: &Process) -> (Figures, AgentFigures) {
    let figures = p.figures(Some(&acme())).await.unwrap();
    let expense = AgentName::parse("expense").unwrap();
    let shown = figures
        .agents
        .iter()
        .find(|a| a.tenant == acme() && a.agent == expense)
        .cloned()
        .unwrap_or_else(|| panic!("the expense agent is shown: {figures:?}"));
    (figures, shown)
}

fn ruled(shown: &AgentFigures, outcome: VerdictKind, mode: RuleMode) -> u64 {
    shown
        .policy_outcomes
        .iter()
        .find(|r| r.outcome == outcome && r.mode == mode)
        .map_or(0, |r| r.count)
}

/// Whether this store keeps counts: the embedded one does, DynamoDB does not.
fn counts_kept(h: &Harness) -> bool {
    h.backend() == "embedded"
}

async fn given_an_approval_waiting_ten_minutes_when_another_process_approves_it_then_none_waits_and_the_decision_is_counted_with_its_time(
    h: &Harness,
) {
    let started = h.process().await;
    let (_, approval) = h.start_paused(&started, "c-102").await;
    h.clock.advance(Duration::minutes(10));

    let watcher = h.process().await;
    let (_, before) = expense(&watcher).await;
    assert_eq!(before.approvals_waiting, 1);
    assert_eq!(before.oldest_wait_seconds, 600.0);
    assert_eq!(before.unknown_outcomes, 0);

    let decider = h.process().await;
    h.decided(&decider, "dana", &approval.id, approve("d-1"))
        .await;

    // A process started after the decision reads what the others wrote: a restart loses nothing.
    let restarted = h.process().await;
    let (figures, after) = expense(&restarted).await;
    assert_eq!(figures.counted, counts_kept(h));
    assert_eq!(after.approvals_waiting, 0);
    assert_eq!(after.oldest_wait_seconds, 0.0);
    let counted = u64::from(counts_kept(h));
    assert_eq!(after.decisions[&DecisionOutcome::Approved], counted);
    assert_eq!(after.decisions[&DecisionOutcome::Rejected], 0);
    assert_eq!(after.decision_seconds.count, counted);
    assert_eq!(after.decision_seconds.sum, 600.0 * counted as f64);
    // Ten minutes is past the 300 s bucket and within the 900 s one.
    let within = |bound: f64| {
        after
            .decision_seconds
            .buckets
            .iter()
            .find(|(b, _)| *b == bound)
            .unwrap()
            .1
    };
    // Each bucket holds its own decisions: none in the 1800 s one, nor past the last.
    assert_eq!(
        (within(300.0), within(900.0), within(1800.0)),
        (0, counted, 0)
    );
    assert_eq!(after.decision_seconds.beyond, 0);
    // The payment ran once the decision was made; the claim's reads ran before.
    let succeeded = |f: &AgentFigures| f.executions[&ExecutionOutcome::Succeeded];
    assert_eq!(succeeded(&after) - succeeded(&before), counted);
    assert_eq!(
        ruled(&after, VerdictKind::Approve, RuleMode::Enforce),
        counted
    );
    assert!(ruled(&after, VerdictKind::Allow, RuleMode::Enforce) >= counted);
    assert_eq!(ruled(&after, VerdictKind::Deny, RuleMode::Enforce), 0);
    // The scripted model reports no usage: each turn a request counted with its run's writes,
    // and no tokens.
    let asked = |f: &AgentFigures| f.model_requests[&ModelOutcome::Ok];
    assert_eq!(asked(&before) > 0, counts_kept(h), "{before:?}");
    assert_eq!(
        asked(&after) - asked(&before),
        counted,
        "the resumed run's one turn"
    );
    assert_eq!(after.model_requests[&ModelOutcome::Error], 0);
    assert_eq!(after.model_tokens[&TokenKind::Input], 0);
}

async fn given_an_approval_nobody_decides_when_the_sweep_expires_it_then_none_waits_and_one_expiry_is_counted(
    h: &Harness,
) {
    let p = h.process().await;
    h.start_paused(&p, "c-102").await;
    h.clock.advance(Duration::hours(24) + Duration::minutes(1));
    let (_, overdue) = expense(&p).await;
    assert_eq!(
        overdue.approvals_waiting, 1,
        "waiting until the sweep expires it"
    );

    p.sweep(100).await.unwrap();

    let (_, after) = expense(&h.process().await).await;
    assert_eq!(after.approvals_waiting, 0);
    let counted = u64::from(counts_kept(h));
    assert_eq!(after.decisions[&DecisionOutcome::Expired], counted);
    assert_eq!(after.decisions[&DecisionOutcome::Approved], 0);
    assert_eq!(after.executions[&ExecutionOutcome::Failed], 0);
    assert_eq!(after.executions[&ExecutionOutcome::Unknown], 0);
}

async fn given_a_payment_whose_answer_was_lost_when_it_waits_for_reconciliation_then_it_is_one_unknown_outcome(
    h: &Harness,
) {
    let (_, p, _, approval) = paused_where_answers_are_lost(h).await;
    h.decided(&p, "dana", &approval.id, approve("d-1")).await;

    let (_, shown) = expense(&h.process().await).await;
    assert_eq!(shown.unknown_outcomes, 1);
    assert_eq!(shown.approvals_waiting, 0);
    let counted = u64::from(counts_kept(h));
    assert_eq!(shown.executions[&ExecutionOutcome::Unknown], counted);
    assert_eq!(shown.executions[&ExecutionOutcome::Failed], 0);
}

async fn given_a_payment_whose_answer_was_lost_when_its_recovery_owner_is_asked_then_it_is_one_unknown_outcome_not_an_approval_waiting(
    h: &Harness,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let p = h
        .process_recovering(on_reimburse(AnswerLost(Counted::new(&calls))), "finance")
        .await;
    super::recovery::lost_payment(h, &p).await;

    let (_, shown) = expense(&h.process().await).await;
    assert_eq!(shown.unknown_outcomes, 1);
    assert_eq!(shown.approvals_waiting, 0);
}

async fn given_two_tenants_when_one_is_asked_for_then_only_its_figures_are_shown(h: &Harness) {
    let p = h.process().await;
    h.start_paused(&p, "c-102").await;

    let all = p.figures(None).await.unwrap();
    let globex = TenantId::parse("globex").unwrap();
    let other = p.figures(Some(&globex)).await.unwrap();

    assert_eq!(
        all.agents
            .iter()
            .map(|a| (a.tenant.as_str(), a.approvals_waiting))
            .collect::<Vec<_>>(),
        [("acme", 1)]
    );
    assert!(
        other
            .agents
            .iter()
            .all(|a| a.tenant == globex && a.approvals_waiting == 0),
        "{other:?}"
    );
}

/// A payroll call approved by a process that cannot run it: its resume there fails, and the
/// call waits in the outbox. The figures of the payroll agent, read afterwards by a process
/// that has it loaded.
async fn approved_where_it_cannot_run(h: &Harness) -> AgentFigures {
    use super::environment::{pay, payroll_with_a_token, serving_and_reviewing};
    let (serving, reviewing) = serving_and_reviewing(h, payroll_with_a_token).await;
    let waiting = serving.gate_call(pay("ana")).await.unwrap();
    let approval = waiting.approval.unwrap();

    reviewing
        .decide(&h.person("dana"), &approval.id, approve("dana-1"))
        .await
        .unwrap();

    let figures = reviewing.figures(Some(&acme())).await.unwrap();
    figures
        .agents
        .into_iter()
        .find(|a| a.agent.as_str() == "payroll")
        .unwrap_or_else(|| panic!("the payroll agent is shown"))
}

async fn given_a_decision_in_a_process_that_cannot_run_the_call_when_its_resume_fails_there_then_one_resume_failure_is_counted(
    h: &Harness,
) {
    let shown = approved_where_it_cannot_run(h).await;

    assert_eq!(shown.resume_failures, u64::from(counts_kept(h)));
    assert_eq!(shown.executions[&ExecutionOutcome::Succeeded], 0);
}

// Each scenario on the embedded store and on DynamoDB (moto over HTTP).
on_both_stores!([
    given_an_approval_waiting_ten_minutes_when_another_process_approves_it_then_none_waits_and_the_decision_is_counted_with_its_time,
    given_an_approval_nobody_decides_when_the_sweep_expires_it_then_none_waits_and_one_expiry_is_counted,
    given_a_payment_whose_answer_was_lost_when_it_waits_for_reconciliation_then_it_is_one_unknown_outcome,
    given_a_payment_whose_answer_was_lost_when_its_recovery_owner_is_asked_then_it_is_one_unknown_outcome_not_an_approval_waiting,
    given_two_tenants_when_one_is_asked_for_then_only_its_figures_are_shown,
    given_a_decision_in_a_process_that_cannot_run_the_call_when_its_resume_fails_there_then_one_resume_failure_is_counted,
]);

/// The lines `printed` holds that carry `metric`, as (outcome, value) pairs.
fn printed_of(lines: &[serde_json::Value], metric: &str) -> Vec<(String, f64)> {
    lines
        .iter()
        .filter_map(|line| {
            let value = line.get(metric)?.as_f64()?;
            let outcome = line.get("outcome").and_then(|o| o.as_str()).unwrap_or("");
            Some((outcome.to_string(), value))
        })
        .collect()
}

#[tokio::test]
async fn dynamodb_given_a_function_store_when_a_claim_waits_ten_minutes_and_is_approved_then_each_count_is_printed_as_a_valid_metric_line()
 {
    let printed = Printed::default();
    let h = Harness::new(DynamoDb::emitting("emf", Emf::to(printed.clone())).await).await;
    let started = h.process().await;
    let (_, approval) = h.start_paused(&started, "c-102").await;
    let opened = printed.lines();
    assert_eq!(
        printed_of(&opened, "countersign_policy_outcomes_total"),
        [
            ("allow".into(), 1.0),
            ("allow".into(), 1.0),
            ("allow".into(), 1.0),
            ("approve".into(), 1.0)
        ],
        "the claim's three reads ran, the payment waits: {opened:?}"
    );
    let asked = printed_of(&opened, "countersign_model_requests_total");
    assert!(!asked.is_empty(), "{opened:?}");
    assert!(
        asked.iter().all(|(outcome, _)| outcome == "ok"),
        "{asked:?}"
    );
    h.clock.advance(Duration::minutes(10));

    // The sweep's gauges: the figures read from the table, a line per tenant and agent.
    let gauges = Printed::default();
    Emf::to(gauges.clone()).figures(&started.figures(None).await.unwrap());
    let gauges = gauges.lines();
    assert_eq!(gauges.len(), 1, "{gauges:?}");
    assert_eq!(rule_broken(&gauges[0]), None);
    assert_eq!(
        (gauges[0]["tenant"].as_str(), gauges[0]["agent"].as_str()),
        (Some("acme"), Some("expense"))
    );
    assert_eq!(gauges[0]["countersign_approvals_waiting"], 1.0);
    assert_eq!(gauges[0]["countersign_approval_oldest_wait_seconds"], 600.0);

    let decider = h.process().await;
    h.decided(&decider, "dana", &approval.id, approve("d-1"))
        .await;

    let lines = printed.lines();
    for line in &lines {
        assert_eq!(rule_broken(line), None);
        assert_eq!(line["tenant"], "acme");
    }
    assert_eq!(
        printed_of(&lines, "countersign_decisions_total"),
        [("approved".into(), 1.0)]
    );
    assert_eq!(
        printed_of(&lines, "countersign_decision_seconds"),
        [("approved".into(), 600.0)]
    );
    let ran = printed_of(&lines, "countersign_executions_total");
    assert!(ran.contains(&("succeeded".into(), 1.0)), "{ran:?}");
    assert!(
        ran.iter().all(|(outcome, _)| outcome == "succeeded"),
        "{ran:?}"
    );
    // Nothing is counted in the table: the store keeps no counter item.
    let (figures, _) = expense(&h.process().await).await;
    assert!(!figures.counted);
}

#[tokio::test]
async fn dynamodb_given_a_function_store_when_a_resume_fails_then_it_prints_one_resume_failure_line_under_the_runs_agent()
 {
    let printed = Printed::default();
    let h = Harness::new(DynamoDb::emitting("emf-resume", Emf::to(printed.clone())).await).await;

    approved_where_it_cannot_run(&h).await;

    let lines = printed.lines();
    let failures: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|line| line.get("countersign_resume_failures_total").is_some())
        .collect();
    assert_eq!(failures.len(), 1, "{lines:?}");
    assert_eq!(rule_broken(failures[0]), None);
    assert_eq!(
        (
            failures[0]["tenant"].as_str(),
            failures[0]["agent"].as_str()
        ),
        (Some("acme"), Some("payroll"))
    );
    assert_eq!(failures[0]["countersign_resume_failures_total"], 1.0);
}
