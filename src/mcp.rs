//! `countersign mcp`: the MCP gateway over stdio for one agent and one person of the people
//! directory, over the same state as every other command. Stdout carries the protocol and
//! nothing else; logs go to stderr. It sweeps as `serve` does, so an approval nobody decides
//! expires and a waiting caller is told.

use std::sync::Arc;
use std::time::Duration;

use shared::api::mcp::{Gateway, McpCaller};

use crate::fail::Failure;
use crate::local::Local;

#[derive(Debug, clap::Args)]
pub struct Options {
    /// The agent whose tools the client gets: a loaded definition's name, or a definition's
    /// directory (the commands that decide its calls need it in --agents too).
    #[arg(long, value_name = "NAME|DIR")]
    pub agent: String,
    /// Who asks: every call is this person's, and they may not approve it.
    #[arg(long = "as", value_name = "NAME")]
    pub person: String,
    /// How often to sweep (expiries, reminders, retries), as `serve` does; 0s turns it off.
    #[arg(long, default_value = "30s", value_parser = crate::cli::parse_duration)]
    pub sweep_every: Duration,
}

/// Serves until the client closes stdin.
pub async fn run(local: Local, options: Options) -> Result<(), Failure> {
    let who = local.identify(&options.person)?;
    let agent = crate::agent_named(&options.agent)?;
    local.loaded(&agent)?;
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
