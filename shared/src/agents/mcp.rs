//! A definition's MCP servers, connected lazily. Every process builds its agents at start-up,
//! including ones that never call a tool (decide, sweep), so building never touches a server.
//! A process that starts a run first prepares the agent's tools ([`crate::agents::prepare`]);
//! one that resumes a run, takes a turn of its model, rules on an edit of it or takes a
//! gateway call lists them itself ([`crate::engine::Agent::list_tools`]), when it first needs
//! them: each server is connected and listed once, and its listing (specs and hints) is then
//! fixed for the life of the process. If a server is down then, the run is refused (the
//! engine's `unavailable`, HTTP 503) before anything is written, a resume waits to be delivered
//! again, and the next attempt tries again.
//!
//! - A `[tools.<name>]` entry bound with `mcp = { server, tool }` is always in the toolbox
//!   under its own name. Its spec is the server's listing, with the entry's `description` and
//!   `input_schema` in place of the listed ones if given; its hints are the listed annotations.
//!   Its call connects and lists first if nothing did yet, so an approved call runs in whichever
//!   process resumes it; a server still down makes the call failed, never sent.
//! - A server's `tools = "*"` or list adds the tools it lists, named as it names them, except
//!   the ones a `[tools.*]` entry already binds. A listed name equal to another tool's fails
//!   preparing, naming both.
//! - A policy rule for a tool only a `tools = "*"` listing can provide is checked once listed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::OnceCell;

use super::DefinitionError;
use super::policy_files::PolicyFiles;
use crate::adapters::mcp_tool::{McpError, McpServer, McpTool, ResolvedMcpServer, ToolSelection};
use crate::domain::action::ToolOutcome;
use crate::domain::policy::{Policy, ToolHints};
use crate::ports::model::ToolSpec;
use crate::ports::tools::{NotRunnableHere, Tool, ToolCall, ToolSource, Unprepared};

/// One server of a definition: its settings (or the variable they read that this process
/// lacks), and its session and listing once it was reached.
pub(super) struct LazyServer {
    name: String,
    config: Result<ResolvedMcpServer, NotRunnableHere>,
    listing: OnceCell<Listing>,
}

struct Listing {
    tools: Vec<McpTool>,
}

/// Why a server's tools are not listed: this process cannot start or reach it by its settings,
/// or it did not answer.
#[derive(Debug, thiserror::Error)]
enum Unlisted {
    #[error(transparent)]
    NotHere(#[from] NotRunnableHere),
    #[error(transparent)]
    Mcp(#[from] McpError),
}

impl LazyServer {
    pub(super) fn new(name: &str, config: Result<ResolvedMcpServer, NotRunnableHere>) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_string(),
            config,
            listing: OnceCell::new(),
        })
    }

    /// Whether this process can start or reach it: not when its settings read a variable
    /// unset here.
    fn runs_here(&self) -> Result<(), NotRunnableHere> {
        self.config.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    /// Connects and lists on first use; a failure is not kept, so the next use tries again.
    async fn listing(&self) -> Result<&Listing, Unlisted> {
        let config = self.config.as_ref().map_err(Clone::clone)?;
        let listing = self.listing.get_or_try_init(|| async {
            let server = McpServer::connect(config.clone()).await?;
            let tools = server.tools().await?;
            Ok::<_, McpError>(Listing { tools })
        });
        Ok(listing.await?)
    }

    /// The tools its `tools = ...` adds, as listed; `None` when the definition binds them one
    /// by one.
    fn selection(&self) -> Option<&ToolSelection> {
        self.config.as_ref().ok()?.tools()
    }

    fn listed(&self, remote: &str) -> Option<&McpTool> {
        self.listing
            .get()?
            .tools
            .iter()
            .find(|tool| tool.remote_name() == remote)
    }
}

/// A `[tools.<name>]` entry bound to one tool of a server.
pub(super) struct BoundMcpTool {
    pub name: String,
    pub server: Arc<LazyServer>,
    pub remote: String,
    pub description: Option<String>,
    pub input_schema: Option<Value>,
}

#[async_trait]
impl Tool for BoundMcpTool {
    /// Before the server is listed (never so in a process that drives runs): the entry's own
    /// description and schema, or an empty object schema.
    fn spec(&self) -> ToolSpec {
        let listed = self.server.listed(&self.remote).map(|tool| tool.spec());
        ToolSpec {
            name: self.name.clone(),
            description: self
                .description
                .clone()
                .or_else(|| listed.as_ref().map(|spec| spec.description.clone()))
                .unwrap_or_default(),
            input_schema: self
                .input_schema
                .clone()
                .or_else(|| listed.map(|spec| spec.input_schema))
                .unwrap_or_else(|| serde_json::json!({"type": "object"})),
        }
    }

