//! Policy is data: a versioned manifest (`policy.toml`) and the rules it holds or names. Each
//! rule is Cedar (the TOML rules are translated to Cedar at load), and decides one proposed call
//! on its tool, its arguments, who asks, the tool's hints, history windows and the time: allow,
//! deny, or a person must decide (why, who, how many, for how long, and what a reviewer may
//! change). The strictest matching rule wins; a rule in log-only mode is evaluated and recorded,
//! never enforced.

pub mod cases;
pub mod cedar;
pub mod history;
mod translate;
pub mod validate;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::args::Args;
use super::ids::Role;
use super::money::Amount;
use cedar::{Defaults, Facts, Rules};
pub use cedar::{Outcome, Requester, Total};
use history::{RawWindow, Window};
use validate::ToolShape;

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
    /// The other roles whose approval is needed too, when rules of several roles matched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<Need>,
}

/// One more role that must approve, and how many of its people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Need {
    pub role: Role,
    pub quorum: u8,
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
    /// The fields a reviewer may edit, per tool, and in which direction.
    pub editable: BTreeMap<String, BTreeMap<String, EditDirection>>,
    /// The history windows rules read, by name.
    pub history: BTreeMap<String, Window>,
    /// The Cedar files the manifest names, as it names them.
    pub cedar: Vec<String>,
    /// Every rule, the TOML ones translated, ready to decide.
    pub rules: Arc<Rules>,
}

/// Which of the three outcomes a verdict is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    Allow,
    Approve,
    Deny,
}

impl VerdictKind {
    pub const ALL: [VerdictKind; 3] = [VerdictKind::Allow, VerdictKind::Approve, VerdictKind::Deny];

    pub fn of(verdict: &Verdict) -> Self {
        match verdict {
            Verdict::Allow => VerdictKind::Allow,
            Verdict::Deny { .. } => VerdictKind::Deny,
            Verdict::RequireApproval(_) => VerdictKind::Approve,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            VerdictKind::Allow => "allow",
            VerdictKind::Approve => "approve",
            VerdictKind::Deny => "deny",
        }
    }
}

/// What every rule, the log-only ones included, would have made of a call: recorded beside
/// the enforced outcome, never acted on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogOnly {
    pub outcome: VerdictKind,
    pub rules: Vec<String>,
    /// The reason it would have given: a denial's, or why a person would have been asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl LogOnly {
    pub fn of(outcome: &Outcome) -> Self {
        Self {
            outcome: VerdictKind::of(&outcome.verdict),
            rules: outcome.rules.clone(),
            reason: match &outcome.verdict {
                Verdict::Allow => None,
                Verdict::Deny { reason } => Some(reason.clone()),
                Verdict::RequireApproval(r) => Some(r.reason.clone()),
            },
        }
    }
}

/// What policy says of one call: the enforced verdict and the rules that made it, and, where
/// some rules are log-only, what every rule together would have said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruling {
    pub verdict: Verdict,
    pub rules: Vec<String>,
    pub log_only: Option<Outcome>,
}

impl Ruling {
    /// The log-only outcome as it is stored, if some rules are log-only.
    pub fn log_only(&self) -> Option<LogOnly> {
        self.log_only.as_ref().map(LogOnly::of)
    }
}

/// One proposed call, as policy decides it.
#[derive(Debug, Clone)]
pub struct CallFacts<'a> {
    pub tool: &'a str,
    pub args: &'a Args,
    pub hints: ToolHints,
    pub agent: &'a str,
    pub requester: &'a Requester<'a>,
    /// The totals of the policy's history windows for this call; a window left out is zero.
    pub history: &'a BTreeMap<String, Total>,
    pub at: DateTime<Utc>,
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

/// Why a policy cannot be loaded: where (a Cedar file and its line, or a field of the
/// manifest), and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the policy is not valid: {}{}{message}", file.as_deref().map(|f| format!("{f}: ")).unwrap_or_default(), if at.is_empty() { String::new() } else { format!("{at}: ") })]
pub struct PolicyError {
    /// The Cedar file, as the manifest names it; `None` for the manifest itself.
    pub file: Option<String>,
    /// The line (`line 12`) or the field (`tools.reimburse`), if known.
    pub at: String,
    pub message: String,
}

