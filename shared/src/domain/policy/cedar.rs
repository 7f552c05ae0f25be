//! Rules in Cedar (the `cedar-policy` crate): each rule is a Cedar policy, read from a file the
//! manifest names or translated from the manifest's TOML rules, annotated with what a match
//! means here. A matching `forbid` denies; a matching `permit` annotated `@approve("<role>")`
//! needs that role's approval; a plain matching `permit` allows; nothing matching denies. The
//! strictest matching outcome wins.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use cedar_policy::{
    Authorizer, Context, Decision, Effect, Entities, Entity, EntityId, EntityTypeName, EntityUid,
    Policy as CedarPolicy, PolicyId, PolicySet, Request, RestrictedExpression,
};
use chrono::{DateTime, Datelike, Timelike, Utc};
use miette::Diagnostic;
use serde_json::Value;

use super::{
    Escalation, MAX_QUORUM, MAX_REASON, PolicyError, Requirement, ToolHints, Verdict,
    check_escalation, parse_ttl,
};
use crate::domain::ids::Role;

/// The annotations a rule may carry, each read here. Any other is refused, so a misspelt
/// `@aprove` cannot silently turn a rule that needs a person into one that allows.
pub const ANNOTATIONS: [&str; 7] = [
    "id", "approve", "quorum", "ttl", "reason", "escalate", "mode",
];

/// What a rule means when it matches.
#[derive(Debug, Clone, PartialEq)]
pub enum Meaning {
    /// A plain `permit`: the call runs.
    Allow,
    /// A `forbid`: the call is refused, with the rule's `@reason` if it has one.
    Deny { reason: Option<String> },
    /// A `permit` with `@approve`: a person of the role must approve it.
    Approve(Terms),
}

/// An approval rule's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Terms {
    pub role: Role,
    pub quorum: u8,
    pub ttl: Option<Duration>,
    pub reason: Option<String>,
    pub escalate: Vec<Escalation>,
}

/// Where a rule was written: a line of a Cedar file, or a rule of the manifest's TOML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Line { file: String, line: u32 },
    Field(String),
}

/// One rule: a Cedar policy and what it means here.
#[derive(Debug, Clone)]
pub struct Rule {
    /// What decisions name it by: its `@id`, or its file and line.
    pub id: String,
    pub place: Place,
    pub effect: Meaning,
    /// `@mode("log_only")`: evaluated and recorded beside the enforced outcome, never enforced.
    pub log_only: bool,
    pub(super) policy: CedarPolicy,
    /// The text of the file it was read from, for the line of an error within it.
    source: Option<Arc<str>>,
}

impl Rule {
    /// The text of the Cedar file the rule was read from.
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// The error a problem with this rule is reported as: its file and line, or its field.
    pub fn error(&self, message: impl Into<String>) -> PolicyError {
        match &self.place {
            Place::Line { file, line } => PolicyError::in_file(file, *line, message),
            Place::Field(field) => PolicyError::at(field, message),
        }
    }

