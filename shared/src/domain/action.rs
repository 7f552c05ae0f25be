//! One immutable version of a proposed tool call, and its way from proposal to outcome.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::args::{Args, ArgsHash};
use super::budget;
use super::conversation::{McpResult, ToolResultText};
use super::identity::Actor;
use super::ids::{
    ActionId, ActionVersion, AgentName, ApprovalId, RunId, TenantId, idempotency_key,
};
use super::log_slot::LogSlot;
use super::names::shown_by_serde_name;
use super::policy::LogOnly;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionStatus {
    AwaitingApproval,
    Approved,
    Executing,
    Succeeded,
    Failed,
    /// The call may have committed remotely: reconciled through the tool, never retried blindly.
    Unknown,
    Rejected,
    Expired,
    Superseded,
    Cancelled,
}

shown_by_serde_name!(ActionStatus);

/// What a tool reported for one call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ToolOutcome {
    Succeeded {
        result: Value,
    },
    Failed {
        error: String,
    },
    /// The tool cannot say whether the call took effect (a timeout after sending, say).
    Unknown {
        detail: String,
    },
    /// An MCP server's result as it gave it: failed when it says `isError`, else succeeded.
    /// Its content blocks and structured content are kept beside the text the model reads.
    Mcp {
        content: Vec<Value>,
        structured_content: Option<Value>,
        is_error: bool,
    },
}

impl ToolOutcome {
    /// What a call that ran becomes when its outcome could not be stored: unknown, for
    /// reconciliation to settle, with the store's reason.
    pub fn unstored(error: impl std::fmt::Display) -> Self {
        ToolOutcome::Unknown {
            detail: format!("the tool answered, but its outcome could not be stored: {error}"),
        }
    }

    pub fn is_unknown(&self) -> bool {
        matches!(self, ToolOutcome::Unknown { .. })
    }
}

/// Why a proposed call did not run, as the model reads it: a plain answer, never an error to
/// work around. The one place these words are written, and read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotExecuted<'a> {
    /// More calls in one turn than the agent's limit.
    OverTurnLimit {
        limit: usize,
    },
    /// The arguments are not a JSON object the engine can hash.
    BadArguments {
        why: &'a str,
    },
    Denied {
        reason: &'a str,
    },
    Rejected {
        by: &'a str,
        reason: &'a str,
    },
    Expired {
        deadline: &'a str,
    },
    Cancelled {
        by: &'a str,
    },
    /// Its requester already has as many approvals waiting as one may: nobody was asked.
    NotProposed {
        requester: &'a str,
        limit: u32,
    },
}

impl NotExecuted<'_> {
    pub const PREFIX: &'static str = "Not executed: ";
    pub const DO_NOT_RETRY: &'static str = " Do not retry it.";

    /// What the model is told.
    pub fn told(&self) -> String {
        let (why, final_word) = match self {
            NotExecuted::OverTurnLimit { limit } => {
                (format!("at most {limit} calls per turn."), false)
            }
            NotExecuted::BadArguments { why } => (sentence(why), false),
            NotExecuted::Denied { reason } => {
                (format!("policy denies this call ({reason})."), true)
            }
            NotExecuted::Rejected { by, reason } => (
                sentence(&format!("{by} rejected this call: {reason}")),
                true,
            ),
            NotExecuted::Expired { deadline } => (
                format!(
                    "nobody decided before the deadline ({deadline}), so the approval expired."
                ),
                true,
            ),
            NotExecuted::Cancelled { by } => (format!("{by} cancelled the run."), false),
            NotExecuted::NotProposed { requester, limit } => (
                format!(
                    "not proposed: too many open approvals ({requester} has {limit} waiting for \
                     a person, the most one requester may). Propose it again once reviewers \
                     have decided some of them."
                ),
                false,
            ),
        };
        let tail = if final_word { Self::DO_NOT_RETRY } else { "" };
        format!("{}{why}{tail}", Self::PREFIX)
    }

    /// The reason inside a told text, without its framing; `None` if the call ran.
    pub fn reason_in(told: &str) -> Option<&str> {
        let why = told.strip_prefix(Self::PREFIX)?;
        Some(
            why.trim_end_matches(Self::DO_NOT_RETRY)
                .trim_end_matches('.'),
        )
    }
}

/// `text` ending in one full stop, whether or not a person's words already had one.
fn sentence(text: &str) -> String {
    let text = text.trim_end();
    match text.ends_with(['.', '!', '?']) {
        true => text.to_string(),
        false => format!("{text}."),
    }
}

