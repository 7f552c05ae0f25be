//! `scripts/walkthrough refunds`, run as real processes: the orders service on a free port, and
//! every step a separate `countersign --json` over the same state, on the embedded store and on
//! DynamoDB and SQS (the local AWS stack), where `countersign worker --once` resumes the run as
//! the resume function does.

#[path = "../shared/tests/support/aws.rs"]
mod aws;
mod common;

use common::orders::OrdersService;
use common::{Countersign, only_approval};
use serde_json::Value;

const TASK: &str = "Refund USD 125 for order ord_55: the blender arrived damaged.";

/// Where the runs are kept, and so who resumes one after a decision.
#[derive(Clone, Copy)]
enum Store {
    /// The deciding process resumes the run itself.
    Embedded,
    /// A decision queues the resume message; the worker takes it.
    DynamoDb,
}

#[test]
fn a_finance_manager_lowers_the_refund_to_75_and_only_version_2_is_refunded_once() {
    let orders = OrdersService::start("walkthrough");
    let cs = Countersign::fresh("walkthrough-refunds").with_env(orders.embedded_env());
    walkthrough(&cs, &orders, Store::Embedded);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_refunds_walkthrough_on_dynamodb_refunds_version_2_once_through_the_queue() {
    let stack = aws::FreshStack::new("refunds-walkthrough").await;
    let orders = OrdersService::start("walkthrough-aws");
    let mut env = stack.env();
    env.extend(orders.env());
    let cs = Countersign::fresh("walkthrough-refunds-aws").with_env(env);
    tokio::task::spawn_blocking(move || walkthrough(&cs, &orders, Store::DynamoDb))
        .await
        .unwrap();
}

fn walkthrough(cs: &Countersign, orders: &OrdersService, store: Store) {
    // Given sam asks the refunds agent for USD 125, which policy puts before a finance manager.
    let started = cs.ok(&["run", "--agent", "refunds", TASK, "--as", "sam"]);
    assert_eq!(started["status"], "awaiting_approval", "{started}");
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let (refund, approval) = only_approval(&started);
    assert_eq!(approval["tool"], "issue_refund");
    assert_eq!(approval["action_version"], 1);
    assert_eq!(approval["args"]["order_id"], "ord_55");
    assert_eq!(approval["args"]["amount_cents"], 12_500);
    assert_eq!(approval["approver_role"], "finance_manager");
    assert!(
        orders.refunds("ord_55").is_empty(),
        "nothing is refunded before a decision"
    );

    // When sam approves his own request, he is refused.
    let own = cs.run(&["review", "approve", &refund, "--as", "sam"]);
    assert_eq!(own.exit, 1, "{}", own.stderr);
    assert_eq!(own.json["error"]["code"], "own_request", "{}", own.json);

    // When mia lowers it to USD 75: version 2, which policy allows, runs at once.
    let edited = cs.ok(&[
        "review",
        "edit",
        &refund,
        "--amount",
        "75",
        "--note",
        "Damage covers the jug only; USD 75 per the repair quote.",
        "--as",
        "mia",
    ]);
    assert_eq!(edited["decision"]["effect"]["effect"], "edited", "{edited}");
    assert_eq!(edited["decision"]["effect"]["new_version"], 2, "{edited}");
    assert!(
        edited.get("next_approval").is_none(),
        "USD 75 needs nobody: {edited}"
    );
    match store {
        Store::Embedded => assert_eq!(edited["run"]["status"], "done", "{edited}"),
        Store::DynamoDb => {
            assert!(
                edited["run"].is_null(),
                "the run waits for the worker: {edited}"
            );
            let worked = cs.ok(&["worker", "--once"]);
            let resumed = worked["resumed"].as_array().unwrap();
            assert_eq!(resumed.len(), 1, "{worked}");
            assert_eq!(resumed[0]["report"]["run"]["status"], "done", "{worked}");
        }
    }

    // When mia's other tab, still on version 1, approves it: a conflict, and nothing runs.
    let stale = cs.run(&[
        "review",
        "approve",
        &refund,
        "--version",
        "1",
        "--as",
        "mia",
    ]);
    assert_eq!(stale.exit, 1, "{}", stale.stderr);
    assert_eq!(stale.json["error"]["code"], "superseded", "{}", stale.json);

    // Then the audit tells the refund's story, version by version.
    let history = cs.ok(&["audit", &run_id]);
    let action = history["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["tool"] == "issue_refund")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let key = format!("{action}:2");
    let story: Vec<(String, i64)> = entries(&history)
        .iter()
        .filter(|e| e["action_id"] == action.as_str())
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_string(),
                e["version"].as_i64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, i64)> = [
        ("proposed", 1),
        ("decision", 1),
        ("superseded", 1),
        ("proposed", 2),
        ("executing", 2),
        ("executed", 2),
    ]
    .iter()
    .map(|(event, version)| (event.to_string(), *version))
    .collect();
    assert_eq!(story, expected);
    let of = |event: &str, version: i64| -> &Value {
        entries(&history)
            .iter()
            .find(|e| {
                e["action_id"] == action.as_str() && e["event"] == event && e["version"] == version
            })
            .unwrap()
    };
    assert_eq!(of("proposed", 1)["verdict"]["verdict"], "require_approval");
    let decision = of("decision", 1);
    assert_eq!(decision["actor"]["id"], "mia");
    assert_eq!(decision["choice"], "edit");
    assert_eq!(decision["amount"], 7_500);
    assert_eq!(decision["args_hash"], approval["args_hash"]);
    assert_eq!(of("superseded", 1)["by_version"], 2);
    assert_eq!(of("proposed", 2)["args"]["amount_cents"], 7_500);
    assert_eq!(
        of("proposed", 2)["verdict"]["verdict"],
        "allow",
        "policy allows USD 75"
    );
    let executed = of("executed", 2);
    assert_eq!(executed["succeeded"], true);
    assert!(
        executed["result"].as_str().unwrap().contains(&key),
        "the service saw the key {key}: {executed}"
    );
    assert_eq!(executed["authorized_by"][0]["id"], "mia");
    let last = entries(&history).last().unwrap();
    assert_eq!(last["event"], "done", "{last}");
    assert_eq!(history["run"]["status"], "done");
    assert_eq!(history["run"]["requested_by"], "sam");

    // And the orders service made exactly one refund: version 2's, under its key.
    let refund = orders.only_refund("ord_55", 7_500, &key);
    assert_eq!(refund["amount"], "75.00");
}

fn entries(history: &Value) -> &Vec<Value> {
    history["entries"].as_array().unwrap()
}