    fn hints(&self) -> ToolHints {
        self.server
            .listed(&self.remote)
            .map(|tool| tool.hints())
            .unwrap_or_default()
    }

    fn runs_here(&self) -> Result<(), NotRunnableHere> {
        self.server.runs_here()
    }

    async fn call(&self, call: ToolCall<'_>) -> ToolOutcome {
        if let Err(error) = self.server.listing().await {
            return ToolOutcome::Failed {
                error: format!("{error}; the call was not sent"),
            };
        }
        match self.server.listed(&self.remote) {
            Some(tool) => tool.call(call).await,
            None => ToolOutcome::Failed {
                error: format!(
                    "the MCP server {} lists no tool named {}; the call was not sent",
                    self.server.name, self.remote
                ),
            },
        }
    }
}

/// Every MCP server of one definition, as the toolbox's source of listed tools.
pub(super) struct McpTools {
    /// `agent.toml` and the policy file, as errors name them.
    pub file: String,
    pub policy_file: String,
    pub servers: BTreeMap<String, Arc<LazyServer>>,
    /// The `[tools.*]` entries: name, and for an MCP one its server and remote name.
    pub entries: BTreeMap<String, Option<(String, String)>>,
    /// Per tool entry, the argument naming a claimant, checked against the listed schema.
    pub claimants: BTreeMap<String, String>,
    /// The tool entries whose schema is the listing's (they give none of their own): the
    /// policy's fields for them are checked once listed.
    pub listed_schemas: Vec<String>,
    pub policy: Arc<Policy>,
    pub policy_files: PolicyFiles,
    /// The agent's tools known before listing: each one's name and input schema. With the
    /// listed ones, every policy rule is checked against them once listed.
    pub known: Vec<(String, serde_json::Value)>,
    /// The roles people hold, where the process knows them.
    pub roles: Option<BTreeSet<String>>,
    /// The tools the offline script calls.
    pub script_tools: Vec<String>,
    /// The tools the servers' selections add, once listed.
    pub listed: OnceLock<BTreeMap<String, Arc<dyn Tool>>>,
}

