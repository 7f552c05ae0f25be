//! The agent's conversation with its model, in the shape of the Messages API with tool use.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::budget::Size;

/// Who says a message: the person side (the task, tool results) or the model; serialized as
/// the Messages API's `role`. Not a person's role ([`crate::domain::ids::Role`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Speaker {
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        content: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Speaker,
    pub content: Vec<Block>,
}

impl Message {
    pub fn user_text(text: impl Into<String>) -> Self {
        Self {
            role: Speaker::User,
            content: vec![Block::Text { text: text.into() }],
        }
    }

    /// The text the model wrote in this message, its blocks joined.
    pub fn text(&self) -> String {
        let parts: Vec<&str> = self
            .content
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } => Some(text.trim()),
                _ => None,
            })
            .filter(|t| !t.is_empty())
            .collect();
        parts.join(" ")
    }

    pub fn tool_uses(&self) -> impl Iterator<Item = ToolUse<'_>> {
        self.content.iter().filter_map(|b| match b {
            Block::ToolUse { id, name, input } => Some(ToolUse { id, name, input }),
            _ => None,
        })
    }
}

/// A tool call the model asked for, borrowed from its message.
#[derive(Debug, Clone, Copy)]
pub struct ToolUse<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub input: &'a Value,
}

/// Why the model stopped writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    ToolUse,
    MaxTokens,
    StopSequence,
    #[serde(other)]
    Other,
}

/// One turn as a model API reports it, recorded in the audit: the model that answered (the API's
/// own id for it, such as a dated version) and the tokens it counted, where it counted them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnUsage {
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
}

/// What one tool call gave back, as the model will read it, and for a call of an MCP server's
/// tool what else the server gave, for the MCP gateway to hand on as it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResultText {
    pub content: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpResult>,
}

/// An MCP server's result beyond the text the model reads: its content blocks (text, images,
/// audio, resources, links), each as the server sent it, and its structured content. Absent
/// parts add nothing to the text: no `content` means the text is the one text block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<Value>,
}

impl McpResult {
    /// What a model reads of an MCP server's result: its text blocks as they are, a line naming
    /// each other block (an image's bytes mean nothing to it), and the structured content as
    /// JSON only when there are no blocks, since a server gives its text form in a block.
    pub fn text_of(blocks: &[Value], structured: Option<&Value>) -> String {
        match (blocks, structured) {
            ([], Some(structured)) => structured.to_string(),
            _ => blocks.iter().map(block_text).collect::<Vec<_>>().join("\n"),
        }
    }
}

/// One MCP content block as a model reads it.
fn block_text(block: &Value) -> String {
    let text = |value: &Value, field: &str| value[field].as_str().unwrap_or_default().to_string();
    // Base64: four characters for three bytes, less one for each `=` that pads the last four.
    let decoded = |value: &Value, field: &str| {
        let data = text(value, field);
        let padding = data.bytes().rev().take_while(|c| *c == b'=').count();
        Size((data.len() / 4 * 3).saturating_sub(padding))
    };
    match block["type"].as_str().unwrap_or_default() {
        "text" => text(block, "text"),
        kind @ ("image" | "audio") => format!(
            "[{kind}: {}, {}]",
            text(block, "mimeType"),
            decoded(block, "data")
        ),
        "resource" => {
            let resource = &block["resource"];
            match resource["text"].as_str() {
                Some(body) => format!("[resource {}]\n{body}", text(resource, "uri")),
                None => format!(
                    "[resource {}: {}, {}]",
                    text(resource, "uri"),
                    text(resource, "mimeType"),
                    decoded(resource, "blob")
                ),
            }
        }
        "resource_link" => format!(
            "[resource link: {} {}]",
            text(block, "name"),
            text(block, "uri")
        ),
        _ => block.to_string(),
    }
}

impl ToolResultText {
    pub fn ok(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
            mcp: None,
        }
    }

    pub fn error(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
            mcp: None,
        }
    }

    pub fn into_block(self, tool_use_id: &str) -> Block {
        Block::ToolResult {
            tool_use_id: tool_use_id.to_string(),
            content: self.content,
            is_error: self.is_error,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_model_reads_each_mcp_block_as_text_or_a_line_naming_it() {
        let blocks = [
            json!({"type": "text", "text": "Two files:"}),
            json!({"type": "resource", "resource": {"uri": "file:///notes.txt", "text": "Ship on Friday."}}),
            json!({"type": "resource", "resource": {"uri": "file:///a.bin", "mimeType": "application/octet-stream", "blob": "AAAAAAAA"}}),
            json!({"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}),
            json!({"type": "resource_link", "name": "plan", "uri": "file:///plan.txt"}),
            json!({"type": "chart", "points": 3}),
        ];

        let told = McpResult::text_of(&blocks, Some(&json!({"files": 2})));

        assert_eq!(
            told,
            "Two files:\n[resource file:///notes.txt]\nShip on Friday.\n\
             [resource file:///a.bin: application/octet-stream, 6 bytes]\n\
             [audio: audio/wav, 3 bytes]\n[resource link: plan file:///plan.txt]\n\
             {\"type\":\"chart\",\"points\":3}"
        );
    }
}
