//! The sweep function's entry point: clients built once, then one bounded sweep per invocation.

use lambda_runtime::{Diagnostic, Error, LambdaEvent, run, service_fn};
use serde_json::Value;
use shared::adapters::emf::Emf;
use shared::deploy::{Aws, Setup, aws_engine};
use shared::engine::EngineError;

#[tokio::main]
async fn main() -> Result<(), Error> {
    shared::logs::for_lambda();
    let aws = Aws::from_env().await?;
    // The sweep expires, reminds, republishes, retries notices and reconciles; it never drives
    // a run, so it has no model.
    let engine = aws_engine(&aws, &Setup::from_env()?, false)?;
    let budget = sweep::budget_from_env();
    let gauges = Emf::stdout();
    run(service_fn(|event: LambdaEvent<Value>| {
        let (engine, gauges) = (&engine, &gauges);
        async move {
            sweep::handle(engine, event.payload, budget, Some(gauges))
                .await
                .map_err(diagnostic)
        }
    }))
    .await
}

/// What Lambda records of a failed sweep: the error's stable code as its type (a boxed error
/// would read as the box's type), and its sentence.
fn diagnostic(error: EngineError) -> Diagnostic {
    Diagnostic {
        error_type: error.code().into(),
        error_message: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_sweep_is_recorded_under_its_code() {
        let diagnostic = diagnostic(EngineError::Unavailable("the table is down".into()));
        assert_eq!(diagnostic.error_type, "unavailable");
        assert!(diagnostic.error_message.contains("the table is down"));
    }
}
