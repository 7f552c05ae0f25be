//! Approvals: what waits in the caller's tenant, what was decided lately, one approval in
//! full, and deciding it.

use axum::Json;
use axum::extract::{RawQuery, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::DecideState;
use super::error::ApiError;
use super::extract::{Caller, IdPath, JsonBody};
use crate::domain::action::{Action, ActionStatus};
use crate::domain::approval::{Approval, Choice, DecisionRequest};
use crate::domain::ids::{ActionVersion, AgentName, ApprovalId, DecisionId, PersonId, TenantId};
use crate::domain::money::Amount;
use crate::domain::policy::{EditDirection, Policy, ToolRule};
use crate::engine::{
    DecisionReport, Engine, MAX_PENDING_PAGE, MAX_RESOLVED, PENDING_PAGE, PendingCursor, Shown,
};

/// An approval as a reviewer reads it: the stored approval (exact call, version, args hash,
/// explanation, reason, deadline, decisions, previous version) and what it still needs.
#[derive(Debug, Serialize)]
pub struct ApprovalView {
    #[serde(flatten)]
    pub approval: Approval,
    /// Distinct approvals still needed for the quorum.
    pub still_needed: u8,
    /// The distinct people whose approval of this version counts so far.
    pub approved_by: Vec<PersonId>,
    /// The amount a reviewer may lower with an edit, if policy lets them edit this call.
    pub editable_amount: Option<EditableAmount>,
    /// The deadline passed; a decision now expires it.
    pub overdue: bool,
    /// What the run was asked to do, so a reviewer knows what the call is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The approval as shown here, opaque: a decision that sends it back is decided in one
    /// conditional write while the approval is still exactly this (it is read again if not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// The argument an edit changes, and its value now: an edit must go below it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EditableAmount {
    pub field: String,
    pub cents: i64,
}

impl ApprovalView {
    fn of(approval: Approval, engine: &Engine, now: DateTime<Utc>) -> Self {
        let policy = engine.policy_of(&approval.tenant, &approval.agent).ok();
        Self {
            still_needed: approval.still_needed(),
            approved_by: approval.approvers().into_iter().cloned().collect(),
            editable_amount: policy.and_then(|policy| editable_amount(policy, &approval)),
            overdue: approval.is_overdue(now),
            approval,
            task: None,
            snapshot: None,
        }
    }

    /// The view of an approval as read from the store, with its snapshot.
    fn shown(shown: Shown, engine: &Engine, now: DateTime<Utc>) -> Self {
        Self {
            snapshot: Some(shown.snapshot),
            ..Self::of(shown.approval, engine, now)
        }
    }
}

/// What [`Policy::edit_amount`] would let a reviewer lower: the tool's amount field, when policy
/// marks it editable downward. The engine checks the edit itself again; this only tells the page
/// whether to offer it.
fn editable_amount(policy: &Policy, approval: &Approval) -> Option<EditableAmount> {
    let field = policy.amount_field(&approval.tool)?;
    let Some(ToolRule::Approve { editable, .. }) = policy.tools.get(&approval.tool) else {
        return None;
    };
    if editable.get(field) != Some(&EditDirection::Lower) {
        return None;
    }
    Some(EditableAmount {
        field: field.to_string(),
        cents: approval.args.int(field)?,
    })
}

#[derive(Debug, Serialize)]
pub struct ApprovalList {
    pub approvals: Vec<ApprovalView>,
    pub now: DateTime<Utc>,
    /// Where the next page starts (`?cursor=`); `null` on the last page.
    pub next_cursor: Option<String>,
}

/// Each view with its run's task, one read per run. A task that cannot be read is left out:
/// the approval is still shown, and a comment already written is still answered.
async fn with_tasks(engine: &Engine, tenant: &TenantId, views: &mut [&mut ApprovalView]) {
    let runs = views.iter().map(|v| &v.approval.run_id);
    let tasks = engine.tasks(tenant, runs).await.unwrap_or_else(|error| {
        tracing::warn!(%error, "the runs' tasks were not read");
        Default::default()
    });
    for view in views.iter_mut() {
        view.task = tasks.get(&view.approval.run_id).cloned();
    }
}

/// `GET /approvals?limit=N&cursor=C`: what waits for a decision in the caller's tenant,
/// soonest deadline first, a page at a time.
pub(super) async fn list(
    State(state): State<DecideState>,
    Caller(who): Caller,
    RawQuery(query): RawQuery,
) -> Result<Json<ApprovalList>, ApiError> {
    let asked = ListQuery::parse(
        query.as_deref().unwrap_or_default(),
        PENDING_PAGE,
        MAX_PENDING_PAGE,
        true,
    )?;
    let after = asked
        .cursor
        .as_deref()
        .map(PendingCursor::parse)
        .transpose()
        .map_err(|e| ApiError::bad_request("invalid_field", e.to_string()))?;
    let now = state.engine.now();
    let page = state
        .engine
        .pending_page(&who.tenant, after.as_ref(), asked.limit)
        .await?;
    let engine = &state.engine;
    let mut approvals: Vec<ApprovalView> = page
        .approvals
        .into_iter()
        .map(|a| ApprovalView::shown(a, engine, now))
        .collect();
    with_tasks(
        engine,
        &who.tenant,
        &mut approvals.iter_mut().collect::<Vec<_>>(),
    )
    .await;
    Ok(Json(ApprovalList {
        approvals,
        now,
        next_cursor: page.next.map(|cursor| cursor.encode()),
    }))
}

/// `GET /approvals/{id}`.
pub(super) async fn read(
    State(state): State<DecideState>,
    Caller(who): Caller,
    IdPath(id): IdPath<ApprovalId>,
) -> Result<Json<ApprovalView>, ApiError> {
    let shown = state.engine.approval_shown(&who.tenant, &id).await?;
    record_run(&shown.approval);
    let mut view = ApprovalView::shown(shown, &state.engine, state.engine.now());
    with_tasks(&state.engine, &who.tenant, &mut [&mut view]).await;
    Ok(Json(view))
}

/// An approval that no longer waits, as the review page's "recently decided" view reads it:
/// what was decided and by whom (its decisions), and how the call ended.
#[derive(Debug, Serialize)]
pub struct DecidedView {
    #[serde(flatten)]
    pub view: ApprovalView,
    /// The call as it stands now: the version the approval let run (an edit's new one), or the
    /// one it stopped, with its status and what it came back with.
    pub call: Option<Action>,
    /// A call its caller runs, approved and not claimed yet: since when, and whether nobody
    /// has claimed it within its tool's lease (its caller may be stuck).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub awaiting_caller: Option<AwaitingCaller>,
}

/// An approved call waiting for its caller to claim it.
#[derive(Debug, Serialize)]
pub struct AwaitingCaller {
    pub since: DateTime<Utc>,
    pub lease_ends_at: DateTime<Utc>,
    /// Unclaimed past its lease.
    pub stuck: bool,
}

impl AwaitingCaller {
    fn of(engine: &Engine, agent: &AgentName, call: &Action, now: DateTime<Utc>) -> Option<Self> {
        if call.status != ActionStatus::Approved {
            return None;
        }
        let lease = engine
            .agent(&call.tenant, agent)
            .ok()?
            .caller_lease(&call.tool)?;
        let lease_ends_at = call.updated_at + chrono::Duration::from_std(lease).ok()?;
        Some(Self {
            since: call.updated_at,
            lease_ends_at,
            stuck: now >= lease_ends_at,
        })
    }
}

#[derive(Debug, Serialize)]
pub struct DecidedList {
    pub approvals: Vec<DecidedView>,
    pub now: DateTime<Utc>,
}

/// How many resolved approvals `GET /approvals/decided` lists without a `limit`.
const DECIDED_BY_DEFAULT: usize = 20;

/// `GET /approvals/decided?limit=N`: the caller's tenant's approvals resolved most recently,
/// newest first, each with its run's task and how its call ended.
pub(super) async fn decided(
    State(state): State<DecideState>,
    Caller(who): Caller,
    RawQuery(query): RawQuery,
) -> Result<Json<DecidedList>, ApiError> {
    let query = query.as_deref().unwrap_or_default();
    let limit = ListQuery::parse(query, DECIDED_BY_DEFAULT, MAX_RESOLVED, false)?.limit;
    let now = state.engine.now();
    let resolved = state.engine.recently_decided(&who.tenant, limit).await?;
    let mut approvals: Vec<DecidedView> = resolved
        .into_iter()
        .map(|r| DecidedView {
            awaiting_caller: r
                .call
                .as_ref()
                .and_then(|call| AwaitingCaller::of(&state.engine, &r.approval.agent, call, now)),
            view: ApprovalView::of(r.approval, &state.engine, now),
            call: r.call,
        })
        .collect();
    let mut views: Vec<&mut ApprovalView> = approvals.iter_mut().map(|d| &mut d.view).collect();
    with_tasks(&state.engine, &who.tenant, &mut views).await;
    Ok(Json(DecidedList { approvals, now }))
}

/// What a list is asked for: how many, and where to start when it pages.
#[derive(Debug)]
struct ListQuery {
    limit: usize,
    cursor: Option<String>,
}

impl ListQuery {
    /// `limit`, a whole number from 1 to `max` (`default` without it), and where the list
    /// `pages`, `cursor`: the query's only parameters.
    fn parse(query: &str, default: usize, max: usize, pages: bool) -> Result<Self, ApiError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).map_err(|_| {
            ApiError::bad_request("invalid_field", "the query string does not parse")
        })?;
        let mut asked = Self {
            limit: default,
            cursor: None,
        };
        for (name, value) in pairs {
            match name.as_str() {
                "limit" => {
                    asked.limit = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=max).contains(n))
                        .ok_or_else(|| {
                            ApiError::bad_request(
                                "invalid_field",
                                format!("limit is a whole number from 1 to {max}"),
                            )
                        })?;
                }
                "cursor" if pages => asked.cursor = Some(value),
                _ => {
                    let takes = match pages {
                        true => "limit and cursor",
                        false => "limit",
                    };
                    return Err(ApiError::bad_request(
                        "unknown_field",
                        format!("{name} is not a parameter of this list; it takes {takes}"),
                    ));
                }
            }
        }
        Ok(asked)
    }
}

