//! The decide function's entry point: clients built once, then lambda_http hosts the router.

use std::sync::Arc;

use lambda_http::Error;
use shared::deploy::{Aws, Setup, aws_engine};

#[tokio::main]
async fn main() -> Result<(), Error> {
    shared::logs::for_lambda();
    let aws = Aws::from_env().await?;
    // Deciding never drives a run: the decision queues its resume message. An edit that opens
    // a new version's approval posts its notices.
    let engine = Arc::new(aws_engine(&aws, &Setup::from_env()?, false)?);
    let auth = shared::lambda::auth_from_env()?;
    // Slack users are people by COUNTERSIGN_SLACK_PEOPLE, a file of the agents layer.
    let slack = shared::deploy::slack_from_env(None)?;
    // The MCP gateway holds a waiting call under API Gateway's 30 s (COUNTERSIGN_MCP_WAIT).
    let gateway = shared::deploy::mcp_settings_from_env()?;
    lambda_http::run(decide::app_with_slack(engine, auth, slack, gateway)).await
}
