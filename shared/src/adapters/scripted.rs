//! A model that replays a conversation from a file: the calls to propose, turn by turn, and
//! the final answer. It plays any agent definition offline, for demos and tests. What it is
//! told between turns does not change what it proposes next; the task it was given chooses
//! which conversation it plays, and placeholders put the task's words into it.
//!
//! ```toml
//! [[turns]]
//! say = "I'll look up the order: {task}"
//! calls = [{ tool = "get_order", args = { order_id = "ord_55" } }]
//!
//! [[turns]]
//! say = "The refund came back: {last_result}"
//!
//! # A task the pattern matches plays these turns instead (the first case that matches wins).
//! [[cases]]
//! when = 'order (?<order>ord_\w+)'
//!
//! [[cases.turns]]
//! say = "I'll look up order {order}."
//! calls = [{ tool = "get_order", args = { order_id = "{order}" } }]
//!
//! [[cases.turns]]
//! say = "Order {order}: {last_result}"
//! ```
//!
//! `turns` is the conversation for any task; each of `cases` has its own for the tasks its
//! `when` matches, a regular expression searched for in the task. In `say` and in every text of
//! a call's `args`, `{task}` is the task, `{last_result}` the last result the agent was told,
//! and `{name}` what the case's named group `(?<name>…)` matched. A placeholder the script does
//! not have is refused when the script is loaded.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use crate::domain::conversation::{Block, Speaker, StopReason};
use crate::ports::model::{Model, ModelError, ModelReply, ModelRequest};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// The conversation of a task no case matches.
    pub turns: Vec<Turn>,
    /// Conversations of the tasks their pattern matches, tried in order.
    #[serde(default)]
    pub cases: Vec<Case>,
}

/// The conversation played for the tasks `when` matches.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub when: Pattern,
    pub turns: Vec<Turn>,
}

/// A regular expression searched for in the task; its named groups are placeholders.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "String")]
pub struct Pattern(regex_lite::Regex);

impl TryFrom<String> for Pattern {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        regex_lite::Regex::new(&text)
            .map(Pattern)
            .map_err(|e| format!("{text:?} is not a regular expression: {e}"))
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

/// One reply: what the agent says, and the calls it proposes (none on the last turn).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    pub say: String,
    #[serde(default)]
    pub calls: Vec<ScriptedCall>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    pub tool: String,
    #[serde(default = "empty_args")]
    pub args: Value,
}

fn empty_args() -> Value {
    Value::Object(Default::default())
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScriptError(String);

/// The placeholders every conversation has.
const TASK: &str = "task";
const LAST_RESULT: &str = "last_result";

impl Script {
    pub fn from_toml(text: &str) -> Result<Self, ScriptError> {
        let script: Script =
            crate::domain::toml_text::from_str(text).map_err(|e| ScriptError(e.to_string()))?;
        check_turns("turns", &script.turns, &[])?;
        for (n, case) in script.cases.iter().enumerate() {
            let groups: Vec<&str> = case.when.0.capture_names().flatten().collect();
            check_turns(&format!("cases[{n}].turns"), &case.turns, &groups)?;
        }
        Ok(script)
    }

    /// Every tool the script calls, so a definition can check it has them.
    pub fn tools(&self) -> impl Iterator<Item = &str> {
        self.conversations()
            .flatten()
            .flat_map(|t| t.calls.iter().map(|c| c.tool.as_str()))
    }

    fn conversations(&self) -> impl Iterator<Item = &[Turn]> {
        std::iter::once(self.turns.as_slice()).chain(self.cases.iter().map(|c| c.turns.as_slice()))
    }

    /// The conversation for `task`, with the placeholders its case's pattern captured.
    fn for_task<'a>(&'a self, task: &'a str) -> (&'a [Turn], Vec<(&'a str, &'a str)>) {
        for case in &self.cases {
            if let Some(found) = case.when.0.captures(task) {
                let captured = case
                    .when
                    .0
                    .capture_names()
                    .flatten()
                    .map(|name| (name, found.name(name).map_or("", |m| m.as_str())))
                    .collect();
                return (&case.turns, captured);
            }
        }
        (&self.turns, Vec::new())
    }
}

