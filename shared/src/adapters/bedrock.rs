//! Amazon Bedrock's Converse API as the model port, with tool use: Claude and the other models
//! Bedrock serves, reached with the process's AWS credentials (a function's role), in the
//! region of its environment. The SDK retries throttling and server errors itself, within the
//! turn's time.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_bedrockruntime::Client;
use aws_sdk_bedrockruntime::config::retry::RetryConfig;
use aws_sdk_bedrockruntime::config::timeout::TimeoutConfig;
use aws_sdk_bedrockruntime::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_bedrockruntime::types::{
    self as wire, ContentBlock, ConversationRole, ConverseOutput, InferenceConfiguration,
    SystemContentBlock, ToolConfiguration, ToolInputSchema, ToolResultBlock,
    ToolResultContentBlock, ToolResultStatus, ToolSpecification, ToolUseBlock,
};
use aws_smithy_types::{Document, Number};
use serde_json::{Map, Value};
use tokio::sync::OnceCell;

use crate::domain::conversation::{Block, Message, Speaker, StopReason, TurnUsage};
use crate::ports::model::{Model, ModelError, ModelReply, ModelRequest, ToolSpec};

/// The most tries of one turn, as for the other providers.
const ATTEMPTS: u32 = 4;

pub struct BedrockModel {
    client: OnceCell<Client>,
    model: String,
    max_tokens: u32,
    turn_timeout: Duration,
}

impl BedrockModel {
    /// `model` (a model id or an inference profile) through a client built from the process's
    /// AWS configuration at its first turn: nothing is read or built by a process that never
    /// drives a run.
    pub fn new(model: &str, max_tokens: u32, turn_timeout: Duration) -> Self {
        Self {
            client: OnceCell::new(),
            model: model.to_string(),
            max_tokens,
            turn_timeout,
        }
    }

    /// With a client configured here (an endpoint of its own, credentials), its retries and
    /// time per turn set as every Bedrock model's are.
    pub fn with_config(
        config: &aws_sdk_bedrockruntime::Config,
        model: &str,
        max_tokens: u32,
        turn_timeout: Duration,
    ) -> Self {
        let this = Self::new(model, max_tokens, turn_timeout);
        let client = this.client_of(config.to_builder());
        let _ = this.client.set(client);
        this
    }

    fn client_of(&self, builder: aws_sdk_bedrockruntime::config::Builder) -> Client {
        let config = builder
            .retry_config(RetryConfig::standard().with_max_attempts(ATTEMPTS))
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_timeout(self.turn_timeout)
                    .build(),
            )
            .build();
        Client::from_conf(config)
    }

    async fn client(&self) -> &Client {
        self.client
            .get_or_init(|| async {
                let config = super::aws_sdk::sdk_config().await;
                self.client_of((&config).into())
            })
            .await
    }
}

