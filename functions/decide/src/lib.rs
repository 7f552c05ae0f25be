//! The decide function: the decision API's router, reading identity from API Gateway's JWT
//! authorizer. A decision queues its resume message; the resume function takes it.

use std::sync::Arc;

use shared::adapters::slack::SlackApp;
use shared::api::{self, Authenticate};
use shared::engine::Engine;

pub fn app(engine: Arc<Engine>, auth: Arc<dyn Authenticate>) -> axum::Router {
    app_with_slack(engine, auth, None, api::mcp::Settings::default())
}

/// With a Slack app, also `POST /slack/interactions` (routed without the JWT authorizer: Slack
/// signs its requests instead); the MCP gateway, `/mcp/{agent}`, with `gateway`'s settings.
pub fn app_with_slack(
    engine: Arc<Engine>,
    auth: Arc<dyn Authenticate>,
    slack: Option<Arc<SlackApp>>,
    gateway: api::mcp::Settings,
) -> axum::Router {
    shared::lambda::with_gateway_claims(api::router_with_slack(engine, auth, slack, gateway))
}