/// A conversation has at least one turn, each call's args is a table, and every placeholder
/// is `{task}`, `{last_result}` or one of `groups`.
fn check_turns(field: &str, turns: &[Turn], groups: &[&str]) -> Result<(), ScriptError> {
    if turns.is_empty() {
        return Err(ScriptError(format!(
            "{field}: a conversation needs at least one turn"
        )));
    }
    let known = |name: &str| name == TASK || name == LAST_RESULT || groups.contains(&name);
    for (n, turn) in turns.iter().enumerate() {
        let mut texts = vec![turn.say.as_str()];
        for call in &turn.calls {
            if !call.args.is_object() {
                return Err(ScriptError(format!(
                    "{field}[{n}]: every call's args is a table"
                )));
            }
            texts.extend(strings(&call.args));
        }
        if let Some(unknown) = texts
            .into_iter()
            .flat_map(placeholders)
            .find(|name| !known(name))
        {
            let names: Vec<&str> = [TASK, LAST_RESULT]
                .into_iter()
                .chain(groups.iter().copied())
                .collect();
            return Err(ScriptError(format!(
                "{field}[{n}]: {{{unknown}}} is not a placeholder here; there are {}",
                names
                    .iter()
                    .map(|n| format!("{{{n}}}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(())
}

/// Every text inside a JSON value.
fn strings(value: &Value) -> Vec<&str> {
    match value {
        Value::String(text) => vec![text],
        Value::Array(items) => items.iter().flat_map(strings).collect(),
        Value::Object(fields) => fields.values().flat_map(strings).collect(),
        _ => Vec::new(),
    }
}

/// The names of the `{name}` placeholders in a text (a name: letters, digits and `_`).
fn placeholders(text: &str) -> impl Iterator<Item = &str> {
    text.split('{').skip(1).filter_map(|rest| {
        let name = &rest[..rest.find('}')?];
        let is_name =
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        is_name.then_some(name)
    })
}

/// `text` with each `{name}` of `values` filled in, in one pass: a value's own braces (a task
/// that says `{last_result}`) stay as they are.
fn fill(text: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let value = after.find('}').and_then(|close| {
            let (_, value) = values.iter().find(|(name, _)| *name == &after[..close])?;
            Some((value, close))
        });
        match value {
            Some((value, close)) => {
                out.push_str(value);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `args` with each of its texts filled in.
fn fill_args(args: &Value, values: &[(&str, &str)]) -> Value {
    match args {
        Value::String(text) => Value::String(fill(text, values)),
        Value::Array(items) => Value::Array(items.iter().map(|v| fill_args(v, values)).collect()),
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(name, v)| (name.clone(), fill_args(v, values)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The model that plays a [`Script`].
pub struct ScriptedModel {
    name: String,
    script: Script,
}

impl ScriptedModel {
    pub fn new(name: impl Into<String>, script: Script) -> Self {
        Self {
            name: name.into(),
            script,
        }
    }
}

/// The content of the newest tool result in the conversation.
fn last_result(request: &ModelRequest<'_>) -> Option<String> {
    request.messages.iter().rev().find_map(|message| {
        message.content.iter().rev().find_map(|block| match block {
            Block::ToolResult { content, .. } => Some(content.clone()),
            _ => None,
        })
    })
}

/// The task: what the conversation's first message asked.
fn task(request: &ModelRequest<'_>) -> String {
    request
        .messages
        .iter()
        .find(|m| m.role == Speaker::User)
        .map(|m| m.text())
        .unwrap_or_default()
}

#[async_trait]
impl Model for ScriptedModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelReply, ModelError> {
        let turn = request.turn();
        let task = task(&request);
        let (turns, captured) = self.script.for_task(&task);
        // Past its end, the script repeats its last words and proposes nothing more.
        let (step, calls) = match turns.get(turn) {
            Some(step) => (step, step.calls.as_slice()),
            None => (&turns[turns.len() - 1], &[][..]),
        };
        let told = last_result(&request).unwrap_or_default();
        let mut values = vec![(TASK, task.as_str()), (LAST_RESULT, told.as_str())];
        values.extend(captured);
        let mut content = vec![Block::Text {
            text: fill(&step.say, &values),
        }];
        content.extend(calls.iter().enumerate().map(|(n, call)| Block::ToolUse {
            id: format!("toolu_script_{turn}_{n}"),
            name: call.tool.clone(),
            input: fill_args(&call.args, &values),
        }));
        let stop_reason = if calls.is_empty() {
            StopReason::EndTurn
        } else {
            StopReason::ToolUse
        };
        Ok(ModelReply {
            content,
            stop_reason,
            usage: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::conversation::{Message, ToolResultText};
    use serde_json::json;

    const SCRIPT: &str = r#"
        [[turns]]
        say = "I'll look up order ord_55."
        calls = [{ tool = "get_order", args = { order_id = "ord_55" } }]

        [[turns]]
        say = "Refunded: {last_result}"
    "#;

    fn request(messages: &[Message]) -> ModelRequest<'_> {
        ModelRequest {
            system: "",
            tools: &[],
            messages,
        }
    }

    #[tokio::test]
    async fn it_proposes_the_scripted_calls_then_answers_with_the_last_result() {
        let model = ScriptedModel::new("refunds-script", Script::from_toml(SCRIPT).unwrap());
        let mut messages = vec![Message::user_text("Refund order ord_55.")];
        let first = model.respond(request(&messages)).await.unwrap();
        assert_eq!(first.stop_reason, StopReason::ToolUse);
        let Block::ToolUse { id, name, input } = &first.content[1] else {
            panic!("a call: {first:?}")
        };
        assert_eq!(
            (name.as_str(), input),
            ("get_order", &json!({"order_id": "ord_55"}))
        );
        let id = id.clone();
        messages.push(Message {
            role: Speaker::Assistant,
            content: first.content,
        });
        messages.push(Message {
            role: Speaker::User,
            content: vec![ToolResultText::ok("75.00 USD").into_block(&id)],
        });
        let last = model.respond(request(&messages)).await.unwrap();
        assert_eq!(last.stop_reason, StopReason::EndTurn);
        assert_eq!(
            last.content,
            vec![Block::Text {
                text: "Refunded: 75.00 USD".into()
            }]
        );
    }

    const CASES: &str = r#"
        [[turns]]
        say = "Asked: {task}"

        [[cases]]
        when = 'refund (?<order>ord_\w+) of USD (?<usd>\d+)'

        [[cases.turns]]
        say = "Refunding USD {usd} of {order}."
        calls = [{ tool = "issue_refund", args = { order_id = "{order}", note = ["{task}"], amount_cents = 100 } }]

        [[cases]]
        when = 'ord_'

        [[cases.turns]]
        say = "Some order: {task}"
    "#;

    /// The first reply of a model playing `script` for `task`.
    async fn first_reply(script: &str, task: &str) -> ModelReply {
        let model = ScriptedModel::new("cases", Script::from_toml(script).unwrap());
        model
            .respond(request(&[Message::user_text(task)]))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_first_case_whose_pattern_matches_the_task_plays_with_its_captures_filled_in() {
        let task = "Please refund ord_77 of USD 40.";

        let reply = first_reply(CASES, task).await;

        assert_eq!(
            reply.content,
            vec![
                Block::Text {
                    text: "Refunding USD 40 of ord_77.".into()
                },
                Block::ToolUse {
                    id: "toolu_script_0_0".into(),
                    name: "issue_refund".into(),
                    input: json!({"order_id": "ord_77", "note": [task], "amount_cents": 100}),
                },
            ]
        );
        let other = first_reply(CASES, "Look at ord_9.").await;
        assert_eq!(
            other.content,
            vec![Block::Text {
                text: "Some order: Look at ord_9.".into()
            }]
        );
    }

    #[tokio::test]
    async fn a_task_no_case_matches_plays_the_turns_and_its_own_braces_stay_as_written() {
        let task = "Say {last_result} and {order}.";

        let reply = first_reply(CASES, task).await;

        assert_eq!(
            reply.content,
            vec![Block::Text {
                text: format!("Asked: {task}")
            }]
        );
        assert_eq!(reply.stop_reason, StopReason::EndTurn);
    }

    #[test]
    fn a_placeholder_the_script_does_not_have_is_refused_where_it_is_written() {
        let unknown = "[[turns]]\nsay = \"x\"\n\n[[cases]]\nwhen = 'ord_(?<order>\\d+)'\n\n[[cases.turns]]\nsay = \"ok\"\ncalls = [{ tool = \"t\", args = { id = \"{ordr}\" } }]\n";
        let error = Script::from_toml(unknown).unwrap_err().to_string();
        assert!(error.contains("cases[0].turns[0]"), "{error}");
        assert!(error.contains("{ordr}"), "{error}");
        assert!(error.contains("{order}"), "{error}");
        // Outside a case there are only the task and the last result.
        let outside = "[[turns]]\nsay = \"{order}\"\n";
        assert!(
            Script::from_toml(outside)
                .unwrap_err()
                .to_string()
                .contains("turns[0]")
        );
        // Braces around anything but a name are text.
        assert!(Script::from_toml("[[turns]]\nsay = '{\"a\": 1} { }'\n").is_ok());
    }

    #[test]
    fn a_bad_pattern_or_a_case_without_turns_is_refused() {
        let bad = "[[turns]]\nsay = \"x\"\n[[cases]]\nwhen = '(unclosed'\nturns = []\n";
        assert!(
            Script::from_toml(bad)
                .unwrap_err()
                .to_string()
                .contains("not a regular expression")
        );
        let empty = "[[turns]]\nsay = \"x\"\n[[cases]]\nwhen = 'x'\nturns = []\n";
        assert!(
            Script::from_toml(empty)
                .unwrap_err()
                .to_string()
                .contains("cases[0].turns")
        );
    }

    #[test]
    fn an_empty_script_or_an_unknown_field_is_refused() {
        assert!(Script::from_toml("turns = []").is_err());
        let extra = "[[turns]]\nsay = \"x\"\nwait = 1\n";
        assert!(
            Script::from_toml(extra)
                .unwrap_err()
                .to_string()
                .contains("wait")
        );
    }
}
