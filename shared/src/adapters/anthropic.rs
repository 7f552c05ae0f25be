//! The Anthropic Messages API as the model port, over reqwest with tool use.

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::model_api::{self, ApiKey, DEFAULT_TURN_TIMEOUT, ModelApi};
use super::secrets::Secrets;
use crate::domain::conversation::{Block, StopReason};
use crate::ports::model::{Model, ModelError, ModelReply, ModelRequest, TurnUsage};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-5";
/// The variable that holds the API key.
pub const KEY_VARIABLE: &str = "ANTHROPIC_API_KEY";
const API_VERSION: &str = "2023-06-01";

pub struct AnthropicModel {
    api: ModelApi,
    base_url: String,
    model: String,
    max_tokens: u32,
}

impl AnthropicModel {
    /// A client of the API at `base_url`. Panics on a key that is no header value: for tests.
    pub fn new(api_key: &str, model: &str, base_url: &str) -> Self {
        Self::with_turn_timeout(api_key, model, base_url, DEFAULT_TURN_TIMEOUT)
            .expect("a key that is a header value")
    }

    pub fn with_turn_timeout(
        api_key: &str,
        model: &str,
        base_url: &str,
        turn_timeout: Duration,
    ) -> Result<Self, String> {
        let mut headers = HeaderMap::new();
        headers.insert("anthropic-version", HeaderValue::from_static(API_VERSION));
        let key = ApiKey {
            header: HeaderName::from_static("x-api-key"),
            prefix: "",
            key: api_key,
            variable: KEY_VARIABLE,
        };
        if let Ok(url) = reqwest::Url::parse(base_url) {
            model_api::refuse_credentials(&url)
                .map_err(|why| format!("ANTHROPIC_BASE_URL {why}"))?;
        }
        Ok(Self {
            api: ModelApi::new(Some(key), headers, Secrets::default(), turn_timeout)?,
            base_url: base_url.trim_end_matches('/').to_string(),
            model: model.to_string(),
            max_tokens: 1024,
        })
    }

    /// For one agent definition when `ANTHROPIC_API_KEY` is set: its model id (unless
    /// `ANTHROPIC_MODEL` overrides every agent's), the endpoint from `ANTHROPIC_BASE_URL` (else
    /// Anthropic's), its most tokens per reply and its time per turn.
    pub fn from_env_for(
        model: &str,
        max_tokens: u32,
        turn_timeout: Duration,
    ) -> Result<Option<Self>, String> {
        let Some(key) = std::env::var(KEY_VARIABLE)
            .ok()
            .filter(|k| !k.trim().is_empty())
        else {
            return Ok(None);
        };
        let model = std::env::var("ANTHROPIC_MODEL").unwrap_or_else(|_| model.to_string());
        let base =
            std::env::var("ANTHROPIC_BASE_URL").unwrap_or_else(|_| DEFAULT_BASE_URL.to_string());
        let mut this = Self::with_turn_timeout(key.trim(), &model, &base, turn_timeout)?;
        this.max_tokens = max_tokens;
        Ok(Some(this))
    }
}

#[derive(Deserialize)]
struct RawReply {
    content: Vec<Value>,
    stop_reason: Option<StopReason>,
    model: Option<String>,
    usage: Option<RawUsage>,
}

#[derive(Deserialize)]
struct RawUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

/// The words of an error body: `{"type": "error", "error": {"message": ...}}`.
fn error_message(body: &Value) -> Option<String> {
    body["error"]["message"].as_str().map(str::to_string)
}

/// Keeps the text and tool-use blocks; other block kinds do not go back into the conversation.
fn parse_reply(answer: Value, asked: &str) -> Result<ModelReply, ModelError> {
    let raw: RawReply =
        serde_json::from_value(answer).map_err(|e| ModelError::BadReply(e.to_string()))?;
    let mut content = Vec::new();
    for block in raw.content {
        match block["type"].as_str() {
            Some("text") | Some("tool_use") => content.push(
                serde_json::from_value::<Block>(block)
                    .map_err(|e| ModelError::BadReply(e.to_string()))?,
            ),
            _ => {}
        }
    }
    let usage = raw.usage.as_ref();
    Ok(ModelReply {
        content,
        stop_reason: raw.stop_reason.unwrap_or(StopReason::EndTurn),
        usage: Some(TurnUsage {
            model: raw.model.unwrap_or_else(|| asked.to_string()),
            input_tokens: usage.and_then(|u| u.input_tokens),
            output_tokens: usage.and_then(|u| u.output_tokens),
        }),
    })
}

#[async_trait]
impl Model for AnthropicModel {
    fn name(&self) -> &str {
        &self.model
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelReply, ModelError> {
        let body = json!({
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": request.system,
            "tools": request.tools,
            "messages": request.messages,
        });
        let url = format!("{}/v1/messages", self.base_url);
        let answer = self.api.post(&url, &body, error_message).await?;
        parse_reply(answer, &self.model)
    }
}
