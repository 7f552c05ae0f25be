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
//!
//! Slack shows an error when its request is not answered within three seconds, and a tool may
//! take longer: with an embedded engine (the local server), the run a decision settles is
//! resumed on a task of its own once the answer is out, not within the request. A resume that
//! fails there is logged and, for a click, told in a second ephemeral message; its action
//! waits in the outbox index, and the sweep resumes the run.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::Instrument;

use super::background::Background;
use super::error::ApiError;
use super::extract::body_bytes;
use crate::adapters::slack::{
    Button, ButtonChoice, EDIT_CALLBACK, SlackApp, edit_modal, ephemeral,
};
use crate::domain::approval::{Approval, ApprovalStatus, Choice, DecisionEffect, DecisionRequest};
use crate::domain::identity::Identity;
use crate::domain::ids::{ActionVersion, ApprovalId, DecisionId};
use crate::domain::money::Amount;
use crate::engine::{DecisionReport, Deferred, Engine};

/// Slack's interaction payloads carry the whole message clicked on: more than the API's usual
/// body limit.
pub const MAX_INTERACTION_BYTES: usize = 64 * 1024;

#[derive(Clone)]
pub(super) struct SlackState {
    pub engine: Arc<Engine>,
    pub slack: Arc<SlackApp>,
    /// Where the resumes decisions left for after the answer run.
    pub background: Background,
}

impl SlackState {
    /// Delivers what a decision deferred (in the embedded mode, resumes its run) on a task of
    /// its own, now that the person has their answer. A resume that fails is logged and, with
    /// a `response_url`, told to them.
    fn resume_after_answer(&self, deferred: Deferred, response_url: Option<&str>) {
        if deferred.is_empty() {
            return;
        }
        let (engine, slack) = (self.engine.clone(), self.slack.clone());
        let response_url = response_url.map(str::to_string);
        let work = async move {
            let failed = engine.deliver_deferred(deferred).await;
            if failed.is_empty() {
                return;
            }
            tracing::warn!(
                ?failed,
                "a run a Slack decision settled did not resume; the sweep will"
            );
            if let Some(url) = response_url {
                let text = format!(
                    "Your decision is recorded, but its run did not resume yet ({}); Countersign's \
                     sweep tries again.",
                    failed.join("; ")
                );
                slack.respond(&url, &ephemeral(&text)).await;
            }
        };
        self.background.spawn(work.in_current_span());
    }
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
    request: Request,
) -> Response {
    let body = match body_bytes(request, &state, MAX_INTERACTION_BYTES).await {
        Ok(body) => body,
        Err(refused) => return refused.into_response(),
    };
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
    match payload["type"].as_str() {
        Some("block_actions") => click(&state, &payload).await,
        Some("view_submission") => submission(&state, &payload).await,
        _ => bad_payload("only block_actions and view_submission interactions are taken"),
    }
}

/// A click on one of a notice's buttons.
async fn click(state: &SlackState, payload: &Value) -> Response {
    let Some(action) = payload["actions"].as_array().and_then(|a| a.first()) else {
        return bad_payload("the interaction has no action");
    };
    let button = match Button::of_action(action) {
        Ok(button) => button,
        Err(why) => return bad_payload(why),
    };
    let user = payload["user"]["id"].as_str().unwrap_or_default();
    let response_url = payload["response_url"].as_str();
    let (message, deferred) = match button.choice {
        ButtonChoice::Edit => {
            let trigger = payload["trigger_id"].as_str().unwrap_or_default();
            let opened = open_edit(state, &button, user, trigger).await;
            (opened, Deferred::default())
        }
        _ => {
            let (message, deferred) = decide(state, &button, user).await;
            (Some(message), deferred)
        }
    };
    let Some(message) = message else {
        // The edit form opened: nothing to tell.
        return Json(json!({})).into_response();
    };
    if let Some(url) = response_url {
        state.slack.respond(url, &message).await;
    }
    // Told first, resumed after: a late word on the resume comes after this one.
    state.resume_after_answer(deferred, response_url);
    Json(message).into_response()
}

fn refusal(error: &ApiError, user: &str, button: &Button) -> String {
    tracing::info!(code = error.code, user, approval_id = %button.approval, "a Slack decision refused");
    format!("Not decided ({}): {}", error.code, sentence(&error.message))
}

/// What a decision from Slack is about: the person, the approval as the button was rendered
/// for it (bound to its args hash), and the version; or why there is none.
async fn bind(
    state: &SlackState,
    button: &Button,
    user: &str,
) -> Result<(Identity, Approval, ActionVersion), ApiError> {
    let Some(who) = state.slack.person(user) else {
        return Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "unknown_person",
            format!(
                "your Slack user {} is not mapped to a person of Countersign's directory",
                user.chars().take(32).collect::<String>()
            ),
        ));
    };
    let invalid = |e: String| ApiError::bad_request("invalid_field", e);
    let approval_id = ApprovalId::parse(&button.approval).map_err(|e| invalid(e.to_string()))?;
    let version = ActionVersion::new(button.version).map_err(|e| invalid(e.to_string()))?;
    // Bound to the arguments the button showed: a button of other arguments is stale.
    let approval = state.engine.approval(&who.tenant, &approval_id).await?;
    if approval.args_hash.as_str() != button.args_hash {
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "stale_version",
            "the arguments this button was shown with are no longer the ones waiting",
        ));
    }
    Ok((who, approval, version))
}