impl PolicyError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            file: None,
            at: String::new(),
            message: message.into(),
        }
    }

    /// A problem with a field of the manifest.
    pub fn at(field: &str, message: impl Into<String>) -> Self {
        Self {
            file: None,
            at: field.to_string(),
            message: message.into(),
        }
    }

    /// A problem at a line of a Cedar file.
    pub fn in_file(file: &str, line: u32, message: impl Into<String>) -> Self {
        Self {
            file: Some(file.to_string()),
            at: format!("line {line}"),
            message: message.into(),
        }
    }

    /// The same problem, under the field `outer` (`tools.x: quorum ...`).
    fn under(self, outer: &str) -> Self {
        let at = match self.at.is_empty() {
            true => outer.to_string(),
            false => format!("{outer}.{}", self.at),
        };
        Self { at, ..self }
    }
}

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

pub(crate) const MAX_QUORUM: u8 = 10;

/// The longest reason a rule may give, in bytes.
pub const MAX_REASON: usize = 1_000;

/// The longest time to decide an approval may have. Deadlines stay well inside what a timestamp
/// can hold, and an approval nobody decides for a quarter is not a pending approval.
pub const MAX_TTL: Duration = Duration::from_secs(90 * 24 * 60 * 60);

impl Policy {
    /// A manifest that names no Cedar files.
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        Self::load(text, &mut |file: &str| {
            Err(format!(
                "{file} cannot be read here: give the policy's directory"
            ))
        })
    }

    /// Reads a manifest and the Cedar files it names, each through `read` (by the name the
    /// manifest gives it). Every rule is parsed and its annotations read; checking them against
    /// the agent's tools is [`Policy::validate`], once the tools are known.
    pub fn load(
        text: &str,
        read: &mut dyn FnMut(&str) -> Result<String, String>,
    ) -> Result<Self, PolicyError> {
        let raw: RawPolicy =
            super::toml_text::from_str(text).map_err(|e| PolicyError::new(e.to_string()))?;
        raw.check(read)
    }

    /// Decides what happens to one proposed call of a tool that hints nothing, asked by
    /// nobody in particular with no history: for tests of the rules on arguments alone.
    pub fn evaluate(&self, tool: &str, args: &Args) -> Verdict {
        self.evaluate_with(tool, ToolHints::default(), args)
    }

    /// [`Policy::evaluate`] for a tool with hints.
    pub fn evaluate_with(&self, tool: &str, hints: ToolHints, args: &Args) -> Verdict {
        let requester = Requester::default();
        let history = BTreeMap::new();
        self.decide(&CallFacts {
            tool,
            args,
            hints,
            agent: "",
            requester: &requester,
            history: &history,
            at: DateTime::UNIX_EPOCH,
        })
        .verdict
    }

    /// Decides what happens to one proposed call: the enforced verdict and the rules that made
    /// it, and what the log-only rules would have made of it.
    pub fn decide(&self, call: &CallFacts<'_>) -> Ruling {
        let history = self
            .history
            .keys()
            .map(|name| {
                let total = call.history.get(name).copied().unwrap_or_default();
                (name.as_str(), total)
            })
            .collect();
        let facts = Facts {
            tool: call.tool,
            input: call.args.fields(),
            hints: call.hints,
            agent: call.agent,
            requester: call.requester,
            history,
            at: call.at,
        };
        let defaults = Defaults {
            version: self.version,
            default_ttl: self.default_ttl,
        };
        let (enforced, log_only) = self.rules.decide(&facts, &defaults);
        Ruling {
            verdict: enforced.verdict,
            rules: enforced.rules,
            log_only,
        }
    }

    /// Checks every rule against the agent's tools (their input schemas, as the Cedar schema
    /// generated from them) and, where the process knows them, the people's roles; and what
    /// the manifest says of each tool against its schema. A rule for a tool the agent lacks,
    /// on an argument it does not have, or of the wrong type, is refused with its place.
    pub fn validate(
        &self,
        tools: &[ToolShape<'_>],
        roles: Option<&BTreeSet<String>>,
    ) -> Result<(), PolicyError> {
        for tool in tools {
            self.check_fields(tool.name, tool.input_schema)
                .map_err(|(at, why)| PolicyError::at(&at, why))?;
        }
        for window in self.history.values() {
            let Some(tool) = tools.iter().find(|t| t.name == window.tool) else {
                return Err(PolicyError::at(
                    &format!("history.{}.tool", window.name),
                    format!("{} is not one of the agent's tools", window.tool),
                ));
            };
            window.check_tool(tool.input_schema)?;
        }
        let windows: Vec<&str> = self.history.keys().map(String::as_str).collect();
        validate::check(&self.rules, tools, &windows, roles)
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

    /// Whether some rule may send a call of `tool` (which says `hints` of itself) to a person:
    /// its TOML rule, by name or by its hints, asks for one; or an approval rule of a Cedar file
    /// whose scope names it or every tool.
    pub fn may_need_a_person(&self, tool: &str, hints: ToolHints) -> bool {
        let by_toml = matches!(self.rule_for(tool, hints), Some(ToolRule::Approve { .. }));
        by_toml
            || self.rules.rules.iter().any(|rule| {
                matches!(rule.effect, cedar::Meaning::Approve(_))
                    && matches!(rule.place, cedar::Place::Line { .. })
                    && rule
                        .tools()
                        .is_none_or(|tools| tools.iter().any(|t| t == tool))
            })
    }

    /// Checks what the manifest reads of `tool`'s calls against the tool's input schema, so a
    /// rule cannot load and then deny every call: the field a gate compares, and any field a
    /// reviewer may edit, must be a required integer argument. On a mismatch, the policy
    /// file's field and what is wrong.
    pub fn check_fields(&self, tool: &str, schema: &Value) -> Result<(), (String, String)> {
        let gated = match self.tools.get(tool) {
            Some(ToolRule::Approve {
                gate: Gate::AboveAmount { field, .. },
                ..
            }) => Some((format!("tools.{tool}.amount_field"), field)),
            _ => None,
        };
        let editable = self
            .editable
            .get(tool)
            .into_iter()
            .flat_map(|fields| fields.keys())
            .map(|field| (format!("editable.{tool}.{field}"), field));
        for (at, field) in gated.into_iter().chain(editable) {
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

    /// The field that carries a tool's amount: the one a TOML rule gates on, or else the one a
    /// reviewer may lower.
    pub fn amount_field(&self, tool: &str) -> Option<&str> {
        match self.tools.get(tool) {
            Some(ToolRule::Approve {
                gate: Gate::AboveAmount { field, .. },
                ..
            }) => Some(field),
            _ => self.lowerable_field(tool),
        }
    }

    /// The amount field a reviewer may lower with an edit, if policy lets them edit this tool.
    pub fn lowerable_field(&self, tool: &str) -> Option<&str> {
        self.editable
            .get(tool)?
            .iter()
            .find_map(|(field, direction)| {
                (*direction == EditDirection::Lower).then_some(field.as_str())
            })
    }

    /// Applies a reviewer's new amount to a call's arguments, if policy lets them.
    pub fn edit_amount(&self, tool: &str, args: &Args, new: Amount) -> Result<Args, EditRefusal> {
        let field = self
            .lowerable_field(tool)
            .ok_or_else(|| EditRefusal::NotEditable {
                tool: tool.to_string(),
            })?;
        let old = args
            .int(field)
            .and_then(|c| Amount::from_cents(c).ok())
            .ok_or_else(|| EditRefusal::NotEditable {
                tool: tool.to_string(),
            })?;
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
    /// Cedar files of the agent's directory, read in this order after the TOML rules.
    #[serde(default)]
    cedar: Vec<String>,
    /// `[editable.<tool>]`: the fields a reviewer may edit, for rules written in Cedar.
    #[serde(default)]
    editable: BTreeMap<String, BTreeMap<String, EditDirection>>,
    #[serde(default)]
    history: BTreeMap<String, RawWindow>,
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
        .map_err(|e| PolicyError::new(format!("{what} {text:?}: {e}")))?;
    if ttl > MAX_TTL {
        return Err(PolicyError::new(format!(
            "{what} {text:?} is longer than 90 days, the longest time to decide"
        )));
    }
    Ok(ttl)
}

impl RawPolicy {
    fn check(
        self,
        read: &mut dyn FnMut(&str) -> Result<String, String>,
    ) -> Result<Policy, PolicyError> {
        if self.version == 0 {
            return Err(PolicyError::new("version starts at 1"));
        }
        let default_ttl = parse_ttl(&self.default_ttl, "default_ttl")?;
        let mut tools = BTreeMap::new();
        for (tool, raw) in self.tools {
            let rule = raw.check().map_err(|e| e.under(&format!("tools.{tool}")))?;
            tools.insert(tool, rule);
        }
        let hint = |raw: Option<RawRule>, name: &str| {
            raw.map(|raw| raw.check().map_err(|e| e.under(&format!("hints.{name}"))))
                .transpose()
        };
        let hints = HintRules {
            read_only: hint(self.hints.read_only, "read_only")?,
            destructive: hint(self.hints.destructive, "destructive")?,
        };
        if let Some(ToolRule::Approve {
            gate: Gate::AboveAmount { .. },
            ..
        }) = hints.read_only.as_ref().or(hints.destructive.as_ref())
        {
            return Err(PolicyError::new(
                "a hints rule cannot gate on an amount: amount_field names one tool's argument",
            ));
        }

        let mut editable = self.editable;
        for (tool, rule) in &tools {
            if let ToolRule::Approve {
                editable: fields, ..
            } = rule
                && !fields.is_empty()
            {
                if editable.contains_key(tool) {
                    return Err(PolicyError::at(
                        &format!("editable.{tool}"),
                        format!("tools.{tool} says what a reviewer may edit already"),
                    ));
                }
                editable.insert(tool.clone(), fields.clone());
            }
        }
        for (tool, fields) in &editable {
            if fields.len() > 1 {
                return Err(PolicyError::at(
                    &format!("editable.{tool}"),
                    "a reviewer may edit one field of a tool: its amount",
                ));
            }
        }
        let mut history = BTreeMap::new();
        for (name, raw) in self.history {
            history.insert(name.clone(), raw.check(&name)?);
        }

        let mut rules = Vec::new();
        for (tool, rule) in &tools {
            let field = format!("tools.{tool}");
            rules.extend(cedar::parse_translated(
                &field,
                &translate::tool_rule(tool, rule),
            )?);
        }
        let named: Vec<&String> = tools.keys().collect();
        for (name, rule) in [
            ("read_only", &hints.read_only),
            ("destructive", &hints.destructive),
        ] {
            if let Some(rule) = rule {
                let field = format!("hints.{name}");
                rules.extend(cedar::parse_translated(
                    &field,
                    &translate::hint_rule(name, rule, &named),
                )?);
            }
        }
        for file in &self.cedar {
            let text = read(file).map_err(|why| PolicyError::at("cedar", why))?;
            rules.extend(cedar::parse_file(file, &text)?);
        }
        let rules = Rules::new(rules)?;

        let longest_rule = rules
            .rules
            .iter()
            .filter_map(|rule| match &rule.effect {
                cedar::Meaning::Approve(terms) => Some(terms.ttl.unwrap_or(default_ttl)),
                _ => None,
            })
            .fold(default_ttl, Duration::max);
        let max_ttl = match self.max_ttl.as_deref() {
            Some(text) => {
                let max_ttl = parse_ttl(text, "max_ttl")?;
                if longest_rule > max_ttl {
                    return Err(PolicyError::new(format!(
                        "max_ttl {text:?} is shorter than a rule's time to decide"
                    )));
                }
                max_ttl
            }
            None => longest_rule,
        };
        let context = match self.context {
            Some(value) => {
                serde_json::to_value(value).map_err(|e| PolicyError::new(e.to_string()))?
            }
            None => Value::Null,
        };
        // A rule's text names every attribute it reads: a window it never names, it never
        // reads. A name that appears for another reason only makes the window read.
        let texts: Vec<String> = rules.rules.iter().map(|r| r.policy.to_string()).collect();
        for window in history.values_mut() {
            window.read_by_rules = texts.iter().any(|text| text.contains(window.name.as_str()));
        }
        Ok(Policy {
            name: self.name,
            version: self.version,
            default_ttl,
            max_ttl,
            tools,
            hints,
            context,
            editable,
            history,
            cedar: self.cedar,
            rules: Arc::new(rules),
        })
    }
}

impl RawRule {
    fn check(self) -> Result<ToolRule, PolicyError> {
        let fail = |why: &str| Err(PolicyError::new(why));
        // A reason is stored with every approval and audit event it explains.
        let reasons = self
            .reason
            .iter()
            .chain(self.thresholds.iter().map(|t| &t.reason));
        if reasons.into_iter().any(|r| r.len() > MAX_REASON) {
            return Err(PolicyError::new(format!(
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
                    return Err(PolicyError::new(format!(
                        "only the amount field can be editable, not {field}"
                    )));
                }
                let steps = self.escalate.into_iter().map(|step| (step.after, step.to));
                let escalate = check_escalation(steps.collect(), &approver_role)?;
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

/// Steps later than the one before, each to a role not asked yet, at most five: each a time
/// after the approval opened and the role it then goes to as well.
fn check_escalation(
    steps: Vec<(String, Role)>,
    approver_role: &Role,
) -> Result<Vec<Escalation>, PolicyError> {
    if steps.len() > MAX_ESCALATIONS {
        return Err(PolicyError::new(format!(
            "escalate has at most {MAX_ESCALATIONS} steps"
        )));
    }
    let mut checked: Vec<Escalation> = Vec::new();
    for (after, to) in steps {
        let after = parse_ttl(&after, "escalate after")?;
        if after.is_zero() {
            return Err(PolicyError::new("escalate after must be above zero"));
        }
        if checked.last().is_some_and(|last| last.after >= after) {
            return Err(PolicyError::new("escalate steps must come later each"));
        }
        if &to == approver_role || checked.iter().any(|s| s.to == to) {
            return Err(PolicyError::new(format!(
                "escalate to {to} asks a role already asked"
            )));
        }
        checked.push(Escalation { after, to });
    }
    Ok(checked)
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
    const POLICY: &str = include_str!("../../../tests/fixtures/policies/expense-v3.toml");

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

#[cfg(test)]
mod cedar_rules {
    use super::validate::ToolShape;
    use super::*;
    use serde_json::json;

    /// A payments policy: a manifest with one window, and rules in `rules.cedar`.
    const MANIFEST: &str = include_str!("../../../tests/fixtures/policies/payments/policy.toml");

    /// Reads run; the hour's limit and the payee and intern rules the scenarios rule by too;
    /// and a log-only rule.
    const RULES: &str = concat!(
        r#"// Reads run.
@id("reads")
permit(principal, action == Action::"get_balance", resource);

"#,
        include_str!("../../../tests/fixtures/policies/payments/hourly-limit.cedar"),
        "\n",
        include_str!("../../../tests/fixtures/policies/payments/payees-and-interns.cedar"),
        r#"
// A rule being tried: the night shift would need a lead.
@id("night shift") @mode("log_only") @approve("lead")
permit(principal, action, resource)
when { context.now.hour < 6 };
"#
    );

    fn tools() -> Vec<(&'static str, Value)> {
        vec![
            (
                "send_transfer",
                json!({"type": "object", "required": ["to", "amount_cents"], "properties": {
                    "to": {"type": "string"},
                    "amount_cents": {"type": "integer"},
                    "payee_is_new": {"type": "boolean"},
                    "rate": {"type": "number"},
                }}),
            ),
            (
                "get_balance",
                json!({"type": "object", "properties": {"account": {"type": "string"}}}),
            ),
        ]
    }

    fn load(manifest: &str, rules: &str) -> Result<Policy, PolicyError> {
        let policy = Policy::load(manifest, &mut |file| match file {
            "rules.cedar" => Ok(rules.to_string()),
            other => Err(format!("no file {other}")),
        })?;
        let tools = tools();
        let shapes = ToolShape::of(&tools);
        let roles: BTreeSet<String> = ["finance", "compliance", "lead", "intern", "employee"]
            .map(String::from)
            .into();
        policy.validate(&shapes, Some(&roles))?;
        Ok(policy)
    }

    fn policy() -> Policy {
        load(MANIFEST, RULES).unwrap()
    }

    #[test]
    fn a_window_is_read_by_rules_only_where_a_rule_names_it() {
        let manifest = format!(
            "{MANIFEST}\n[history.refunded_1h]\ntool = \"send_transfer\"\nwindow = \"1h\"\nper = \"agent\"\n"
        );
        let policy = load(&manifest, RULES).unwrap();
        assert!(policy.history["sent_1h"].read_by_rules);
        assert!(!policy.history["refunded_1h"].read_by_rules);
    }

    /// Decides a call by `roles` with `sent` already sent this hour, at `hour` UTC.
    fn decide(
        policy: &Policy,
        tool: &str,
        args: Value,
        roles: &[&str],
        sent: i64,
        hour: u32,
    ) -> Ruling {
        let args = Args::new(args).unwrap();
        let requester = Requester {
            name: "lee",
            tenant: "acme",
            roles: roles.to_vec(),
            claims: vec![],
        };
        let history = BTreeMap::from([(
            "sent_1h".to_string(),
            Total {
                count: 1,
                sum: sent,
            },
        )]);
        let at = format!("2026-12-07T{hour:02}:30:00Z").parse().unwrap();
        policy.decide(&CallFacts {
            tool,
            args: &args,
            hints: ToolHints::default(),
            agent: "payments",
            requester: &requester,
            history: &history,
            at,
        })
    }

    fn transfer(cents: i64) -> Value {
        json!({"to": "acct_1", "amount_cents": cents})
    }

    #[test]
    fn a_plain_permit_allows_and_names_its_rule() {
        let ruling = decide(&policy(), "send_transfer", transfer(10_000), &[], 0, 12);
        assert_eq!(ruling.verdict, Verdict::Allow);
        assert_eq!(ruling.rules, ["small transfers"]);
        let read = decide(&policy(), "get_balance", json!({}), &[], 0, 12);
        assert_eq!(read.rules, ["reads"]);
    }

    #[test]
    fn a_running_total_past_its_limit_needs_a_person() {
        let p = policy();
        assert_eq!(
            decide(&p, "send_transfer", transfer(10_000), &[], 40_000, 12).verdict,
            Verdict::Allow
        );
        let ruling = decide(&p, "send_transfer", transfer(10_001), &[], 40_000, 12);
        let Verdict::RequireApproval(requirement) = ruling.verdict else {
            panic!("{ruling:?}")
        };
        assert_eq!(requirement.approver_role.as_str(), "finance");
        assert_eq!(
            requirement.reason,
            "Above USD 500 an hour, finance decides."
        );
        assert_eq!(requirement.ttl, Duration::from_secs(4 * 3600));
        assert_eq!(ruling.rules, ["large transfers"]);
    }

    #[test]
    fn two_approval_rules_of_two_roles_need_both() {
        let mut args = transfer(60_000);
        args["payee_is_new"] = json!(true);
        let ruling = decide(&policy(), "send_transfer", args, &[], 0, 12);
        let Verdict::RequireApproval(requirement) = ruling.verdict else {
            panic!("{ruling:?}")
        };
        assert_eq!(requirement.approver_role.as_str(), "finance");
        assert_eq!(requirement.quorum, 1);
        assert_eq!(
            requirement.also,
            [Need {
                role: Role::parse("compliance").unwrap(),
                quorum: 2
            }]
        );
        // The shortest time to decide of the two, and both reasons.
        assert_eq!(requirement.ttl, Duration::from_secs(3600));
        let reason = &requirement.reason;
        assert!(
            reason.starts_with("Above USD 500") && reason.contains("new payee"),
            "{reason}"
        );
        assert_eq!(ruling.rules, ["large transfers", "new payee"]);
    }

    #[test]
    fn a_forbid_wins_over_every_permit() {
        let ruling = decide(
            &policy(),
            "send_transfer",
            transfer(100),
            &["intern"],
            0,
            12,
        );
        assert_eq!(
            ruling.verdict,
            Verdict::Deny {
                reason: "Interns never move money.".into()
            }
        );
        assert_eq!(ruling.rules, ["no interns"]);
    }

    #[test]
    fn nothing_matching_denies() {
        let none = load(
            MANIFEST,
            "permit(principal, action == Action::\"get_balance\", resource);",
        )
        .unwrap();
        let ruling = decide(&none, "send_transfer", transfer(1), &[], 0, 12);
        assert_eq!(
            ruling.verdict,
            Verdict::Deny {
                reason: "policy v3 has no rule for the tool send_transfer".into()
            }
        );
        assert!(ruling.rules.is_empty());
    }

    #[test]
    fn a_log_only_rule_is_recorded_beside_the_enforced_outcome_and_changes_nothing() {
        let night = decide(&policy(), "send_transfer", transfer(100), &[], 0, 3);
        assert_eq!(night.verdict, Verdict::Allow);
        assert_eq!(night.rules, ["small transfers"]);
        let shadow = night.log_only.expect("a log-only rule exists");
        assert!(
            matches!(shadow.verdict, Verdict::RequireApproval(ref r) if r.approver_role.as_str() == "lead")
        );
        assert_eq!(shadow.rules, ["night shift"]);
        let day = decide(&policy(), "send_transfer", transfer(100), &[], 0, 12);
        assert_eq!(day.log_only.unwrap().verdict, Verdict::Allow);
        let without = load(MANIFEST, &RULES.replace("@mode(\"log_only\") ", "")).unwrap();
        let enforced = decide(&without, "send_transfer", transfer(100), &[], 0, 3);
        assert!(matches!(enforced.verdict, Verdict::RequireApproval(_)));
        assert_eq!(enforced.log_only, None);
    }

    #[test]
    fn a_rule_reads_the_requesters_claims_and_tenant() {
        let rules = r#"@id("finance team")
permit(principal, action == Action::"send_transfer", resource)
when { principal.tenant == "acme" && principal.hasTag("department") && principal.getTag("department") == "finance" };"#;
        let p = load(MANIFEST, rules).unwrap();
        let args = Args::new(transfer(5)).unwrap();
        let history = BTreeMap::new();
        let mut requester = Requester {
            name: "lee",
            tenant: "acme",
            roles: vec![],
            claims: vec![("department", "finance".into())],
        };
        let call = |requester: &Requester<'_>| {
            p.decide(&CallFacts {
                tool: "send_transfer",
                args: &args,
                hints: ToolHints::default(),
                agent: "payments",
                requester,
                history: &history,
                at: Utc::now(),
            })
            .verdict
        };
        assert_eq!(call(&requester), Verdict::Allow);
        requester.claims = vec![("department", "sales".into())];
        assert!(matches!(call(&requester), Verdict::Deny { .. }));
        requester.claims = vec![];
        assert!(matches!(call(&requester), Verdict::Deny { .. }));
    }

    #[test]
    fn a_rule_without_an_id_is_named_by_its_file_and_line() {
        let p = load(
            MANIFEST,
            "\n\npermit(principal, action == Action::\"get_balance\", resource);\n",
        )
        .unwrap();
        let ruling = decide(&p, "get_balance", json!({}), &[], 0, 12);
        assert_eq!(ruling.rules, ["rules.cedar:3"]);
    }

    /// Loads `rules` and says where and why it was refused.
    fn refused(rules: &str) -> (Option<String>, String, String) {
        let error = load(MANIFEST, rules).expect_err(rules);
        (error.file, error.at, error.message)
    }

    #[test]
    fn a_rule_on_an_argument_the_tool_lacks_is_refused_with_its_file_line_and_reason() {
        let (file, at, message) = refused(
            "permit(principal, action == Action::\"get_balance\", resource);\n\n@id(\"typo\")\npermit(principal, action == Action::\"send_transfer\", resource)\nwhen { context.input.amount > 5 };\n",
        );
        assert_eq!(file.as_deref(), Some("rules.cedar"));
        assert_eq!(at, "line 5");
        assert!(message.contains("input.amount"), "{message}");
        assert!(
            message.contains("send_transfer has no argument amount; the ones rules can read: amount_cents, payee_is_new, to"),
            "{message}"
        );
    }

    #[test]
    fn a_rule_comparing_a_string_with_a_number_is_refused() {
        let (_, at, message) = refused(
            "permit(principal, action == Action::\"send_transfer\", resource)\nwhen { context.input.to > 5 };",
        );
        assert_eq!(at, "line 2");
        assert!(
            message.contains("Long") && message.contains("String"),
            "{message}"
        );
    }

    #[test]
    fn a_rule_on_an_argument_rules_cannot_read_says_why() {
        let (_, _, message) = refused(
            "permit(principal, action == Action::\"send_transfer\", resource)\nwhen { context.input.rate > 1 };",
        );
        assert!(
            message.contains("rate") && message.contains("\"number\""),
            "{message}"
        );
    }

    #[test]
    fn an_unknown_role_an_unknown_window_and_an_unknown_tool_are_refused() {
        let (_, at, message) = refused(
            "@approve(\"cfo\")\npermit(principal, action == Action::\"send_transfer\", resource);",
        );
        assert_eq!(at, "line 1");
        assert!(message.contains("no person has the role cfo"), "{message}");
        let (_, at, message) = refused(
            "\npermit(principal, action, resource) when { principal.roles.contains(\"treasurer\") };",
        );
        assert_eq!(at, "line 2");
        assert!(message.contains("treasurer"), "{message}");
        let (_, at, message) = refused(
            "permit(principal, action == Action::\"send_transfer\", resource)\nwhen { context.history.sent_24h.count < 5 };",
        );
        assert_eq!(at, "line 2");
        assert!(message.contains("sent_24h"), "{message}");
        let (_, _, message) = refused("permit(principal, action == Action::\"wire\", resource);");
        assert!(message.contains("wire"), "{message}");
    }

    #[test]
    fn a_rule_that_does_not_parse_is_refused_with_its_line() {
        let (file, at, message) = refused(
            "permit(principal, action, resource);\n\npermit(principal, action, resource) when { context.x = 1 };",
        );
        assert_eq!(file.as_deref(), Some("rules.cedar"));
        assert_eq!(at, "line 3");
        assert!(message.contains("not a valid operator"), "{message}");
    }

    #[test]
    fn annotations_are_checked() {
        for (rule, says) in [
            (
                "@aprove(\"finance\") permit(principal, action, resource);",
                "@aprove is not an annotation",
            ),
            (
                "@approve(\"finance\") forbid(principal, action, resource);",
                "@approve is for permit rules",
            ),
            (
                "@quorum(\"2\") permit(principal, action, resource);",
                "@quorum goes with @approve",
            ),
            (
                "@approve(\"finance\") @quorum(\"11\") permit(principal, action, resource);",
                "1 to 10",
            ),
            (
                "@approve(\"finance\") @ttl(\"91days\") permit(principal, action, resource);",
                "90 days",
            ),
            (
                "@reason(\"why\") permit(principal, action, resource);",
                "takes no @reason",
            ),
            (
                "@mode(\"dry_run\") permit(principal, action, resource);",
                "log_only",
            ),
            (
                "@approve(\"finance\") @escalate(\"soon\") permit(principal, action, resource);",
                "@escalate",
            ),
            (
                "permit(principal == ?principal, action, resource);",
                "templates",
            ),
            (
                "@id(\"a\") permit(principal, action, resource);\n@id(\"a\") permit(principal, action, resource);",
                "also the id of the rule at rules.cedar line 1",
            ),
        ] {
            let (_, _, message) = refused(rule);
            assert!(message.contains(says), "{rule}: {message}");
        }
        let escalating = load(
            MANIFEST,
            "@approve(\"finance\") @escalate(\"4h lead, 8h compliance\")\npermit(principal, action == Action::\"send_transfer\", resource);",
        )
        .unwrap();
        let Verdict::RequireApproval(r) =
            decide(&escalating, "send_transfer", transfer(1), &[], 0, 12).verdict
        else {
            panic!()
        };
        let steps: Vec<(u64, &str)> = r
            .escalate
            .iter()
            .map(|s| (s.after.as_secs(), s.to.as_str()))
            .collect();
        assert_eq!(steps, [(4 * 3600, "lead"), (8 * 3600, "compliance")]);
    }

    #[test]
    fn a_window_must_sum_a_required_integer_of_its_own_tool() {
        for (window, field, says) in [
            (
                "tool = \"wire\"",
                "history.sent_1h.tool",
                "not one of the agent's tools",
            ),
            ("sum = \"to\"", "history.sent_1h.sum", "required integer"),
            ("sum = \"fee\"", "history.sent_1h.sum", "not one of"),
            (
                "per = \"arg:payee_is_new\"",
                "history.sent_1h.per",
                "required string or integer",
            ),
            ("per = \"everyone\"", "history.sent_1h", "arg:"),
            ("window = \"30s\"", "history.sent_1h", "1 minute"),
        ] {
            let key = window.split(" =").next().unwrap();
            let manifest: String = MANIFEST
                .lines()
                .map(|line| match line.starts_with(&format!("{key} =")) {
                    true => window.to_string(),
                    false => line.to_string(),
                })
                .collect::<Vec<_>>()
                .join("\n");
            let manifest = match manifest.contains(window) {
                true => manifest,
                false => format!("{manifest}\n{window}\n"),
            };
            let error = load(&manifest, RULES).expect_err(window);
            assert_eq!(error.at, field, "{window}: {error}");
            assert!(error.message.contains(says), "{window}: {error}");
        }
    }

    #[test]
    fn a_manifest_naming_a_file_it_cannot_read_says_so() {
        let error = Policy::from_toml(MANIFEST).unwrap_err();
        assert_eq!(error.at, "cedar");
        assert!(error.message.contains("rules.cedar"), "{error}");
    }
}
