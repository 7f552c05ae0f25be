//! The HTTP API. JSON in and out; every error is `{"error": {"code": "...", "message": "..."}}`.
//!
//! - `GET /orders/{order_id}`: the order, with what was refunded and what is left to refund.
//! - `POST /orders/{order_id}/refunds` with `Idempotency-Key`: 201 and the refund; the same key
//!   and body again, 200 and the same refund; the same key with another body, 409 `key_reused`;
//!   a key voided by a lookup, 409 `key_void`; past a hard limit, 422.
//! - `GET /refunds/by-key/{key}`: 200 and the refund if the key took effect. Otherwise the key is
//!   voided in the same transaction and the answer is 404 `not_found`: **404 from the lookup
//!   means: did not take effect, and never will.**
//! - `GET /refunds`: every refund, oldest first.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::refund::{IdempotencyKey, Order, Refund, RefundAsk, RefundBody, Refusal};
use crate::store::{self, Outcome, Store};

/// A failure injected into refund POSTs, so tests can see what a caller does when the answer
/// is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// Each refund POST runs its transaction (committing any refund), then answers 500.
    #[value(name = "commit-then-500")]
    CommitThen500,
    /// Each refund POST runs its transaction (committing any refund), then never answers.
    HangAfterCommit,
    /// Each refund POST never answers and commits nothing.
    HangBeforeCommit,
}

pub struct App {
    pub store: Arc<Store>,
    /// When set, every request needs `Authorization: Bearer <token>`.
    pub token: Option<String>,
    pub fault: Option<Fault>,
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/orders/{order_id}", get(get_order))
        .route("/orders/{order_id}/refunds", post(post_refund))
        .route("/refunds", get(list_refunds))
        .route("/refunds/by-key/{key}", get(refund_by_key))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // After the fallbacks, so an unknown path without a token is 401 too and reveals nothing.
        .layer(middleware::from_fn_with_state(app.clone(), require_token))
        .with_state(app)
}

async fn get_order(
    State(app): State<Arc<App>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(order_id) = path?;
    let found = blocking(&app, {
        let order_id = order_id.clone();
        move |store| Ok(store.order(&order_id)?)
    })
    .await?;
    let order = found.ok_or(Refusal::UnknownOrder(order_id))?;
    Ok(Json(order_json(&order)))
}

async fn post_refund(
    State(app): State<Arc<App>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if app.fault == Some(Fault::HangBeforeCommit) {
        hang().await;
    }
    let Path(order_id) = path?;
    let key = idempotency_key(&headers)?;
    // Parsed by hand: axum's Json would answer 422 for an unknown field, and that is a 400 here.
    let body: RefundBody = serde_json::from_slice(&body)
        .map_err(|e| Refusal::BadRequest(format!("the body is not a refund request: {e}")))?;
    let ask = RefundAsk::parse(&order_id, body)?;
    let outcome = blocking(&app, move |store| store.refund(&key, &ask)).await;
    match app.fault {
        Some(Fault::CommitThen500) => return Err(ApiError::injected()),
        Some(Fault::HangAfterCommit) => hang().await,
        _ => {}
    }
    Ok(match outcome? {
        Outcome::Created(refund) => {
            tracing::info!(
                refund = %refund.refund_id,
                order = %refund.ask.order_id,
                amount = %refund.ask.amount_cents,
                key = %refund.idempotency_key,
                "refunded"
            );
            (StatusCode::CREATED, Json(refund_json(&refund))).into_response()
        }
        // The header tells a curious caller this is the earlier answer, not a second refund.
        Outcome::Replayed(refund) => (
            StatusCode::OK,
            [("idempotent-replayed", "true")],
            Json(refund_json(&refund)),
        )
            .into_response(),
    })
}

/// The reconcile lookup. A 404 voids the key first, so it means "did not take effect, and never
/// will": a slow request with the key that arrives later is refused with 409 `key_void`.
async fn refund_by_key(
    State(app): State<Arc<App>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    // Path has already percent-decoded the key, so `act_1%3A2` and `act_1:2` are one key.
    let Path(key) = path?;
    let key = IdempotencyKey::parse(&key)?;
    let refund = blocking(&app, move |store| store.refund_by_key_or_void(&key)).await?;
    Ok(Json(refund_json(&refund)))
}

