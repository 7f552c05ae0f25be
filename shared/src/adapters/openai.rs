//! OpenAI-compatible Chat Completions as the model port, with tool calls: OpenAI, Azure OpenAI
//! (its `/openai/v1` endpoint), Ollama, vLLM and LiteLLM. The engine keeps its conversation in
//! the Messages API's shape; each turn maps it to Chat Completions messages and the answer back.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::model_api::{self, ApiKey, ModelApi};
use super::secrets::Secrets;
use crate::domain::conversation::{Block, Message, Speaker, StopReason};
use crate::ports::model::{Model, ModelError, ModelReply, ModelRequest, ToolSpec, TurnUsage};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// The environment variable that holds the key unless `[model] api_key_env` names another.
pub const DEFAULT_KEY_VARIABLE: &str = "OPENAI_API_KEY";

pub struct OpenAiModel {
    api: ModelApi,
    url: Url,
    model: String,
    max_tokens: u32,
}

/// Where the API is and how to reach it.
pub struct OpenAiEndpoint<'a> {
    /// Such as `https://api.openai.com/v1` or `http://localhost:11434/v1`; a query (Azure's
    /// `api-version`) is kept.
    pub base_url: &'a str,
    /// What the `${VAR}`s of `base_url` filled in: kept out of errors and answers as the key is.
    pub secrets: Secrets,
    /// The key and the variable it came from; none for a local server that takes no key.
    pub key: Option<(&'a str, &'a str)>,
    pub turn_timeout: Duration,
}

impl OpenAiModel {
    pub fn new(endpoint: OpenAiEndpoint<'_>, model: &str, max_tokens: u32) -> Result<Self, String> {
        let url =
            completions_url(endpoint.base_url).map_err(|why| endpoint.secrets.redact(&why))?;
        let key = endpoint.key.map(|(key, variable)| ApiKey {
            header: AUTHORIZATION,
            prefix: "Bearer ",
            key,
            variable,
        });
        Ok(Self {
            api: ModelApi::new(
                key,
                HeaderMap::new(),
                endpoint.secrets,
                endpoint.turn_timeout,
            )?,
            url,
            model: model.to_string(),
            max_tokens,
        })
    }
}

/// Where turns are posted: `chat/completions` under an http(s) base URL, its query kept. The
/// error never quotes the URL: it may hold what a `${VAR}` filled in.
pub fn completions_url(base_url: &str) -> Result<Url, String> {
    let mut url = Url::parse(base_url)
        .ok()
        .filter(|url| matches!(url.scheme(), "http" | "https") && url.has_host())
        .ok_or("is not an http:// or https:// URL with a host (once ${...} is filled)")?;
    model_api::refuse_credentials(&url)?;
    url.path_segments_mut()
        .map_err(|_| "cannot take a path")?
        .pop_if_empty()
        .extend(["chat", "completions"]);
    Ok(url)
}

#[async_trait]
impl Model for OpenAiModel {
    fn name(&self) -> &str {
        &self.model
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelReply, ModelError> {
        let mut body = json!({
            "model": self.model,
            "max_completion_tokens": self.max_tokens,
            "messages": wire_messages(request.system, request.messages),
        });
        if !request.tools.is_empty() {
            // Some servers refuse an empty list.
            body["tools"] = request.tools.iter().map(wire_tool).collect();
        }
        let answer = self
            .api
            .post(self.url.as_str(), &body, error_message)
            .await?;
        parse_reply(answer, &self.model)
    }
}

fn wire_tool(tool: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.input_schema,
        },
    })
}

