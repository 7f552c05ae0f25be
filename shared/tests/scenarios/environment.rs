//! A process without the variables an agent's bindings read (a reviewer's) records decisions
//! and runs none of the agent's calls: an approved call waits, unclaimed, in the outbox for a
//! process that has them, which runs it once; its sweep leaves what the tools would do to one.

use super::*;
use shared::agents::{Definition, Environment, InMemory};
use shared::domain::ids::AgentName;
use shared::domain::run::GateVia;
use shared::engine::{CallStatus, GateCall};

/// Where the payroll service is not: a call made there is failed, nothing sent.
pub(super) const NOWHERE: &str = "http://127.0.0.1:9/pay";

/// A payroll agent, `top` among its top-level lines, its one tool posting to `url` with the
/// binding's `http` lines: every payment waits for finance.
pub(super) fn payroll(top: &str, url: &str, http: &str) -> Definition {
    let agent = format!(
        r#"name = "payroll"
system_prompt = "You pay what you are asked to."
{top}

[tools.pay]
description = "Pays an employee, in cents."
input_schema = {{ type = "object", properties = {{ employee = {{ type = "string" }}, amount_cents = {{ type = "integer", minimum = 1 }} }}, required = ["employee", "amount_cents"], additionalProperties = false }}

[tools.pay.http]
method = "POST"
url = "{url}"
timeout = "1s"
{http}
"#
    );
    let policy = r#"name = "payroll"
version = 1
default_ttl = "1h"

[tools.pay]
decision = "approve"
approver_role = "finance"
quorum = 1
reason = "Every payment needs finance."
"#;
    // Played, where `top` names it, by a script that pays no one.
    let script = "[[turns]]\nsay = \"Nothing to pay.\"\n";
    Definition::load(&InMemory {
        dir: "test-payroll",
        files: &[
            ("agent.toml", &agent),
            ("policy.toml", policy),
            ("script.toml", script),
        ],
    })
    .expect("the payroll definition loads")
}

const TOKEN_HEADER: &str = r#"headers = { Authorization = "Bearer ${PAYROLL_TOKEN}" }"#;

/// [`payroll`] sending its token from `PAYROLL_TOKEN`, to nowhere.
pub(super) fn payroll_with_a_token() -> Definition {
    payroll("", NOWHERE, TOKEN_HEADER)
}

/// `ben` asks, through the gate API, to pay `employee` 200 dollars.
pub(super) fn pay(employee: &str) -> GateCall {
    GateCall {
        tenant: acme(),
        agent: AgentName::parse("payroll").unwrap(),
        requested_by: person("ben"),
        tool: "pay".into(),
        args: json!({"employee": employee, "amount_cents": 20_000}),
        call_id: Some(format!("pay-{employee}")),
        conversation: None,
        via: GateVia::Api,
        standing: Default::default(),
    }
}

fn with_the_token(var: &str) -> Option<String> {
    (var == "PAYROLL_TOKEN").then(|| "payroll-s3cret".to_string())
}

fn without_it(_: &str) -> Option<String> {
    None
}

/// A process of `payroll` that has the token, and one that has not (a reviewer's).
pub(super) async fn serving_and_reviewing(
    h: &Harness,
    payroll: impl Fn() -> Definition,
) -> (Process, Process) {
    let serving = h
        .process_of_definitions_in(
            &[payroll()],
            Delivery::InProcess,
            &with_the_token,
            Environment::AtStart,
        )
        .await;
    let reviewing = h
        .process_of_definitions_in(
            &[payroll()],
            Delivery::InProcess,
            &without_it,
            Environment::WhenRun,
        )
        .await;
    (serving, reviewing)
}

