//! The tool port. Hard limits live inside each tool, so no approval can skip them.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use super::model::ToolSpec;
use crate::domain::action::ToolOutcome;
use crate::domain::args::Args;
use crate::domain::ids::{PersonId, RunId, TenantId};
use crate::domain::policy::ToolHints;

/// One call as the tool receives it. `idempotency_key` is `action_id:version`: the same key
/// twice must never act twice.
#[derive(Debug, Clone, Copy)]
pub struct ToolCall<'a> {
    pub tenant: &'a TenantId,
    pub run_id: &'a RunId,
    pub args: &'a Args,
    pub idempotency_key: &'a str,
}

#[async_trait]
pub trait Tool: Send + Sync {
    fn spec(&self) -> ToolSpec;

    /// What the tool says about itself (an MCP server's annotations); policy may match these.
    fn hints(&self) -> ToolHints {
        ToolHints::default()
    }

    /// People a call names who may not approve it (the expense claim's employee), beyond the
    /// run's requester. Looked up by the tool from its own data, never taken from the model.
    fn claimants(&self, args: &Args) -> Vec<PersonId> {
        let _ = args;
        Vec::new()
    }

    async fn call(&self, call: ToolCall<'_>) -> ToolOutcome;

    /// A tool its caller runs in its own process (`executor = "caller"`): never called here;
    /// once approved, the caller claims the call for this lease and reports its outcome.
    fn caller_lease(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether [`Tool::reconcile`] can ever settle an unknown outcome. A tool that cannot sends
    /// an unknown outcome to its agent's recovery owner, a person, instead of asking again.
    fn reconciles(&self) -> bool {
        false
    }

    /// How long, from when an outcome became unknown, the sweep keeps asking
    /// [`Tool::reconcile`] before it hands the question to the agent's recovery owner (a
    /// person); `None`: for as long as it takes.
    fn gives_up_after(&self) -> Option<std::time::Duration> {
        None
    }

    /// After an unknown outcome: did the call with this key take effect? `None` if the tool
    /// cannot tell yet. The engine never calls `call` again for that key.
    async fn reconcile(&self, call: ToolCall<'_>) -> Option<ToolOutcome> {
        let _ = call;
        None
    }
}

/// Tools an agent gets only once something lists them, such as every tool an MCP server
/// lists: none until [`ToolSource::prepare`] succeeds, then fixed for the life of the process.
#[async_trait]
pub trait ToolSource: Send + Sync {
    /// Lists the tools, once; after a success, later calls return at once.
    async fn prepare(&self) -> Result<(), Unprepared>;

    /// A listed tool; `None` before a successful [`ToolSource::prepare`].
    fn get(&self, name: &str) -> Option<&Arc<dyn Tool>>;

    /// The listed tools' specs; none before a successful [`ToolSource::prepare`].
    fn specs(&self) -> Vec<ToolSpec>;
}

/// Why an agent's tools cannot be made ready now (a server they come from is down).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unprepared(pub String);

/// The tools an agent may call, by name.
#[derive(Clone, Default)]
pub struct Toolbox {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    /// Tools known once listed; a name bound in `tools` comes first.
    sources: Vec<Arc<dyn ToolSource>>,
}

impl Toolbox {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.insert(tool.spec().name, tool);
        self
    }

    /// Adds tools that exist once `source` has listed them.
    pub fn with_source(mut self, source: Arc<dyn ToolSource>) -> Self {
        self.sources.push(source);
        self
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools
            .get(name)
            .or_else(|| self.sources.iter().find_map(|source| source.get(name)))
    }

    pub fn specs(&self) -> Vec<ToolSpec> {
        let mut specs: Vec<ToolSpec> = self.tools.values().map(|t| t.spec()).collect();
        for source in &self.sources {
            specs.extend(source.specs());
        }
        specs
    }

    /// Lists every source's tools (once per process); a process that drives runs calls it
    /// before it lets the model see the tools or calls one.
    pub async fn prepare(&self) -> Result<(), Unprepared> {
        for source in &self.sources {
            source.prepare().await?;
        }
        Ok(())
    }
}
