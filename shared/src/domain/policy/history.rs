//! History windows, declared in the manifest: the calls of one tool over a time window, counted
//! and summed per requester, per agent or per value of an argument. Rules read them as
//! `context.history.<name>.count` and `.sum`.
//!
//! ```toml
//! [history.sent_1h]
//! tool = "send_transfer"      # the calls counted
//! window = "1h"
//! per = "requester"           # or "agent", or "arg:customer_id": one total per value
//! sum = "amount_cents"        # optional: a running total of this integer argument
//! ```

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::PolicyError;
use crate::domain::args::Args;

/// The shortest and the longest window.
pub const MIN_WINDOW: Duration = Duration::from_secs(60);
pub const MAX_WINDOW: Duration = Duration::from_secs(90 * 24 * 3600);

/// One window, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub name: String,
    pub tool: String,
    pub window: Duration,
    pub per: Per,
    /// The integer argument summed, if any.
    pub sum: Option<String>,
    /// Some rule reads it. A call of another tool than the window's need not read a window no
    /// rule reads: its totals could change no decision.
    pub read_by_rules: bool,
}

/// Whose calls one total counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Per {
    /// The person who asked: each requester has a total.
    Requester,
    /// Every call of the agent, whoever asked.
    Agent,
    /// Each value of the argument: one total per customer, say.
    Arg(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWindow {
    tool: String,
    window: String,
    per: String,
    sum: Option<String>,
}

impl RawWindow {
    pub(super) fn check(self, name: &str) -> Result<Window, PolicyError> {
        let field = format!("history.{name}");
        let fail = |message: String| PolicyError::at(&field, message);
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(fail(
                "a window's name has 1 to 64 letters, digits or '_', and starts with a letter: rules read context.history.<name>".into(),
            ));
        }
        let window = humantime::parse_duration(&self.window)
            .map_err(|e| fail(format!("window {:?}: {e}", self.window)))?;
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&window) {
            return Err(fail(format!(
                "window {:?} must be from 1 minute to 90 days",
                self.window
            )));
        }
        let per = match self.per.as_str() {
            "requester" => Per::Requester,
            "agent" => Per::Agent,
            other => match other.strip_prefix("arg:") {
                Some(arg) if !arg.is_empty() => Per::Arg(arg.to_string()),
                _ => {
                    return Err(fail(format!(
                        "per {other:?} is \"requester\", \"agent\" or \"arg:<argument>\""
                    )));
                }
            },
        };
        Ok(Window {
            name: name.to_string(),
            tool: self.tool,
            window,
            per,
            sum: self.sum,
            read_by_rules: true,
        })
    }
}

/// The longest argument value a subject keeps as it is; a longer one, or one with other
/// characters than letters, digits, '-', '_' and '.', is kept by its SHA-256.
const PLAIN_VALUE: usize = 64;

/// Where one call is counted in a history window: the partition of its window's subject, its
/// place there, and when it was proposed. An approval keeps its call's, so the transaction that
/// settles it voids or rewrites them without reading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistorySlot {
    pub window: String,
    pub pk: String,
    pub seq: u64,
    pub at: DateTime<Utc>,
}

impl Window {
    /// Whose total a call reads and, for a call of this window's tool, counts in: the
    /// requester, the agent, or the call's value of the argument (`None` when it has none: its
    /// total is zero, and it counts nowhere).
    pub fn subject(&self, agent: &str, requester: &str, args: &Args) -> Option<String> {
        match &self.per {
            Per::Requester => Some(format!("requester#{requester}")),
            Per::Agent => Some(format!("agent#{agent}")),
            Per::Arg(arg) => {
                let value = match args.get(arg)? {
                    Value::String(text) => text.clone(),
                    Value::Number(n) if n.is_i64() => n.to_string(),
                    _ => return None,
                };
                let plain = value.len() <= PLAIN_VALUE
                    && value
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                Some(match plain {
                    true => format!("arg#{value}"),
                    false => format!("arg#sha256:{}", hex::encode(Sha256::digest(value))),
                })
            }
        }
    }

