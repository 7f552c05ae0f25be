//! The resume function's entry point: clients built once, then one engine call per batch.

use lambda_runtime::{Diagnostic, Error, LambdaEvent, run, service_fn};
use shared::deploy::{Aws, Setup, aws_engine};

#[tokio::main]
async fn main() -> Result<(), Error> {
    shared::logs::for_lambda();
    let aws = Aws::from_env().await?;
    // Resuming drives the run on: each agent gets its model.
    let engine = aws_engine(&aws, &Setup::from_env()?, true)?;
    run(service_fn(
        |event: LambdaEvent<aws_lambda_events::event::sqs::SqsEvent>| {
            let engine = &engine;
            // A batch never fails as a whole: each message that did not resume is reported back
            // for SQS to deliver again.
            async move { Ok::<_, Diagnostic>(resume::handle(engine, event.payload).await) }
        },
    ))
    .await
}
