//! Policy rules in Cedar, through the engine: each call is decided for its requester as
//! authentication said of them (roles and claims, kept with the run), the rules that decided it
//! are named on the action, the approval and the audit, a log-only rule is recorded and changes
//! nothing, and an approval that rules of two roles asked for needs both.

use std::collections::BTreeSet;

use super::*;
use shared::agents::{Definition, InMemory};
use shared::domain::ids::AgentName;
use shared::domain::money::Amount;
use shared::domain::policy::VerdictKind;
use shared::domain::run::GateVia;
use shared::engine::{CallState, CallStatus, GateCall};

/// A payments agent whose caller runs its tools; its rules are in `rules.cedar`, beside the
/// new payee and intern rules the policy tests decide by.
fn payments() -> Definition {
    let agent = r#"name = "payments"
system_prompt = "You move money when asked."

[tools.send_transfer]
executor = "caller"
description = "Sends money to an account, in cents."
input_schema = { type = "object", required = ["to", "amount_cents"], additionalProperties = false, properties = { to = { type = "string" }, amount_cents = { type = "integer", minimum = 1 }, payee_is_new = { type = "boolean" } } }
"#;
    let policy = r#"name = "payments"
version = 2
default_ttl = "4h"
cedar = ["rules.cedar", "payees-and-interns.cedar"]

[editable.send_transfer]
amount_cents = "lower"
"#;
    let rules = r#"// Up to USD 500 runs; a treasury person may send up to USD 1,000.
@id("small transfers")
permit(principal, action == Action::"send_transfer", resource)
when { context.input.amount_cents <= 50000 };

@id("treasury transfers")
permit(principal, action == Action::"send_transfer", resource)
when { principal.hasTag("department") && principal.getTag("department") == "treasury" && context.input.amount_cents <= 100000 };

@id("large transfers") @approve("finance") @reason("Transfers above USD 500 need finance.")
permit(principal, action == Action::"send_transfer", resource)
when { context.input.amount_cents > 50000 && !(principal.hasTag("department") && principal.getTag("department") == "treasury" && context.input.amount_cents <= 100000) };

// Being tried: everything above USD 100 would need a lead.
@id("lead above 100") @mode("log_only") @approve("lead")
permit(principal, action == Action::"send_transfer", resource)
when { context.input.amount_cents > 10000 };
"#;
    Definition::load(&InMemory {
        dir: "test-payments",
        files: &[
            ("agent.toml", agent),
            ("policy.toml", policy),
            ("rules.cedar", rules),
            (
                "payees-and-interns.cedar",
                include_str!("../fixtures/policies/payments/payees-and-interns.cedar"),
            ),
        ],
    })
    .expect("the payments definition loads")
}

