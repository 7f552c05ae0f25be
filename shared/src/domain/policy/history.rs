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

use serde::Deserialize;
use serde_json::Value;

use super::PolicyError;

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
        })
    }
}

impl Window {
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
