//! The start function's entry point: clients built once, then one run per invocation.

use std::sync::Arc;

use lambda_http::{Error, LambdaEvent, service_fn};
use serde_json::Value;
use shared::deploy::{Aws, Notifications, expense_engine_notifying, model_from_env};
use shared::example::expense;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let aws = Aws::from_env().await?;
    let notifications = Notifications::from_env()?;
    let engine = Arc::new(expense_engine_notifying(
        &aws,
        Some(model_from_env()),
        &notifications,
    ));
    let start = start::Start::new(
        engine,
        shared::lambda::auth_from_env()?,
        expense::default_claims(),
    );
    lambda_http::lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        let start = &start;
        async move { Ok::<_, Error>(start.handle(event.payload, event.context).await?) }
    }))
    .await
}
