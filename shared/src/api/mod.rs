//! The HTTP decision API: one axum router over the engine, hosted by `lambda_http` in Lambda
//! and served directly by `countersign serve` in the local mode. `openapi.yaml` beside this file
//! documents it.
//!
//! - [`router`]: the decide routes (list, read and decide approvals, list the ones decided
//!   lately; read a run, cancel it, read its audit) and the review page (`GET /`, `GET /review/{file}`, no token needed), hosted by the
//!   decide function.
//! - [`start_routes`]: `POST /runs`, hosted by the start function.
//! - [`local_router`]: both, for the local server, and its development sign-in (`/dev/...`).
//! - [`mcp::routes`]: `/mcp/{agent}`, the MCP gateway over Streamable HTTP, with the decide
//!   routes; [`gate::routes`]: `/gate/calls`, the gate API, with them too; and
//!   [`claude_code::routes`]: `/hooks/claude-code/{agent}`, Claude Code's `http` hook.
//!
//! A request that waits (a gate long-poll, an MCP call held for a person) takes a slot of the
//! server's [`waiting::WaitSlots`], when it gives them, so waiters cannot crowd out everyone
//! else.
//!
//! Identity comes only from an [`Authenticate`]: [`BearerJwt`] locally, [`GatewayClaims`] behind
//! API Gateway's JWT authorizer (the Lambda adapter inserts [`VerifiedClaims`] into each
//! request's extensions). Every error is `{"error": {"code", "message"}}` with a stable code.

mod approvals;
pub mod auth;
mod background;
pub mod claude_code;
pub mod dev;
pub mod error;
pub mod extract;
pub mod gate;
pub mod mcp;
mod page;
mod runs;
mod slack;
pub mod waiting;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRef, MatchedPath, Request};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tracing::Instrument;

pub use auth::{
    AuthError, Authenticate, BearerJwt, GatewayClaims, IssuedToken, KeyError, TokenClaims,
    VerifiedClaims,
};
pub use background::Background;
pub use dev::DevSignIn;
pub use error::ApiError;

use crate::adapters::slack::SlackApp;
use crate::engine::Engine;
use crate::example::expense::Claims;

/// The largest request body the API reads; a larger one is a 400 `body_too_large`.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// The OpenAPI 3.1 description of every route.
pub const OPENAPI_YAML: &str = include_str!("openapi.yaml");

#[derive(Clone)]
struct DecideState {
    engine: Arc<Engine>,
    auth: Arc<dyn Authenticate>,
}

impl FromRef<DecideState> for Arc<dyn Authenticate> {
    fn from_ref(state: &DecideState) -> Self {
        state.auth.clone()
    }
}

#[derive(Clone)]
struct StartState {
    engine: Arc<Engine>,
    auth: Arc<dyn Authenticate>,
    claims: Arc<Claims>,
    /// Where an embedded engine drives the runs it accepts.
    background: Background,
}

impl FromRef<StartState> for Arc<dyn Authenticate> {
    fn from_ref(state: &StartState) -> Self {
        state.auth.clone()
    }
}

fn decide_part(
    engine: Arc<Engine>,
    auth: Arc<dyn Authenticate>,
    slack: Option<Arc<SlackApp>>,
    background: Background,
    gateway: mcp::Settings,
) -> Router {
    let mut router = Router::new()
        .route("/approvals", get(approvals::list))
        .route("/approvals/decided", get(approvals::decided))
        .route("/approvals/{id}", get(approvals::read))
        .route("/approvals/{id}/decisions", post(approvals::decide))
        .route("/approvals/{id}/comments", post(approvals::comment))
        .route("/runs/{id}", get(runs::read))
        .route("/runs/{id}/cancel", post(runs::cancel))
        .route("/runs/{id}/audit", get(runs::audit))
        .with_state(DecideState {
            engine: engine.clone(),
            auth: auth.clone(),
        })
        .merge(gate::routes(
            engine.clone(),
            auth.clone(),
            gateway.public_url.clone(),
        ))
        .merge(mcp::routes(engine.clone(), auth.clone(), gateway))
        .merge(claude_code::routes(engine.clone(), auth))
        .merge(page::routes());
    if let Some(slack) = slack {
        router = router.merge(
            Router::new()
                .route("/slack/interactions", post(slack::interactions))
                .layer(DefaultBodyLimit::max(slack::MAX_INTERACTION_BYTES))
                .with_state(slack::SlackState {
                    engine,
                    slack,
                    background,
                }),
        );
    }
    router
}

fn start_part(
    engine: Arc<Engine>,
    auth: Arc<dyn Authenticate>,
    claims: Arc<Claims>,
    background: Background,
) -> Router {
    Router::new()
        .route("/runs", post(runs::start))
        .with_state(StartState {
            engine,
            auth,
            claims,
            background,
        })
}