/// The conversation as Chat Completions messages: the system prompt first; a model's message
/// with its text and `tool_calls`; the results of its calls as `tool` messages right after it,
/// in order, then any words of the person's side as a `user` message.
fn wire_messages(system: &str, messages: &[Message]) -> Vec<Value> {
    let mut wire = Vec::new();
    if !system.trim().is_empty() {
        wire.push(json!({"role": "system", "content": system}));
    }
    for message in messages {
        let text = message.text();
        match message.role {
            Speaker::Assistant => {
                let calls: Vec<Value> = message
                    .tool_uses()
                    .map(|call| {
                        json!({
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": arguments_text(call.input)},
                        })
                    })
                    .collect();
                let mut out = json!({"role": "assistant", "content": Value::Null});
                if !text.is_empty() {
                    out["content"] = Value::String(text);
                }
                if !calls.is_empty() {
                    out["tool_calls"] = Value::Array(calls);
                }
                wire.push(out);
            }
            Speaker::User => {
                for block in &message.content {
                    if let Block::ToolResult {
                        tool_use_id,
                        content,
                        ..
                    } = block
                    {
                        wire.push(
                            json!({"role": "tool", "tool_call_id": tool_use_id, "content": content}),
                        );
                    }
                }
                if !text.is_empty() {
                    wire.push(json!({"role": "user", "content": text}));
                }
            }
        }
    }
    wire
}

/// A call's arguments as the model wrote them: its own text again when it was not JSON.
fn arguments_text(input: &Value) -> String {
    match input {
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
    }
}

/// The words of an error body: `{"error": {"message": ...}}` (OpenAI, Azure, vLLM, LiteLLM) or
/// `{"error": "..."}` (Ollama).
fn error_message(body: &Value) -> Option<String> {
    let error = &body["error"];
    error["message"]
        .as_str()
        .or_else(|| error.as_str())
        .map(str::to_string)
}

#[derive(Deserialize)]
struct RawReply {
    model: Option<String>,
    #[serde(default)]
    choices: Vec<RawChoice>,
    usage: Option<RawUsage>,
}

#[derive(Deserialize)]
struct RawChoice {
    message: RawMessage,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct RawMessage {
    #[serde(default)]
    content: Value,
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Vec<RawToolCall>,
}

#[derive(Deserialize)]
struct RawToolCall {
    id: Option<String>,
    function: RawFunction,
}

#[derive(Deserialize)]
struct RawFunction {
    name: String,
    /// A JSON text by the specification; some servers send the object itself.
    #[serde(default)]
    arguments: Value,
}

#[derive(Deserialize)]
struct RawUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

/// The first choice as the engine's blocks. A refusal is the turn's text. Arguments that are not
/// JSON are kept as the model's text, a string, which the engine refuses as not an object and
/// tells the model so, as a plain result: the run goes on.
fn parse_reply(answer: Value, asked: &str) -> Result<ModelReply, ModelError> {
    let raw: RawReply =
        serde_json::from_value(answer).map_err(|e| ModelError::BadReply(e.to_string()))?;
    let choice = raw
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| ModelError::BadReply("the answer has no choices".into()))?;
    let message = choice.message;
    let mut content = Vec::new();
    let words = [content_text(&message.content), message.refusal];
    for text in words.into_iter().flatten() {
        if !text.trim().is_empty() {
            content.push(Block::Text { text });
        }
    }
    let calls = message.tool_calls.len();
    for (n, call) in message.tool_calls.into_iter().enumerate() {
        let id = call
            .id
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| format!("call_{n}_{:016x}", rand::random::<u64>()));
        content.push(Block::ToolUse {
            id,
            name: call.function.name,
            input: arguments(call.function.arguments),
        });
    }
    let stop_reason = match choice.finish_reason.as_deref() {
        Some("tool_calls" | "function_call") => StopReason::ToolUse,
        Some("length") => StopReason::MaxTokens,
        Some("stop") | None if calls > 0 => StopReason::ToolUse,
        Some("stop") | None => StopReason::EndTurn,
        Some(_) => StopReason::Other,
    };
    let usage = raw.usage.as_ref();
    Ok(ModelReply {
        content,
        stop_reason,
        usage: Some(TurnUsage {
            model: raw.model.unwrap_or_else(|| asked.to_string()),
            input_tokens: usage.and_then(|u| u.prompt_tokens),
            output_tokens: usage.and_then(|u| u.completion_tokens),
        }),
    })
}