    /// The tools this rule can apply to, by its scope: `None` for every tool.
    pub fn tools(&self) -> Option<Vec<String>> {
        let json = self.policy.to_json().ok()?;
        let action = &json["action"];
        let id = |e: &Value| e["id"].as_str().map(str::to_string);
        match action["op"].as_str() {
            Some("==") => Some(id(&action["entity"]).into_iter().collect()),
            Some("in") if action["entities"].is_array() => Some(
                action["entities"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(id)
                    .collect(),
            ),
            Some("in") => Some(id(&action["entity"]).into_iter().collect()),
            _ => None,
        }
    }

    /// The role names the rule's conditions test the requester for
    /// (`principal.roles.contains("x")`, `containsAny`, `containsAll`).
    pub fn roles_named(&self) -> Vec<String> {
        let mut named = Vec::new();
        if let Ok(json) = self.policy.to_json() {
            roles_in(&json["conditions"], &mut named);
        }
        named
    }
}

/// Collects the string literals tested against `principal.roles` anywhere in an expression.
fn roles_in(expr: &Value, named: &mut Vec<String>) {
    match expr {
        Value::Object(map) => {
            for (op, body) in map {
                let tests_roles = matches!(op.as_str(), "contains" | "containsAny" | "containsAll")
                    && body["left"]["."]["left"]["Var"] == "principal"
                    && body["left"]["."]["attr"] == "roles";
                if tests_roles {
                    let right = &body["right"];
                    let literals = match right.get("Set") {
                        Some(Value::Array(items)) => items.iter().collect(),
                        _ => vec![right],
                    };
                    named.extend(
                        literals
                            .into_iter()
                            .filter_map(|v| v["Value"].as_str().map(str::to_string)),
                    );
                }
                roles_in(body, named);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| roles_in(item, named)),
        _ => {}
    }
}

/// Reads the rules of one Cedar file, `label` as the manifest names it.
pub fn parse_file(label: &str, text: &str) -> Result<Vec<Rule>, PolicyError> {
    let set = PolicySet::from_str(text).map_err(|e| {
        let offset = e
            .labels()
            .and_then(|mut labels| labels.next())
            .map_or(0, |l| l.offset());
        PolicyError::in_file(label, line_of(text, offset), e.to_string())
    })?;
    if set.templates().next().is_some() {
        return Err(PolicyError::in_file(
            label,
            1,
            "templates (?principal, ?resource) are not rules: write each rule out",
        ));
    }
    let starts = policy_starts(text);
    let source: Arc<str> = Arc::from(text);
    let mut rules = Vec::with_capacity(starts.len());
    for (index, start) in starts.iter().enumerate() {
        let line = line_of(text, *start);
        let place = Place::Line {
            file: label.to_string(),
            line,
        };
        let Some(policy) = set.policy(&PolicyId::new(format!("policy{index}"))) else {
            return Err(PolicyError::in_file(
                label,
                line,
                "this rule could not be told apart from the one before it",
            ));
        };
        let mut read = rule(policy.clone(), place)?;
        read.source = Some(source.clone());
        rules.push(read);
    }
    if rules.len() != set.num_of_policies() {
        return Err(PolicyError::in_file(
            label,
            1,
            "the rules could not be told apart: end each with ';'",
        ));
    }
    Ok(rules)
}

/// Reads rules the manifest's TOML was translated into, named by its field.
pub fn parse_translated(field: &str, text: &str) -> Result<Vec<Rule>, PolicyError> {
    let set = PolicySet::from_str(text)
        .map_err(|e| PolicyError::at(field, format!("cannot be read as Cedar: {e}")))?;
    let mut rules: Vec<Rule> = Vec::new();
    for index in 0..set.num_of_policies() {
        let policy = set
            .policy(&PolicyId::new(format!("policy{index}")))
            .expect("translated rules are numbered in order");
        rules.push(rule(policy.clone(), Place::Field(field.to_string()))?);
    }
    Ok(rules)
}

/// A policy with its annotations read.
fn rule(policy: CedarPolicy, place: Place) -> Result<Rule, PolicyError> {
    let mut rule = Rule {
        id: match &place {
            Place::Line { file, line } => format!("{file}:{line}"),
            Place::Field(field) => field.clone(),
        },
        place,
        effect: Meaning::Allow,
        log_only: false,
        policy,
        source: None,
    };
    let annotation = |key: &str| rule.policy.annotation(key).map(str::to_string);
    if let Some((key, _)) = rule
        .policy
        .annotations()
        .find(|(key, _)| !ANNOTATIONS.contains(key))
    {
        return Err(rule.error(format!(
            "@{key} is not an annotation Countersign reads (it reads @{})",
            ANNOTATIONS.join(", @")
        )));
    }
    let id = annotation("id");
    let approve = annotation("approve");
    let quorum = annotation("quorum");
    let ttl = annotation("ttl");
    let reason = annotation("reason");
    let escalate = annotation("escalate");
    let mode = annotation("mode");
    if let Some(id) = id {
        if id.trim().is_empty() || id.len() > 200 {
            return Err(rule.error("@id has 1 to 200 characters"));
        }
        rule.id = id;
    }
    rule.log_only = match mode.as_deref() {
        None | Some("enforce") => false,
        Some("log_only") => true,
        Some(other) => {
            return Err(rule.error(format!(
                "@mode({other:?}) is not a mode: \"enforce\" (the default) or \"log_only\""
            )));
        }
    };
    if let Some(reason) = &reason
        && (reason.trim().is_empty() || reason.len() > MAX_REASON)
    {
        return Err(rule.error(format!(
            "@reason has 1 to {MAX_REASON} bytes: a sentence the reviewer reads"
        )));
    }
    let approve_only = [
        ("quorum", quorum.is_some()),
        ("ttl", ttl.is_some()),
        ("escalate", escalate.is_some()),
    ];
    rule.effect = match (rule.policy.effect(), approve) {
        (Effect::Forbid, Some(_)) => {
            return Err(rule.error("@approve is for permit rules: a forbid denies"));
        }
        (Effect::Forbid, None) | (Effect::Permit, None) => {
            if let Some((key, _)) = approve_only.iter().find(|(_, given)| *given) {
                return Err(rule.error(format!("@{key} goes with @approve")));
            }
            match rule.policy.effect() {
                Effect::Forbid => Meaning::Deny { reason },
                Effect::Permit if reason.is_some() => {
                    return Err(rule
                        .error("a permit without @approve allows the call: it takes no @reason"));
                }
                Effect::Permit => Meaning::Allow,
            }
        }
        (Effect::Permit, Some(role)) => {
            let role = Role::parse(&role).map_err(|e| rule.error(format!("@approve: {e}")))?;
            let quorum = match quorum.as_deref() {
                None => 1,
                Some(text) => match text.parse::<u8>() {
                    Ok(n) if (1..=MAX_QUORUM).contains(&n) => n,
                    _ => {
                        return Err(rule.error(format!(
                            "@quorum({text:?}) must be a whole number from 1 to {MAX_QUORUM}"
                        )));
                    }
                },
            };
            let ttl = ttl
                .as_deref()
                .map(|t| parse_ttl(t, "@ttl"))
                .transpose()
                .map_err(|e| rule.error(e.message))?;
            let escalate = match escalate.as_deref() {
                None => Vec::new(),
                Some(steps) => {
                    check_escalation(parse_steps(steps).map_err(|e| rule.error(e))?, &role)
                        .map_err(|e| rule.error(format!("@escalate: {}", e.message)))?
                }
            };
            Meaning::Approve(Terms {
                role,
                quorum,
                ttl,
                reason,
                escalate,
            })
        }
    };
    rule.policy = rule.policy.new_id(PolicyId::new(&rule.id));
    Ok(rule)
}

/// `@escalate("4h finance_manager, 8h cfo")`: steps, each a time after opening and a role.
fn parse_steps(text: &str) -> Result<Vec<(String, Role)>, String> {
    text.split(',')
        .map(|step| {
            let mut words = step.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some(after), Some(role), None) => Role::parse(role)
                    .map(|role| (after.to_string(), role))
                    .map_err(|e| format!("@escalate: {e}")),
                _ => Err(format!(
                    "@escalate({text:?}) lists steps as \"4h finance_manager, 8h cfo\""
                )),
            }
        })
        .collect()
}

