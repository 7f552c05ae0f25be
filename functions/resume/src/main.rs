//! The resume function's entry point: clients built once, then one engine call per batch.

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use shared::deploy::{Aws, Notifications, expense_engine_notifying, model_from_env};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let aws = Aws::from_env().await?;
    let notifications = Notifications::from_env()?;
    let engine = expense_engine_notifying(&aws, Some(model_from_env()), &notifications);
    run(service_fn(
        |event: LambdaEvent<aws_lambda_events::event::sqs::SqsEvent>| {
            let engine = &engine;
            async move { Ok::<_, Error>(resume::handle(engine, event.payload).await) }
        },
    ))
    .await
}
