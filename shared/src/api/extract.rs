//! Extractors that parse a request at the edge and refuse it in the API's own error shape,
//! never with axum's plain-text rejections.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRef, FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::error::Category;

use super::auth::Authenticate;
use super::error::ApiError;
use crate::domain::identity::Identity;
use crate::domain::ids::{ApprovalId, IdError, RunId};

/// The authenticated person making the request.
pub struct Caller(pub Identity);

impl<S> FromRequestParts<S> for Caller
where
    S: Send + Sync,
    Arc<dyn Authenticate>: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let auth = Arc::<dyn Authenticate>::from_ref(state);
        let who = auth.identify(parts).inspect_err(|error| {
            tracing::info!(code = error.code(), "not authenticated");
        })?;
        let span = tracing::Span::current();
        span.record("tenant", tracing::field::display(&who.tenant));
        span.record("person", tracing::field::display(&who.person));
        Ok(Caller(who))
    }
}

/// An id in the path, parsed; a malformed one is a 400 `bad_id`.
pub struct IdPath<T>(pub T);

/// Ids that can stand in a path.
pub trait PathId: Sized {
    /// The span field the id is recorded in.
    const FIELD: &'static str;
    fn parse_id(text: &str) -> Result<Self, IdError>;
}

impl PathId for ApprovalId {
    const FIELD: &'static str = "approval_id";
    fn parse_id(text: &str) -> Result<Self, IdError> {
        ApprovalId::parse(text)
    }
}

impl PathId for RunId {
    const FIELD: &'static str = "run_id";
    fn parse_id(text: &str) -> Result<Self, IdError> {
        RunId::parse(text)
    }
}

impl<S, T> FromRequestParts<S> for IdPath<T>
where
    S: Send + Sync,
    T: PathId + std::fmt::Display,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(text) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::bad_request("bad_id", rejection.body_text()))?;
        let id = T::parse_id(&text).map_err(|e| ApiError::bad_request("bad_id", e.to_string()))?;
        tracing::Span::current().record(T::FIELD, tracing::field::display(&id));
        Ok(IdPath(id))
    }
}

/// A request body that did not arrive within the time its server gives a body once its head
/// is in (the local server's `--body-timeout`): the error its body yields then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the body did not arrive within {}", humantime::format_duration(*.0))]
pub struct BodyLate(pub Duration);

/// The request's body, within the route's `DefaultBodyLimit`, which is `limit` (named in the
/// refusal): over it a 400 `body_too_large`, late a 408 `request_timeout`.
pub async fn body_bytes<S: Send + Sync>(
    request: Request,
    state: &S,
    limit: usize,
) -> Result<Bytes, ApiError> {
    Bytes::from_request(request, state)
        .await
        .map_err(|rejection| {
            if let Some(BodyLate(within)) = cause::<BodyLate>(&rejection) {
                return ApiError::request_timeout(*within);
            }
            match rejection.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ApiError::bad_request(
                    "body_too_large",
                    format!("the body is larger than {limit} bytes"),
                ),
                _ => ApiError::bad_request("unreadable_body", rejection.body_text()),
            }
        })
}

/// The first error of type `E` in `error`'s chain of sources, itself included.
fn cause<'a, E: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(found) = error.downcast_ref::<E>() {
            return Some(found);
        }
        next = error.source();
    }
    None
}

/// A JSON body of type `T`, of at most `LIMIT` bytes (the route's `DefaultBodyLimit`),
/// [`MAX_BODY_BYTES`](super::MAX_BODY_BYTES) unless the route allows more.
pub struct JsonBody<T, const LIMIT: usize = { super::MAX_BODY_BYTES }>(pub T);

impl<S, T, const LIMIT: usize> FromRequest<S> for JsonBody<T, LIMIT>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        if !is_json(&request) {
            return Err(ApiError::bad_request(
                "bad_content_type",
                "send the body as JSON, with Content-Type: application/json",
            ));
        }
        let bytes = body_bytes(request, state, LIMIT).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

fn is_json(request: &Request) -> bool {
    let Some(value) = request.headers().get(header::CONTENT_TYPE) else {
        return false;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let essence = essence.to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Parses a body, naming what is wrong with a stable code.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|error| {
        let message = error.to_string();
        let code = match error.classify() {
            Category::Syntax | Category::Eof => "malformed_json",
            Category::Data if message.starts_with("unknown field") => "unknown_field",
            Category::Data if message.starts_with("missing field") => "missing_field",
            Category::Data | Category::Io => "invalid_field",
        };
        ApiError::bad_request(code, message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        name: String,
        count: u32,
    }

    fn code_of(text: &str) -> &'static str {
        parse_json::<Body>(text.as_bytes()).unwrap_err().code
    }

    #[test]
    fn each_kind_of_bad_body_has_its_code() {
        assert_eq!(code_of(r#"{"name": "#), "malformed_json");
        assert_eq!(code_of(""), "malformed_json");
        assert_eq!(code_of(r#"{"name": "x" "count": 1}"#), "malformed_json");
        assert_eq!(
            code_of(r#"{"name": "x", "count": 1, "by": "ben"}"#),
            "unknown_field"
        );
        assert_eq!(code_of(r#"{"name": "x"}"#), "missing_field");
        assert_eq!(code_of(r#"{"name": "x", "count": -1}"#), "invalid_field");
        assert_eq!(code_of(r#"[1, 2]"#), "invalid_field");
        assert!(parse_json::<Body>(br#"{"name": "x", "count": 1}"#).is_ok());
    }
}
