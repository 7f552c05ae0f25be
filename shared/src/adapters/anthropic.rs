//! The Anthropic Messages API as the model port, over reqwest with tool use.

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::domain::conversation::{Block, StopReason};
use crate::ports::model::{Model, ModelError, ModelReply, ModelRequest};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-5";
const API_VERSION: &str = "2023-06-01";
const ATTEMPTS: u32 = 4;

pub struct AnthropicModel {
    client: reqwest::Client,
    base_url: String,
    api_key: String,
    model: String,
    max_tokens: u32,
}

impl AnthropicModel {
    pub fn new(api_key: &str, model: &str, base_url: &str) -> Self {
        let client = super::trust::client_builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .build()
            .expect("an HTTP client with default TLS");
        Self {
            client,
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key: api_key.to_string(),
            model: model.to_string(),
            max_tokens: 1024,
        }
    }

    /// When `ANTHROPIC_API_KEY` is set: the model from `ANTHROPIC_MODEL`, the endpoint from
    /// `ANTHROPIC_BASE_URL`, each with a default.
    pub fn from_env() -> Option<Self> {
        let key = std::env::var("ANTHROPIC_API_KEY")
            .ok()
            .filter(|k| !k.trim().is_empty())?;
        let model = std::env::var("ANTHROPIC_MODEL").unwrap_or_else(|_| DEFAULT_MODEL.to_string());
        let base =
            std::env::var("ANTHROPIC_BASE_URL").unwrap_or_else(|_| DEFAULT_BASE_URL.to_string());
        Some(Self::new(&key, &model, &base))
    }

    /// For one agent definition when `ANTHROPIC_API_KEY` is set: its model id (unless
    /// `ANTHROPIC_MODEL` overrides every agent's) and its most tokens per reply.
    pub fn from_env_for(model: &str, max_tokens: u32) -> Option<Self> {
        let mut this = Self::from_env()?;
        if std::env::var("ANTHROPIC_MODEL").is_err() {
            this.model = model.to_string();
        }
        this.max_tokens = max_tokens;
        Some(this)
    }

    async fn send_once(&self, body: &Value) -> Result<ModelReply, Attempt> {
        let response = self
            .client
            .post(format!("{}/v1/messages", self.base_url))
            .header("x-api-key", &self.api_key)
            .header("anthropic-version", API_VERSION)
            .json(body)
            .send()
            .await
            .map_err(|e| Attempt::Retry(ModelError::Unavailable(e.to_string()), None))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = response
            .text()
            .await
            .map_err(|e| Attempt::Retry(ModelError::Unavailable(e.to_string()), None))?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or(text);
            let error = ModelError::Refused { status, message };
            return Err(match status {
                408 | 409 | 429 | 500..=599 => Attempt::Retry(error, retry_after),
                _ => Attempt::Final(error),
            });
        }
        parse_reply(&text).map_err(Attempt::Final)
    }
}

enum Attempt {
    Retry(ModelError, Option<Duration>),
    Final(ModelError),
}

#[derive(Deserialize)]
struct RawReply {
    content: Vec<Value>,
    stop_reason: Option<StopReason>,
}

/// Keeps the text and tool-use blocks; other block kinds do not go back into the conversation.
fn parse_reply(text: &str) -> Result<ModelReply, ModelError> {
    let raw: RawReply =
        serde_json::from_str(text).map_err(|e| ModelError::BadReply(e.to_string()))?;
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
    Ok(ModelReply {
        content,
        stop_reason: raw.stop_reason.unwrap_or(StopReason::EndTurn),
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
        let mut backoff = Duration::from_millis(500);
        for attempt in 1..=ATTEMPTS {
            match self.send_once(&body).await {
                Ok(reply) => return Ok(reply),
                Err(Attempt::Final(error)) => return Err(error),
                Err(Attempt::Retry(error, _)) if attempt == ATTEMPTS => return Err(error),
                Err(Attempt::Retry(error, retry_after)) => {
                    let wait = retry_after.unwrap_or(backoff).min(Duration::from_secs(30));
                    tracing::warn!(attempt, ?wait, %error, "model call failed; trying again");
                    tokio::time::sleep(wait).await;
                    backoff *= 2;
                }
            }
        }
        unreachable!("the last attempt returns")
    }
}
