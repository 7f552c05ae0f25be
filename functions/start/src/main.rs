//! The start function's entry point: clients built once, then one run per invocation.

use std::sync::Arc;

use lambda_http::lambda_runtime::Diagnostic;
use lambda_http::{Error, LambdaEvent, service_fn};
use serde_json::Value;
use shared::deploy::{Aws, Setup, aws_engine};

#[tokio::main]
async fn main() -> Result<(), Error> {
    shared::logs::for_lambda();
    let aws = Aws::from_env().await?;
    let setup = Setup::from_env()?;
    let engine = Arc::new(aws_engine(&aws, &setup, true)?);
    let start = start::Start::new(engine, shared::lambda::auth_from_env()?, setup.claims);
    lambda_http::lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        let start = &start;
        async move {
            start
                .handle(event.payload, event.context)
                .await
                .map_err(diagnostic)
        }
    }))
    .await
}

/// What Lambda records of a failed invoke: the error's stable code as its type (a boxed error
/// would read as the box's type), and its sentence.
fn diagnostic(error: start::StartError) -> Diagnostic {
    let code = match &error {
        start::StartError::BadEvent(_) => "bad_event",
        start::StartError::Engine(engine) => engine.code(),
    };
    Diagnostic {
        error_type: code.into(),
        error_message: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_start_is_recorded_under_its_code() {
        let bad = diagnostic(start::StartError::BadEvent("no claim_id".into()));
        assert_eq!(bad.error_type, "bad_event");
        assert!(bad.error_message.contains("no claim_id"));
        let engine = shared::engine::EngineError::not_found("claim c-999");
        assert_eq!(diagnostic(engine.into()).error_type, "not_found");
    }
}