async fn list_refunds(State(app): State<Arc<App>>) -> Result<Json<Value>, ApiError> {
    let refunds = blocking(&app, |store| Ok(store.refunds()?)).await?;
    Ok(Json(Value::Array(
        refunds.iter().map(refund_json).collect(),
    )))
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such resource")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this resource does not take that method",
    )
}

async fn require_token(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    if let Some(token) = &app.token {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        if !presented.is_some_and(|presented| same_secret(presented, token)) {
            let refused = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this service needs an Authorization: Bearer token",
            );
            return ([(header::WWW_AUTHENTICATE, "Bearer")], refused).into_response();
        }
    }
    next.run(request).await
}

/// Compares without stopping at the first difference, so timing does not reveal the token.
fn same_secret(presented: &str, token: &str) -> bool {
    presented.len() == token.len()
        && presented
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
}

fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, Refusal> {
    let value = headers
        .get("idempotency-key")
        .ok_or(Refusal::MissingKey)?
        .to_str()
        .map_err(|_| Refusal::BadKey("the idempotency key must be visible ASCII".into()))?;
    IdempotencyKey::parse(value)
}

/// Never returns: the request stays open until the caller gives up.
async fn hang() {
    let never: Infallible = std::future::pending().await;
    match never {}
}

/// Runs a database call off the async workers: SQLite blocks, on `fsync` above all.
async fn blocking<T: Send + 'static>(
    app: &App,
    work: impl FnOnce(&Store) -> Result<T, store::Error> + Send + 'static,
) -> Result<T, ApiError> {
    let store = app.store.clone();
    tokio::task::spawn_blocking(move || work(&store))
        .await
        .map_err(|e| ApiError::internal(format!("the database call stopped: {e}")))?
        .map_err(ApiError::from)
}

pub fn order_json(order: &Order) -> Value {
    json!({
        "id": order.id,
        "customer": order.customer,
        "currency": order.currency,
        "paid_cents": order.paid_cents,
        "paid": order.paid_cents.to_string(),
        "refunded_cents": order.refunded_cents,
        "refundable_cents": order.refundable_cents(),
        "items": order.items.iter().map(|item| json!({
            "sku": item.sku,
            "name": item.name,
            "quantity": item.quantity,
            "price_cents": item.price_cents,
        })).collect::<Vec<_>>(),
        "note": order.note,
    })
}

pub fn refund_json(refund: &Refund) -> Value {
    json!({
        "refund_id": refund.refund_id,
        "order_id": refund.ask.order_id,
        "amount_cents": refund.ask.amount_cents,
        "amount": refund.ask.amount_cents.to_string(),
        "currency": refund.ask.currency,
        "reason": refund.ask.reason,
        "idempotency_key": refund.idempotency_key,
        "created_at": refund.created_at,
    })
}

/// An error answer with a stable `code`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn internal(message: String) -> Self {
        tracing::error!(%message, "answering 500");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    fn injected() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "fault",
            "injected fault commit-then-500: the request was handled, but this answer says it failed",
        )
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        let status = match refusal {
            Refusal::BadRequest(_)
            | Refusal::MissingKey
            | Refusal::BadKey(_)
            | Refusal::OrderMismatch { .. } => StatusCode::BAD_REQUEST,
            Refusal::UnknownOrder(_) | Refusal::NoRefundForKey(_) => StatusCode::NOT_FOUND,
            Refusal::KeyReused(_) | Refusal::KeyVoid(_) => StatusCode::CONFLICT,
            Refusal::NotPositive(_)
            | Refusal::ExceedsRefundable { .. }
            | Refusal::CurrencyMismatch { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        };
        Self::new(status, refusal.code(), refusal.to_string())
    }
}

impl From<store::Error> for ApiError {
    fn from(error: store::Error) -> Self {
        match error {
            store::Error::Refused(refusal) => refusal.into(),
            store::Error::Database(_) => Self::internal(error.to_string()),
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            rejection.body_text(),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_passes() {
        assert!(same_secret("s3cret", "s3cret"));
        assert!(!same_secret("s3cres", "s3cret"));
        assert!(!same_secret("s3cre", "s3cret"));
        assert!(!same_secret("", "s3cret"));
    }
}