async fn given_a_process_without_the_agents_token_when_it_approves_a_call_then_the_call_waits_unclaimed_and_a_process_with_it_runs_it_once(
    h: &Harness,
) {
    let (serving, reviewing) = serving_and_reviewing(h, payroll_with_a_token).await;
    let waiting = serving.gate_call(pay("ana")).await.unwrap();
    assert_eq!(waiting.status, CallStatus::AwaitingApproval, "{waiting:?}");
    let approval = waiting.approval.clone().unwrap();

    // A call from outside is refused where the tool cannot run, before anything is written.
    let refused = reviewing.gate_call(pay("chen")).await.unwrap_err();
    assert_eq!(refused.code(), "not_configured");
    assert!(refused.to_string().contains("PAYROLL_TOKEN"), "{refused}");
    assert_eq!(reviewing.pending(&acme()).await.unwrap().len(), 1);

    // When a reviewer's process approves, and sweeps.
    let report = reviewing
        .decide(&h.person("dana"), &approval.id, approve("dana-1"))
        .await
        .unwrap();
    reviewing.sweep(100).await.unwrap();

    // Then the decision is recorded and the call waits approved: not claimed, not run.
    assert_eq!(report.approval.status, ApprovalStatus::Approved);
    let history = reviewing.history(&acme(), &waiting.run_id).await.unwrap();
    assert_eq!(history.actions[0].status, ActionStatus::Approved);
    assert_eq!(
        event_names(&history.entries),
        ["started", "proposed", "paused", "decision"]
    );

    // When a process with the token sweeps, twice, it runs the call once.
    serving.sweep(100).await.unwrap();
    serving.sweep(100).await.unwrap();
    let history = serving.history(&acme(), &waiting.run_id).await.unwrap();
    let names = event_names(&history.entries);
    assert_eq!(
        names.iter().filter(|n| **n == "executing").count(),
        1,
        "{names:?}"
    );
    // Its service is not there: failed, nothing sent, and the caller's run ends with it.
    assert_eq!(history.actions[0].status, ActionStatus::Failed);
    assert_eq!(history.run.status, RunStatus::Done, "{names:?}");
}

async fn given_a_call_whose_outcome_is_unknown_when_a_process_without_the_token_sweeps_then_only_a_process_with_it_asks_again(
    h: &Harness,
) {
    // A service that takes the request and never answers: the outcome is unknown.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/pay", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let silent = || payroll("", &url, TOKEN_HEADER);
    let (serving, reviewing) = serving_and_reviewing(h, silent).await;
    let waiting = serving.gate_call(pay("ana")).await.unwrap();
    let approval = waiting.approval.clone().unwrap();
    serving
        .decide(&h.person("dana"), &approval.id, approve("dana-1"))
        .await
        .unwrap();
    let history = serving.history(&acme(), &waiting.run_id).await.unwrap();
    assert_eq!(history.actions[0].status, ActionStatus::Unknown);
    let key = history.actions[0].key();

    let left = reviewing.sweep(100).await.unwrap();
    let asked = serving.sweep(100).await.unwrap();

    assert!(left.unknown.is_empty(), "{left:?}");
    assert_eq!(asked.unknown, [key]);
}

async fn given_a_run_whose_driver_stopped_when_a_process_without_the_token_sweeps_then_it_is_left_for_one_with_it(
    h: &Harness,
) {
    let scripted = || {
        payroll(
            "[model]\nprovider = \"scripted\"\noffline = \"script.toml\"",
            NOWHERE,
            TOKEN_HEADER,
        )
    };
    let (serving, reviewing) = serving_and_reviewing(h, scripted).await;
    let start = shared::engine::StartRun {
        agent: AgentName::parse("payroll").unwrap(),
        task: "Pay no one.".into(),
        ..scripted_task("ben")
    };
    // Accepted, and its driver gone before it drove it: its lease runs out.
    let accepted = serving.accept(start).await.unwrap();
    h.clock.advance(Duration::minutes(16));

    let left = reviewing.sweep(100).await.unwrap();
    let still = reviewing.run(&acme(), &accepted.run_id).await.unwrap();
    let taken = serving.sweep(100).await.unwrap();

    assert!(
        left.redriven.is_empty() && left.abandoned.is_empty(),
        "{left:?}"
    );
    assert_eq!(still.status, RunStatus::Running);
    assert_eq!(taken.redriven, from_ref(&accepted.run_id));
    let done = serving.run(&acme(), &accepted.run_id).await.unwrap();
    assert_eq!(done.status, RunStatus::Done);
}

on_both_stores!([
    given_a_process_without_the_agents_token_when_it_approves_a_call_then_the_call_waits_unclaimed_and_a_process_with_it_runs_it_once,
    given_a_call_whose_outcome_is_unknown_when_a_process_without_the_token_sweeps_then_only_a_process_with_it_asks_again,
    given_a_run_whose_driver_stopped_when_a_process_without_the_token_sweeps_then_it_is_left_for_one_with_it,
]);
