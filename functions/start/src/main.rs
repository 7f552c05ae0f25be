//! The start function's entry point: clients built once, then one run per invocation.

use std::sync::Arc;

use lambda_http::{Error, LambdaEvent, service_fn};
use serde_json::Value;
use shared::deploy::{Aws, Setup, aws_engine};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let aws = Aws::from_env().await?;
    let setup = Setup::from_env()?;
    let engine = Arc::new(aws_engine(&aws, &setup, true)?);
    let start = start::Start::new(engine, shared::lambda::auth_from_env()?, setup.claims);
    lambda_http::lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        let start = &start;
        async move { Ok::<_, Error>(start.handle(event.payload, event.context).await?) }
    }))
    .await
}