#[async_trait]
impl Model for BedrockModel {
    fn name(&self) -> &str {
        &self.model
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelReply, ModelError> {
        let bad = |e: aws_smithy_types::error::operation::BuildError| {
            ModelError::BadReply(format!("the conversation cannot be sent: {e}"))
        };
        let messages = request
            .messages
            .iter()
            .map(wire_message)
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;
        let mut converse = self
            .client()
            .await
            .converse()
            .model_id(&self.model)
            .set_messages(Some(messages))
            .inference_config(
                InferenceConfiguration::builder()
                    .max_tokens(i32::try_from(self.max_tokens).unwrap_or(i32::MAX))
                    .build(),
            );
        if !request.system.trim().is_empty() {
            converse = converse.system(SystemContentBlock::Text(request.system.to_string()));
        }
        if !request.tools.is_empty() {
            let tools = request
                .tools
                .iter()
                .map(wire_tool)
                .collect::<Result<Vec<_>, _>>()
                .map_err(bad)?;
            let config = ToolConfiguration::builder()
                .set_tools(Some(tools))
                .build()
                .map_err(bad)?;
            converse = converse.tool_config(config);
        }
        let output = converse.send().await.map_err(refused)?;

        let mut content = Vec::new();
        if let Some(ConverseOutput::Message(message)) = output.output() {
            for block in message.content() {
                match block {
                    ContentBlock::Text(text) if !text.trim().is_empty() => {
                        content.push(Block::Text { text: text.clone() })
                    }
                    ContentBlock::ToolUse(call) => content.push(Block::ToolUse {
                        id: call.tool_use_id().to_string(),
                        name: call.name().to_string(),
                        input: json_of(call.input()),
                    }),
                    // Reasoning, citations and media do not go back into the conversation.
                    _ => {}
                }
            }
        }
        let stop_reason = match output.stop_reason() {
            wire::StopReason::EndTurn => StopReason::EndTurn,
            wire::StopReason::ToolUse => StopReason::ToolUse,
            wire::StopReason::MaxTokens => StopReason::MaxTokens,
            wire::StopReason::StopSequence => StopReason::StopSequence,
            _ => StopReason::Other,
        };
        let usage = output.usage();
        let tokens = |n: i32| u64::try_from(n).ok();
        Ok(ModelReply {
            content,
            stop_reason,
            usage: Some(TurnUsage {
                model: self.model.clone(),
                input_tokens: usage.and_then(|u| tokens(u.input_tokens())),
                output_tokens: usage.and_then(|u| tokens(u.output_tokens())),
            }),
        })
    }
}

/// What the API said when it refused, or why it could not be reached: its status and words,
/// never the request (which the SDK signed).
fn refused<E: ProvideErrorMetadata + std::error::Error, R>(error: SdkError<E, R>) -> ModelError {
    match &error {
        SdkError::ServiceError(service) => {
            let status = match service.err().code() {
                Some("ThrottlingException") => 429,
                Some("ValidationException") => 400,
                Some("AccessDeniedException") => 403,
                Some("ResourceNotFoundException") => 404,
                Some("ModelTimeoutException") => 408,
                Some("ModelNotReadyException" | "ServiceUnavailableException") => 503,
                _ => 500,
            };
            let message = service
                .err()
                .message()
                .or(service.err().code())
                .unwrap_or("no reason given")
                .to_string();
            ModelError::Refused { status, message }
        }
        SdkError::TimeoutError(_) => ModelError::Unavailable("the turn took too long".into()),
        SdkError::DispatchFailure(_) => ModelError::Unavailable("could not connect".into()),
        SdkError::ResponseError(_) => ModelError::BadReply("the answer could not be read".into()),
        _ => ModelError::Unavailable("the request failed".into()),
    }
}

fn wire_tool(
    tool: &ToolSpec,
) -> Result<wire::Tool, aws_smithy_types::error::operation::BuildError> {
    let spec = ToolSpecification::builder()
        .name(&tool.name)
        .description(&tool.description)
        .input_schema(ToolInputSchema::Json(document_of(&tool.input_schema)))
        .build()?;
    Ok(wire::Tool::ToolSpec(spec))
}

/// One message as Converse takes it: text, tool uses and tool results as its blocks.
fn wire_message(
    message: &Message,
) -> Result<wire::Message, aws_smithy_types::error::operation::BuildError> {
    let role = match message.role {
        Speaker::User => ConversationRole::User,
        Speaker::Assistant => ConversationRole::Assistant,
    };
    let mut blocks = Vec::new();
    for block in &message.content {
        blocks.push(match block {
            Block::Text { text } if text.trim().is_empty() => continue,
            Block::Text { text } => ContentBlock::Text(text.clone()),
            Block::ToolUse { id, name, input } => ContentBlock::ToolUse(
                ToolUseBlock::builder()
                    .tool_use_id(id)
                    .name(name)
                    .input(document_of(input))
                    .build()?,
            ),
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                let status = match is_error {
                    true => ToolResultStatus::Error,
                    false => ToolResultStatus::Success,
                };
                ContentBlock::ToolResult(
                    ToolResultBlock::builder()
                        .tool_use_id(tool_use_id)
                        .content(ToolResultContentBlock::Text(content.clone()))
                        .status(status)
                        .build()?,
                )
            }
        });
    }
    wire::Message::builder()
        .role(role)
        .set_content(Some(blocks))
        .build()
}

fn document_of(value: &Value) -> Document {
    match value {
        Value::Null => Document::Null,
        Value::Bool(b) => Document::Bool(*b),
        Value::Number(n) => Document::Number(match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Number::PosInt(u),
            (None, Some(i)) => Number::NegInt(i),
            _ => Number::Float(n.as_f64().unwrap_or(f64::NAN)),
        }),
        Value::String(s) => Document::String(s.clone()),
        Value::Array(items) => Document::Array(items.iter().map(document_of).collect()),
        Value::Object(map) => Document::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), document_of(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

fn json_of(document: &Document) -> Value {
    match document {
        Document::Null => Value::Null,
        Document::Bool(b) => Value::Bool(*b),
        Document::Number(Number::PosInt(u)) => Value::from(*u),
        Document::Number(Number::NegInt(i)) => Value::from(*i),
        Document::Number(Number::Float(f)) => {
            serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number)
        }
        Document::String(s) => Value::String(s.clone()),
        Document::Array(items) => Value::Array(items.iter().map(json_of).collect()),
        Document::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), json_of(v)))
                .collect::<Map<_, _>>(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_arguments_cross_as_documents_and_back_unchanged() {
        let args = json!({"order_id": "ord_55", "amount_cents": 12500, "delta": -3, "rate": 0.5,
            "lines": [{"sku": "BLD-200", "gift": false}], "note": null});
        assert_eq!(json_of(&document_of(&args)), args);
    }
}