/// A message's content: a string, or (some servers) a list of text parts.
fn content_text(content: &Value) -> Option<String> {
    match content {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
            Some(texts.join(""))
        }
        _ => None,
    }
}

fn arguments(raw: Value) -> Value {
    match raw {
        Value::String(text) if text.trim().is_empty() => Value::Object(Map::new()),
        Value::String(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        Value::Null => Value::Object(Map::new()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::conversation::ToolResultText;

    #[test]
    fn a_paused_turn_goes_out_as_tool_calls_then_one_tool_message_each_in_order() {
        let messages = vec![
            Message::user_text("Refund ord_55."),
            Message {
                role: Speaker::Assistant,
                content: vec![
                    Block::Text {
                        text: "Reading it.".into(),
                    },
                    Block::ToolUse {
                        id: "call_a".into(),
                        name: "get_order".into(),
                        input: json!({"order_id": "ord_55"}),
                    },
                    Block::ToolUse {
                        id: "call_b".into(),
                        name: "issue_refund".into(),
                        input: Value::String("{not json".into()),
                    },
                ],
            },
            Message {
                role: Speaker::User,
                content: vec![
                    ToolResultText::ok("{\"id\":\"ord_55\"}").into_block("call_a"),
                    ToolResultText::error("not executed").into_block("call_b"),
                ],
            },
        ];
        let wire = wire_messages("Be careful.", &messages);
        assert_eq!(
            wire,
            vec![
                json!({"role": "system", "content": "Be careful."}),
                json!({"role": "user", "content": "Refund ord_55."}),
                json!({"role": "assistant", "content": "Reading it.", "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "get_order", "arguments": "{\"order_id\":\"ord_55\"}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "issue_refund", "arguments": "{not json"}},
                ]}),
                json!({"role": "tool", "tool_call_id": "call_a", "content": "{\"id\":\"ord_55\"}"}),
                json!({"role": "tool", "tool_call_id": "call_b", "content": "not executed"}),
            ]
        );
    }

    #[test]
    fn arguments_are_read_from_text_or_an_object_and_kept_as_text_when_not_json() {
        assert_eq!(arguments(json!("{\"a\":1}")), json!({"a": 1}));
        assert_eq!(arguments(json!({"a": 1})), json!({"a": 1}));
        assert_eq!(arguments(json!("")), json!({}));
        assert_eq!(arguments(json!("{\"a\":")), json!("{\"a\":"));
    }

    #[test]
    fn a_base_url_with_a_query_keeps_it_after_the_path() {
        let url = completions_url("https://acme.openai.azure.com/openai/v1/?api-version=preview");
        assert_eq!(
            url.unwrap().as_str(),
            "https://acme.openai.azure.com/openai/v1/chat/completions?api-version=preview"
        );
        assert_eq!(
            completions_url("http://127.0.0.1:11434/v1")
                .unwrap()
                .as_str(),
            "http://127.0.0.1:11434/v1/chat/completions"
        );
        assert!(completions_url("localhost:11434").is_err());
    }

    #[test]
    fn a_base_url_with_credentials_is_refused_without_quoting_them() {
        for base in [
            "https://user:pw-secret-1@llm.example/v1",
            "https://only-user@llm.example/v1",
        ] {
            let error = completions_url(base).unwrap_err();
            assert!(error.starts_with("carries credentials"), "{error}");
            assert!(!error.contains("pw-secret-1") && !error.contains("only-user"));
        }
    }

    #[test]
    fn a_bad_base_url_filled_from_the_environment_is_not_quoted() {
        let mut secrets = Secrets::default();
        secrets.add_variable("LLM_URL", "ftp://llm-secret-host.example");
        let endpoint = OpenAiEndpoint {
            base_url: "ftp://llm-secret-host.example/v1",
            secrets,
            key: None,
            turn_timeout: Duration::from_secs(10),
        };
        let error = OpenAiModel::new(endpoint, "gpt-4o", 16).err().unwrap();
        assert!(error.starts_with("is not an http"), "{error}");
        assert!(!error.contains("llm-secret-host"), "{error}");
    }
}
