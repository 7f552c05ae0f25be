//! Adapters: the ports implemented on real things.

pub mod anthropic;
pub mod dynamodb;
pub mod env_template;
pub mod http_tool;
pub mod mcp_tool;
pub mod scheduler;
pub mod scripted;
pub mod slack;
pub mod sqlite;
pub mod sqs;
pub mod state_dir;
pub mod trust;
pub mod webhook;
