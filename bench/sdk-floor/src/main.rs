//! Hello world on lambda_runtime (as `hello-lambda`), after the AWS set-up every function does
//! before its first request and nothing of Countersign's: the SDK configuration, its HTTPS client
//! trusting the system bundle's roots (`shared::deploy::sdk_config`), and the DynamoDB, SQS and
//! Scheduler clients. Its cold start, against hello world's, is the floor under the functions'
//! (BENCHMARKS.md section 10).
//!
//! `SDK_FLOOR` stops the set-up early, to take each step's share:
//! - `config`: the SDK configuration only;
//! - `dynamodb`: the configuration and the DynamoDB client;
//! - `platform-roots`: the three clients on the SDK's default HTTPS client, which loads the
//!   platform's roots itself (the bundle and every file of the certificate directory);
//! - unset: the configuration and the three clients, as every function builds them.

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let step = std::env::var("SDK_FLOOR").unwrap_or_default();
    let config = match step.as_str() {
        "platform-roots" => {
            aws_config::defaults(aws_config::BehaviorVersion::latest())
                .credentials_provider(
                    aws_config::environment::EnvironmentVariableCredentialsProvider::new(),
                )
                .load()
                .await
        }
        "" | "config" | "dynamodb" => shared::deploy::sdk_config().await,
        other => {
            return Err(
                format!("SDK_FLOOR={other}: expected config, dynamodb or platform-roots").into(),
            );
        }
    };
    // Kept until the process ends, as a function keeps its clients.
    let dynamodb = (step != "config").then(|| aws_sdk_dynamodb::Client::new(&config));
    let queue_and_schedules = (step != "config" && step != "dynamodb").then(|| {
        (
            aws_sdk_sqs::Client::new(&config),
            aws_sdk_scheduler::Client::new(&config),
        )
    });
    std::hint::black_box((&config, &dynamodb, &queue_and_schedules));
    run(service_fn(|event: LambdaEvent<Value>| async move {
        Ok::<_, Error>(event.payload)
    }))
    .await
}
