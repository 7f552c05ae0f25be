//! The agents an engine drives: for each, its policy, tools, model, system prompt and limits.
//! A run names its agent, so a resume, a decision or the sweep uses that agent's rules and tools,
//! whichever process handles it. Definitions files become agents in [`crate::agents`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::error::EngineError;
use crate::domain::approval::Asking;
use crate::domain::args::Args;
use crate::domain::budget;
use crate::domain::identity::Directory;
use crate::domain::ids::{AgentName, PersonId, Role, TenantId};
use crate::domain::policy::cases::{Cases, Failure};
use crate::domain::policy::{CallFacts, Policy, Requester, Ruling, ToolHints, Total};
use crate::domain::run::{Asker, Run};
use crate::domain::schema::Schema;
use crate::ports::model::Model;
use crate::ports::tools::Toolbox;

/// Bounds that keep one run from running away.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_model_turns: u32,
    pub max_calls_per_turn: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_model_turns: 16,
            max_calls_per_turn: 8,
        }
    }
}

/// One agent, ready to run.
pub struct Agent {
    pub name: AgentName,
    pub policy: Arc<Policy>,
    pub tools: Toolbox,
    /// Only processes that drive runs (start, resume) have one.
    pub model: Option<Arc<dyn Model>>,
    /// Why a process that drives runs has no model for it: the variable its model API's key
    /// is read from is unset here, and no offline script plays it.
    pub model_missing: Option<String>,
    pub system_prompt: String,
    pub limits: Limits,
    /// Per tool, the argument that names a person who may not approve the call (a claimant).
    pub claimant_args: BTreeMap<String, String>,
    /// Who answers "did this take effect?" when a call's outcome is unknown and its tool cannot
    /// reconcile it.
    pub recovery_owner: Option<Role>,
    /// Its definition has no `[model]`: its calls come through the MCP gateway and the gate
    /// API only, and a run of it is refused unless a model was attached by other means.
    pub gateway_only: bool,
    /// The tenants that may use it; `None`: every tenant. To any other it does not exist.
    pub tenants: Option<BTreeSet<TenantId>>,
    /// Each tool's input schema, compiled the first time a call of it is checked (a tool of an
    /// MCP server is known once listed), or why it cannot be.
    schemas: Mutex<HashMap<String, Arc<Result<Schema, String>>>>,
}

/// Why a proposed call is answered without policy ruling on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Unfit {
    /// What the model is told and the audit says.
    pub why: String,
    /// The arguments, where they are an object within their share: the audit keeps them.
    pub args: Option<Args>,
}

impl Agent {
    pub fn new(name: AgentName, policy: Arc<Policy>) -> Self {
        Self {
            name,
            policy,
            tools: Toolbox::new(),
            model: None,
            model_missing: None,
            system_prompt: String::new(),
            limits: Limits::default(),
            claimant_args: BTreeMap::new(),
            recovery_owner: None,
            gateway_only: false,
            tenants: None,
            schemas: Mutex::default(),
        }
    }

    pub fn with_tools(mut self, tools: Toolbox) -> Self {
        self.tools = tools;
        self
    }

    pub fn with_model(mut self, model: Arc<dyn Model>) -> Self {
        self.model = Some(model);
        self.model_missing = None;
        self
    }

    /// The model that plays it in this process, or why there is none: a setting this process
    /// lacks, which trying again does not mend.
    pub fn model_here(&self) -> Result<&Arc<dyn Model>, EngineError> {
        self.model.as_ref().ok_or_else(|| {
            EngineError::NotConfigured(self.model_missing.clone().unwrap_or_else(|| {
                format!(
                    "this process does not drive runs, so no model plays the agent {} here",
                    self.name
                )
            }))
        })
    }

