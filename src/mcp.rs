//! `countersign mcp`: the MCP gateway over stdio for one agent and one person of the people
//! directory, over the same state as every other command. Stdout carries the protocol and
//! nothing else; logs go to stderr. It sweeps as `serve` does, so an approval nobody decides
//! expires and a waiting caller is told.

use std::path::Path;
use std::sync::Arc;

use shared::api::mcp::{Gateway, McpCaller};
use shared::domain::identity::Identity;
use shared::domain::ids::AgentName;

use crate::cli::{Global, McpOptions};
use crate::fail::Failure;
use crate::local::Local;

/// Serves until the client closes stdin.
pub async fn run(local: Local, global: &Global, options: McpOptions) -> Result<(), Failure> {
    let who = local.identify(&options.person)?;
    let agent = crate::agent_named(&options.agent)?;
    local.loaded(&who.tenant, &agent)?;
    let settings =
        shared::deploy::mcp_settings_from_env().map_err(|e| Failure::usage(e.to_string()))?;
    // A client starts this process in a directory and an environment of its own: say which
    // state and agents it works on, where the client's log shows it (never on stdout).
    for line in started(&local, global, &who, &agent) {
        eprintln!("countersign mcp: {}", shared::logs::escaped(&line, false));
    }
    let engine = Arc::new(local.engine);
    if !options.sweep_every.is_zero() {
        tokio::spawn(crate::serve::sweep_forever(
            engine.clone(),
            options.sweep_every,
        ));
    }
    Gateway::for_caller(engine, settings, McpCaller { who, agent })
        .serve_stdio()
        .await
        .map_err(|e| Failure {
            code: "mcp",
            message: e.to_string(),
            exit: 1,
        })
}

/// What `countersign mcp` says on stderr as it starts, a line each: whose calls of which agent,
/// the state they are kept in (an absolute path, and how to review them there), and the agents
/// loaded.
fn started(local: &Local, global: &Global, who: &Identity, agent: &AgentName) -> [String; 3] {
    let state = match &local.aws {
        Some(_) => format!(
            "the DynamoDB table {} (COUNTERSIGN_STORE=dynamodb)",
            std::env::var("COUNTERSIGN_TABLE").unwrap_or_default()
        ),
        None => {
            let dir = absolute(&global.state);
            format!("{dir}; review its calls with: countersign review --state {dir}")
        }
    };
    let names: Vec<String> = local
        .engine
        .agents()
        .names()
        .map(|name| name.to_string())
        .collect();
    let from = match &global.agents {
        Some(paths) => {
            let paths: Vec<String> = paths
                .split(',')
                .map(|p| absolute(Path::new(p.trim())))
                .collect();
            format!("from {}", paths.join(", "))
        }
        None => "the shipped ones: no --agents or COUNTERSIGN_AGENTS".to_string(),
    };
    [
        format!(
            "serving the tools of agent {agent} to {} ({}) over stdio",
            who.person, who.tenant
        ),
        format!("state {state}"),
        format!("agents loaded: {} ({from})", names.join(", ")),
    ]
}

/// `path` from the filesystem's root, as a person reads it.
fn absolute(path: &Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}
