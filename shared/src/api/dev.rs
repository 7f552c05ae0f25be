//! Development sign-in, for the local server only: the people of the directory, and a
//! development token for one of them. Lambda never hosts these routes; the local server adds
//! them only when started with `--dev-sign-in` on a loopback address.
//!
//! - `GET /dev/people`: `{"people": [{"name", "tenant", "roles"}]}`.
//! - `POST /dev/token` with `{"as": "<name>"}`: the token and whom it names.
//!
//! Both need the header [`SECRET_HEADER`] holding the state directory's sign-in secret, checked
//! before anything else is read. Loopback is not a boundary between the users of one machine;
//! the secret, readable by the state's owner only, is.

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

/// The header that carries the development sign-in secret.
pub const SECRET_HEADER: &str = "x-countersign-dev-secret";

/// What development sign-in needs: whom it may sign in, the key it signs with, and the secret a
/// caller must show.
#[derive(Clone)]
pub struct DevSignIn {
    pub directory: Directory,
    pub issuer: Arc<BearerJwt>,
    /// How long an issued token is valid.
    pub ttl: Duration,
    /// What [`SECRET_HEADER`] must hold.
    pub secret: String,
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
    let dev = Arc::new(dev);
    Router::new()
        .route("/dev/people", get(people))
        .route("/dev/token", post(token))
        .route_layer(middleware::from_fn_with_state(dev.clone(), secret_shown))
        .route_layer(middleware::from_fn(loopback_host_only))
        .with_state(dev)
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

/// Refuses a request without the sign-in secret before its body is read: without it, nobody
/// learns who may sign in, nor signs in.
async fn secret_shown(
    State(dev): State<Arc<DevSignIn>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let mut shown = request.headers().get_all(SECRET_HEADER).iter();
    let secret = match (shown.next(), shown.next()) {
        (Some(secret), None) => secret.as_bytes(),
        _ => b"",
    };
    if !same_secret(secret, dev.secret.as_bytes()) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "dev_secret",
            "development sign-in needs the secret in the state directory's dev-sign-in.secret, \
             sent as one X-Countersign-Dev-Secret header",
        ));
    }
    Ok(next.run(request).await)
}

/// Compares in time that does not depend on where the first difference is.
fn same_secret(shown: &[u8], secret: &[u8]) -> bool {
    shown.len() == secret.len()
        && shown
            .iter()
            .zip(secret)
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
}

/// Refuses a request not addressed to a loopback name: a web page that rebinds its own DNS
/// name to 127.0.0.1 must not be able to mint tokens from the browser of whoever visits it.
/// There must be exactly one `Host`, and an absolute request target must name a loopback host
/// too, so no proxy or parser in between can be told one host and act on another.
async fn loopback_host_only(request: Request, next: Next) -> Result<Response, ApiError> {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(host), None) => host.to_str().unwrap_or_default(),
        _ => "",
    };
    let target_is_local = request
        .uri()
        .authority()
        .is_none_or(|authority| is_loopback_host(authority.as_str()));
    if !is_loopback_host(host) || !target_is_local {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "not_local",
            "development sign-in answers only requests addressed to localhost, with one Host header",
        ));
    }
    Ok(next.run(request).await)
}

/// `localhost`, `127.x.x.x` or `[::1]`, with or without a port, and nothing else: no text after
/// the bracket of an IPv6 address but a port, no port that is not digits.
fn is_loopback_host(host: &str) -> bool {
    let (name, port, bracketed) = match host.strip_prefix('[') {
        Some(rest) => {
            let Some((name, after)) = rest.split_once(']') else {
                return false;
            };
            let port = match after {
                "" => None,
                _ => match after.strip_prefix(':') {
                    Some(port) => Some(port),
                    None => return false,
                },
            };
            (name, port, true)
        }
        None => match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port), false),
            None => (host, None, false),
        },
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return false;
    }
    match bracketed {
        true => name
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|ip| ip.is_loopback()),
        false => {
            name.eq_ignore_ascii_case("localhost")
                || name
                    .parse::<std::net::Ipv4Addr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    }
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
            "[::1]evil.example",
            "[::1].evil.example:80",
            "[::1]:80@evil.example",
            "[::1]:80:81",
            "[::1",
            "[127.0.0.1]:80",
            "localhost:",
            "localhost:80x",
            "localhost:80@evil.example",
            "::1",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn the_secret_must_match_exactly() {
        assert!(same_secret(b"abc123", b"abc123"));
        assert!(!same_secret(b"abc124", b"abc123"));
        assert!(!same_secret(b"abc12", b"abc123"));
        assert!(!same_secret(b"", b"abc123"));
    }
}
