//! The walkthrough against DynamoDB and SQS on the local AWS stack: every command a separate
//! `countersign` process with `COUNTERSIGN_STORE=dynamodb`; a decision queues its resume message
//! and `countersign worker --once` takes it, as the resume function does in Lambda.

#[path = "../shared/tests/support/aws.rs"]
mod aws;
mod common;

use common::{Countersign, only_approval};

#[tokio::test(flavor = "multi_thread")]
async fn the_walkthrough_on_dynamodb_gives_the_same_outcomes_through_the_queue() {
    let stack = aws::FreshStack::new("cli-walkthrough").await;
    let cs = Countersign::fresh("walkthrough-aws").with_env(stack.env());
    tokio::task::spawn_blocking(move || walkthrough(&cs))
        .await
        .unwrap();
}

fn walkthrough(cs: &Countersign) {
    assert_eq!(cs.ok(&["agent", "c-101"])["status"], "done");
    let (ap102, approval) = only_approval(&cs.ok(&["agent", "c-102"]));
    assert_eq!(approval["args"]["amount_cents"], 25_000);
    let c103 = cs.ok(&["agent", "c-103"]);
    let (ap103, _) = only_approval(&c103);
    let (ap104, _) = only_approval(&cs.ok(&["agent", "c-104", "--ttl", "0s"]));

    let own = cs.run(&["review", "approve", &ap102, "--as", "ben"]);
    assert_eq!(
        (own.exit, own.json["error"]["code"].as_str()),
        (1, Some("own_request"))
    );

    let approved = cs.ok(&["review", "approve", &ap102, "--as", "dana"]);
    assert_eq!(approved["approval"]["status"], "approved");
    assert!(approved["run"].is_null(), "the run waits for the worker");
    let worked = cs.ok(&["worker", "--once"]);
    let resumed = worked["resumed"].as_array().unwrap();
    assert_eq!(resumed.len(), 1, "{worked}");
    assert_eq!(resumed[0]["report"]["run"]["status"], "done");
    assert!(
        resumed[0]["report"]["run"]["answer"]
            .as_str()
            .unwrap()
            .contains("$250.00")
    );

    let again = cs.run(&["review", "approve", &ap102, "--as", "erin"]);
    assert_eq!(again.json["error"]["code"], "already_decided");

    cs.ok(&["review", "approve", &ap103, "--as", "dana"]);
    let swept = cs.ok(&["review", "expire"]);
    assert_eq!(swept["sweep"]["expired"], serde_json::json!([ap104]));
    let worked = cs.ok(&["worker", "--once"]);
    let outcomes: Vec<String> = worked["resumed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["report"]["run"]["answer"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(outcomes.len(), 2, "{worked}");
    assert!(
        outcomes
            .iter()
            .any(|a| a.starts_with("Declined claim c-103")),
        "{outcomes:?}"
    );
    assert!(
        outcomes.iter().any(|a| a.contains("expired")),
        "{outcomes:?}"
    );
    assert_eq!(
        cs.ok(&["worker", "--once"])["resumed"],
        serde_json::json!([]),
        "nothing left"
    );

    let ledger = cs.ok(&["ledger"]);
    let paid: Vec<(&str, i64)> = ledger["payments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["claim_id"].as_str().unwrap(),
                p["amount"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(paid, [("c-101", 4_200), ("c-102", 25_000)]);

    let history = cs.ok(&["audit", c103["run_id"].as_str().unwrap()]);
    let names: Vec<&str> = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    for expected in [
        "started",
        "proposed",
        "paused",
        "decision",
        "executing",
        "executed",
        "done",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }

    let worker_on_embedded = Countersign::fresh("worker-embedded").run(&["worker", "--once"]);
    assert_eq!(worker_on_embedded.exit, 2, "a worker needs the queue");
}
