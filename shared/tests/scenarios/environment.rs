//! A process without the variables an agent's bindings read (a reviewer's) records decisions
//! and runs none of the agent's calls: an approved call waits, unclaimed, in the outbox for a
//! process that has them, which runs it once.

use super::*;
use shared::adapters::env_template::Lookup;
use shared::agents::{Definition, Environment, InMemory};
use shared::domain::ids::AgentName;
use shared::domain::run::GateVia;
use shared::engine::{CallStatus, GateCall};

/// A payroll agent, `top` among its top-level lines and `http` among its one tool's binding:
/// every payment waits for finance. Its service is not there: a call made is failed, nothing
/// sent.
pub(super) fn payroll(top: &str, http: &str) -> Definition {
    let agent = format!(
        r#"name = "payroll"
system_prompt = "You pay what you are asked to."
{top}

[tools.pay]
description = "Pays an employee, in cents."
input_schema = {{ type = "object", properties = {{ employee = {{ type = "string" }}, amount_cents = {{ type = "integer", minimum = 1 }} }}, required = ["employee", "amount_cents"], additionalProperties = false }}

[tools.pay.http]
method = "POST"
url = "http://127.0.0.1:9/pay"
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
    Definition::load(&InMemory {
        dir: "test-payroll",
        files: &[("agent.toml", &agent), ("policy.toml", policy)],
    })
    .expect("the payroll definition loads")
}

/// [`payroll`] sending its token from `PAYROLL_TOKEN`.
fn payroll_with_a_token() -> Definition {
    payroll(
        "",
        r#"headers = { Authorization = "Bearer ${PAYROLL_TOKEN}" }"#,
    )
}

/// `ben` asks, through the gate API, to pay `employee` 200 dollars.
fn pay(employee: &str) -> GateCall {
    GateCall {
        tenant: acme(),
        agent: AgentName::parse("payroll").unwrap(),
        requested_by: person("ben"),
        tool: "pay".into(),
        args: json!({"employee": employee, "amount_cents": 20_000}),
        call_id: Some(format!("pay-{employee}")),
        conversation: None,
        via: GateVia::Api,
    }
}

fn with_the_token(var: &str) -> Option<String> {
    (var == "PAYROLL_TOKEN").then(|| "payroll-s3cret".to_string())
}

fn without_it(_: &str) -> Option<String> {
    None
}

/// A process of the payroll agent, its variables read from `env`.
async fn payroll_process(h: &Harness, env: Lookup<'_>, environment: Environment) -> Process {
    h.process_of_definitions_in(
        &[payroll_with_a_token()],
        Delivery::InProcess,
        env,
        environment,
    )
    .await
}

async fn given_a_process_without_the_agents_token_when_it_approves_a_call_then_the_call_waits_unclaimed_and_a_process_with_it_runs_it_once(
    h: &Harness,
) {
    let serving = payroll_process(h, &with_the_token, Environment::AtStart).await;
    let reviewing = payroll_process(h, &without_it, Environment::WhenRun).await;
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

on_both_stores!([
    given_a_process_without_the_agents_token_when_it_approves_a_call_then_the_call_waits_unclaimed_and_a_process_with_it_runs_it_once,
]);