    pub fn with_system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = prompt.into();
        self
    }

    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Whether `tenant` may use it: one its definition names, or any where it names none.
    pub fn serves(&self, tenant: &TenantId) -> bool {
        serves(&self.tenants, tenant)
    }

    /// Whether this process can run the agent's calls: every tool it binds or lists. A process
    /// that lacks a variable the agent's bindings read resumes and drives none of its runs: a
    /// decision it records waits for a process that has the agent's environment.
    pub fn runs_here(&self) -> Result<(), EngineError> {
        self.tools.all_run_here().map_err(|missing| {
            EngineError::NotConfigured(format!(
                "this process cannot run the agent {}'s tools: {missing}",
                self.name
            ))
        })
    }

    /// Lists the tools its MCP servers offer, once per process (at once after that): a tool only
    /// a listing gives is known here only then. A server that is down is `unavailable`, and
    /// the next call tries again.
    pub async fn list_tools(&self) -> Result<(), EngineError> {
        self.tools
            .prepare()
            .await
            .map_err(|e| EngineError::Unavailable(e.to_string()))
    }

    /// [`Agent::list_tools`] unless `tool` is known here: a run this process did not start (or
    /// started before it was restarted) may name a tool only a listing gives.
    pub async fn knowing(&self, tool: &str) -> Result<(), EngineError> {
        match self.tools.get(tool) {
            Some(_) => Ok(()),
            None => self.list_tools().await,
        }
    }

    /// What a tool says about itself, as policy may match it.
    pub fn hints(&self, tool: &str) -> ToolHints {
        self.tools.get(tool).map(|t| t.hints()).unwrap_or_default()
    }

    /// The one gate every proposed call passes before policy rules on it, whoever proposed it:
    /// a tool of this agent, arguments that are a JSON object within their share
    /// ([`budget::ARGS`], canonical), and that match the tool's input schema. Pure: nothing is
    /// written here.
    pub fn check_call(&self, tool: &str, input: Value) -> Result<Args, Unfit> {
        let unfit = |why: String, args: Option<Args>| Unfit { why, args };
        if self.tools.get(tool).is_none() {
            return Err(unfit(format!("there is no tool named {tool}"), None));
        }
        let args = Args::new(input).map_err(|e| unfit(e.to_string(), None))?;
        let len = args.canonical().len();
        if let Some(why) = budget::too_large(len, budget::ARGS) {
            return Err(unfit(why, None));
        }
        let schema = self.schema(tool);
        let checked = match schema.as_ref() {
            Ok(schema) => schema
                .check(&args)
                .map_err(|why| format!("the arguments do not match the tool's schema: {why}")),
            Err(why) => Err(format!("the tool's schema cannot be used: {why}")),
        };
        match checked {
            Ok(()) => Ok(args),
            Err(why) => Err(unfit(why, Some(args))),
        }
    }

    /// The lease of a tool its caller runs (`executor = "caller"`); `None` for a bound tool.
    pub fn caller_lease(&self, tool: &str) -> Option<std::time::Duration> {
        self.tools.get(tool)?.caller_lease()
    }

    /// A tool's compiled input schema, compiled once per process.
    fn schema(&self, tool: &str) -> Arc<Result<Schema, String>> {
        let mut schemas = self.schemas.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(schema) = schemas.get(tool) {
            return schema.clone();
        }
        let spec = self.tools.get(tool).map(|t| t.spec());
        let compiled = match spec {
            Some(spec) => Schema::compile(&spec.input_schema),
            None => Err(format!("there is no tool named {tool}")),
        };
        let compiled = Arc::new(compiled);
        schemas.insert(tool.to_string(), compiled.clone());
        compiled
    }

    /// Runs a policy's test cases against this agent: each case's call passes the gate a real
    /// call passes (a tool of the agent, arguments that match its schema) before policy rules
    /// on it, with the tool's own hints.
    pub fn run_cases(&self, cases: &Cases, people: &Directory) -> Vec<Failure> {
        cases.run(&self.policy, self.name.as_str(), people, &|tool, input| {
            let args = self.check_call(tool, input).map_err(|unfit| unfit.why)?;
            Ok((args, self.hints(tool)))
        })
    }

    /// What `policy` (the agent's own, or a candidate replayed) says about one proposed call
    /// asked by `asker` as their standing says, with the tool's `hints` and the totals of the
    /// policy's history windows, at `at`.
    #[allow(clippy::too_many_arguments)]
    pub fn decide(
        &self,
        policy: &Policy,
        asker: Asker<'_>,
        tool: &str,
        args: &Args,
        hints: ToolHints,
        history: &BTreeMap<String, Total>,
        at: DateTime<Utc>,
    ) -> Ruling {
        let requester = Requester {
            name: asker.person.as_str(),
            tenant: asker.tenant.as_str(),
            roles: asker.standing.roles.iter().map(Role::as_str).collect(),
            claims: asker
                .standing
                .claims
                .iter()
                .map(|(name, value)| (name.as_str(), value.clone()))
                .collect(),
        };
        policy.decide(&CallFacts {
            tool,
            args,
            hints,
            agent: self.name.as_str(),
            requester: &requester,
            history,
            at,
        })
    }

    /// Who asks a person about one call of `run`, under this agent's rules: the requester and
    /// the call's claimants may never decide it.
    pub fn asking(
        &self,
        run: &Run,
        tool: &str,
        args: &Args,
        opened_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Asking {
        let mut requested_by = run.requesters();
        for claimant in self.claimants(tool, args) {
            if !requested_by.contains(&claimant) {
                requested_by.push(claimant);
            }
        }
        Asking {
            agent: self.name.clone(),
            hints: self.hints(tool),
            requested_by,
            standing: Some(run.standing.clone()),
            policy_version: self.policy.version,
            opened_at,
            expires_at,
        }
    }

    /// The people a call names who may not approve it: the tool's own claimants (the expense
    /// claim's employee) and the person in the argument the definition names, if any.
    pub fn claimants(&self, tool: &str, args: &Args) -> Vec<PersonId> {
        let mut people = self
            .tools
            .get(tool)
            .map(|t| t.claimants(args))
            .unwrap_or_default();
        let named = self.claimant_args.get(tool).and_then(|arg| args.str(arg));
        people.extend(named.and_then(|name| PersonId::parse(name).ok()));
        people.sort();
        people.dedup();
        people
    }
}

