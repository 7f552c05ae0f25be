//! The local AWS stack for tests: each test gets its own table and FIFO queue, copied from the
//! ones `infra/local-stack up` created from template.yaml, so tests never share state and the
//! schema has one source. A missing stack fails the test with the command that starts it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use aws_config::SdkConfig;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::{BillingMode, GlobalSecondaryIndex};
use aws_sdk_sqs::types::QueueAttributeName;
use shared::deploy::{Aws, AwsSettings};

const START: &str = "eval \"$(infra/local-stack up)\"";

fn required(name: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| {
        panic!("{name} is not set: the AWS adapter tests need the local stack; from the repository root run: {START}")
    })
}

/// The attributes `names` of the queue at `url`.
pub async fn queue_attributes(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    names: QueueAttributeName,
) -> HashMap<QueueAttributeName, String> {
    sqs.get_queue_attributes()
        .queue_url(url)
        .attribute_names(names)
        .send()
        .await
        .unwrap_or_else(|e| panic!("the attributes of {url}: {e}"))
        .attributes
        .unwrap_or_else(|| panic!("{url} answered no attributes"))
}

/// Fails the test unless the local stack takes one request at a time (its serial mode), as a
/// test that judges races on it needs.
pub async fn assert_serial() {
    let endpoint = required("AWS_ENDPOINT_URL");
    let mode = async {
        let client = reqwest::Client::builder().no_proxy().build().ok()?;
        let answer = client
            .get(format!("{endpoint}/countersign/local-stack"))
            .send()
            .await
            .ok()?;
        let body: serde_json::Value = answer.json().await.ok()?;
        body["mode"].as_str().map(str::to_string)
    }
    .await;
    assert_eq!(
        mode.as_deref(),
        Some("serial"),
        "the race scenarios need the local stack in its serial mode (moto one request at a \
         time); restart it: infra/local-stack down && {START}"
    );
}

/// A table and a queue of this test's own, on the local stack.
pub struct FreshStack {
    pub config: SdkConfig,
    pub settings: AwsSettings,
}

/// A name no other fresh stack has: the tests of one binary share their prefix and run in
/// parallel, so the clock alone could give two of them the same; the process and a count
/// make it this call's own. (Within 80 characters with `.fifo`, SQS's limit.)
fn unique(name: &str) -> String {
    static MADE: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(40)
        .collect();
    let made = MADE.fetch_add(1, Ordering::Relaxed);
    let process = std::process::id();
    format!("t-{name}-{:x}-{process:x}-{made:x}", nanos % 0xffff_ffff)
}

impl FreshStack {
    pub async fn new(test: &str) -> Self {
        let endpoint = required("AWS_ENDPOINT_URL");
        let base_table = required("COUNTERSIGN_TABLE");
        let base_queue = required("COUNTERSIGN_QUEUE_URL");
        let config = shared::deploy::sdk_config().await;
        let name = unique(test);

        let dynamodb = aws_sdk_dynamodb::Client::new(&config);
        let described = dynamodb.describe_table().table_name(&base_table).send().await.unwrap_or_else(|e| {
            panic!(
                "cannot read table {base_table} at {endpoint}: {}; is the local stack running? {START}",
                DisplayErrorContext(&e)
            )
        });
        let base = described.table().expect("a described table");
        let indexes = base
            .global_secondary_indexes()
            .iter()
            .map(|i| {
                GlobalSecondaryIndex::builder()
                    .index_name(i.index_name().unwrap())
                    .set_key_schema(Some(i.key_schema().to_vec()))
                    .set_projection(i.projection().cloned())
                    .build()
                    .unwrap()
            })
            .collect();
        let created = dynamodb
            .create_table()
            .table_name(&name)
            .set_attribute_definitions(Some(base.attribute_definitions().to_vec()))
            .set_key_schema(Some(base.key_schema().to_vec()))
            .set_global_secondary_indexes(Some(indexes))
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        match created {
            Ok(_) => {}
            // The name is this call's own: only an earlier attempt of this request, which the
            // SDK retried when its answer was lost, can have made it.
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_resource_in_use_exception()) => {}
            Err(e) => panic!("a fresh table {name}: {}", DisplayErrorContext(&e)),
        }