/// Where each top-level policy of a Cedar file starts (its first annotation or its effect),
/// skipping comments and string literals.
fn policy_starts(text: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut starts = Vec::new();
    let (mut i, mut inside) = (0, false);
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            c if c.is_ascii_whitespace() => {}
            c => {
                if !inside {
                    starts.push(i);
                    inside = true;
                }
                match c {
                    b'"' => {
                        i += 1;
                        while i < bytes.len() && bytes[i] != b'"' {
                            i += if bytes[i] == b'\\' { 2 } else { 1 };
                        }
                    }
                    b';' => inside = false,
                    _ => {}
                }
            }
        }
        i += 1;
    }
    starts
}

/// The line (from 1) that byte `offset` of `text` is on.
pub fn line_of(text: &str, offset: usize) -> u32 {
    let end = offset.min(text.len());
    1 + text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count() as u32
}

/// A Cedar string literal holding `text`.
pub fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The rules of a policy, ready to decide: the enforced ones, and all of them with the
/// log-only ones, when there are any.
pub struct Rules {
    pub rules: Vec<Rule>,
    enforced: PolicySet,
    everything: Option<PolicySet>,
    by_id: HashMap<String, usize>,
    authorizer: Authorizer,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.rules.iter().map(|r| r.id.as_str()).collect();
        f.debug_struct("Rules").field("rules", &ids).finish()
    }
}

