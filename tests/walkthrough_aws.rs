//! The walkthrough against DynamoDB and SQS on the local AWS stack: every command a separate
//! `countersign` process with `COUNTERSIGN_STORE=dynamodb`; a decision queues its resume message
//! and `countersign worker --once` takes it, as the resume function does in Lambda.

#[path = "../shared/tests/support/aws.rs"]
mod aws;
mod common;

use common::Countersign;
use common::walkthrough::{self, Resumes};

#[tokio::test(flavor = "multi_thread")]
async fn the_walkthrough_on_dynamodb_gives_the_same_outcomes_through_the_queue() {
    let stack = aws::FreshStack::new("cli-walkthrough").await;
    let cs = Countersign::fresh("walkthrough-aws").with_env(stack.env());
    tokio::task::spawn_blocking(move || walkthrough(&cs))
        .await
        .unwrap();
}

fn walkthrough(cs: &Countersign) {
    walkthrough::expense(cs, Resumes::ThroughTheQueue);

    let worker_on_embedded = Countersign::fresh("worker-embedded").run(&["worker", "--once"]);
    assert_eq!(worker_on_embedded.exit, 2, "a worker needs the queue");
}
