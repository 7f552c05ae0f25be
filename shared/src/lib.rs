//! Countersign's engine: durable human sign-off for an AI agent's risky tool calls.
//!
//! - [`domain`]: pure types and rules (runs, actions, approvals, policy, audit).
//! - [`engine`]: the use cases, written once on top of the ports.
//! - [`ports`]: the small traits the engine needs (store, model, tools, queue, scheduler, clock).
//! - [`adapters`]: the ports on real things (SQLite, the Anthropic API, AWS).
//! - [`api`]: the HTTP decision API, one axum router for Lambda and the local server.
//! - [`example`]: the expense agent shipped with Countersign.
//! - [`logs`]: log lines whose fields cannot forge a line or drive a terminal.
//! - `testing` (feature `testing`): test doubles for the test suites and the bench.

pub mod adapters;
pub mod agents;
pub mod api;
pub mod deploy;
pub mod domain;
pub mod engine;
pub mod example;
pub mod lambda;
pub mod logs;
pub mod ports;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