/// What every hosted router gets: JSON for unknown routes and methods, the body limit, the
/// response headers every answer carries, and a span per request.
fn finish(router: Router) -> Router {
    router
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::map_response(protect_response))
        .layer(middleware::from_fn(trace_request))
}

/// Every answer is read as the type it says it is (`nosniff`); a JSON answer (approvals, audit
/// trails, tokens) is kept by no cache, shared or the browser's (`no-store`).
async fn protect_response(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// The decide API: `GET /approvals`, `GET /approvals/decided`, `GET /approvals/{id}`,
/// `POST /approvals/{id}/decisions`, `GET /runs/{id}`, `POST /runs/{id}/cancel`,
/// `GET /runs/{id}/audit`; the
/// MCP gateway, `/mcp/{agent}`, with its default settings; and the review page, `GET /` and
/// `GET /review/{file}`.
pub fn router(engine: Arc<Engine>, auth: Arc<dyn Authenticate>) -> Router {
    finish(decide_part(
        engine,
        auth,
        None,
        Background::default(),
        mcp::Settings::default(),
    ))
}

/// As [`router`], the MCP gateway with `gateway`'s settings, and with a Slack app,
/// `POST /slack/interactions`: its buttons' clicks, authenticated by Slack's request signature
/// instead of a bearer token. With a queue (the decide function) a click's decision publishes
/// its resume message before the answer; an embedded engine resumes the run on a task of its
/// own after it, which nobody waits for.
pub fn router_with_slack(
    engine: Arc<Engine>,
    auth: Arc<dyn Authenticate>,
    slack: Option<Arc<SlackApp>>,
    gateway: mcp::Settings,
) -> Router {
    finish(decide_part(
        engine,
        auth,
        slack,
        Background::default(),
        gateway,
    ))
}

/// `POST /runs`: accepts a run (an agent's task, or the expense agent on one of `claims`) and
/// sends it to the queue's consumer to be driven (the start function).
pub fn start_routes(
    engine: Arc<Engine>,
    auth: Arc<dyn Authenticate>,
    claims: Arc<Claims>,
) -> Router {
    finish(start_part(engine, auth, claims, Background::default()))
}

/// Every route, for one process that hosts them all (the local server), the MCP gateway with
/// `gateway`'s settings; with `dev`, the development sign-in (`GET /dev/people` and
/// `POST /dev/token`); with `slack`, the Slack app's `POST /slack/interactions`, whose
/// decisions resume their run on a task of `background` once Slack has its answer, as the runs
/// `POST /runs` accepts are driven on its tasks (the
/// decision API's `POST /approvals/{id}/decisions` resumes it before it answers, and says where
/// the run stands).
pub fn local_router(
    engine: Arc<Engine>,
    auth: Arc<dyn Authenticate>,
    claims: Arc<Claims>,
    dev: Option<DevSignIn>,
    slack: Option<Arc<SlackApp>>,
    background: Background,
    gateway: mcp::Settings,
) -> Router {
    let mut router = decide_part(
        engine.clone(),
        auth.clone(),
        slack,
        background.clone(),
        gateway,
    )
    .merge(start_part(engine, auth, claims, background));
    if let Some(dev) = dev {
        router = router.merge(dev::routes(dev));
    }
    finish(router)
}

async fn no_route(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// Runs a request in a span; the extractors and handlers record the tenant, person, run and
/// approval into it as they learn them. `route` is the route's template
/// (`/approvals/{id}/decisions`), the same for every approval, to group requests by; `path`
/// is the request's own.
async fn trace_request(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unrouted", MatchedPath::as_str);
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        route,
        path = %request.uri().path(),
        tenant = tracing::field::Empty,
        person = tracing::field::Empty,
        run_id = tracing::field::Empty,
        approval_id = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    let started = Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.record("status", status);
    let millis = started.elapsed().as_millis() as u64;
    span.in_scope(|| tracing::info!(status, millis, "handled"));
    response.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route is documented; every code is checked, from the error enums and the API's
    /// own literals, in `error.rs`.
    #[test]
    fn the_openapi_document_describes_every_route() {
        for path in [
            "/:",
            "/review/{file}:",
            "/dev/people:",
            "/dev/token:",
            "/approvals:",
            "/approvals/decided:",
            "/approvals/{id}:",
            "/approvals/{id}/decisions:",
            "/runs:",
            "/runs/{id}:",
            "/runs/{id}/cancel:",
            "/runs/{id}/audit:",
            "/slack/interactions:",
            "/approvals/{id}/comments:",
            "/mcp/{agent}:",
            "/gate/calls:",
            "/gate/calls/{id}:",
            "/hooks/claude-code/{agent}:",
        ] {
            assert!(OPENAPI_YAML.contains(path), "{path} is not documented");
        }
    }
}
