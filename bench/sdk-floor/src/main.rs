//! Hello world on lambda_runtime (as `hello-lambda`), after the AWS set-up every function does
//! before its first request and nothing of Countersign's: `shared::deploy::Aws::from_env`, the
//! functions' own path, which builds the SDK configuration (its HTTPS client trusting the system
//! bundle's roots) and the DynamoDB, SQS and Scheduler clients (the last where the deployment
//! names its schedule group, as `template.yaml` does). Its cold start, against hello world's, is
//! the floor under the functions' (BENCHMARKS.md section 10).
//!
//! `SDK_FLOOR` changes the set-up, to take a step's share:
//! - `config`: the SDK configuration only;
//! - `platform-roots`: the same clients on the SDK's default HTTPS client, which loads the
//!   platform's roots itself (the bundle and every file of the certificate directory);
//! - unset: the set-up as every function makes it.

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use serde_json::Value;
use shared::deploy::{Aws, AwsSettings, sdk_config};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    // Kept until the process ends, as a function keeps its clients.
    let set_up = match std::env::var("SDK_FLOOR").unwrap_or_default().as_str() {
        "" => (None, Some(Aws::from_env().await?)),
        "config" => (Some(sdk_config().await), None),
        "platform-roots" => {
            let settings = AwsSettings::from_env()?;
            let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .credentials_provider(
                    aws_config::environment::EnvironmentVariableCredentialsProvider::new(),
                )
                .load()
                .await;
            (None, Some(Aws::new(&config, &settings)))
        }
        other => {
            return Err(format!("SDK_FLOOR={other}: expected config or platform-roots").into());
        }
    };
    std::hint::black_box(&set_up);
    run(service_fn(|event: LambdaEvent<Value>| async move {
        Ok::<_, Error>(event.payload)
    }))
    .await
}
