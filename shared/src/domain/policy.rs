//! Policy is data: a versioned file says, per tool, whether a person must decide, why, who, how
//! many, for how long, and what a reviewer may change.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::args::Args;
use super::ids::Role;
use super::money::Amount;

/// What a tool says about itself: an MCP server's `readOnlyHint` and `destructiveHint`
/// annotations, read once when the tool is listed. Policy may match them, after rules by name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolHints {
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub destructive: bool,
}

/// What policy says about one proposed call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    Deny { reason: String },
    RequireApproval(Requirement),
}

/// The terms on which a person must decide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirement {
    pub reason: String,
    pub approver_role: Role,
    pub quorum: u8,
    #[serde(with = "duration_as_secs")]
    pub ttl: Duration,
    /// Whom the approval goes to as well when nobody decided it in time, step by step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalate: Vec<Escalation>,
}

/// One step of escalation: an approval nobody decided `after` its opening goes to the role
/// `to` as well; people of either role may then decide it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Escalation {
    #[serde(with = "duration_as_secs")]
    pub after: Duration,
    pub to: Role,
}

/// Escalation steps one rule may have at most.
pub const MAX_ESCALATIONS: usize = 5;

/// A parsed, checked policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub name: String,
    pub version: u32,
    pub default_ttl: Duration,
    /// The longest time to decide a caller may ask for when starting a run: a caller may
    /// shorten the policy's time to decide, never lengthen it past this. `max_ttl` in the file,
    /// or else the longest time to decide of any rule.
    pub max_ttl: Duration,
    pub tools: BTreeMap<String, ToolRule>,
    /// Rules for tools the policy does not name, by what the tool says of itself: a tool that
    /// hints it is destructive gets `destructive`, one that hints it only reads gets `read_only`.
    pub hints: HintRules,
    /// Facts the agent and the tools may read (the expense limits); the engine does not.
    pub context: Value,
}

/// Rules matched by a tool's hints, for tools the policy does not name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HintRules {
    pub read_only: Option<ToolRule>,
    pub destructive: Option<ToolRule>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolRule {
    Allow,
    Deny {
        reason: String,
    },
    Approve {
        gate: Gate,
        approver_role: Role,
        ttl: Option<Duration>,
        editable: BTreeMap<String, EditDirection>,
        escalate: Vec<Escalation>,
    },
}

