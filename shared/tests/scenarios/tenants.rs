//! An agent serves the tenants its definition names: to any other it does not exist, on every
//! path (a run, a call from outside, a decision, a read), in the words an unknown agent gets.

use super::*;
use shared::agents::Definition;
use shared::domain::ids::AgentName;
use shared::domain::run::GateVia;
use shared::engine::{CallStatus, GateCall};

/// The payroll agent that `tenants` (a TOML line) may use.
fn payroll(tenants: &str) -> Definition {
    super::environment::payroll(tenants, super::environment::NOWHERE, "")
}

/// `who` asks, through the gate API, to pay ana 200 dollars with `agent`.
fn pay(who: &Identity, agent: &str) -> GateCall {
    GateCall {
        tenant: who.tenant.clone(),
        agent: AgentName::parse(agent).unwrap(),
        requested_by: who.person.clone(),
        tool: "pay".into(),
        args: json!({"employee": "ana", "amount_cents": 20_000}),
        call_id: Some(format!("pay-{}-{agent}", who.person)),
        conversation: None,
        via: GateVia::Api,
        standing: Default::default(),
    }
}

async fn given_an_agent_for_acme_when_globex_calls_it_or_runs_it_then_it_is_not_found_as_an_unknown_agent_is(
    h: &Harness,
) {
    let p = h
        .process_of_definitions(&[payroll("tenants = [\"acme\"]")])
        .await;
    // zoe is of globex.
    let zoe = h.person("zoe");

    let foreign = p.gate_call(pay(&zoe, "payroll")).await.unwrap_err();
    let unknown = p.gate_call(pay(&zoe, "nobody")).await.unwrap_err();

    assert_refusal(&foreign, "not_found", ErrorKind::NotFound);
    assert_eq!(foreign.to_string(), "agent payroll was not found");
    assert_eq!(unknown.to_string(), "agent nobody was not found");
    assert!(p.pending(&zoe.tenant).await.unwrap().is_empty());
    let taken = p.gate_call(pay(&h.person("ben"), "payroll")).await.unwrap();
    assert_eq!(taken.status, CallStatus::AwaitingApproval);

    // A run the engine drives: the shipped expense agent names acme too.
    let expense = h.process().await;
    let globex_run = shared::engine::StartRun {
        tenant: zoe.tenant.clone(),
        requested_by: zoe.person.clone(),
        ..scripted_task("ben")
    };
    let refused = expense.start(globex_run).await.unwrap_err();
    assert_eq!(refused.to_string(), "agent expense was not found");
}

async fn given_a_call_of_acme_when_the_definition_changes_to_name_globex_then_acme_can_neither_read_decide_nor_run_it(
    h: &Harness,
) {
    let before = h
        .process_of_definitions(&[payroll("tenants = [\"acme\"]")])
        .await;
    let ben = h.person("ben");
    let taken = before.gate_call(pay(&ben, "payroll")).await.unwrap();
    let approval = taken.approval.clone().unwrap();
    let acme = acme();

    // A process of the definition as changed: globex's only.
    let after = h
        .process_of_definitions(&[payroll("tenants = [\"globex\"]")])
        .await;

    let dana = h.person("dana");
    let not_found = |e: EngineError| assert_refusal(&e, "not_found", ErrorKind::NotFound);
    not_found(after.approval(&acme, &approval.id).await.unwrap_err());
    not_found(after.run(&acme, &taken.run_id).await.unwrap_err());
    not_found(after.history(&acme, &taken.run_id).await.unwrap_err());
    not_found(after.call_state(&acme, &taken.run_id).await.unwrap_err());
    not_found(
        after
            .decide(&dana, &approval.id, approve("dana-1"))
            .await
            .unwrap_err(),
    );
    not_found(
        after
            .comment(&dana, &approval.id, "Paid?")
            .await
            .unwrap_err(),
    );
    not_found(after.cancel(&ben, &taken.run_id).await.unwrap_err());
    not_found(after.gate_call(pay(&ben, "payroll")).await.unwrap_err());
    assert!(after.pending(&acme).await.unwrap().is_empty());
    assert!(after.recently_decided(&acme, 10).await.unwrap().is_empty());
    // Nothing moved: the process of the old definition still reads it waiting.
    let waiting = before.approval(&acme, &approval.id).await.unwrap();
    assert_eq!(waiting.status, ApprovalStatus::AwaitingApproval);
    assert!(waiting.comments.is_empty());
}

on_both_stores!([
    given_an_agent_for_acme_when_globex_calls_it_or_runs_it_then_it_is_not_found_as_an_unknown_agent_is,
    given_a_call_of_acme_when_the_definition_changes_to_name_globex_then_acme_can_neither_read_decide_nor_run_it,
]);