fn record_run(approval: &Approval) {
    tracing::Span::current().record("run_id", tracing::field::display(&approval.run_id));
}

/// The body of `POST /approvals/{id}/decisions`. The decider is the authenticated caller; the
/// body has no field that could name anyone.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// Chosen by the client; the same id again returns the recorded outcome.
    pub decision_id: String,
    /// The version the reviewer saw.
    pub action_version: u32,
    pub choice: ChoiceName,
    /// Edit only: the new amount in dollars, as a string such as "200.00". Never a number, so
    /// no float ever touches money.
    pub amount: Option<Value>,
    /// Edit only: why, for the record.
    pub note: Option<String>,
    /// Reject only: why, which the agent is told.
    pub reason: Option<String>,
    /// The `snapshot` the approval was shown with, if the client kept it: the decision is then
    /// made in one conditional write while the approval is unchanged.
    pub snapshot: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChoiceName {
    Approve,
    Edit,
    Reject,
    /// A recovery's answers: the call whose outcome was unknown took effect, or did not.
    TookEffect,
    DidNotTakeEffect,
}

impl DecisionBody {
    /// The engine's request, or why the body does not make one.
    pub fn into_request(self) -> Result<DecisionRequest, ApiError> {
        let invalid = |message: String| ApiError::bad_request("invalid_field", message);
        let decision_id =
            DecisionId::parse(&self.decision_id).map_err(|e| invalid(e.to_string()))?;
        let action_version =
            ActionVersion::new(self.action_version).map_err(|e| invalid(e.to_string()))?;
        let stray = |field: &str, allowed: &str| {
            invalid(format!("{field} goes only with choice \"{allowed}\""))
        };
        let choice = match self.choice {
            ChoiceName::Approve => {
                if self.amount.is_some() {
                    return Err(stray("amount", "edit"));
                }
                if self.note.is_some() {
                    return Err(stray("note", "edit"));
                }
                if self.reason.is_some() {
                    return Err(stray("reason", "reject"));
                }
                Choice::Approve
            }
            ChoiceName::Edit => {
                if self.reason.is_some() {
                    return Err(stray("reason", "reject"));
                }
                let amount = self.amount.ok_or_else(|| {
                    ApiError::bad_request("missing_field", "an edit needs the new amount")
                })?;
                Choice::Edit {
                    amount: dollars(&amount)?,
                    note: self.note,
                }
            }
            ChoiceName::Reject => {
                if self.amount.is_some() {
                    return Err(stray("amount", "edit"));
                }
                if self.note.is_some() {
                    return Err(stray("note", "edit"));
                }
                let reason = self.reason.ok_or_else(|| {
                    ApiError::bad_request("missing_field", "a rejection needs a reason")
                })?;
                Choice::Reject { reason }
            }
            ChoiceName::TookEffect | ChoiceName::DidNotTakeEffect => {
                if self.amount.is_some() {
                    return Err(stray("amount", "edit"));
                }
                if self.reason.is_some() {
                    return Err(stray("reason", "reject"));
                }
                match self.choice {
                    ChoiceName::TookEffect => Choice::TookEffect { note: self.note },
                    _ => Choice::DidNotTakeEffect { note: self.note },
                }
            }
        };
        Ok(DecisionRequest {
            decision_id,
            action_version,
            choice,
        })
    }
}