    /// What a call adds to the window's sum: its summed argument, or nothing.
    pub fn amount(&self, args: &Args) -> i64 {
        self.sum
            .as_deref()
            .and_then(|sum| args.int(sum))
            .unwrap_or(0)
    }

    /// When the window of a call made at `at` begins: calls made after it count.
    pub fn since(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        let window = chrono::Duration::from_std(self.window).unwrap_or(chrono::Duration::MAX);
        at.checked_sub_signed(window)
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// Checks the window against its tool's input schema: the argument it sums must be a
    /// required whole number, the one it is kept per a required string or whole number.
    pub fn check_tool(&self, schema: &Value) -> Result<(), PolicyError> {
        let field = format!("history.{}", self.name);
        let property = |arg: &str| schema["properties"].get(arg);
        let required = |arg: &str| {
            schema["required"]
                .as_array()
                .is_some_and(|r| r.iter().any(|name| name == arg))
        };
        if let Some(sum) = &self.sum {
            match property(sum) {
                None => {
                    return Err(PolicyError::at(
                        &format!("{field}.sum"),
                        format!("{sum} is not one of {}'s arguments", self.tool),
                    ));
                }
                Some(p) if p["type"] != "integer" || !required(sum) => {
                    return Err(PolicyError::at(
                        &format!("{field}.sum"),
                        format!(
                            "{}'s argument {sum} must be a required integer to be summed",
                            self.tool
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        if let Per::Arg(arg) = &self.per {
            let kept_by =
                property(arg).is_some_and(|p| p["type"] == "string" || p["type"] == "integer");
            if !kept_by || !required(arg) {
                return Err(PolicyError::at(
                    &format!("{field}.per"),
                    format!(
                        "{}'s argument {arg} must be a required string or integer to keep a total per value",
                        self.tool
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn window(per: Per) -> Window {
        Window {
            name: "sent_1h".into(),
            tool: "send_transfer".into(),
            window: Duration::from_secs(3600),
            per,
            sum: Some("amount_cents".into()),
            read_by_rules: true,
        }
    }

    #[test]
    fn a_subject_is_the_requester_the_agent_or_the_value_and_a_long_or_odd_value_its_hash() {
        let args = |to: Value| Args::new(json!({"to": to, "amount_cents": 700})).unwrap();
        let plain = args(json!("acct_1"));
        assert_eq!(
            window(Per::Requester).subject("payments", "lee", &plain),
            Some("requester#lee".into())
        );
        assert_eq!(
            window(Per::Agent).subject("payments", "lee", &plain),
            Some("agent#payments".into())
        );
        let per_to = window(Per::Arg("to".into()));
        assert_eq!(
            per_to.subject("payments", "lee", &plain),
            Some("arg#acct_1".into())
        );
        assert_eq!(
            per_to.subject("payments", "lee", &args(json!(42))),
            Some("arg#42".into())
        );
        // A key's separator, or a value past its share, never reaches the key as it is.
        for odd in ["a#b", &"x".repeat(65)] {
            let subject = per_to
                .subject("payments", "lee", &args(json!(odd)))
                .unwrap();
            assert!(subject.starts_with("arg#sha256:"), "{subject}");
            assert_eq!(subject.len(), "arg#sha256:".len() + 64);
        }
        let without = Args::new(json!({"amount_cents": 700})).unwrap();
        assert_eq!(per_to.subject("payments", "lee", &without), None);
        assert_eq!(per_to.amount(&plain), 700);
        assert_eq!(window(Per::Agent).amount(&without), 700);
    }

    #[test]
    fn a_window_starts_its_length_before_the_call() {
        let at: DateTime<Utc> = "2026-12-07T12:00:00Z".parse().unwrap();
        let since = window(Per::Agent).since(at);
        assert_eq!(
            since,
            "2026-12-07T11:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
    }
}
