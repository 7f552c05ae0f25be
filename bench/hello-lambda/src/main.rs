//! Hello world on lambda_runtime, set up the way the functions are (tracing, then `run`), so
//! their start-up and size can be read against it. See BENCHMARKS.md.

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    run(service_fn(|event: LambdaEvent<Value>| async move {
        Ok::<_, Error>(event.payload)
    }))
    .await
}
