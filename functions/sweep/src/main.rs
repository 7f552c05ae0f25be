//! The sweep function's entry point: clients built once, then one bounded sweep per invocation.

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use serde_json::Value;
use shared::deploy::{Aws, Setup, aws_engine};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let aws = Aws::from_env().await?;
    // The sweep expires, reminds, republishes, retries notices and reconciles; it never drives
    // a run, so it has no model.
    let engine = aws_engine(&aws, &Setup::from_env()?, false)?;
    let budget = sweep::budget_from_env();
    run(service_fn(|event: LambdaEvent<Value>| {
        let engine = &engine;
        async move { Ok::<_, Error>(sweep::handle(engine, event.payload, budget).await?) }
    }))
    .await
}