        let sqs = aws_sdk_sqs::Client::new(&config);
        let copied: HashMap<QueueAttributeName, String> =
            queue_attributes(&sqs, &base_queue, QueueAttributeName::All)
                .await
                .into_iter()
                .filter(|(k, _)| {
                    matches!(
                        k,
                        QueueAttributeName::FifoQueue
                            | QueueAttributeName::ContentBasedDeduplication
                            | QueueAttributeName::VisibilityTimeout
                            | QueueAttributeName::RedrivePolicy
                            | QueueAttributeName::MessageRetentionPeriod
                    )
                })
                .collect();
        let queue = sqs
            .create_queue()
            .queue_name(format!("{name}.fifo"))
            .set_attributes(Some(copied))
            .send()
            .await
            .expect("a fresh queue");
        let settings = AwsSettings {
            table: name,
            queue_url: queue.queue_url().unwrap().to_string(),
            schedule: None,
        };
        Self { config, settings }
    }

    /// Gives this test's queue a dead-letter queue of its own, with the redrive template.yaml
    /// sets (a message received `maxReceiveCount` times without being deleted goes there), and
    /// a visibility timeout of `visibility_seconds`, so a message its consumers receive and drop
    /// comes back soon. Returns the dead-letter queue's URL, and after how many receives a
    /// message goes there.
    pub async fn dead_letter_queue(&self, visibility_seconds: u32) -> (String, usize) {
        let sqs = aws_sdk_sqs::Client::new(&self.config);
        let queue_url = &self.settings.queue_url;
        let redrive: serde_json::Value =
            queue_attributes(&sqs, queue_url, QueueAttributeName::RedrivePolicy)
                .await
                .get(&QueueAttributeName::RedrivePolicy)
                .map(|policy| serde_json::from_str(policy).expect("a redrive policy is JSON"))
                .expect("the queue copies template.yaml's redrive policy");
        let dlq_url = sqs
            .create_queue()
            .queue_name(format!("{}-dlq.fifo", self.settings.table))
            .attributes(QueueAttributeName::FifoQueue, "true")
            .send()
            .await
            .expect("a dead-letter queue of this test's own")
            .queue_url
            .expect("a queue URL");
        let dlq_arn = queue_attributes(&sqs, &dlq_url, QueueAttributeName::QueueArn).await
            [&QueueAttributeName::QueueArn]
            .clone();
        let max_receives = redrive["maxReceiveCount"]
            .as_u64()
            .or_else(|| redrive["maxReceiveCount"].as_str()?.parse().ok())
            .expect("a maxReceiveCount");
        let policy = serde_json::json!({
            "deadLetterTargetArn": dlq_arn,
            "maxReceiveCount": max_receives,
        });
        sqs.set_queue_attributes()
            .queue_url(queue_url)
            .attributes(
                QueueAttributeName::VisibilityTimeout,
                visibility_seconds.to_string(),
            )
            .attributes(QueueAttributeName::RedrivePolicy, policy.to_string())
            .send()
            .await
            .expect("the queue takes a short visibility timeout and its own dead letters");
        (dlq_url, max_receives as usize)
    }

    pub fn aws(&self) -> Aws {
        Aws::new(&self.config, &self.settings)
    }

    /// The environment a `countersign` process needs to use this stack.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("COUNTERSIGN_STORE", "dynamodb".into()),
            ("COUNTERSIGN_TABLE", self.settings.table.clone()),
            ("COUNTERSIGN_QUEUE_URL", self.settings.queue_url.clone()),
            ("COUNTERSIGN_SCHEDULE_GROUP", String::new()),
            ("COUNTERSIGN_SCHEDULER_ROLE_ARN", String::new()),
            ("COUNTERSIGN_SWEEP_ARN", String::new()),
        ]
    }
}