/// `who` of acme, holding `roles` and `claims`.
fn someone(who: &str, roles: &[&str], claims: &[(&str, &str)]) -> Identity {
    Identity::new(
        acme(),
        person(who),
        roles.iter().map(|r| Role::parse(r).unwrap()).collect(),
    )
    .with_claims(claims.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

/// `who` asks to send `cents` to `to`, through the gate API, as authentication says of them.
fn transfer(who: &Identity, cents: i64, new_payee: bool) -> GateCall {
    GateCall {
        tenant: acme(),
        agent: AgentName::parse("payments").unwrap(),
        requested_by: who.person.clone(),
        tool: "send_transfer".into(),
        args: json!({"to": "acct_9", "amount_cents": cents, "payee_is_new": new_payee}),
        call_id: Some(format!("t-{}-{cents}-{new_payee}", who.person)),
        conversation: None,
        via: GateVia::Api,
        standing: who.standing(),
    }
}

async fn payments_process(h: &Harness) -> Process {
    h.process_of_definitions(&[payments()]).await
}

async fn called(p: &Process, call: GateCall) -> CallState {
    p.gate_call(call).await.expect("the gate takes the call")
}

/// The `proposed` event of the call's action, in its run's audit.
fn proposed_event(history: &History) -> (Vec<String>, Option<shared::domain::policy::LogOnly>) {
    history
        .entries
        .iter()
        .find_map(|entry| match &entry.event {
            AuditEvent::Proposed {
                rules, log_only, ..
            } => Some((rules.clone(), log_only.clone())),
            _ => None,
        })
        .expect("the call was proposed")
}

async fn given_the_requesters_roles_and_claims_when_a_rule_reads_them_then_the_call_is_decided_for_them(
    h: &Harness,
) {
    let p = payments_process(h).await;
    let plain = someone("lee", &["employee"], &[]);
    let treasury = someone("tam", &["employee"], &[("department", "treasury")]);
    let intern = someone("ivy", &["intern"], &[]);

    let waits = called(&p, transfer(&plain, 80_000, false)).await;
    assert_eq!(waits.status, CallStatus::AwaitingApproval, "{waits:?}");
    let allowed = called(&p, transfer(&treasury, 80_000, false)).await;
    assert_eq!(allowed.status, CallStatus::Approved, "{allowed:?}");
    let denied = called(&p, transfer(&intern, 100, false)).await;
    assert_eq!(denied.status, CallStatus::Denied, "{denied:?}");
    assert!(
        denied
            .result
            .as_ref()
            .unwrap()
            .content
            .contains("Interns never move money."),
        "{denied:?}"
    );

    // The run keeps what authentication said: another process decides on the same facts.
    let other = payments_process(h).await;
    let history = other.history(&acme(), &allowed.run_id).await.unwrap();
    assert_eq!(history.run.standing, treasury.standing());
    let action = history.actions.last().unwrap();
    assert_eq!(action.rules, ["treasury transfers"]);
}

async fn given_a_call_that_needs_a_person_then_the_approval_the_action_and_the_audit_name_the_rules_and_the_log_only_outcome(
    h: &Harness,
) {
    let p = payments_process(h).await;
    let lee = someone("lee", &["employee"], &[]);

    let waits = called(&p, transfer(&lee, 60_000, false)).await;
    let approval = waits.approval.clone().expect("it waits for finance");
    assert_eq!(approval.rules, ["large transfers"]);
    assert_eq!(approval.reason, "Transfers above USD 500 need finance.");
    let history = p.history(&acme(), &waits.run_id).await.unwrap();
    let (rules, log_only) = proposed_event(&history);
    assert_eq!(rules, ["large transfers"]);
    let log_only = log_only.expect("a log-only rule is recorded beside the enforced one");
    assert_eq!(log_only.outcome, VerdictKind::Approve);
    assert_eq!(log_only.rules, ["large transfers", "lead above 100"]);

    // The log-only rule changes nothing: USD 200 still runs at once.
    let runs = called(&p, transfer(&lee, 20_000, false)).await;
    assert_eq!(runs.status, CallStatus::Approved, "{runs:?}");
    let history = p.history(&acme(), &runs.run_id).await.unwrap();
    let (rules, log_only) = proposed_event(&history);
    assert_eq!(rules, ["small transfers"]);
    let log_only = log_only.unwrap();
    assert_eq!(log_only.outcome, VerdictKind::Approve);
    assert_eq!(log_only.rules, ["lead above 100"]);
    assert_eq!(history.actions.last().unwrap().log_only, Some(log_only));
}

async fn given_rules_of_two_roles_that_match_when_people_decide_then_each_roles_quorum_must_be_met(
    h: &Harness,
) {
    let p = payments_process(h).await;
    let lee = someone("lee", &["employee"], &[]);
    let fay = someone("fay", &["finance"], &[]);
    let cole = someone("cole", &["compliance"], &[]);
    let cruz = someone("cruz", &["compliance", "finance"], &[]);
    let ed = someone("ed", &["employee"], &[]);

    let waits = called(&p, transfer(&lee, 60_000, true)).await;
    let approval = waits.approval.clone().unwrap();
    assert_eq!(approval.approver_role, Role::parse("finance").unwrap());
    assert_eq!(approval.quorum, 1);
    assert_eq!(approval.also.len(), 1);
    assert_eq!(approval.also[0].role, Role::parse("compliance").unwrap());
    assert_eq!(approval.also[0].quorum, 2);
    assert_eq!(approval.still_needed(), 3);
    assert_eq!(approval.rules, ["large transfers", "new payee"]);

    // Someone of neither role may not decide it.
    let refused = h.refused(&p, &ed, &approval.id, approve("d-ed")).await;
    assert_eq!(refused.code(), "missing_role");

    // Finance's approval counts for finance alone: compliance still has two to give.
    let report = h.decided(&p, &fay, &approval.id, approve("d-fay")).await;
    let after = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(after.still_needed(), 2, "{report:?}");
    // A second finance approver adds nothing finance still needs.
    let flo = someone("flo", &["finance"], &[]);
    let again = h.refused(&p, &flo, &approval.id, approve("d-flo")).await;
    assert_eq!(again.code(), "missing_role");
    assert!(again.to_string().contains("compliance"), "{again}");

    // One who holds both roles counts for compliance; one more compliance officer settles it.
    h.decided(&p, &cruz, &approval.id, approve("d-cruz")).await;
    let state = p.call_state(&acme(), &waits.run_id).await.unwrap();
    assert_eq!(state.status, CallStatus::AwaitingApproval, "{state:?}");
    h.decided(&p, &cole, &approval.id, approve("d-cole")).await;
    let state = p.call_state(&acme(), &waits.run_id).await.unwrap();
    assert_eq!(state.status, CallStatus::Approved, "{state:?}");
    let approvers: BTreeSet<String> = state
        .approval
        .iter()
        .flat_map(|a| a.approvers())
        .map(|p| p.to_string())
        .collect();
    assert!(approvers.is_empty(), "no approval waits any longer");
}

async fn given_an_edit_of_a_call_when_policy_rules_on_the_new_version_then_it_decides_for_the_runs_requester(
    h: &Harness,
) {
    let p = payments_process(h).await;
    let lee = someone("lee", &["employee"], &[]);
    let fay = someone("fay", &["finance"], &[]);

    let waits = called(&p, transfer(&lee, 60_000, false)).await;
    let approval = waits.approval.clone().unwrap();
    // Lowered to USD 400: the new version is one policy allows, so fay's edit lets it run.
    let lowered = decision(
        "d-edit",
        approval.action_version,
        Choice::Edit {
            amount: Amount::from_dollars(400),
            note: Some("Pay what was invoiced.".into()),
        },
    );
    h.decided(&p, &fay, &approval.id, lowered).await;
    let state = p.call_state(&acme(), &waits.run_id).await.unwrap();
    assert_eq!(state.status, CallStatus::Approved, "{state:?}");
    assert_eq!(state.version, Some(2));
    let history = p.history(&acme(), &waits.run_id).await.unwrap();
    let second = history
        .actions
        .iter()
        .find(|a| a.version.get() == 2)
        .unwrap();
    assert_eq!(second.rules, ["small transfers"]);
}

/// Lowers a treasury person's USD 1,200 transfer to USD 900: a call only their department's
/// claim lets run, so the new version runs only if it is decided for them.
async fn treasury_transfer_lowered(h: &Harness, p: &Process, forget_standing: bool) -> CallState {
    let tia = someone("tia", &["employee"], &[("department", "treasury")]);
    let fay = someone("fay", &["finance"], &[]);
    let call = GateCall {
        call_id: Some(format!("t-tia-forgotten-{forget_standing}")),
        ..transfer(&tia, 120_000, false)
    };
    let waits = called(p, call).await;
    let approval = waits.approval.clone().unwrap();
    if forget_standing {
        // As an approval opened before approvals kept their requester's standing.
        let pk = keys::approval_pk(&acme(), &approval.id);
        let item = p.store.get(&pk, keys::APPROVAL_SK).await.unwrap().unwrap();
        let mut body: serde_json::Value = serde_json::from_str(&item.body).unwrap();
        assert!(body.as_object_mut().unwrap().remove("standing").is_some());
        let write = shared::ports::store::Write::Put {
            condition: shared::ports::store::Condition::VersionIs(item.ver),
            item: shared::ports::store::Item {
                ver: item.ver + 1,
                body: body.to_string(),
                ..item
            },
        };
        p.store.transact(vec![write]).await.unwrap();
    }
    let lowered = decision(
        "d-edit",
        approval.action_version,
        Choice::Edit {
            amount: Amount::from_dollars(900),
            note: None,
        },
    );
    h.decided(p, &fay, &approval.id, lowered).await;
    p.call_state(&acme(), &waits.run_id).await.unwrap()
}

async fn given_an_edit_of_a_call_that_only_the_requesters_claim_allows_then_it_runs_whether_or_not_the_approval_kept_their_standing(
    h: &Harness,
) {
    let p = payments_process(h).await;

    let kept = treasury_transfer_lowered(h, &p, false).await;
    let read_from_the_run = treasury_transfer_lowered(h, &p, true).await;

    for state in [kept, read_from_the_run] {
        assert_eq!(state.status, CallStatus::Approved, "{state:?}");
        assert_eq!(state.version, Some(2));
        assert_eq!(state.rules, ["treasury transfers"], "{state:?}");
    }
}

on_both_stores!([
    given_the_requesters_roles_and_claims_when_a_rule_reads_them_then_the_call_is_decided_for_them,
    given_a_call_that_needs_a_person_then_the_approval_the_action_and_the_audit_name_the_rules_and_the_log_only_outcome,
    given_rules_of_two_roles_that_match_when_people_decide_then_each_roles_quorum_must_be_met,
    given_an_edit_of_a_call_when_policy_rules_on_the_new_version_then_it_decides_for_the_runs_requester,
    given_an_edit_of_a_call_that_only_the_requesters_claim_allows_then_it_runs_whether_or_not_the_approval_kept_their_standing,
]);
