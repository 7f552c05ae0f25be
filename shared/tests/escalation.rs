//! Escalation: policy may say that an approval nobody decided within a time goes to one more
//! role. With the clock moved, the sweep escalates it once its step is due (not before), records
//! it, posts a notice, and people of either role may decide it; a decided approval is never
//! escalated. On both stores.

#[macro_use]
mod harness;
#[path = "harness/dynamodb.rs"]
mod dynamodb_backend;
// Only the webhook receiver of the notification helpers is used here.
#[allow(dead_code)]
#[path = "harness/notices.rs"]
mod notices;
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use chrono::Duration;
use shared::domain::approval::{ApprovalStatus, Refusal};
use shared::domain::audit::AuditEvent;
use shared::domain::identity::Actor;
use shared::domain::ids::Role;
use shared::domain::policy::Policy;
use shared::engine::EngineError;
use shared::example::expense::OfflineExpenseAgent;
use shared::ports::store::ItemStore;

use dynamodb_backend::DynamoDb;
use harness::{Embedded, Harness, Process, acme, approve, assert_recorded};
use notices::Receiver;

const POLICY: &str = include_str!("../../agents/expense/policy.toml");

/// The shipped expense policy, with reimbursements nobody decided in 4 hours going to finance
/// managers as well.
fn escalating_policy() -> Policy {
    let text = POLICY.replacen(
        "[tools.reimburse]\n",
        "[tools.reimburse]\nescalate = [{ after = \"4h\", to = \"finance_manager\" }]\n",
        1,
    );
    assert_ne!(
        text, POLICY,
        "the reimburse rule is where the test expects it"
    );
    Policy::from_toml(&text).unwrap()
}

/// A process of the expense agent under the escalating policy, its notices posted to `receiver`.
async fn escalating(h: &Harness, receiver: &Receiver) -> Process {
    let connected: Arc<Mutex<Option<Arc<dyn ItemStore>>>> = Arc::default();
    let notifier = receiver.webhooks(StdDuration::from_millis(500));
    let seen = connected.clone();
    h.process_configured(
        Arc::new(OfflineExpenseAgent),
        move |store| {
            *seen.lock().unwrap() = Some(store.clone());
            store
        },
        |builder| {
            let store = connected.lock().unwrap().clone().unwrap();
            let mut agent = h.expense_agent(&store, Arc::new(OfflineExpenseAgent), |t| t);
            agent.policy = Arc::new(escalating_policy());
            builder.agent(agent).notifier(notifier)
        },
    )
    .await
}

fn at(hours: i64, minutes: i64) -> chrono::DateTime<chrono::Utc> {
    harness::start_of_test() + Duration::hours(hours) + Duration::minutes(minutes)
}

async fn given_nobody_decides_in_4h_then_finance_managers_may_decide_too(h: &Harness) {
    let receiver = Receiver::ok().await;
    let p = escalating(h, &receiver).await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    let finance_manager = Role::parse("finance_manager").unwrap();

    h.clock.set(at(1, 0));
    let refused = h.refused(&p, "mia", &approval.id, approve("d-early")).await;
    assert!(
        matches!(refused, EngineError::Refused(Refusal::MissingRole { .. })),
        "{refused:?}"
    );

    h.clock.set(at(3, 59));
    let early = p.sweep(100).await.unwrap();
    assert!(early.escalated.is_empty(), "{early:?}");

    h.clock.set(at(4, 0));
    let due = p.sweep(100).await.unwrap();
    assert_eq!(due.escalated, std::slice::from_ref(&approval.id));
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.escalated_to, std::slice::from_ref(&finance_manager));
    assert_eq!(stored.status, ApprovalStatus::AwaitingApproval);

    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let escalated = AuditEvent::Escalated {
        approval_id: approval.id.clone(),
        to: finance_manager,
    };
    assert_recorded(&history.entries, escalated, Actor::system("sweep"));
    let notices = receiver.notices();
    assert_eq!(notices, ["approval_requested", "escalated"]);
    let last = receiver.requests().pop().unwrap();
    let headline = last.body["blocks"][0]["text"]["text"].as_str().unwrap();
    assert_eq!(headline, "Escalated: reimburse still needs a decision");
    let details = last.body["blocks"][1]["text"]["text"].as_str().unwrap();
    assert!(
        details.contains("a person with the `finance` or `finance_manager` role, not ben"),
        "{details}"
    );

    // Once is enough: the step is done.
    h.clock.set(at(5, 0));
    assert!(p.sweep(100).await.unwrap().escalated.is_empty());
    assert_eq!(receiver.requests().len(), 2);

    // A person of the new role decides it; the run goes on.
    let decided = h.decided(&p, "mia", &approval.id, approve("d-mia")).await;
    assert_eq!(decided.approval.status, ApprovalStatus::Approved);
    assert_eq!(decided.approval.decisions[0].by.as_str(), "mia");
}

async fn given_an_approval_decided_in_time_then_it_is_never_escalated(h: &Harness) {
    let receiver = Receiver::ok().await;
    let p = escalating(h, &receiver).await;
    let (_, approval) = h.start_paused(&p, "c-102").await;
    h.clock.set(at(2, 0));
    h.decided(&p, "dana", &approval.id, approve("d-dana")).await;

    h.clock.set(at(4, 0));
    let swept = p.sweep(100).await.unwrap();
    assert!(swept.escalated.is_empty(), "{swept:?}");
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert!(stored.escalated_to.is_empty());
    use shared::engine::records::{IndexShards, keys};
    for shard in keys::shard_pks(keys::ESCALATE_INDEX, IndexShards::DEFAULT) {
        let page = p
            .store
            .query_index(&shard, "", "\u{10FFFF}", None, 10)
            .await
            .unwrap();
        assert!(page.items.is_empty(), "the marker is gone");
    }
}

macro_rules! every_scenario {
    ($module:ident, $backend:expr) => {
        on_backend!(
            $module,
            $backend,
            [
                given_nobody_decides_in_4h_then_finance_managers_may_decide_too,
                given_an_approval_decided_in_time_then_it_is_never_escalated,
            ]
        );
    };
}

every_scenario!(embedded, Embedded::fresh());
every_scenario!(dynamodb, DynamoDb::fresh("escalation").await);
