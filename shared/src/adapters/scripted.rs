//! A model that replays a conversation from a file: the calls to propose, turn by turn, and
//! the final answer. It plays any agent definition offline, for demos and tests; what it is told
//! between turns does not change what it proposes next, only `{last_result}` in its words.
//!
//! ```toml
//! [[turns]]
//! say = "I'll look up order ord_55."
//! calls = [{ tool = "get_order", args = { order_id = "ord_55" } }]
//!
//! [[turns]]
//! say = "The refund came back: {last_result}"
//! ```

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use crate::domain::conversation::{Block, StopReason};
use crate::ports::model::{Model, ModelError, ModelReply, ModelRequest};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    pub turns: Vec<Turn>,
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

impl Script {
    pub fn from_toml(text: &str) -> Result<Self, ScriptError> {
        let script: Script = toml::from_str(text).map_err(|e| ScriptError(e.to_string()))?;
        if script.turns.is_empty() {
            return Err(ScriptError("a script needs at least one turn".into()));
        }
        if let Some(n) = script
            .turns
            .iter()
            .position(|t| !t.calls.iter().all(|c| c.args.is_object()))
        {
            return Err(ScriptError(format!(
                "turns[{n}]: every call's args is a table"
            )));
        }
        Ok(script)
    }

    /// Every tool the script calls, so a definition can check it has them.
    pub fn tools(&self) -> impl Iterator<Item = &str> {
        self.turns
            .iter()
            .flat_map(|t| t.calls.iter().map(|c| c.tool.as_str()))
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

#[async_trait]
impl Model for ScriptedModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelReply, ModelError> {
        let turn = request.turn();
        // Past its end, the script repeats its last words and proposes nothing more.
        let last = self.script.turns.len() - 1;
        let (step, calls) = match self.script.turns.get(turn) {
            Some(step) => (step, step.calls.as_slice()),
            None => (&self.script.turns[last], &[][..]),
        };
        let told = last_result(&request).unwrap_or_default();
        let mut content = vec![Block::Text {
            text: step.say.replace("{last_result}", &told),
        }];
        content.extend(calls.iter().enumerate().map(|(n, call)| Block::ToolUse {
            id: format!("toolu_script_{turn}_{n}"),
            name: call.tool.clone(),
            input: call.args.clone(),
        }));
        let stop_reason = if calls.is_empty() {
            StopReason::EndTurn
        } else {
            StopReason::ToolUse
        };
        Ok(ModelReply {
            content,
            stop_reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::conversation::Speaker;
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