/// The agents of one engine, by name: each built at the start, or, where the process may never
/// need it (a function), when the first call that names it arrives, once per process.
#[derive(Clone, Default)]
pub struct Agents(BTreeMap<AgentName, Arc<Entry>>);

/// Builds an agent when first asked for; its error names the definition's file, field and
/// reason.
pub type BuildAgent = Box<dyn Fn() -> Result<Agent, String> + Send + Sync>;

/// One agent of an engine: its tenants known from the start, the agent itself built or to be.
struct Entry {
    tenants: Option<BTreeSet<TenantId>>,
    built: OnceLock<Arc<Agent>>,
    build: Option<BuildAgent>,
}

impl Entry {
    fn serves(&self, tenant: &TenantId) -> bool {
        serves(&self.tenants, tenant)
    }

    /// The agent, built now if it was not yet. Two callers at once may both build it; one
    /// result is kept, and building twice writes nothing.
    fn agent(&self, name: &AgentName) -> Result<&Arc<Agent>, EngineError> {
        if let Some(agent) = self.built.get() {
            return Ok(agent);
        }
        let build = self
            .build
            .as_ref()
            .expect("an entry without a builder is built");
        let agent = build().map_err(|why| {
            tracing::error!(agent = %name, %why, "the agent's definition cannot be built");
            EngineError::NotConfigured(format!("the agent {name} cannot be built here: {why}"))
        })?;
        Ok(self.built.get_or_init(|| Arc::new(agent)))
    }
}

fn serves(tenants: &Option<BTreeSet<TenantId>>, tenant: &TenantId) -> bool {
    tenants.as_ref().is_none_or(|t| t.contains(tenant))
}

impl Agents {
    pub fn insert(&mut self, agent: Agent) {
        let name = agent.name.clone();
        let entry = Entry {
            tenants: agent.tenants.clone(),
            built: OnceLock::from(Arc::new(agent)),
            build: None,
        };
        self.0.insert(name, Arc::new(entry));
    }

    /// An agent of this name, serving `tenants`, that `build` makes when a call first needs it.
    pub fn insert_lazy(
        &mut self,
        name: AgentName,
        tenants: Option<BTreeSet<TenantId>>,
        build: BuildAgent,
    ) {
        let entry = Entry {
            tenants,
            built: OnceLock::new(),
            build: Some(build),
        };
        self.0.insert(name, Arc::new(entry));
    }

    /// The agent of this name for `tenant`. To a tenant it does not serve it does not exist:
    /// `not_found`, in the words an unknown agent gets, on every route that looks it up here.
    pub fn get(&self, tenant: &TenantId, name: &AgentName) -> Result<&Arc<Agent>, EngineError> {
        self.0
            .get(name)
            .filter(|entry| entry.serves(tenant))
            .ok_or_else(|| EngineError::not_found(format!("agent {name}")))?
            .agent(name)
    }

    /// Whether `tenant` may read records of the agent `name`: unless this process loads the
    /// agent and it does not serve the tenant (a definition changed since they were written).
    pub fn admits(&self, tenant: &TenantId, name: &AgentName) -> bool {
        self.0.get(name).is_none_or(|entry| entry.serves(tenant))
    }

    /// Whether this process loads an agent of this name, for any tenant.
    pub fn contains(&self, name: &AgentName) -> bool {
        self.0.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &AgentName> {
        self.0.keys()
    }

    /// Every agent, each built now if it was not yet; one that cannot be built is left out
    /// (its error is logged).
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Agent>> {
        self.0
            .iter()
            .filter_map(|(name, entry)| entry.agent(name).ok())
    }
}
