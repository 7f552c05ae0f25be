//! The tool port. Hard limits live inside each tool, so no approval can skip them.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

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

    /// Whether a call of it only reads, changing nothing: an answer it lost leaves nothing to
    /// reconcile, so the call failed and may simply be made again. By default what the tool
    /// says of itself (an MCP server's `readOnlyHint`, unless it also says it destroys).
    fn reads_only(&self) -> bool {
        let hints = self.hints();
        hints.read_only && !hints.destructive
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

    /// Whether this process can run the tool: not where a variable its binding reads is unset.
    /// The engine asks before it claims a call; a call this process cannot run waits, unclaimed,
    /// for one that can.
    fn runs_here(&self) -> Result<(), NotRunnableHere> {
        Ok(())
    }
}

/// Why a process cannot run a tool it knows: its binding reads an environment variable that is
/// unset here. A process with the agent's environment runs it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} reads the environment variable {var}, which is not set in this process")]
pub struct NotRunnableHere {
    /// The variable, such as `NOTES_DIR`.
    pub var: String,
    /// Where the definition reads it, such as `mcp.files.args`.
    pub field: String,
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

    /// Whether this process can list and run the source's tools, as [`Tool::runs_here`].
    fn runs_here(&self) -> Result<(), NotRunnableHere> {
        Ok(())
    }
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
    /// Every tool's spec, kept once no source is left to list: a model turn shows the model
    /// the same specs every time, and building them again (their schemas are JSON) was a
    /// fiftieth of an embedded lifecycle's CPU.
    specs: Arc<OnceLock<Arc<[ToolSpec]>>>,
}

impl Toolbox {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.insert(tool.spec().name, tool);
        self.specs = Arc::default();
        self
    }

    /// Adds tools that exist once `source` has listed them.
    pub fn with_source(mut self, source: Arc<dyn ToolSource>) -> Self {
        self.sources.push(source);
        self.specs = Arc::default();
        self
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools
            .get(name)
            .or_else(|| self.sources.iter().find_map(|source| source.get(name)))
    }

    /// Every tool's spec: the bound tools', then each source's listed ones (none before it
    /// is prepared).
    pub fn specs(&self) -> Arc<[ToolSpec]> {
        if let Some(specs) = self.specs.get() {
            return specs.clone();
        }
        let specs = self.build_specs();
        if self.sources.is_empty() {
            // Nothing left to list: these are the specs for the life of the toolbox.
            let _ = self.specs.set(specs.clone());
        }
        specs
    }

    fn build_specs(&self) -> Arc<[ToolSpec]> {
        let mut specs: Vec<ToolSpec> = self.tools.values().map(|t| t.spec()).collect();
        for source in &self.sources {
            specs.extend(source.specs());
        }
        specs.into()
    }

    /// Whether this process can run every tool of the box, bound or listed: the first variable
    /// it lacks otherwise.
    pub fn all_run_here(&self) -> Result<(), NotRunnableHere> {
        self.tools.values().try_for_each(|tool| tool.runs_here())?;
        self.sources
            .iter()
            .try_for_each(|source| source.runs_here())
    }

    /// Lists every source's tools (once per process); a process that drives runs calls it
    /// before it lets the model see the tools or calls one.
    pub async fn prepare(&self) -> Result<(), Unprepared> {
        for source in &self.sources {
            source.prepare().await?;
        }
        // Every source has listed its tools, fixed from now on for the life of the process.
        if self.specs.get().is_none() {
            let _ = self.specs.set(self.build_specs());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A tool that counts how often its spec is built.
    struct Counted(&'static str, AtomicUsize);

    fn counted(name: &'static str) -> Arc<Counted> {
        Arc::new(Counted(name, AtomicUsize::new(0)))
    }

    #[async_trait]
    impl Tool for Counted {
        fn spec(&self) -> ToolSpec {
            self.1.fetch_add(1, Ordering::Relaxed);
            ToolSpec {
                name: self.0.into(),
                description: "Pays.".into(),
                input_schema: serde_json::json!({"type": "object"}),
            }
        }

        async fn call(&self, _: ToolCall<'_>) -> ToolOutcome {
            ToolOutcome::Failed {
                error: "not called here".into(),
            }
        }
    }

    /// A source that lists one tool once prepared.
    struct Listing(OnceLock<BTreeMap<String, Arc<dyn Tool>>>);

    #[async_trait]
    impl ToolSource for Listing {
        async fn prepare(&self) -> Result<(), Unprepared> {
            let tool: Arc<dyn Tool> = counted("listed");
            let _ = self.0.set(BTreeMap::from([("listed".to_string(), tool)]));
            Ok(())
        }

        fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
            self.0.get()?.get(name)
        }

        fn specs(&self) -> Vec<ToolSpec> {
            let listed = self.0.get().into_iter().flat_map(|tools| tools.values());
            listed.map(|tool| tool.spec()).collect()
        }
    }

    #[test]
    fn bound_tools_specs_are_built_once() {
        let tool = counted("pay");
        let toolbox = Toolbox::new().with(tool.clone());
        let built = tool.1.load(Ordering::Relaxed);
        let first = toolbox.specs();
        let second = toolbox.specs();
        assert_eq!(first[0].name, "pay");
        assert!(Arc::ptr_eq(&first, &second), "the same specs, kept");
        assert_eq!(tool.1.load(Ordering::Relaxed), built + 1);
    }

    #[tokio::test]
    async fn a_sources_specs_are_kept_only_once_it_has_listed() {
        let toolbox = Toolbox::new()
            .with(counted("pay"))
            .with_source(Arc::new(Listing(OnceLock::new())));
        assert_eq!(
            toolbox.specs().len(),
            1,
            "only the bound tool before listing"
        );
        toolbox.prepare().await.unwrap();
        let specs = toolbox.specs();
        assert_eq!(specs.len(), 2, "the listed tool once prepared");
        assert!(Arc::ptr_eq(&specs, &toolbox.specs()));
        let more = toolbox.clone().with(counted("refund"));
        let specs = more.specs();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["pay", "refund", "listed"],
            "a tool added anew is listed"
        );
    }
}
