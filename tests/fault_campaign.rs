//! The fault campaign on both stores: approvals opened by the expense agent, deciders racing on
//! each and (on DynamoDB) resume workers, SIGKILLed at seeded random moments; then the sweep with
//! the clock past every lease and deadline, and the checks: no claim paid twice, nothing paid
//! without a winning approval, no rejected approval paid, every run terminal, every unknown
//! outcome reconciled. `scripts/fault-campaign` runs the same campaign longer; these variables
//! set it (the defaults are CI's): FAULT_CAMPAIGN_APPROVALS, FAULT_CAMPAIGN_SEED (else from the
//! time, printed), FAULT_CAMPAIGN_PARALLEL, FAULT_CAMPAIGN_KILL_SHARE, FAULT_CAMPAIGN_WORKERS.

#[path = "../shared/tests/support/aws.rs"]
mod aws;
#[path = "common/campaign.rs"]
mod campaign;
mod common;

use std::sync::Arc;

use aws_sdk_sqs::types::QueueAttributeName;
use campaign::{Campaign, DeadLetters, Figures, Store};
use shared::adapters::sqlite::SqliteStore;

/// How long a killed worker's message stays invisible on the campaign's own queue, instead of
/// template.yaml's 720 s.
const VISIBILITY_SECONDS: &str = "2";

fn campaign(name: &str, store: Store) -> Campaign {
    let seed = campaign::setting(
        "FAULT_CAMPAIGN_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    eprintln!(
        "fault campaign {name}: seed {seed} (FAULT_CAMPAIGN_SEED={seed} repeats its choices)"
    );
    Campaign {
        approvals: campaign::setting("FAULT_CAMPAIGN_APPROVALS", 200),
        seed,
        store,
        dir: campaign::scratch(name),
        parallel: campaign::setting("FAULT_CAMPAIGN_PARALLEL", 3),
        kill_share: campaign::setting("FAULT_CAMPAIGN_KILL_SHARE", 0.3),
        workers: campaign::setting("FAULT_CAMPAIGN_WORKERS", 2),
    }
}

fn verdict(figures: &Figures) {
    println!("{figures}");
    assert!(
        figures.killed > 0,
        "the campaign killed nothing:\n{figures}"
    );
    assert!(
        figures.payments > 0 && figures.rejected > 0,
        "the campaign should pay some claims and reject others:\n{figures}"
    );
    assert_eq!(figures.runs_stuck, 0, "{figures}");
    assert!(figures.violations.is_empty(), "{figures}");
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_deciders_never_pay_twice_or_unapproved_and_leave_no_run_stuck_embedded() {
    let campaign = campaign("embedded", Store::Embedded);
    let dir = campaign.dir.clone();
    std::fs::create_dir_all(dir.join("state")).unwrap();
    let store = Arc::new(SqliteStore::open_dir(&dir.join("state")).unwrap());
    let figures = campaign.run(store).await;
    verdict(&figures);
    campaign::remove(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_deciders_and_workers_never_pay_twice_or_unapproved_and_leave_no_run_stuck_on_dynamodb()
 {
    aws::assert_serial().await;
    let stack = aws::FreshStack::new("fault-campaign").await;
    let sqs = aws_sdk_sqs::Client::new(&stack.config);
    let queue_url = stack.settings.queue_url.clone();
    let dlq_url = sqs
        .create_queue()
        .queue_name(
            queue_url
                .rsplit('/')
                .next()
                .unwrap()
                .replace(".fifo", "-dlq.fifo"),
        )
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .expect("the campaign's dead-letter queue")
        .queue_url
        .unwrap();
    let dlq_arn = aws::queue_attributes(&sqs, &dlq_url, QueueAttributeName::QueueArn).await
        [&QueueAttributeName::QueueArn]
        .clone();
    sqs.set_queue_attributes()
        .queue_url(&queue_url)
        .attributes(QueueAttributeName::VisibilityTimeout, VISIBILITY_SECONDS)
        .attributes(
            QueueAttributeName::RedrivePolicy,
            serde_json::json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5}).to_string(),
        )
        .send()
        .await
        .expect("the campaign's queue takes a short visibility timeout and its own dead letters");
    let store = Store::DynamoDb {
        env: stack.env(),
        dead_letters: DeadLetters {
            sqs,
            queue_url,
            dlq_url,
        },
    };
    let campaign = campaign("dynamodb", store);
    let dir = campaign.dir.clone();
    let figures = campaign.run(stack.aws().store.clone()).await;
    // Its thousands of items would slow every later test on the same moto.
    let _ = aws_sdk_dynamodb::Client::new(&stack.config)
        .delete_table()
        .table_name(&stack.settings.table)
        .send()
        .await;
    verdict(&figures);
    campaign::remove(&dir);
}