/// An amount of dollars written as a string: "200", "200.5", "200.50" or "$200.50".
fn dollars(value: &Value) -> Result<Amount, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "bad_amount",
            "amount is dollars written as a string, such as \"200.00\"",
        )
    };
    match value {
        Value::String(text) => text.parse().map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// The body of `POST /approvals/{id}/comments`. The author is the authenticated caller.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommentBody {
    pub text: String,
}

/// `POST /approvals/{id}/comments`: a comment that decides nothing; 201 with the approval and
/// its snapshot as written.
pub(super) async fn comment(
    State(state): State<DecideState>,
    Caller(who): Caller,
    IdPath(id): IdPath<ApprovalId>,
    JsonBody(body): JsonBody<CommentBody>,
) -> Result<(axum::http::StatusCode, Json<ApprovalView>), ApiError> {
    let shown = state.engine.comment(&who, &id, &body.text).await?;
    record_run(&shown.approval);
    tracing::info!("commented");
    let mut view = ApprovalView::shown(shown, &state.engine, state.engine.now());
    with_tasks(&state.engine, &who.tenant, &mut [&mut view]).await;
    Ok((axum::http::StatusCode::CREATED, Json(view)))
}

/// `POST /approvals/{id}/decisions`: approve, edit (a lower amount) or reject one version.
pub(super) async fn decide(
    State(state): State<DecideState>,
    Caller(who): Caller,
    IdPath(id): IdPath<ApprovalId>,
    JsonBody(mut body): JsonBody<DecisionBody>,
) -> Result<Json<DecisionReport>, ApiError> {
    let snapshot = body.snapshot.take();
    let request = body.into_request()?;
    let report = state
        .engine
        .decide_shown(&who, &id, request, snapshot.as_deref())
        .await?;
    record_run(&report.approval);
    tracing::info!(
        choice = report.decision.choice.name(),
        replayed = report.replayed,
        "decision"
    );
    Ok(Json(report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::extract::parse_json;

    fn request(body: &str) -> Result<DecisionRequest, ApiError> {
        parse_json::<DecisionBody>(body.as_bytes())?.into_request()
    }

    #[test]
    fn a_list_takes_a_limit_within_its_bounds_and_a_cursor_only_where_it_pages() {
        let pending = |query| ListQuery::parse(query, 50, 200, true);
        let asked = pending("").unwrap();
        assert_eq!((asked.limit, asked.cursor), (50, None));
        let asked = pending("limit=2&cursor=abc").unwrap();
        assert_eq!((asked.limit, asked.cursor.as_deref()), (2, Some("abc")));
        for bad in ["limit=0", "limit=201", "limit=two", "limit=-1"] {
            assert_eq!(pending(bad).unwrap_err().code, "invalid_field", "{bad}");
        }
        assert_eq!(pending("sort=deadline").unwrap_err().code, "unknown_field");
        let decided = ListQuery::parse("cursor=abc", 20, 50, false).unwrap_err();
        assert_eq!(decided.code, "unknown_field");
        assert!(
            decided.message.contains("it takes limit"),
            "{}",
            decided.message
        );
    }

    #[test]
    fn an_edit_takes_dollars_as_a_string() {
        let edit = request(
            r#"{"decision_id": "d1", "action_version": 1, "choice": "edit", "amount": "200.00", "note": "one night"}"#,
        )
        .unwrap();
        assert_eq!(
            edit.choice,
            Choice::Edit {
                amount: Amount::from_dollars(200),
                note: Some("one night".into())
            }
        );
    }

    #[test]
    fn an_amount_as_a_number_is_refused() {
        for amount in ["200", "200.5", "\"20o\"", "\"-5\""] {
            let body = format!(
                r#"{{"decision_id": "d1", "action_version": 1, "choice": "edit", "amount": {amount}}}"#
            );
            assert_eq!(request(&body).unwrap_err().code, "bad_amount", "{amount}");
        }
    }

    #[test]
    fn fields_that_do_not_go_with_the_choice_are_refused() {
        let approve_with_amount =
            r#"{"decision_id": "d1", "action_version": 1, "choice": "approve", "amount": "1"}"#;
        assert_eq!(
            request(approve_with_amount).unwrap_err().code,
            "invalid_field"
        );
        let reject_without_reason =
            r#"{"decision_id": "d1", "action_version": 1, "choice": "reject"}"#;
        assert_eq!(
            request(reject_without_reason).unwrap_err().code,
            "missing_field"
        );
        let edit_without_amount = r#"{"decision_id": "d1", "action_version": 1, "choice": "edit"}"#;
        assert_eq!(
            request(edit_without_amount).unwrap_err().code,
            "missing_field"
        );
    }

    #[test]
    fn a_body_cannot_name_the_decider() {
        let by = r#"{"decision_id": "d1", "action_version": 1, "choice": "approve", "by": "dana"}"#;
        assert_eq!(request(by).unwrap_err().code, "unknown_field");
    }

    #[test]
    fn bad_ids_versions_and_choices_are_invalid_fields() {
        for body in [
            r#"{"decision_id": "d 1", "action_version": 1, "choice": "approve"}"#,
            r#"{"decision_id": "d1", "action_version": 0, "choice": "approve"}"#,
            r#"{"decision_id": "d1", "action_version": 1, "choice": "maybe"}"#,
        ] {
            assert_eq!(request(body).unwrap_err().code, "invalid_field", "{body}");
        }
    }
}