/// When a person must decide.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    Always {
        quorum: u8,
        reason: String,
    },
    /// Above the lowest threshold a person decides; the highest threshold passed sets quorum and reason.
    AboveAmount {
        field: String,
        thresholds: Vec<Threshold>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Threshold {
    #[serde(deserialize_with = "amount_from_text")]
    pub above: Amount,
    pub quorum: u8,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EditDirection {
    /// The new value must be a smaller number: amounts only ever go down.
    Lower,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the policy is not valid: {0}")]
pub struct PolicyError(String);

/// Why a reviewer's edit is refused by policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditRefusal {
    #[error("{tool} has no amount a reviewer may edit")]
    NotEditable { tool: String },
    #[error("an edit may only lower the amount: {new} is not below {old}")]
    NotLower { old: Amount, new: Amount },
    #[error("an edit may not lower the amount to zero; reject the call instead")]
    ToZero,
}

const MAX_QUORUM: u8 = 10;

/// The longest reason a rule may give, in bytes.
pub const MAX_REASON: usize = 1_000;

/// The longest time to decide an approval may have. Deadlines stay well inside what a timestamp
/// can hold, and an approval nobody decides for a quarter is not a pending approval.
pub const MAX_TTL: Duration = Duration::from_secs(90 * 24 * 60 * 60);

impl Policy {
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        let raw: RawPolicy =
            super::toml_text::from_str(text).map_err(|e| PolicyError(e.to_string()))?;
        raw.check()
    }

    /// Decides what happens to one proposed call of a tool that hints nothing.
    pub fn evaluate(&self, tool: &str, args: &Args) -> Verdict {
        self.evaluate_with(tool, ToolHints::default(), args)
    }

    /// The rule for a tool: its own by name; else, by its hints, the destructive rule before
    /// the read-only one (a tool that says both is treated as destructive); else none.
    pub fn rule_for(&self, tool: &str, hints: ToolHints) -> Option<&ToolRule> {
        self.tools.get(tool).or_else(|| {
            let destructive = hints.destructive.then_some(&self.hints.destructive);
            let read_only =
                (hints.read_only && !hints.destructive).then_some(&self.hints.read_only);
            destructive.or(read_only).and_then(Option::as_ref)
        })
    }

    /// Decides what happens to one proposed call. A tool no rule matches is denied.
    pub fn evaluate_with(&self, tool: &str, hints: ToolHints, args: &Args) -> Verdict {
        let Some(rule) = self.rule_for(tool, hints) else {
            return Verdict::Deny {
                reason: format!("policy v{} has no rule for the tool {tool}", self.version),
            };
        };
        match rule {
            ToolRule::Allow => Verdict::Allow,
            ToolRule::Deny { reason } => Verdict::Deny {
                reason: reason.clone(),
            },
            ToolRule::Approve {
                gate,
                approver_role,
                ttl,
                escalate,
                ..
            } => {
                let require = |quorum: u8, reason: &str| {
                    Verdict::RequireApproval(Requirement {
                        reason: reason.to_string(),
                        approver_role: approver_role.clone(),
                        quorum,
                        ttl: ttl.unwrap_or(self.default_ttl),
                        escalate: escalate.clone(),
                    })
                };
                match gate {
                    Gate::Always { quorum, reason } => require(*quorum, reason),
                    Gate::AboveAmount { field, thresholds } => {
                        let Some(amount) = args.int(field).and_then(|c| Amount::from_cents(c).ok())
                        else {
                            return Verdict::Deny {
                                reason: format!("{tool} needs {field} as a whole number of cents"),
                            };
                        };
                        match thresholds.iter().rev().find(|t| amount > t.above) {
                            Some(t) => require(t.quorum, &t.reason),
                            None => Verdict::Allow,
                        }
                    }
                }
            }
        }
    }

    /// Checks the amount this policy reads of `tool`'s calls against the tool's input schema,
    /// so a rule cannot load and then deny every call: the field a gate compares (and the only
    /// one a reviewer may edit) must be a required integer argument. On a mismatch, the policy
    /// file's field and what is wrong.
    pub fn check_fields(&self, tool: &str, schema: &Value) -> Result<(), (String, String)> {
        let Some(ToolRule::Approve {
            gate: Gate::AboveAmount { field, .. },
            ..
        }) = self.tools.get(tool)
        else {
            return Ok(());
        };
        let at = format!("tools.{tool}.amount_field");
        let Some(property) = schema["properties"].get(field) else {
            return Err((at, format!("{field} is not one of {tool}'s arguments")));
        };
        if property["type"] != "integer" {
            return Err((
                at,
                format!("{tool}'s argument {field} must have type \"integer\" (whole cents)"),
            ));
        }
        let required = schema["required"].as_array();
        if !required.is_some_and(|r| r.iter().any(|name| name == field.as_str())) {
            return Err((
                at,
                format!("{tool}'s input schema must list {field} under required"),
            ));
        }
        Ok(())
    }

    /// Whether a caller may ask for this time to decide when starting a run.
    pub fn check_ttl(&self, ttl: Duration) -> Result<(), String> {
        if ttl > self.max_ttl {
            return Err(format!(
                "a time to decide of {} is longer than the {} policy v{} allows ({})",
                humantime::format_duration(ttl),
                self.name,
                self.version,
                humantime::format_duration(self.max_ttl)
            ));
        }
        Ok(())
    }

    /// The field that carries a tool's amount, if policy gates it by amount.
    pub fn amount_field(&self, tool: &str) -> Option<&str> {
        match self.tools.get(tool)? {
            ToolRule::Approve {
                gate: Gate::AboveAmount { field, .. },
                ..
            } => Some(field),
            _ => None,
        }
    }

    /// The amount field a reviewer may lower with an edit, if policy lets them edit this tool.
    pub fn lowerable_field(&self, tool: &str) -> Option<&str> {
        let field = self.amount_field(tool)?;
        let Some(ToolRule::Approve { editable, .. }) = self.tools.get(tool) else {
            return None;
        };
        (editable.get(field) == Some(&EditDirection::Lower)).then_some(field)
    }

    /// Applies a reviewer's new amount to a call's arguments, if policy lets them.
    pub fn edit_amount(&self, tool: &str, args: &Args, new: Amount) -> Result<Args, EditRefusal> {
        let not_editable = || EditRefusal::NotEditable {
            tool: tool.to_string(),
        };
        let Some(ToolRule::Approve { editable, .. }) = self.tools.get(tool) else {
            return Err(not_editable());
        };
        let field = self.amount_field(tool).ok_or_else(not_editable)?;
        let Some(EditDirection::Lower) = editable.get(field) else {
            return Err(not_editable());
        };
        let old = args
            .int(field)
            .and_then(|c| Amount::from_cents(c).ok())
            .ok_or_else(not_editable)?;
        if new == Amount::ZERO {
            return Err(EditRefusal::ToZero);
        }
        if new >= old {
            return Err(EditRefusal::NotLower { old, new });
        }
        Ok(args.with(field, Value::from(new.cents())))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    name: String,
    version: u32,
    default_ttl: String,
    max_ttl: Option<String>,
    #[serde(default)]
    tools: BTreeMap<String, RawRule>,
    #[serde(default)]
    hints: RawHints,
    context: Option<toml::Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHints {
    read_only: Option<RawRule>,
    destructive: Option<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    decision: RawDecision,
    reason: Option<String>,
    approver_role: Option<Role>,
    quorum: Option<u8>,
    amount_field: Option<String>,
    #[serde(default)]
    thresholds: Vec<Threshold>,
    ttl: Option<String>,
    #[serde(default)]
    editable: BTreeMap<String, EditDirection>,
    #[serde(default)]
    escalate: Vec<RawEscalation>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEscalation {
    after: String,
    to: Role,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum RawDecision {
    Allow,
    Deny,
    Approve,
}

fn parse_ttl(text: &str, what: &str) -> Result<Duration, PolicyError> {
    let ttl = humantime::parse_duration(text)
        .map_err(|e| PolicyError(format!("{what} {text:?}: {e}")))?;
    if ttl > MAX_TTL {
        return Err(PolicyError(format!(
            "{what} {text:?} is longer than 90 days, the longest time to decide"
        )));
    }
    Ok(ttl)
}

impl RawPolicy {
    fn check(self) -> Result<Policy, PolicyError> {
        if self.version == 0 {
            return Err(PolicyError("version starts at 1".into()));
        }
        let default_ttl = parse_ttl(&self.default_ttl, "default_ttl")?;
        let mut tools = BTreeMap::new();
        for (tool, raw) in self.tools {
            let rule = raw
                .check()
                .map_err(|PolicyError(why)| PolicyError(format!("tools.{tool}: {why}")))?;
            tools.insert(tool, rule);
        }
        let hint = |raw: Option<RawRule>, name: &str| {
            raw.map(|raw| {
                raw.check()
                    .map_err(|PolicyError(why)| PolicyError(format!("hints.{name}: {why}")))
            })
            .transpose()
        };
        let hints = HintRules {
            read_only: hint(self.hints.read_only, "read_only")?,
            destructive: hint(self.hints.destructive, "destructive")?,
        };
        let longest_rule = tools
            .values()
            .chain(hints.read_only.iter())
            .chain(hints.destructive.iter())
            .filter_map(|rule| match rule {
                ToolRule::Approve { ttl, .. } => Some(ttl.unwrap_or(default_ttl)),
                _ => None,
            })
            .fold(default_ttl, Duration::max);
        let max_ttl = match self.max_ttl.as_deref() {
            Some(text) => {
                let max_ttl = parse_ttl(text, "max_ttl")?;
                if longest_rule > max_ttl {
                    return Err(PolicyError(format!(
                        "max_ttl {text:?} is shorter than a rule's time to decide"
                    )));
                }
                max_ttl
            }
            None => longest_rule,
        };
        let context = match self.context {
            Some(value) => serde_json::to_value(value).map_err(|e| PolicyError(e.to_string()))?,
            None => Value::Null,
        };
        Ok(Policy {
            name: self.name,
            version: self.version,
            default_ttl,
            max_ttl,
            tools,
            hints,
            context,
        })
    }
}

impl RawRule {
    fn check(self) -> Result<ToolRule, PolicyError> {
        let fail = |why: &str| Err(PolicyError(why.to_string()));
        // A reason is stored with every approval and audit event it explains.
        let reasons = self
            .reason
            .iter()
            .chain(self.thresholds.iter().map(|t| &t.reason));
        if reasons.into_iter().any(|r| r.len() > MAX_REASON) {
            return Err(PolicyError(format!(
                "a reason has at most {MAX_REASON} bytes: a sentence the reviewer reads"
            )));
        }
        let approve_only = self.approver_role.is_some()
            || self.quorum.is_some()
            || self.amount_field.is_some()
            || !self.thresholds.is_empty()
            || self.ttl.is_some()
            || !self.editable.is_empty()
            || !self.escalate.is_empty();
        match self.decision {
            RawDecision::Allow | RawDecision::Deny if approve_only => fail(
                "only decision = \"approve\" takes approver_role, quorum, amount_field, thresholds, ttl, editable or escalate",
            ),
            RawDecision::Allow if self.reason.is_some() => fail("allow takes no reason"),
            RawDecision::Allow => Ok(ToolRule::Allow),
            RawDecision::Deny => match self.reason {
                Some(reason) => Ok(ToolRule::Deny { reason }),
                None => fail("deny needs a reason"),
            },
            RawDecision::Approve => {
                let Some(approver_role) = self.approver_role else {
                    return fail("approve needs approver_role");
                };
                let ttl = self
                    .ttl
                    .as_deref()
                    .map(|t| parse_ttl(t, "ttl"))
                    .transpose()?;
                let gate = match (self.amount_field, self.quorum, self.reason) {
                    (Some(field), None, None) => {
                        if self.thresholds.is_empty() {
                            return fail("amount_field needs at least one threshold");
                        }
                        let ascending = self.thresholds.windows(2).all(|w| w[0].above < w[1].above);
                        if !ascending {
                            return fail("thresholds must rise");
                        }
                        if self
                            .thresholds
                            .iter()
                            .any(|t| !(1..=MAX_QUORUM).contains(&t.quorum))
                        {
                            return fail("a threshold's quorum must be between 1 and 10");
                        }
                        Gate::AboveAmount {
                            field,
                            thresholds: self.thresholds,
                        }
                    }
                    (None, Some(quorum), Some(reason)) if self.thresholds.is_empty() => {
                        if !(1..=MAX_QUORUM).contains(&quorum) {
                            return fail("quorum must be between 1 and 10");
                        }
                        Gate::Always { quorum, reason }
                    }
                    _ => {
                        return fail(
                            "approve takes either quorum and reason, or amount_field and thresholds",
                        );
                    }
                };
                if let Some(field) = self
                    .editable
                    .keys()
                    .find(|f| !matches!(&gate, Gate::AboveAmount { field: a, .. } if a == *f))
                {
                    return Err(PolicyError(format!(
                        "only the amount field can be editable, not {field}"
                    )));
                }
                let escalate = check_escalation(self.escalate, &approver_role)?;
                Ok(ToolRule::Approve {
                    gate,
                    approver_role,
                    ttl,
                    editable: self.editable,
                    escalate,
                })
            }
        }
    }
}

/// Steps later than the one before, each to a role not asked yet, at most five.
fn check_escalation(
    raw: Vec<RawEscalation>,
    approver_role: &Role,
) -> Result<Vec<Escalation>, PolicyError> {
    if raw.len() > MAX_ESCALATIONS {
        return Err(PolicyError(format!(
            "escalate has at most {MAX_ESCALATIONS} steps"
        )));
    }
    let mut steps: Vec<Escalation> = Vec::new();
    for step in raw {
        let after = parse_ttl(&step.after, "escalate after")?;
        if after.is_zero() {
            return Err(PolicyError("escalate after must be above zero".into()));
        }
        if steps.last().is_some_and(|last| last.after >= after) {
            return Err(PolicyError("escalate steps must come later each".into()));
        }
        if &step.to == approver_role || steps.iter().any(|s| s.to == step.to) {
            return Err(PolicyError(format!(
                "escalate to {} asks a role already asked",
                step.to
            )));
        }
        steps.push(Escalation { after, to: step.to });
    }
    Ok(steps)
}

fn amount_from_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Amount, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(serde::de::Error::custom)
}

/// Durations in stored records: whole seconds, so every adapter reads them the same way.
pub mod duration_as_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_secs(u64::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The expense policy, version 3, with a limit in its context.
    const POLICY: &str = include_str!("../../tests/fixtures/policies/expense-v3.toml");

    fn policy() -> Policy {
        Policy::from_toml(POLICY).unwrap()
    }

    fn reimburse(cents: i64) -> Args {
        Args::new(json!({"claim_id": "c-1", "amount_cents": cents})).unwrap()
    }

    fn quorum_of(verdict: Verdict) -> Option<u8> {
        match verdict {
            Verdict::RequireApproval(r) => Some(r.quorum),
            _ => None,
        }
    }

    #[test]
    fn amounts_up_to_the_first_threshold_are_allowed() {
        assert_eq!(
            policy().evaluate("reimburse", &reimburse(7_500)),
            Verdict::Allow
        );
        assert_eq!(
            policy().evaluate("reimburse", &reimburse(4_200)),
            Verdict::Allow
        );
    }

    #[test]
    fn above_75_needs_one_and_above_500_needs_two() {
        assert_eq!(
            quorum_of(policy().evaluate("reimburse", &reimburse(7_501))),
            Some(1)
        );
        assert_eq!(
            quorum_of(policy().evaluate("reimburse", &reimburse(50_000))),
            Some(1)
        );
        assert_eq!(
            quorum_of(policy().evaluate("reimburse", &reimburse(50_001))),
            Some(2)
        );
    }

    #[test]
    fn a_reason_longer_than_a_sentence_the_reviewer_reads_is_refused() {
        let rule = |reason: &str| {
            format!(
                "name = \"x\"\nversion = 1\ndefault_ttl = \"1h\"\n[tools.t]\ndecision = \"approve\"\napprover_role = \"f\"\nquorum = 1\nreason = \"{reason}\"\n"
            )
        };
        assert!(Policy::from_toml(&rule(&"r".repeat(MAX_REASON))).is_ok());
        let refused = Policy::from_toml(&rule(&"r".repeat(MAX_REASON + 1))).unwrap_err();
        assert!(
            refused.to_string().contains("at most 1000 bytes"),
            "{refused}"
        );
        let threshold = "name = \"x\"\nversion = 1\ndefault_ttl = \"1h\"\n[tools.t]\ndecision = \"approve\"\napprover_role = \"f\"\namount_field = \"a\"\n[[tools.t.thresholds]]\nabove = \"$1\"\nquorum = 1\nreason = \"REASON\"\n";
        let long = threshold.replace("REASON", &"r".repeat(MAX_REASON + 1));
        assert!(Policy::from_toml(&long).is_err());
    }

    #[test]
    fn the_requirement_carries_role_reason_and_ttl() {
        let Verdict::RequireApproval(r) = policy().evaluate("decline", &reimburse(1)) else {
            panic!()
        };
        assert_eq!(r.approver_role.as_str(), "finance");
        assert_eq!(r.reason, "every decline");
        assert_eq!(r.ttl, Duration::from_secs(7_200));
        let Verdict::RequireApproval(r) = policy().evaluate("reimburse", &reimburse(9_000)) else {
            panic!()
        };
        assert_eq!(r.ttl, Duration::from_secs(86_400));
    }

    #[test]
    fn unknown_tools_and_denied_tools_are_denied() {
        assert!(matches!(
            policy().evaluate("drop_table", &reimburse(1)),
            Verdict::Deny { .. }
        ));
        assert_eq!(
            policy().evaluate("wire_money", &reimburse(1)),
            Verdict::Deny {
                reason: "Agents never wire money.".into()
            }
        );
    }

    #[test]
    fn a_missing_or_fractional_amount_is_denied() {
        let args = Args::new(json!({"claim_id": "c-1", "amount_cents": 12.5})).unwrap();
        assert!(matches!(
            policy().evaluate("reimburse", &args),
            Verdict::Deny { .. }
        ));
        let args = Args::new(json!({"claim_id": "c-1"})).unwrap();
        assert!(matches!(
            policy().evaluate("reimburse", &args),
            Verdict::Deny { .. }
        ));
    }

    #[test]
    fn an_edit_may_only_lower_the_amount() {
        let p = policy();
        let edited = p
            .edit_amount("reimburse", &reimburse(25_000), Amount::from_dollars(200))
            .unwrap();
        assert_eq!(edited.int("amount_cents"), Some(20_000));
        assert_eq!(edited.str("claim_id"), Some("c-1"));
        let raise = p.edit_amount("reimburse", &reimburse(25_000), Amount::from_dollars(300));
        assert!(matches!(raise, Err(EditRefusal::NotLower { .. })));
        let same = p.edit_amount("reimburse", &reimburse(25_000), Amount::from_dollars(250));
        assert!(matches!(same, Err(EditRefusal::NotLower { .. })));
        let decline = p.edit_amount("decline", &reimburse(25_000), Amount::from_dollars(1));
        assert!(matches!(decline, Err(EditRefusal::NotEditable { .. })));
    }

    #[test]
    fn an_edit_may_not_lower_the_amount_to_zero() {
        let refused = policy()
            .edit_amount("reimburse", &reimburse(25_000), Amount::ZERO)
            .unwrap_err();
        assert_eq!(refused, EditRefusal::ToZero);
        assert!(refused.to_string().contains("reject"), "{refused}");
        let one_cent = Amount::from_cents(1).unwrap();
        let edited = policy().edit_amount("reimburse", &reimburse(25_000), one_cent);
        assert_eq!(edited.unwrap().int("amount_cents"), Some(1));
    }

    #[test]
    fn a_time_to_decide_above_90_days_is_refused() {
        let with = |default_ttl: &str, ttl: &str| {
            format!(
                "name = \"x\"\nversion = 1\ndefault_ttl = \"{default_ttl}\"\n[tools.t]\ndecision = \"approve\"\napprover_role = \"f\"\nquorum = 1\nreason = \"r\"\nttl = \"{ttl}\"\n"
            )
        };
        let longest = Policy::from_toml(&with("90days", "90days")).unwrap();
        assert_eq!(longest.default_ttl, MAX_TTL);
        for (default_ttl, ttl, named) in [
            ("91days", "1h", "default_ttl"),
            ("1h", "90days 1s", "ttl"),
            ("1h", "300000000years", "ttl"),
        ] {
            let err = Policy::from_toml(&with(default_ttl, ttl))
                .unwrap_err()
                .to_string();
            assert!(err.contains(named) && err.contains("90 days"), "{err}");
        }
    }

    #[test]
    fn a_caller_may_shorten_the_time_to_decide_but_not_lengthen_it() {
        let p = policy();
        assert_eq!(p.max_ttl, Duration::from_secs(86_400));
        assert!(p.check_ttl(Duration::ZERO).is_ok());
        assert!(p.check_ttl(Duration::from_secs(86_400)).is_ok());
        let refused = p.check_ttl(Duration::from_secs(86_401)).unwrap_err();
        assert!(refused.to_string().contains("longer than"), "{refused}");
        let stated = Policy::from_toml(&POLICY.replace(
            "default_ttl = \"24h\"",
            "default_ttl = \"24h\"\nmax_ttl = \"7days\"",
        ))
        .unwrap();
        assert_eq!(stated.max_ttl, Duration::from_secs(7 * 86_400));
        let short = POLICY.replace(
            "default_ttl = \"24h\"",
            "default_ttl = \"24h\"\nmax_ttl = \"1h\"",
        );
        assert!(
            Policy::from_toml(&short)
                .unwrap_err()
                .to_string()
                .contains("max_ttl")
        );
    }

    #[test]
    fn a_tool_no_rule_names_is_ruled_on_by_its_hints() {
        let text = format!(
            "{POLICY}\n[hints.read_only]\ndecision = \"allow\"\n[hints.destructive]\ndecision = \"approve\"\napprover_role = \"ops\"\nquorum = 1\nreason = \"It says it is destructive.\"\n"
        );
        let p = Policy::from_toml(&text).unwrap();
        let args = reimburse(1);
        let read_only = ToolHints {
            read_only: true,
            destructive: false,
        };
        let destructive = ToolHints {
            read_only: false,
            destructive: true,
        };
        let both = ToolHints {
            read_only: true,
            destructive: true,
        };
        assert_eq!(p.evaluate_with("lookup", read_only, &args), Verdict::Allow);
        assert!(matches!(
            p.evaluate_with("drop", destructive, &args),
            Verdict::RequireApproval(_)
        ));
        assert!(matches!(
            p.evaluate_with("odd", both, &args),
            Verdict::RequireApproval(_)
        ));
        assert!(matches!(
            p.evaluate_with("plain", ToolHints::default(), &args),
            Verdict::Deny { .. }
        ));
        // A rule by name wins over any hint: wire_money stays denied even if it says it only reads.
        assert!(matches!(
            p.evaluate_with("wire_money", read_only, &args),
            Verdict::Deny { .. }
        ));
        // Without hint rules, hints change nothing: a tool the policy does not name is denied.
        assert!(matches!(
            policy().evaluate_with("lookup", read_only, &args),
            Verdict::Deny { .. }
        ));
    }

    #[test]
    fn context_is_carried_for_the_tools() {
        assert_eq!(policy().context["limits"]["taxi"], json!(6000));
    }

    #[test]
    fn malformed_policies_say_what_is_wrong() {
        let cases = [
            (
                "name = \"x\"\nversion = 0\ndefault_ttl = \"1h\"\n[tools]\n",
                "version",
            ),
            (
                "name = \"x\"\nversion = 1\ndefault_ttl = \"soon\"\n[tools]\n",
                "default_ttl",
            ),
            (
                "name = \"x\"\nversion = 1\ndefault_ttl = \"1h\"\n[tools.t]\ndecision = \"approve\"\n",
                "approver_role",
            ),
            (
                "name = \"x\"\nversion = 1\ndefault_ttl = \"1h\"\n[tools.t]\ndecision = \"allow\"\nquorum = 2\n",
                "only decision",
            ),
            (
                "name = \"x\"\nversion = 1\ndefault_ttl = \"1h\"\n[tools.t]\ndecision = \"approve\"\napprover_role = \"f\"\nquorum = 0\nreason = \"r\"\n",
                "quorum",
            ),
            (
                "name = \"x\"\nversion = 1\ndefault_ttl = \"1h\"\nextra = 1\n[tools]\n",
                "extra",
            ),
        ];
        for (text, expected) in cases {
            let err = Policy::from_toml(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{err} should mention {expected}");
        }
    }

    #[test]
    fn escalation_steps_come_later_each_and_ask_new_roles() {
        let with = |escalate: &str| {
            Policy::from_toml(&POLICY.replacen(
                "[tools.decline]\n",
                &format!("[tools.decline]\nescalate = {escalate}\n"),
                1,
            ))
        };
        let policy =
            with(r#"[{ after = "4h", to = "finance_manager" }, { after = "8h", to = "cfo" }]"#)
                .unwrap();
        let Verdict::RequireApproval(requirement) =
            policy.evaluate("decline", &Args::new(json!({"claim_id": "c-1"})).unwrap())
        else {
            panic!("decline needs a person")
        };
        let steps: Vec<(u64, &str)> = requirement
            .escalate
            .iter()
            .map(|s| (s.after.as_secs(), s.to.as_str()))
            .collect();
        assert_eq!(steps, [(4 * 3600, "finance_manager"), (8 * 3600, "cfo")]);
        for bad in [
            r#"[{ after = "8h", to = "cfo" }, { after = "4h", to = "finance_manager" }]"#,
            r#"[{ after = "4h", to = "finance" }]"#,
            r#"[{ after = "4h", to = "cfo" }, { after = "5h", to = "cfo" }]"#,
            r#"[{ after = "0s", to = "cfo" }]"#,
            r#"[{ after = "soon", to = "cfo" }]"#,
            r#"[{ after = "4h", to = "cfo", also = "x" }]"#,
        ] {
            assert!(with(bad).is_err(), "{bad}");
        }
        let allow = POLICY.replacen(
            "[tools.get_claim]\n",
            "[tools.get_claim]\nescalate = [{ after = \"4h\", to = \"cfo\" }]\n",
            1,
        );
        assert_ne!(allow, POLICY);
        assert!(
            Policy::from_toml(&allow).is_err(),
            "allow takes no escalation"
        );
    }
}
