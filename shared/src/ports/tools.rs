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

    /// Whether [`Tool::reconcile`] can ever settle an unknown outcome. A tool that cannot sends
    /// an unknown outcome to its agent's recovery owner, a person, instead of asking again.
    fn reconciles(&self) -> bool {
        false
    }

    /// After an unknown outcome: did the call with this key take effect? `None` if the tool
    /// cannot tell yet. The engine never calls `call` again for that key.
    async fn reconcile(&self, call: ToolCall<'_>) -> Option<ToolOutcome> {
        let _ = call;
        None
    }
}

/// The tools an agent may call, by name.
#[derive(Clone, Default)]
pub struct Toolbox {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl Toolbox {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.insert(tool.spec().name, tool);
        self
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|t| t.spec()).collect()
    }
}