/// Decides the button's choice as the Slack user's person, and says what came of it; with
/// what the decision left to deliver once that is said.
async fn decide(state: &SlackState, button: &Button, user: &str) -> (Value, Deferred) {
    let refused = |error: ApiError| ephemeral(&refusal(&error, user, button));
    let (who, approval, version) = match bind(state, button, user).await {
        Ok(bound) => bound,
        Err(error) => return (refused(error), Deferred::default()),
    };
    let approval_id = approval.id;
    let decision_id = match DecisionId::parse(&format!("{}.{user}", button.action_id)) {
        Ok(id) => id,
        Err(e) => {
            let invalid = ApiError::bad_request("invalid_field", e.to_string());
            return (refused(invalid), Deferred::default());
        }
    };
    let choice = match button.choice {
        ButtonChoice::Reject => Choice::Reject {
            reason: format!("Rejected in Slack by {}, without a reason.", who.person),
        },
        _ => Choice::Approve,
    };
    let request = DecisionRequest {
        decision_id,
        action_version: version,
        choice,
    };
    let (decided, deferred) = state
        .engine
        .decide_deferred(&who, &approval_id, request)
        .await;
    let message = match decided {
        Ok(report) => {
            tracing::info!(user, person = %who.person, approval_id = %approval_id, replayed = report.replayed, "decided in Slack");
            ephemeral(&outcome(&report))
        }
        // A late decision expires the approval: its run resumes all the same.
        Err(error) => refused(error.into()),
    };
    (message, deferred)
}

/// Opens the edit form for a person who could edit the approval; `None` once it is open, else
/// the ephemeral message that says why not.
async fn open_edit(
    state: &SlackState,
    button: &Button,
    user: &str,
    trigger: &str,
) -> Option<Value> {
    let refused = |error: ApiError| Some(ephemeral(&refusal(&error, user, button)));
    let (who, approval, version) = match bind(state, button, user).await {
        Ok(bound) => bound,
        Err(error) => return refused(error),
    };
    // The engine checks all of this again when the form comes back; here it spares a person a
    // form they could not submit.
    let conflict =
        |code, message: String| ApiError::new(axum::http::StatusCode::CONFLICT, code, message);
    if approval.status != ApprovalStatus::AwaitingApproval {
        return refused(conflict(
            "already_decided",
            format!("this approval is already {}", approval.status.as_str()),
        ));
    }
    if approval.action_version != version {
        return refused(conflict("stale_version", "a newer version waits".into()));
    }
    if approval.requested_by.contains(&who.person) {
        return refused(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "own_request",
            format!(
                "nobody approves their own request: {} asked for this",
                who.person
            ),
        ));
    }
    if !approval.deciding_roles().any(|role| who.has_role(role)) {
        return refused(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "missing_role",
            format!(
                "{} does not have the {} role",
                who.person, approval.approver_role
            ),
        ));
    }
    let cents = state
        .engine
        .policy_of(&approval.tenant, &approval.agent)
        .ok()
        .and_then(|policy| policy.lowerable_field(&approval.tool))
        .and_then(|field| approval.args.int(field));
    let Some(cents) = cents else {
        return refused(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "edit_refused",
            "policy lets nobody edit this call",
        ));
    };
    match state
        .slack
        .open_view(trigger, &edit_modal(&approval, button, cents))
        .await
    {
        Ok(()) => None,
        Err(why) => Some(ephemeral(&format!(
            "The edit form did not open ({}); edit on the review page instead.",
            sentence(&why).trim_end_matches('.')
        ))),
    }
}

/// The edit form, submitted: the edit is decided as the person who submitted it, bound to the
/// version and args hash the form was opened for. Success closes the form; a refusal shows
/// under the amount (`response_action: errors`), as Slack documents.
async fn submission(state: &SlackState, payload: &Value) -> Response {
    let view = &payload["view"];
    if view["callback_id"] != EDIT_CALLBACK {
        return bad_payload("the form is not Countersign's");
    }
    let button = match Button::of_metadata(view["private_metadata"].as_str().unwrap_or_default()) {
        Ok(button) => button,
        Err(why) => return bad_payload(why),
    };
    let user = payload["user"]["id"].as_str().unwrap_or_default();
    let values = &view["state"]["values"];
    let errors = |text: String| {
        Json(json!({"response_action": "errors", "errors": {"amount": text}})).into_response()
    };
    let Ok(amount) = values["amount"]["value"]["value"]
        .as_str()
        .unwrap_or_default()
        .parse::<Amount>()
    else {
        return errors("Write the amount in dollars, such as 200.00.".into());
    };
    let note = values["note"]["value"]["value"]
        .as_str()
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    let (who, approval, version) = match bind(state, &button, user).await {
        Ok(bound) => bound,
        Err(error) => return errors(refusal(&error, user, &button)),
    };
    let decision_id =
        match DecisionId::parse(&format!("{}.{user}.{}", button.action_id, amount.cents())) {
            Ok(id) => id,
            Err(e) => return errors(e.to_string()),
        };
    let request = DecisionRequest {
        decision_id,
        action_version: version,
        choice: Choice::Edit { amount, note },
    };
    let (decided, deferred) = state
        .engine
        .decide_deferred(&who, &approval.id, request)
        .await;
    let answer = match decided {
        Ok(report) => {
            tracing::info!(user, person = %who.person, approval_id = %approval.id, replayed = report.replayed, "edited in Slack");
            Json(json!({"response_action": "clear"})).into_response()
        }
        Err(error) => errors(refusal(&error.into(), user, &button)),
    };
    // A form's submission has no response_url: a resume that fails is only logged.
    state.resume_after_answer(deferred, None);
    answer
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
