//! The decide function: the decision API's router, reading identity from API Gateway's JWT
//! authorizer. A decision queues its resume message; the resume function takes it.

use std::sync::Arc;

use shared::api::{self, Authenticate};
use shared::engine::Engine;

pub fn app(engine: Arc<Engine>, auth: Arc<dyn Authenticate>) -> axum::Router {
    shared::lambda::with_gateway_claims(api::router(engine, auth))
}
