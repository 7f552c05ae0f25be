//! Adapters: the ports implemented on real things.

pub mod anthropic;
pub mod dynamodb;
pub mod env_template;
pub mod mcp_tool;
pub mod scheduler;
pub mod sqlite;
pub mod sqs;
pub mod webhook;