impl PartialEq for Rules {
    fn eq(&self, other: &Self) -> bool {
        self.rules.len() == other.rules.len()
            && self
                .rules
                .iter()
                .zip(&other.rules)
                .all(|(a, b)| a.id == b.id && a.policy.to_cedar() == b.policy.to_cedar())
    }
}

impl Rules {
    pub fn new(rules: Vec<Rule>) -> Result<Self, PolicyError> {
        let mut enforced = PolicySet::new();
        let mut everything = PolicySet::new();
        let mut by_id = HashMap::new();
        for (index, rule) in rules.iter().enumerate() {
            if let Some(first) = by_id.insert(rule.id.clone(), index) {
                let first: &Rule = &rules[first];
                return Err(rule.error(format!(
                    "@id({:?}) is also the id of the rule at {}",
                    rule.id,
                    first.place_text()
                )));
            }
            let add = |set: &mut PolicySet| {
                set.add(rule.policy.clone())
                    .map_err(|e| rule.error(e.to_string()))
            };
            if !rule.log_only {
                add(&mut enforced)?;
            }
            add(&mut everything)?;
        }
        let any_log_only = rules.iter().any(|r| r.log_only);
        Ok(Self {
            rules,
            enforced,
            everything: any_log_only.then_some(everything),
            by_id,
            authorizer: Authorizer::new(),
        })
    }

    /// Whether some rule runs in log-only mode.
    pub fn has_log_only(&self) -> bool {
        self.everything.is_some()
    }

    /// Every rule, the log-only ones included, as one set: what validation checks.
    pub fn all(&self) -> &PolicySet {
        self.everything.as_ref().unwrap_or(&self.enforced)
    }

    pub fn get(&self, id: &str) -> Option<&Rule> {
        self.by_id.get(id).map(|&index| &self.rules[index])
    }

    /// Decides one call under the enforced rules, and under every rule where some are
    /// log-only.
    pub fn decide(&self, facts: &Facts<'_>, terms: &Defaults) -> (Outcome, Option<Outcome>) {
        let request = facts.request();
        let entities = facts.entities();
        let enforced = self.outcome(&self.enforced, &request, &entities, facts, terms);
        let log_only = self
            .everything
            .as_ref()
            .map(|set| self.outcome(set, &request, &entities, facts, terms));
        (enforced, log_only)
    }

    fn outcome(
        &self,
        set: &PolicySet,
        request: &Request,
        entities: &Entities,
        facts: &Facts<'_>,
        terms: &Defaults,
    ) -> Outcome {
        let response = self.authorizer.is_authorized(request, set, entities);
        for error in response.diagnostics().errors() {
            tracing::warn!(tool = facts.tool, %error, "a rule could not be evaluated and does not apply");
        }
        let mut matched: Vec<&Rule> = response
            .diagnostics()
            .reason()
            .filter_map(|id| self.get(id.as_ref()))
            .collect();
        // In the order they were written, so the first approval rule leads.
        matched.sort_by_key(|rule| self.by_id[&rule.id]);
        let ids = |rules: &[&Rule]| rules.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
        if response.decision() == Decision::Deny {
            let Some(first) = matched.first() else {
                return Outcome {
                    verdict: Verdict::Deny {
                        reason: format!(
                            "policy v{} has no rule for the tool {}",
                            terms.version, facts.tool
                        ),
                    },
                    rules: Vec::new(),
                };
            };
            let reason = match &first.effect {
                Meaning::Deny {
                    reason: Some(reason),
                } => reason.clone(),
                _ => format!("Refused by the rule {}.", first.id),
            };
            return Outcome {
                verdict: Verdict::Deny { reason },
                rules: ids(&matched),
            };
        }
        let approvals: Vec<&Rule> = matched
            .iter()
            .copied()
            .filter(|r| matches!(r.effect, Meaning::Approve(_)))
            .collect();
        if approvals.is_empty() {
            return Outcome {
                verdict: Verdict::Allow,
                rules: ids(&matched),
            };
        }
        Outcome {
            verdict: Verdict::RequireApproval(requirement(&approvals, terms)),
            rules: ids(&approvals),
        }
    }
}

