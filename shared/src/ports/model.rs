//! The model port: one turn of a conversation with tool use.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::domain::conversation::TurnUsage;
use crate::domain::conversation::{Block, Message, Speaker, StopReason};

/// A tool as the model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    pub system: &'a str,
    pub tools: &'a [ToolSpec],
    pub messages: &'a [Message],
}

impl ModelRequest<'_> {
    /// How many times the model has answered so far: 0 on the run's first turn.
    pub fn turn(&self) -> usize {
        self.messages
            .iter()
            .filter(|m| m.role == Speaker::Assistant)
            .count()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelReply {
    pub content: Vec<Block>,
    pub stop_reason: StopReason,
    /// What a model API reported of the turn; an offline model spends no tokens and has none.
    pub usage: Option<TurnUsage>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("the model API refused the request ({status}): {message}")]
    Refused { status: u16, message: String },
    #[error("the model API is unavailable: {0}")]
    Unavailable(String),
    #[error("the model's reply could not be read: {0}")]
    BadReply(String),
}

#[async_trait]
pub trait Model: Send + Sync {
    /// A short name for logs and the audit, such as the model id.
    fn name(&self) -> &str;

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelReply, ModelError>;
}