impl McpTools {
    async fn list(&self) -> Result<BTreeMap<String, Arc<dyn Tool>>, DefinitionError> {
        let mut listed: BTreeMap<String, (String, Arc<dyn Tool>)> = BTreeMap::new();
        for (server_name, server) in &self.servers {
            let field = format!("mcp.{server_name}");
            let listing = server
                .listing()
                .await
                .map_err(|e| DefinitionError::new(&self.file, &field, e.to_string()))?;
            for (entry, binding) in &self.entries {
                let Some((server_of, remote)) = binding else {
                    continue;
                };
                if server_of != server_name {
                    continue;
                }
                let Some(tool) = listing.tools.iter().find(|t| t.remote_name() == remote) else {
                    return Err(DefinitionError::new(
                        &self.file,
                        &format!("tools.{entry}.mcp.tool"),
                        format!("the MCP server {server_name} lists no tool named {remote}"),
                    ));
                };
                self.check_claimant(entry, &tool.spec())?;
                if self.listed_schemas.contains(entry) {
                    self.check_policy_fields(entry, &tool.spec())?;
                }
            }
            let bound = |remote: &str| {
                self.entries
                    .values()
                    .flatten()
                    .any(|(server_of, bound)| server_of == server_name && bound == remote)
            };
            let selected: Vec<&McpTool> = match server.selection() {
                None => Vec::new(),
                Some(ToolSelection::All) => listing.tools.iter().collect(),
                Some(ToolSelection::Named(names)) => names
                    .iter()
                    .map(|name| {
                        listing
                            .tools
                            .iter()
                            .find(|t| t.remote_name() == name)
                            .ok_or_else(|| {
                                DefinitionError::new(
                                    &self.file,
                                    &format!("{field}.tools"),
                                    format!(
                                        "the MCP server {server_name} lists no tool named {name}"
                                    ),
                                )
                            })
                    })
                    .collect::<Result<_, _>>()?,
            };
            for tool in selected {
                let name = tool.remote_name();
                if bound(name) {
                    continue;
                }
                if self.entries.contains_key(name) {
                    return Err(DefinitionError::new(
                        &self.file,
                        &format!("{field}.tools"),
                        format!("{field} lists {name}, which is also the name of tools.{name}"),
                    ));
                }
                if let Some((other, _)) = listed.get(name) {
                    return Err(DefinitionError::new(
                        &self.file,
                        &format!("{field}.tools"),
                        format!("{field} lists {name}, which {other} lists too"),
                    ));
                }
                self.check_policy_fields(name, &tool.spec())?;
                listed.insert(name.to_string(), (field.clone(), Arc::new(tool.clone())));
            }
        }
        for rule in self.policy.tools.keys() {
            if !self.entries.contains_key(rule) && !listed.contains_key(rule) {
                return Err(DefinitionError::new(
                    &self.policy_file,
                    &format!("tools.{rule}"),
                    format!(
                        "the policy has a rule for {rule}, which {} does not define and its MCP \
                         servers do not list",
                        self.file
                    ),
                ));
            }
        }
        if let Some(unknown) = self
            .script_tools
            .iter()
            .find(|t| !self.entries.contains_key(*t) && !listed.contains_key(*t))
        {
            return Err(DefinitionError::new(
                &self.file,
                "model.offline",
                format!(
                    "the script calls {unknown}, which the definition does not define and its \
                     MCP servers do not list"
                ),
            ));
        }
        let listed: BTreeMap<String, Arc<dyn Tool>> = listed
            .into_iter()
            .map(|(name, (_, tool))| (name, tool))
            .collect();
        // Every rule against every tool, the listed ones and the entries' listed schemas too.
        let mut tools = self.known.clone();
        for (entry, binding) in &self.entries {
            let Some((server_of, remote)) = binding else {
                continue;
            };
            if self.listed_schemas.contains(entry)
                && let Some(tool) = self.servers[server_of].listed(remote)
            {
                tools.push((entry.clone(), tool.spec().input_schema));
            }
        }
        tools.extend(
            listed
                .iter()
                .map(|(name, tool)| (name.clone(), tool.spec().input_schema)),
        );
        self.policy_files
            .check(&self.policy, &tools, self.roles.as_ref())?;
        Ok(listed)
    }

    fn check_policy_fields(&self, tool: &str, spec: &ToolSpec) -> Result<(), DefinitionError> {
        self.policy
            .check_fields(tool, &spec.input_schema)
            .map_err(|(field, why)| DefinitionError::new(&self.policy_file, &field, why))
    }

    fn check_claimant(&self, entry: &str, spec: &ToolSpec) -> Result<(), DefinitionError> {
        let Some(claimant) = self.claimants.get(entry) else {
            return Ok(());
        };
        if spec.input_schema["properties"].get(claimant).is_none() {
            return Err(DefinitionError::new(
                &self.file,
                &format!("tools.{entry}.claimant"),
                format!("{claimant} is not one of the tool's arguments"),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl ToolSource for McpTools {
    async fn prepare(&self) -> Result<(), Unprepared> {
        if self.listed.get().is_some() {
            return Ok(());
        }
        let listed = self.list().await.map_err(|e| Unprepared(e.to_string()))?;
        // Two runs preparing at once list twice; the first listing stays.
        let _ = self.listed.set(listed);
        Ok(())
    }

    fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.listed.get()?.get(name)
    }

    fn specs(&self) -> Vec<ToolSpec> {
        self.listed
            .get()
            .map(|tools| tools.values().map(|tool| tool.spec()).collect())
            .unwrap_or_default()
    }

    fn runs_here(&self) -> Result<(), NotRunnableHere> {
        self.servers
            .values()
            .try_for_each(|server| server.runs_here())
    }
}

/// The names the servers' `tools = [..]` lists select, each with the server's field; known
/// without listing.
pub(super) fn named_selections<'a>(
    servers: impl Iterator<Item = (&'a String, Option<&'a ToolSelection>)>,
) -> Vec<(String, String)> {
    let mut names = Vec::new();
    for (server, selection) in servers {
        if let Some(ToolSelection::Named(list)) = selection {
            names.extend(
                list.iter()
                    .map(|name| (name.clone(), format!("mcp.{server}"))),
            );
        }
    }
    names
}

/// Whether a server takes every tool it lists (`tools = "*"`): then only its listing says which
/// names the agent has.
pub(super) fn lists_everything<'a>(
    mut selections: impl Iterator<Item = Option<&'a ToolSelection>>,
) -> bool {
    selections.any(|selection| selection == Some(&ToolSelection::All))
}
