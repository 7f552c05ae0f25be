//! Development sign-in, for the local server only: the people of the directory, and a
//! development token for one of them. Lambda never hosts these routes; the local server adds
//! them only when it listens on a loopback address.
//!
//! - `GET /dev/people`: `{"people": [{"name", "tenant", "roles"}]}`.
//! - `POST /dev/token` with `{"as": "<name>"}`: the token and whom it names.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::auth::{BearerJwt, IssuedToken};
use super::error::ApiError;
use super::extract::JsonBody;
use crate::domain::identity::{Directory, Person};
use crate::engine::EngineError;

/// What development sign-in needs: whom it may sign in, and the key it signs with.
#[derive(Clone)]
pub struct DevSignIn {
    pub directory: Directory,
    pub issuer: Arc<BearerJwt>,
    /// How long an issued token is valid.
    pub ttl: Duration,
}

#[derive(Debug, Serialize)]
pub struct People {
    pub people: Vec<Person>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    /// The person to sign in as.
    #[serde(rename = "as")]
    pub person: String,
}

pub(super) fn routes(dev: DevSignIn) -> Router {
    Router::new()
        .route("/dev/people", get(people))
        .route("/dev/token", post(token))
        .route_layer(middleware::from_fn(loopback_host_only))
        .with_state(Arc::new(dev))
}

async fn people(State(dev): State<Arc<DevSignIn>>) -> Json<People> {
    Json(People {
        people: dev.directory.people.clone(),
    })
}

async fn token(
    State(dev): State<Arc<DevSignIn>>,
    JsonBody(body): JsonBody<TokenBody>,
) -> Result<Json<IssuedToken>, ApiError> {
    let who = dev
        .directory
        .identify(&body.person)
        .map_err(EngineError::from)?;
    let issued = dev
        .issuer
        .issue_for(&who, chrono::Utc::now(), dev.ttl)
        .map_err(|e| EngineError::Unavailable(e.to_string()))?;
    tracing::info!(person = %who.person, "development sign-in");
    Ok(Json(issued))
}

/// Refuses a request whose `Host` is not a loopback name: a web page that rebinds its own DNS
/// name to 127.0.0.1 must not be able to mint tokens from the browser of whoever visits it.
async fn loopback_host_only(request: Request, next: Next) -> Result<Response, ApiError> {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !is_loopback_host(host) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "not_local",
            "development sign-in answers only requests addressed to localhost",
        ));
    }
    Ok(next.run(request).await)
}

/// `localhost`, `127.x.x.x` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_may_sign_in() {
        for host in [
            "localhost",
            "localhost:8780",
            "LOCALHOST:1",
            "127.0.0.1",
            "127.0.0.1:8780",
            "127.1.2.3:9",
            "[::1]:8780",
            "[::1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "",
            "evil.example",
            "evil.example:8780",
            "localhost.evil.example",
            "10.0.0.1:8780",
            "[::2]:8780",
            "127.0.0.1.evil.example",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
