//! Adapters: the ports implemented on real things.

pub mod anthropic;
pub mod dynamodb;
pub mod scheduler;
pub mod sqlite;
pub mod sqs;
pub mod trust;
pub mod webhook;
