//! The decide function's entry point: clients built once, then lambda_http hosts the router.

use std::sync::Arc;

use lambda_http::Error;
use shared::deploy::{Aws, Notifications, expense_engine_notifying};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let aws = Aws::from_env().await?;
    // Deciding never drives a run: the decision queues its resume message. An edit that opens
    // a new version's approval posts its notices.
    let notifications = Notifications::from_env()?;
    let engine = Arc::new(expense_engine_notifying(&aws, None, &notifications));
    let auth = shared::lambda::auth_from_env()?;
    lambda_http::run(decide::app(engine, auth)).await
}
