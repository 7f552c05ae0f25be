//! `POST /slack/interactions`: the clicks on a notice's Approve and Reject buttons, as Slack's
//! app sends them (a form-encoded `payload` holding a `block_actions` JSON object).
//!
//! Nothing is read before the request's Slack signature verifies (fresh timestamp, constant-time
//! compare); a request that does not is refused with a 401 and changes nothing. The Slack user
//! is mapped to a person by the people directory's `slack` ids. The decision goes through the
//! same engine call as the page, bound to the version and args hash the button was rendered
//! for, with the button's action id and the Slack user as its decision id: a double click or
//! Slack's retry is one decision. The outcome, or why it was refused, is told to the person who
//! clicked as an ephemeral message through the interaction's `response_url`; the same message
//! is the HTTP answer's body.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use crate::adapters::slack::{Button, ButtonChoice, SlackApp, ephemeral};
use crate::domain::approval::{Choice, DecisionEffect, DecisionRequest};
use crate::domain::ids::{ActionVersion, ApprovalId, DecisionId};
use crate::engine::{DecisionReport, Engine};

/// Slack's interaction payloads carry the whole message clicked on: more than the API's usual
/// body limit.
pub const MAX_INTERACTION_BYTES: usize = 64 * 1024;

#[derive(Clone)]
pub(super) struct SlackState {
    pub engine: Arc<Engine>,
    pub slack: Arc<SlackApp>,
}

#[derive(Deserialize)]
struct Form {
    payload: String,
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn bad_payload(message: impl Into<String>) -> Response {
    ApiError::bad_request("slack_payload", message).into_response()
}

pub(super) async fn interactions(
    State(state): State<SlackState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let now = state.engine.now().timestamp();
    if let Err(error) = state.slack.verify(
        header(&headers, "x-slack-request-timestamp"),
        header(&headers, "x-slack-signature"),
        &body,
        now,
    ) {
        tracing::warn!(%error, "a Slack interaction refused");
        return ApiError::new(
            axum::http::StatusCode::UNAUTHORIZED,
            "slack_signature",
            error.to_string(),
        )
        .into_response();
    }
    let Ok(form) = serde_urlencoded::from_bytes::<Form>(&body) else {
        return bad_payload("the body is not a form with a payload field");
    };
    let Ok(payload) = serde_json::from_str::<Value>(&form.payload) else {
        return bad_payload("the payload is not JSON");
    };
    if payload["type"] != "block_actions" {
        return bad_payload("only block_actions interactions are taken");
    }
    let Some(action) = payload["actions"].as_array().and_then(|a| a.first()) else {
        return bad_payload("the interaction has no action");
    };
    let button = match Button::of_action(action) {
        Ok(button) => button,
        Err(why) => return bad_payload(why),
    };
    let user = payload["user"]["id"].as_str().unwrap_or_default();
    let message = decide(&state, &button, user).await;
    if let Some(url) = payload["response_url"].as_str() {
        state.slack.respond(url, &message).await;
    }
    Json(message).into_response()
}

/// Decides the button's choice as the Slack user's person, and says what came of it.
async fn decide(state: &SlackState, button: &Button, user: &str) -> Value {
    let refused = |error: ApiError| {
        tracing::info!(code = error.code, user, approval = %button.approval, "a Slack decision refused");
        ephemeral(&format!(
            "Not decided ({}): {}",
            error.code,
            sentence(&error.message)
        ))
    };
    let Some(who) = state.slack.person(user) else {
        return refused(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "unknown_person",
            format!(
                "your Slack user {} is not mapped to a person of Countersign's directory",
                user.chars().take(32).collect::<String>()
            ),
        ));
    };
    let invalid = |e: String| ApiError::bad_request("invalid_field", e);
    let approval_id = match ApprovalId::parse(&button.approval) {
        Ok(id) => id,
        Err(e) => return refused(invalid(e.to_string())),
    };
    let version = match ActionVersion::new(button.version) {
        Ok(v) => v,
        Err(e) => return refused(invalid(e.to_string())),
    };
    let decision_id = match DecisionId::parse(&format!("{}.{user}", button.action_id)) {
        Ok(id) => id,
        Err(e) => return refused(invalid(e.to_string())),
    };
    // Bound to the arguments the button showed: a button of other arguments is stale.
    match state.engine.approval(&who.tenant, &approval_id).await {
        Ok(approval) if approval.args_hash.as_str() != button.args_hash => {
            return refused(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                "stale_version",
                "the arguments this button was shown with are no longer the ones waiting",
            ));
        }
        Ok(_) => {}
        Err(error) => return refused(error.into()),
    }
    let choice = match button.choice {
        ButtonChoice::Approve => Choice::Approve,
        ButtonChoice::Reject => Choice::Reject {
            reason: format!("Rejected in Slack by {}, without a reason.", who.person),
        },
    };
    let request = DecisionRequest {
        decision_id,
        action_version: version,
        choice,
    };
    match state.engine.decide(&who, &approval_id, request).await {
        Ok(report) => {
            tracing::info!(user, person = %who.person, approval = %approval_id, replayed = report.replayed, "decided in Slack");
            ephemeral(&outcome(&report))
        }
        Err(error) => refused(error.into()),
    }
}

fn sentence(text: &str) -> String {
    let mut text = text.to_string();
    if !text.ends_with('.') {
        text.push('.');
    }
    text
}

/// What the person who clicked is told of their decision.
fn outcome(report: &DecisionReport) -> String {
    let d = &report.decision;
    let what = format!(
        "{} version {} ({})",
        report.approval.tool, d.action_version, report.approval.id
    );
    let text = match &d.effect {
        DecisionEffect::Approved => format!("You approved {what}."),
        DecisionEffect::Counted { still_needed } => {
            format!("Your approval of {what} is recorded; {still_needed} more needed.")
        }
        DecisionEffect::Rejected => {
            format!("You rejected {what}. The agent is told not to retry it.")
        }
        _ => format!("Your decision on {what} is recorded."),
    };
    match report.replayed {
        true => format!("Already recorded: {text}"),
        false => text,
    }
}