/// A transition the state machine does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("action {action}:{version} is {from}, so it cannot become {to}")]
pub struct InvalidTransition {
    pub action: ActionId,
    pub version: ActionVersion,
    pub from: ActionStatus,
    pub to: ActionStatus,
}

/// The facts of one proposed call version.
#[derive(Debug, Clone)]
pub struct ProposedCall {
    /// The agent that proposes it: the hash binds a decision to it.
    pub agent: AgentName,
    pub id: ActionId,
    pub version: ActionVersion,
    pub tenant: TenantId,
    pub run_id: RunId,
    pub tool_use_id: String,
    pub tool: String,
    pub args: Args,
    pub explanation: String,
    /// The policy rules that decided it, by name.
    pub rules: Vec<String>,
    /// What the policy's log-only rules would have made of it, where it has some.
    pub log_only: Option<LogOnly>,
}

impl ProposedCall {
    /// What a decision on this call is bound to, with its version: agent, tool and arguments.
    pub fn hash(&self) -> ArgsHash {
        ArgsHash::of_call(&self.agent, &self.tool, &self.args)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Action {
    pub id: ActionId,
    pub version: ActionVersion,
    pub tenant: TenantId,
    pub run_id: RunId,
    /// The model's id for the call, so the result goes back to the right place.
    pub tool_use_id: String,
    pub tool: String,
    pub args: Args,
    pub args_hash: ArgsHash,
    /// What the agent said about this call when it proposed it.
    pub explanation: String,
    /// The policy rules that decided this version, by name: why it ran, waited or was refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    /// What the policy's log-only rules would have made of it, where it has some: recorded,
    /// never acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_only: Option<LogOnly>,
    pub status: ActionStatus,
    /// Who let it run: a policy version, or the people who approved this exact version.
    #[serde(default)]
    pub authorized_by: Vec<Actor>,
    pub approval_id: Option<ApprovalId>,
    /// What the model will be told about this call, once there is something to tell.
    pub result: Option<ToolResultText>,
    pub proposed_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The claim that let this version run, once it was claimed: the action's item holds the
    /// `executing` event, written once by the claim and carried unchanged by every later write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed: Option<Claimed>,
}

/// Who claimed an approved version to run (`approved → executing`), when, and where that
/// `executing` event sits in the run's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claimed {
    pub at: DateTime<Utc>,
    pub by: Actor,
    pub logged: LogSlot,
    /// A call its caller runs: which of the caller's workers claimed it, and until when its
    /// outcome is awaited before it is taken as unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_caller: Option<CallerClaim>,
}

/// A claim of a call its caller runs itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerClaim {
    pub claimant: String,
    pub lease_expires_at: DateTime<Utc>,
}

impl Action {
    /// A new version as the agent (or an edit) proposes it, before policy or people decide.
    pub fn propose(call: ProposedCall, now: DateTime<Utc>) -> Self {
        let args_hash = call.hash();
        Self {
            id: call.id,
            version: call.version,
            tenant: call.tenant,
            run_id: call.run_id,
            tool_use_id: call.tool_use_id,
            tool: call.tool,
            args: call.args,
            args_hash,
            explanation: call.explanation,
            rules: call.rules,
            log_only: call.log_only,
            status: ActionStatus::AwaitingApproval,
            authorized_by: Vec::new(),
            approval_id: None,
            result: None,
            proposed_at: now,
            updated_at: now,
            claimed: None,
        }
    }

    pub fn key(&self) -> String {
        idempotency_key(&self.id, self.version)
    }

    /// Whether the stored arguments are still the ones its hash was made of, for `agent`.
    pub fn intact(&self, agent: &AgentName) -> bool {
        self.args_hash.binds(agent, &self.tool, &self.args)
    }

    fn to(
        &mut self,
        allowed_from: &[ActionStatus],
        to: ActionStatus,
        now: DateTime<Utc>,
    ) -> Result<(), InvalidTransition> {
        if !allowed_from.contains(&self.status) {
            return Err(InvalidTransition {
                action: self.id.clone(),
                version: self.version,
                from: self.status,
                to,
            });
        }
        self.status = to;
        self.updated_at = now;
        Ok(())
    }