impl Rule {
    fn place_text(&self) -> String {
        match &self.place {
            Place::Line { file, line } => format!("{file} line {line}"),
            Place::Field(field) => field.clone(),
        }
    }
}

/// What the policy says where a rule does not: its version and its time to decide.
pub struct Defaults {
    pub version: u32,
    pub default_ttl: Duration,
}

/// The requirement of every approval rule that matched: each role with the largest quorum any
/// rule asks of it, the first rule's role leading (its escalation with it), the shortest time
/// to decide, and every distinct reason.
fn requirement(rules: &[&Rule], defaults: &Defaults) -> Requirement {
    let terms: Vec<&Terms> = rules
        .iter()
        .filter_map(|r| match &r.effect {
            Meaning::Approve(terms) => Some(terms),
            _ => None,
        })
        .collect();
    let lead = terms[0];
    let mut needs: Vec<(Role, u8)> = Vec::new();
    for t in &terms {
        match needs.iter_mut().find(|(role, _)| *role == t.role) {
            Some((_, quorum)) => *quorum = (*quorum).max(t.quorum),
            None => needs.push((t.role.clone(), t.quorum)),
        }
    }
    let mut reasons: Vec<String> = Vec::new();
    for (rule, t) in rules.iter().zip(&terms) {
        let reason = t
            .reason
            .clone()
            .unwrap_or_else(|| format!("The rule {} needs a person of role {}.", rule.id, t.role));
        if !reasons.contains(&reason) {
            reasons.push(reason);
        }
    }
    let ttl = terms
        .iter()
        .map(|t| t.ttl.unwrap_or(defaults.default_ttl))
        .min()
        .unwrap_or(defaults.default_ttl);
    let (role, quorum) = needs.remove(0);
    Requirement {
        reason: crate::domain::budget::cut(&reasons.join(" "), MAX_REASON, "reason")
            .unwrap_or_else(|| reasons.join(" ")),
        approver_role: role,
        quorum,
        ttl,
        escalate: lead.escalate.clone(),
        also: needs
            .into_iter()
            .map(|(role, quorum)| super::Need { role, quorum })
            .collect(),
    }
}

/// What one rule set says of a call: the verdict and the rules that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub verdict: Verdict,
    pub rules: Vec<String>,
}

/// A running total over a history window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Total {
    pub count: i64,
    pub sum: i64,
}

/// Who asks, as rules see them: `principal`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Requester<'a> {
    pub name: &'a str,
    pub tenant: &'a str,
    pub roles: Vec<&'a str>,
    /// A token's other claims, as strings: `principal.getTag("department")`.
    pub claims: Vec<(&'a str, String)>,
}

/// Everything a rule may read of one call.
pub struct Facts<'a> {
    pub tool: &'a str,
    pub input: &'a serde_json::Map<String, Value>,
    pub hints: ToolHints,
    pub agent: &'a str,
    pub requester: &'a Requester<'a>,
    /// Every window the policy declares, by name.
    pub history: Vec<(&'a str, Total)>,
    pub at: DateTime<Utc>,
}

