//! Adapters: the ports implemented on real things.

pub mod anthropic;
pub mod aws_sdk;
pub mod bedrock;
pub mod dynamodb;
pub mod emf;
pub mod env_template;
pub mod http_tool;
pub mod mcp_tool;
pub mod model_api;
pub mod openai;
pub mod scheduler;
pub mod scripted;
pub mod secrets;
pub mod slack;
mod slack_buttons;
pub mod sqlite;
pub mod sqlite_vfs;
pub mod sqs;
pub mod state_dir;
pub mod trust;
pub mod webhook;

/// Why a request got no answer, in words that name no URL (one may hold a secret).
fn unanswered(error: &reqwest::Error) -> &'static str {
    if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "the request failed"
    }
}
