//! A policy's test cases: calls and what policy must make of them, for a team to hold its rules
//! to in CI (`countersign policy test`). Each case is a tool, its arguments, who asks (a person
//! of the people file), optionally the tool's hints, token claims, history totals and the time,
//! and the expected outcome; approval cases may pin the role, the quorum, the reason and the
//! rules too.
//!
//! ```toml
//! [[case]]
//! name = "a large transfer needs finance"
//! tool = "send_transfer"
//! args = { to = "acct_1", amount_cents = 60000 }
//! as = "lee"
//! history = { sent_1h = { count = 2, sum = 40000 } }
//! expect = "approve"
//! role = "finance"
//! ```

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;

use super::cedar::{Requester, Total};
use super::{CallFacts, Policy, Ruling, ToolHints, Verdict, VerdictKind};
use crate::domain::args::Args;
use crate::domain::identity::Directory;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cases {
    #[serde(rename = "case", default)]
    pub cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: Option<String>,
    pub tool: String,
    #[serde(default = "empty_args")]
    pub args: Value,
    #[serde(rename = "as")]
    pub person: String,
    #[serde(default)]
    pub hints: ToolHints,
    #[serde(default)]
    pub claims: BTreeMap<String, String>,
    #[serde(default)]
    pub history: BTreeMap<String, RawTotal>,
    /// When the call is made (RFC 3339); now if not given.
    pub at: Option<DateTime<Utc>>,
    pub expect: VerdictKind,
    pub role: Option<String>,
    pub quorum: Option<u8>,
    pub reason: Option<String>,
    pub rules: Option<Vec<String>>,
}

fn empty_args() -> Value {
    Value::Object(Default::default())
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTotal {
    #[serde(default)]
    pub count: i64,
    #[serde(default)]
    pub sum: i64,
}

/// One case that did not hold: what was expected, what policy said, and why.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The case's name, or its number and tool.
    pub case: String,
    pub problems: Vec<String>,
    /// What policy decided, when it got that far.
    pub ruling: Option<Box<Ruling>>,
}

/// The gate a real call passes before policy (a tool of the agent, arguments that match its
/// schema): the checked arguments and the tool's hints, or why not.
pub type CheckCall<'a> = &'a dyn Fn(&str, Value) -> Result<(Args, ToolHints), String>;

impl Cases {
    pub fn from_toml(text: &str) -> Result<Self, String> {
        crate::domain::toml_text::from_str(text).map_err(|e| e.to_string())
    }

    /// Runs every case against `policy` for `agent`, people from `people`; `check` is the gate
    /// a real call passes first (the tool's input schema), giving the checked arguments and the
    /// tool's hints. Returns the failures, in order.
    pub fn run(
        &self,
        policy: &Policy,
        agent: &str,
        people: &Directory,
        check: CheckCall<'_>,
    ) -> Vec<Failure> {
        let mut failures = Vec::new();
        for (index, case) in self.cases.iter().enumerate() {
            let label = case
                .name
                .clone()
                .unwrap_or_else(|| format!("case {} ({})", index + 1, case.tool));
            let (problems, ruling) = match case.run(policy, agent, people, check) {
                Ok((problems, ruling)) => (problems, Some(Box::new(ruling))),
                Err(problem) => (vec![problem], None),
            };
            if !problems.is_empty() {
                failures.push(Failure {
                    case: label,
                    problems,
                    ruling,
                });
            }
        }
        failures
    }
}

impl Case {
    fn run(
        &self,
        policy: &Policy,
        agent: &str,
        people: &Directory,
        check: CheckCall<'_>,
    ) -> Result<(Vec<String>, Ruling), String> {
        let person = people
            .people
            .iter()
            .find(|p| p.name.as_str() == self.person)
            .ok_or_else(|| format!("{:?} is not in the people file", self.person))?;
        if let Some(window) = self
            .history
            .keys()
            .find(|w| !policy.history.contains_key(*w))
        {
            return Err(format!(
                "history names the window {window}, which the policy does not declare"
            ));
        }
        let (args, listed) = check(&self.tool, self.args.clone())?;
        let hints = ToolHints {
            read_only: self.hints.read_only || listed.read_only,
            destructive: self.hints.destructive || listed.destructive,
        };
        let requester = Requester {
            name: person.name.as_str(),
            tenant: person.tenant.as_str(),
            roles: person.roles.iter().map(|r| r.as_str()).collect(),
            claims: self
                .claims
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone()))
                .collect(),
        };
        let history = self
            .history
            .iter()
            .map(|(name, t)| {
                let total = Total {
                    count: t.count,
                    sum: t.sum,
                };
                (name.clone(), total)
            })
            .collect();
        let ruling = policy.decide(&CallFacts {
            tool: &self.tool,
            args: &args,
            hints,
            agent,
            requester: &requester,
            history: &history,
            at: self.at.unwrap_or_else(Utc::now),
        });
        Ok((self.problems(&ruling), ruling))
    }

    /// Where the ruling differs from what the case expects.
    fn problems(&self, ruling: &Ruling) -> Vec<String> {
        let mut problems = Vec::new();
        let got = VerdictKind::of(&ruling.verdict);
        if got != self.expect {
            problems.push(format!(
                "expected {}, got {}",
                self.expect.name(),
                got.name()
            ));
        }
        let requirement = match &ruling.verdict {
            Verdict::RequireApproval(requirement) => Some(requirement),
            _ => None,
        };
        if let (Some(role), Some(r)) = (&self.role, requirement)
            && r.approver_role.as_str() != role
        {
            problems.push(format!("expected role {role}, got {}", r.approver_role));
        }
        if let (Some(quorum), Some(r)) = (self.quorum, requirement)
            && r.quorum != quorum
        {
            problems.push(format!("expected quorum {quorum}, got {}", r.quorum));
        }
        if let Some(reason) = &self.reason {
            let said = match &ruling.verdict {
                Verdict::RequireApproval(r) => Some(&r.reason),
                Verdict::Deny { reason } => Some(reason),
                Verdict::Allow => None,
            };
            if said != Some(reason) {
                problems.push(format!(
                    "expected the reason {reason:?}, got {}",
                    said.map_or("none".to_string(), |s| format!("{s:?}"))
                ));
            }
        }
        if let Some(rules) = &self.rules
            && *rules != ruling.rules
        {
            problems.push(format!(
                "expected the rules [{}], got [{}]",
                rules.join(", "),
                ruling.rules.join(", ")
            ));
        }
        problems
    }
}