impl Facts<'_> {
    fn uid(kind: &str, id: &str) -> EntityUid {
        EntityUid::from_type_name_and_id(
            EntityTypeName::from_str(kind).expect("a plain type name"),
            EntityId::new(id),
        )
    }

    fn request(&self) -> Request {
        let record = |pairs: Vec<(String, RestrictedExpression)>| {
            RestrictedExpression::new_record(pairs).expect("distinct keys")
        };
        let input = record(
            self.input
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), cedar_value(v)?)))
                .collect(),
        );
        let hints = record(vec![
            (
                "read_only".into(),
                RestrictedExpression::new_bool(self.hints.read_only),
            ),
            (
                "destructive".into(),
                RestrictedExpression::new_bool(self.hints.destructive),
            ),
        ]);
        let history = record(
            self.history
                .iter()
                .map(|(name, total)| {
                    (
                        name.to_string(),
                        record(vec![
                            ("count".into(), RestrictedExpression::new_long(total.count)),
                            ("sum".into(), RestrictedExpression::new_long(total.sum)),
                        ]),
                    )
                })
                .collect(),
        );
        let at = self.at;
        let now = record(vec![
            (
                "datetime".into(),
                RestrictedExpression::new_datetime(at.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
            ),
            (
                "date".into(),
                RestrictedExpression::new_string(at.format("%Y-%m-%d").to_string()),
            ),
            (
                "hour".into(),
                RestrictedExpression::new_long(at.hour().into()),
            ),
            (
                "minute".into(),
                RestrictedExpression::new_long(at.minute().into()),
            ),
            (
                "weekday".into(),
                RestrictedExpression::new_long(at.weekday().number_from_monday().into()),
            ),
            (
                "epoch".into(),
                RestrictedExpression::new_long(at.timestamp()),
            ),
        ]);
        let context = Context::from_pairs([
            ("input".to_string(), input),
            ("hints".to_string(), hints),
            ("history".to_string(), history),
            ("now".to_string(), now),
        ])
        .expect("distinct keys");
        Request::new(
            Self::uid("Person", self.requester.name),
            Self::uid("Action", self.tool),
            Self::uid("Agent", self.agent),
            context,
            None,
        )
        .expect("a request without a schema is always made")
    }

    fn entities(&self) -> Entities {
        let requester = self.requester;
        let person = Entity::new_with_tags(
            Self::uid("Person", requester.name),
            [
                (
                    "tenant".to_string(),
                    RestrictedExpression::new_string(requester.tenant.to_string()),
                ),
                (
                    "roles".to_string(),
                    RestrictedExpression::new_set(
                        requester
                            .roles
                            .iter()
                            .map(|r| RestrictedExpression::new_string(r.to_string())),
                    ),
                ),
            ],
            [],
            requester.claims.iter().map(|(k, v)| {
                (
                    k.to_string(),
                    RestrictedExpression::new_string(v.to_string()),
                )
            }),
        )
        .expect("a person's attributes are plain values");
        let agent = Entity::with_uid(Self::uid("Agent", self.agent));
        Entities::from_entities([person, agent], None).expect("two distinct entities")
    }
}

/// A JSON value as Cedar holds it: strings, whole numbers, booleans, sets and records. A
/// fraction or a null has no Cedar form and is left out, as its schema type is.
fn cedar_value(value: &Value) -> Option<RestrictedExpression> {
    match value {
        Value::String(s) => Some(RestrictedExpression::new_string(s.clone())),
        Value::Bool(b) => Some(RestrictedExpression::new_bool(*b)),
        Value::Number(n) => n.as_i64().map(RestrictedExpression::new_long),
        Value::Array(items) => Some(RestrictedExpression::new_set(
            items.iter().filter_map(cedar_value),
        )),
        Value::Object(map) => RestrictedExpression::new_record(
            map.iter()
                .filter_map(|(k, v)| Some((k.clone(), cedar_value(v)?))),
        )
        .ok(),
        Value::Null => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_found_where_they_start_past_comments_and_strings() {
        let text = "// a comment; with a semicolon\n@reason(\"a; b\")\npermit(principal, action, resource);\n\n  forbid(principal, action, resource)\n  when { context.input.note == \"x;y\" };\n";
        let starts = policy_starts(text);
        let lines: Vec<u32> = starts.iter().map(|&s| line_of(text, s)).collect();
        assert_eq!(lines, [2, 5]);
    }

    #[test]
    fn a_literal_escapes_quotes_backslashes_and_control_characters() {
        assert_eq!(literal("a \"b\" \\ c\n"), "\"a \\\"b\\\" \\\\ c\\u{a}\"");
        let set = PolicySet::from_str(&format!(
            "@reason({}) forbid(principal, action, resource);",
            literal("say \"no\"\\\n")
        ))
        .unwrap();
        let policy = set.policies().next().unwrap();
        assert_eq!(policy.annotation("reason"), Some("say \"no\"\\\n"));
    }
}
