//! `countersign mcp`: the MCP gateway over stdio for one agent and one person of the people
//! directory, over the same state as every other command. Stdout carries the protocol and
//! nothing else; logs go to stderr. It sweeps as `serve` does, so an approval nobody decides
//! expires and a waiting caller is told.

use std::sync::Arc;

use shared::api::mcp::{Gateway, McpCaller};

use crate::cli::McpOptions;
use crate::fail::Failure;
use crate::local::Local;

/// Serves until the client closes stdin.
pub async fn run(local: Local, options: McpOptions) -> Result<(), Failure> {
    let who = local.identify(&options.person)?;
    let agent = crate::agent_named(&options.agent)?;
    local.loaded(&who.tenant, &agent)?;
    let settings =
        shared::deploy::mcp_settings_from_env().map_err(|e| Failure::usage(e.to_string()))?;
    let engine = Arc::new(local.engine);
    if !options.sweep_every.is_zero() {
        tokio::spawn(crate::serve::sweep_forever(
            engine.clone(),
            options.sweep_every,
        ));
    }
    tracing::info!(%agent, person = %who.person, "serving MCP over stdio");
    Gateway::for_caller(engine, settings, McpCaller { who, agent })
        .serve_stdio()
        .await
        .map_err(|e| Failure {
            code: "mcp",
            message: e.to_string(),
            exit: 1,
        })
}