    pub fn approve(&mut self, by: Vec<Actor>, now: DateTime<Utc>) -> Result<(), InvalidTransition> {
        self.to(
            &[ActionStatus::AwaitingApproval],
            ActionStatus::Approved,
            now,
        )?;
        self.authorized_by = by;
        Ok(())
    }

    /// `approved → executing`: only the process that makes this transition runs the tool.
    /// `logged` is where its `executing` event sits in the run's log.
    pub fn claim(
        &mut self,
        now: DateTime<Utc>,
        by: Actor,
        logged: LogSlot,
    ) -> Result<(), InvalidTransition> {
        self.to(&[ActionStatus::Approved], ActionStatus::Executing, now)?;
        self.claimed = Some(Claimed {
            at: now,
            by,
            logged,
            by_caller: None,
        });
        Ok(())
    }

    /// `approved → executing` for a call its caller runs: `claimant` of the caller's process
    /// runs it and reports its outcome before `lease_expires_at`.
    pub fn claim_for_caller(
        &mut self,
        now: DateTime<Utc>,
        by: Actor,
        logged: LogSlot,
        claim: CallerClaim,
    ) -> Result<(), InvalidTransition> {
        self.claim(now, by, logged)?;
        if let Some(claimed) = &mut self.claimed {
            claimed.by_caller = Some(claim);
        }
        Ok(())
    }

    /// The caller's claim, if a caller claimed this version.
    pub fn caller_claim(&self) -> Option<&CallerClaim> {
        self.claimed.as_ref()?.by_caller.as_ref()
    }

    /// Whether recording `outcome` would leave this settled action as it is: a report of the
    /// same outcome again.
    pub fn already_records(&self, outcome: &ToolOutcome) -> bool {
        let (status, result) = recorded(outcome);
        self.status == status && self.result.as_ref() == Some(&result)
    }

    pub fn record(
        &mut self,
        outcome: &ToolOutcome,
        now: DateTime<Utc>,
    ) -> Result<(), InvalidTransition> {
        let (to, result) = recorded(outcome);
        // An unknown outcome is settled only by reconciliation, which may say succeeded or failed.
        let from: &[ActionStatus] = match to {
            ActionStatus::Unknown => &[ActionStatus::Executing],
            _ => &[ActionStatus::Executing, ActionStatus::Unknown],
        };
        self.to(from, to, now)?;
        self.result = Some(result);
        Ok(())
    }

    /// Ends an action that will never run, with the plain answer the model will read.
    pub fn close(
        &mut self,
        to: ActionStatus,
        told: String,
        now: DateTime<Utc>,
    ) -> Result<(), InvalidTransition> {
        debug_assert!(matches!(
            to,
            ActionStatus::Rejected
                | ActionStatus::Expired
                | ActionStatus::Superseded
                | ActionStatus::Cancelled
        ));
        self.to(&[ActionStatus::AwaitingApproval], to, now)?;
        if to != ActionStatus::Superseded {
            self.result = Some(ToolResultText::ok(told));
        }
        Ok(())
    }

    /// Settled: nothing more will happen to this version.
    pub fn is_settled(&self) -> bool {
        matches!(
            self.status,
            ActionStatus::Succeeded
                | ActionStatus::Failed
                | ActionStatus::Rejected
                | ActionStatus::Expired
                | ActionStatus::Superseded
                | ActionStatus::Cancelled
        )
    }
}

/// The status and told result an outcome is recorded as.
fn recorded(outcome: &ToolOutcome) -> (ActionStatus, ToolResultText) {
    match outcome {
        ToolOutcome::Succeeded { result } => (
            ActionStatus::Succeeded,
            ToolResultText::ok(kept(result_text(result))),
        ),
        ToolOutcome::Failed { error } => (
            ActionStatus::Failed,
            ToolResultText::error(kept(failed(error))),
        ),
        ToolOutcome::Unknown { .. } => (ActionStatus::Unknown, ToolResultText::error(UNKNOWN_TEXT)),
        ToolOutcome::Mcp {
            content,
            structured_content,
            is_error,
        } => {
            let text = McpResult::text_of(content, structured_content.as_ref());
            let (status, text) = match is_error {
                false => (ActionStatus::Succeeded, text),
                true if text.trim().is_empty() => (
                    ActionStatus::Failed,
                    failed("the tool reported an error and said nothing more"),
                ),
                true => (ActionStatus::Failed, failed(&text)),
            };
            // One plain text block that is the text itself is not kept twice.
            let plain = matches!(content.as_slice(), [block] if *block == json!({"type": "text", "text": text}));
            let mcp = McpResult {
                content: (!plain).then(|| content.clone()),
                structured_content: structured_content.clone(),
            };
            let (content, mcp) = budget::fit_result(text, mcp);
            let told = ToolResultText {
                content,
                is_error: *is_error,
                mcp,
            };
            (status, told)
        }
    }
}

/// What the model is told of a call the tool refused.
fn failed(error: &str) -> String {
    format!("The call failed: {error}")
}

pub const UNKNOWN_TEXT: &str = "The outcome of this call is unknown: it may have taken effect. It will be reconciled; do not retry it.";

/// A result as stored and told to the model: within its share, else cut with a note of what
/// was cut, how long the whole was and its hash ([`budget::cut`]).
pub fn kept(text: String) -> String {
    budget::cut(&text, budget::RESULT, "result").unwrap_or(text)
}

fn result_text(result: &Value) -> String {
    match result {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// The call the domain's unit tests propose: reimburse claim c-102, USD 250, for acme.
    pub(crate) fn proposed_call(explanation: &str) -> ProposedCall {
        ProposedCall {
            agent: AgentName::parse("expense").unwrap(),
            id: ActionId::parse("act-1").unwrap(),
            version: ActionVersion::FIRST,
            tenant: TenantId::parse("acme").unwrap(),
            run_id: RunId::parse("run-1").unwrap(),
            tool_use_id: "toolu_1".into(),
            tool: "reimburse".into(),
            args: Args::new(json!({"claim_id": "c-102", "amount_cents": 25000})).unwrap(),
            explanation: explanation.into(),
            rules: Vec::new(),
            log_only: None,
        }
    }

    fn action() -> Action {
        Action::propose(proposed_call("capped at the limit"), Utc::now())
    }

    #[test]
    fn the_hash_is_taken_at_proposal() {
        let a = action();
        assert!(a.intact(&AgentName::parse("expense").unwrap()));
        assert_eq!(a.key(), "act-1:1");
    }

    #[test]
    fn only_an_approved_action_can_be_claimed_and_only_once() {
        let mut a = action();
        assert!(
            a.claim(Utc::now(), Actor::Agent, LogSlot::new("0", 0))
                .is_err(),
            "awaiting approval must not run"
        );
        a.approve(vec![Actor::Agent], Utc::now()).unwrap();
        a.claim(Utc::now(), Actor::Agent, LogSlot::new("0", 0))
            .unwrap();
        let again = a
            .claim(Utc::now(), Actor::Agent, LogSlot::new("0", 0))
            .unwrap_err();
        assert_eq!(again.from, ActionStatus::Executing);
    }

    #[test]
    fn an_unknown_outcome_is_settled_only_by_a_definite_one() {
        let mut a = action();
        a.approve(vec![], Utc::now()).unwrap();
        a.claim(Utc::now(), Actor::Agent, LogSlot::new("0", 0))
            .unwrap();
        a.record(
            &ToolOutcome::Unknown {
                detail: "timeout".into(),
            },
            Utc::now(),
        )
        .unwrap();
        assert_eq!(a.status, ActionStatus::Unknown);
        assert!(!a.is_settled());
        assert!(
            a.claim(Utc::now(), Actor::Agent, LogSlot::new("0", 0))
                .is_err(),
            "unknown is never claimed again"
        );
        assert!(
            a.record(
                &ToolOutcome::Unknown {
                    detail: "still".into()
                },
                Utc::now()
            )
            .is_err()
        );
        a.record(
            &ToolOutcome::Succeeded {
                result: json!({"paid": true}),
            },
            Utc::now(),
        )
        .unwrap();
        assert_eq!(a.status, ActionStatus::Succeeded);
        assert_eq!(a.result.unwrap().content, r#"{"paid":true}"#);
    }

    #[test]
    fn closing_tells_the_model_in_plain_words_not_as_an_error() {
        let mut a = action();
        a.close(
            ActionStatus::Rejected,
            "rejected by erin".into(),
            Utc::now(),
        )
        .unwrap();
        let told = a.result.clone().unwrap();
        assert!(!told.is_error);
        assert_eq!(told.content, "rejected by erin");
        assert!(
            a.close(ActionStatus::Expired, "x".into(), Utc::now())
                .is_err()
        );
        assert!(a.approve(vec![], Utc::now()).is_err());
    }

    #[test]
    fn a_reason_with_its_own_full_stop_is_told_with_one() {
        let told = |reason: &str| NotExecuted::Rejected { by: "mia", reason }.told();
        let expected =
            "Not executed: mia rejected this call: Retention team calls first. Do not retry it.";
        assert_eq!(told("Retention team calls first."), expected);
        assert_eq!(told("Retention team calls first"), expected);
        assert_eq!(
            told("Why now?"),
            "Not executed: mia rejected this call: Why now? Do not retry it."
        );
        assert_eq!(
            NotExecuted::reason_in(expected),
            Some("mia rejected this call: Retention team calls first")
        );
    }

    #[test]
    fn an_action_status_reads_as_its_record_stores_it() {
        assert_eq!(ActionStatus::AwaitingApproval.as_str(), "awaiting_approval");
        assert_eq!(ActionStatus::Executing.to_string(), "executing");
    }

    fn mcp(content: Vec<Value>, structured: Option<Value>, is_error: bool) -> ToolOutcome {
        ToolOutcome::Mcp {
            content,
            structured_content: structured,
            is_error,
        }
    }

    fn text(text: &str) -> Value {
        json!({"type": "text", "text": text})
    }

    #[test]
    fn an_mcp_text_result_is_told_as_its_text_and_kept_once() {
        let (status, told) = recorded(&mcp(vec![text("Ship on Friday.")], None, false));

        assert_eq!(status, ActionStatus::Succeeded);
        assert_eq!(told, ToolResultText::ok("Ship on Friday."));
    }

    #[test]
    fn an_mcp_result_keeps_its_blocks_and_structured_content_beside_the_text_the_model_reads() {
        let image = json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"});
        let blocks = vec![text("The chart:"), image.clone()];

        let (status, told) = recorded(&mcp(blocks.clone(), Some(json!({"points": 3})), false));
        let (_, structured_only) = recorded(&mcp(vec![], Some(json!({"points": 3})), false));

        assert_eq!(status, ActionStatus::Succeeded);
        assert_eq!(told.content, "The chart:\n[image: image/png, 8 bytes]");
        assert!(!told.is_error);
        assert_eq!(
            told.mcp,
            Some(McpResult {
                content: Some(blocks),
                structured_content: Some(json!({"points": 3})),
            })
        );
        assert_eq!(structured_only.content, r#"{"points":3}"#);
    }

    #[test]
    fn an_mcp_error_result_is_failed_told_as_such_and_keeps_its_blocks_as_given() {
        let (status, told) = recorded(&mcp(vec![text("order is closed")], None, true));
        let (_, silent) = recorded(&mcp(vec![], None, true));

        assert_eq!(status, ActionStatus::Failed);
        assert_eq!(told.content, "The call failed: order is closed");
        assert!(told.is_error);
        assert_eq!(
            told.mcp.unwrap().content,
            Some(vec![text("order is closed")])
        );
        assert_eq!(
            silent.content,
            "The call failed: the tool reported an error and said nothing more"
        );
    }

    #[test]
    fn an_mcp_result_too_large_to_store_keeps_its_text_and_says_what_was_left_out() {
        let data = "A".repeat(40 * 1024);
        let image = json!({"type": "image", "data": data, "mimeType": "image/png"});
        let long = "x".repeat(20 * 1024);

        let (_, picture) = recorded(&mcp(vec![image], Some(json!({"id": 7})), false));
        let (_, document) = recorded(&mcp(
            vec![text(&long), text("end")],
            Some(json!({"content": long})),
            false,
        ));

        assert_eq!(
            picture.content,
            "[image: image/png, 30 KiB]\n[Countersign kept the text of this result and left out \
             its content blocks (40.0 KiB): a stored result is at most 32 KiB.]"
        );
        assert_eq!(
            picture.mcp,
            Some(McpResult {
                content: None,
                structured_content: Some(json!({"id": 7})),
            })
        );
        assert!(document.content.starts_with(&long));
        assert!(
            document.content.ends_with(
                "left out its content blocks (20.1 KiB) and its structured content (20.0 KiB): a \
                 stored result is at most 32 KiB.]"
            ),
            "{}",
            &document.content[long.len()..]
        );
        assert_eq!(document.mcp, None);
        let whole = serde_json::to_string(&document).unwrap();
        assert!(whole.len() <= budget::RESULT + 100, "{}", whole.len());
    }
}
