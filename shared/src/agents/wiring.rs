//! A definition made the engine's [`Agent`] in one process: its tools built from their
//! bindings over what the process has (store, clock, HTTP client, environment), and its model
//! from the `[model]` table. A definition is data; the adapters are built here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::DefinitionError;
use super::definition::{
    ApiEndpoint, Definition, ModelSettings, Offline, Provider, ToolBinding, ToolDefinition,
    binding_error,
};
use super::mcp::{BoundMcpTool, LazyServer, McpTools};
use crate::adapters::anthropic::{self, AnthropicModel};
use crate::adapters::bedrock::BedrockModel;
use crate::adapters::env_template::{self, BindingError, EnvError, Filling, Lookup};
use crate::adapters::http_tool::{HttpBinding, HttpTool, SharedClient};
use crate::adapters::openai::{OpenAiEndpoint, OpenAiModel};
use crate::adapters::scripted::ScriptedModel;
use crate::adapters::secrets::Secrets;
use crate::domain::action::ToolOutcome;
use crate::domain::identity::Directory;
use crate::engine::{Agent, Limits};
use crate::example::expense::{self, Claims, OfflineExpenseAgent};
use crate::ports::clock::Clock;
use crate::ports::model::{Model, ToolSpec};
use crate::ports::store::ItemStore;
use crate::ports::tools::{NotRunnableHere, Tool, ToolCall, Toolbox};

/// Set (a model id or inference profile), every definition whose provider is a model API is
/// played by Bedrock with that model: how an AWS deployment moves its agents to Bedrock
/// without editing them.
pub const BEDROCK_MODEL_VAR: &str = "COUNTERSIGN_BEDROCK_MODEL";

/// When a process needs the variables (`${VAR}`) its agents' bindings read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Environment {
    /// At start: the process runs tools (it serves, drives or resumes runs), so a variable
    /// unset here stops it, naming the file and the field.
    AtStart,
    /// Only to run a tool: a tool whose variable is unset here is bound all the same, and this
    /// process runs none of its agent's calls; they wait, unclaimed, for a process that has
    /// the agent's environment. For the commands that review, decide and read.
    WhenRun,
}

/// What binding a definition's tools and model needs from the process.
pub struct Wiring<'a> {
    pub store: Arc<dyn ItemStore>,
    pub clock: Arc<dyn Clock>,
    /// The expense example's claims, for its built-in tools.
    pub claims: Arc<Claims>,
    /// One HTTP client for every HTTP tool of the process: built while binding where runs are
    /// driven (in Lambda's init phase), elsewhere at a tool's first call, which the decide and
    /// sweep functions never make.
    pub http: SharedClient,
    /// Where `${VAR}` in bindings is read from.
    pub env: Lookup<'a>,
    /// Whether this process drives runs (start, resume): only then is a model attached.
    pub drives: bool,
    /// When the variables bindings read are needed.
    pub environment: Environment,
    /// The roles people hold, where the process knows them (its people file): every role a
    /// policy rule names must be one. `None` checks no role names.
    pub roles: Option<BTreeSet<String>>,
}

impl<'a> Wiring<'a> {
    /// Tools over `store` and `clock`, `${VAR}` from the process environment, no model.
    pub fn new(store: Arc<dyn ItemStore>, clock: Arc<dyn Clock>, claims: Arc<Claims>) -> Self {
        Self {
            store,
            clock,
            claims,
            http: Default::default(),
            env: &env_template::process_env,
            drives: false,
            environment: Environment::AtStart,
            roles: None,
        }
    }

    /// With the roles the people of `directory` hold, as policy rules may name them.
    pub fn with_roles_of(mut self, directory: &Directory) -> Self {
        self.roles = Some(directory.roles());
        self
    }

    /// Builds every definition into an agent.
    pub fn build_all(&self, definitions: &[Definition]) -> Result<Vec<Agent>, DefinitionError> {
        definitions.iter().map(|d| self.build(d)).collect()
    }

    /// Binds the definition's tools (resolving `${VAR}` from the environment, or, where only
    /// running a tool needs them, noting the first one unset) and, for a process that drives
    /// runs, its model: the Anthropic API with `ANTHROPIC_API_KEY`, else the offline one.
    pub fn build(&self, definition: &Definition) -> Result<Agent, DefinitionError> {
        let file = &definition.file;
        let mut toolbox = Toolbox::new();
        let mut claimant_args = BTreeMap::new();
        let builtins = expense::toolbox(
            self.claims.clone(),
            definition.policy.clone(),
            self.store.clone(),
            self.clock.clone(),
        );
        let mut servers = BTreeMap::new();
        for (name, binding) in &definition.mcp {
            let resolved = binding.resolve(&format!("mcp.{name}"), self.env);
            let resolved = self.unless_unset(file, resolved)?;
            servers.insert(name.clone(), LazyServer::new(name, resolved));
        }
        for tool in &definition.tools {
            let field = format!("tools.{}", tool.name);
            let bound: Arc<dyn Tool> = match &tool.binding {
                ToolBinding::Builtin(name) => {
                    let short = name.trim_start_matches("expense.");
                    builtins.get(short).cloned().ok_or_else(|| {
                        DefinitionError::new(file, &field, format!("no built-in tool {name}"))
                    })?
                }
                ToolBinding::Http(binding) => self.http_tool(file, &field, tool, binding)?,
                ToolBinding::Caller { lease } => Arc::new(CallerTool {
                    spec: tool.spec.clone().expect("a caller-run tool has its spec"),
                    lease: *lease,
                }),
                ToolBinding::Mcp {
                    binding,
                    description,
                    input_schema,
                } => Arc::new(BoundMcpTool {
                    name: tool.name.clone(),
                    server: servers[&binding.server].clone(),
                    remote: binding.tool.clone(),
                    description: description.clone(),
                    input_schema: input_schema.clone(),
                }),
            };
            if bound.spec().name != tool.name {
                return Err(DefinitionError::new(
                    file,
                    &field,
                    format!("the built-in tool is named {}", bound.spec().name),
                ));
            }
            // An MCP entry without a schema of its own is checked once its server lists it.
            if !tool.schema_is_listed() {
                definition
                    .policy
                    .check_fields(&tool.name, &bound.spec().input_schema)
                    .map_err(|(field, why)| {
                        DefinitionError::new(&definition.policy_file, &field, why)
                    })?;
            }
            toolbox = toolbox.with(bound);
            if let Some(arg) = &tool.claimant {
                claimant_args.insert(tool.name.clone(), arg.clone());
            }
        }
        // The specs known now; a tool an MCP server lists is known once listed.
        let known: Vec<(String, serde_json::Value)> = definition
            .tools
            .iter()
            .filter(|tool| !tool.schema_is_listed())
            .filter_map(|tool| {
                let spec = toolbox.get(&tool.name)?.spec();
                Some((spec.name, spec.input_schema))
            })
            .collect();
        if !definition.needs_listing() {
            definition
                .policy_files
                .check(&definition.policy, &known, self.roles.as_ref())?;
        }
        if !servers.is_empty() {
            // An entry's own schema was checked at load; the listing's is checked once listed.
            let schema_listed = || definition.tools.iter().filter(|t| t.schema_is_listed());
            toolbox = toolbox.with_source(Arc::new(McpTools {
                file: file.clone(),
                policy_file: definition.policy_file.clone(),
                servers,
                entries: definition
                    .tools
                    .iter()
                    .map(|tool| {
                        let remote = match &tool.binding {
                            ToolBinding::Mcp { binding, .. } => {
                                Some((binding.server.clone(), binding.tool.clone()))
                            }
                            _ => None,
                        };
                        (tool.name.clone(), remote)
                    })
                    .collect(),
                claimants: schema_listed()
                    .filter_map(|tool| Some((tool.name.clone(), tool.claimant.clone()?)))
                    .collect(),
                listed_schemas: schema_listed().map(|tool| tool.name.clone()).collect(),
                policy: definition.policy.clone(),
                policy_files: definition.policy_files.clone(),
                known,
                roles: self.roles.clone(),
                script_tools: match definition.model.as_ref().and_then(|m| m.offline.as_ref()) {
                    Some(Offline::Script(script)) => script.tools().map(str::to_string).collect(),
                    _ => Vec::new(),
                },
                listed: Default::default(),
            }));
        }
        let mut agent = Agent::new(definition.name.clone(), definition.policy.clone())
            .with_tools(toolbox)
            .with_system_prompt(definition.system_prompt.clone())
            .with_limits(Limits {
                max_model_turns: definition
                    .model
                    .as_ref()
                    .map_or(Limits::default().max_model_turns, |m| m.max_turns),
                ..Limits::default()
            });
        agent.gateway_only = definition.model.is_none();
        agent.tenants = definition.tenants.clone();
        if let Some(field) = definition.secret_open_to_every_tenant() {
            tracing::warn!(
                agent = %definition.name,
                file = %definition.file,
                %field,
                "names no tenants, so every tenant may use it, and its bindings hold secrets: name \
                 the tenants that may, with tenants = [...]"
            );
        }
        agent.claimant_args = claimant_args;
        agent.recovery_owner = definition.recovery_owner.clone();
        if self.drives
            && let Some(settings) = &definition.model
        {
            match model_of(definition, self.env)? {
                Some(model) => agent = agent.with_model(model),
                None => agent.model_missing = Some(no_model(definition, settings)),
            }
        }
        Ok(agent)
    }
}

impl Wiring<'_> {
    /// An HTTP tool, the arguments its URLs name checked against its schema; where a variable
    /// it reads is unset and only running it needs it, a stand-in this process never runs.
    fn http_tool(
        &self,
        file: &str,
        field: &str,
        tool: &ToolDefinition,
        binding: &HttpBinding,
    ) -> Result<Arc<dyn Tool>, DefinitionError> {
        let spec = tool.spec.clone().expect("an HTTP tool has its spec");
        let resolved = binding.resolve(&format!("{field}.http"), self.env);
        let resolved = match self.unless_unset(file, resolved)? {
            Ok(resolved) => resolved,
            Err(missing) => return Ok(Arc::new(NotHere { spec, missing })),
        };
        if let Some((at, missing)) = resolved
            .named_arguments()
            .into_iter()
            .find(|(_, arg)| spec.input_schema["properties"].get(*arg).is_none())
        {
            let named = match at.ends_with("url") {
                true => format!("{{{missing}}}"),
                false => missing.to_string(),
            };
            return Err(DefinitionError::new(
                file,
                &format!("{field}.http.{at}"),
                format!("{named} is not one of the tool's arguments"),
            ));
        }
        if self.drives {
            self.http.get();
        }
        Ok(Arc::new(HttpTool::new(spec, resolved, self.http.clone())))
    }

    /// A binding as resolved; where only running a tool needs its variables, a variable unset
    /// here is what this process lacks to run it, not an error. Any other fault is the
    /// definition's.
    fn unless_unset<T>(
        &self,
        file: &str,
        resolved: Result<T, BindingError>,
    ) -> Result<Result<T, NotRunnableHere>, DefinitionError> {
        match resolved {
            Ok(resolved) => Ok(Ok(resolved)),
            Err(BindingError::Env(EnvError::Unset { field, var }))
                if self.environment == Environment::WhenRun =>
            {
                Ok(Err(NotRunnableHere { var, field }))
            }
            Err(error) => Err(binding_error(file, error)),
        }
    }
}

/// A bound tool this process cannot run: a variable its binding reads is unset here. Its calls
/// are checked and ruled on as the definition describes it; the engine never claims one here.
struct NotHere {
    spec: ToolSpec,
    missing: NotRunnableHere,
}

#[async_trait::async_trait]
impl Tool for NotHere {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    async fn call(&self, _call: ToolCall<'_>) -> ToolOutcome {
        ToolOutcome::Failed {
            error: format!("{}; nothing was sent", self.missing),
        }
    }

    fn runs_here(&self) -> Result<(), NotRunnableHere> {
        Err(self.missing.clone())
    }
}

/// The model that plays the agent here: the provider's API when its key is set (Claude with
/// `ANTHROPIC_API_KEY`; an OpenAI-compatible API with its `api_key_env`, or without a key when
/// it names none), else the offline one, if the definition has one.
fn model_of(
    definition: &Definition,
    env: Lookup<'_>,
) -> Result<Option<Arc<dyn Model>>, DefinitionError> {
    let Some(settings) = definition.model.as_ref() else {
        return Ok(None);
    };
    let refused = |field: &str, why: String| DefinitionError::new(&definition.file, field, why);
    let on_bedrock = env(BEDROCK_MODEL_VAR).filter(|id| !id.trim().is_empty());
    match (settings.provider, on_bedrock) {
        (Provider::Scripted, _) => {}
        (_, Some(id)) => return Ok(Some(Arc::new(bedrock(settings, id.trim())))),
        (Provider::Bedrock, None) => return Ok(Some(Arc::new(bedrock(settings, &settings.id)))),
        _ => {}
    }
    match (settings.provider, &settings.endpoint) {
        (Provider::Anthropic, _) => {
            let found = AnthropicModel::from_env_for(
                &settings.id,
                settings.max_tokens,
                settings.turn_timeout,
            )
            .map_err(|why| refused("model", why))?;
            if let Some(model) = found {
                return Ok(Some(Arc::new(model)));
            }
        }
        (Provider::OpenAi, Some(endpoint)) => {
            let key = match &endpoint.api_key_env {
                None => Some(None),
                Some(var) => env(var)
                    .filter(|k| !k.trim().is_empty())
                    .map(|k| Some((k.trim().to_string(), var.as_str()))),
            };
            if let Some(key) = key {
                let mut secrets = Secrets::default();
                let base_url = env_template::expand_into(
                    &endpoint.base_url,
                    "model.base_url",
                    env,
                    &mut secrets,
                    Filling::Text,
                )
                .map_err(|e| binding_error(&definition.file, BindingError::Env(e)))?;
                let api = OpenAiEndpoint {
                    base_url: &base_url,
                    secrets,
                    key: key.as_ref().map(|(key, var)| (key.as_str(), *var)),
                    turn_timeout: settings.turn_timeout,
                };
                let model = OpenAiModel::new(api, &settings.id, settings.max_tokens)
                    .map_err(|why| refused("model.base_url", why))?;
                return Ok(Some(Arc::new(model)));
            }
        }
        _ => {}
    }
    Ok(match settings.offline.as_ref() {
        None => None,
        Some(Offline::Script(script)) => Some(Arc::new(ScriptedModel::new(
            format!("{}-script", definition.name),
            script.clone(),
        ))),
        Some(Offline::Expense) => Some(Arc::new(OfflineExpenseAgent)),
    })
}

/// Why no model plays an agent whose definition names one: the variable its model API's key
/// is read from is unset, and it names no offline script.
fn no_model(definition: &Definition, settings: &ModelSettings) -> String {
    let var = match &settings.endpoint {
        Some(ApiEndpoint {
            api_key_env: Some(var),
            ..
        }) => var.as_str(),
        _ => anthropic::KEY_VARIABLE,
    };
    format!(
        "the agent {} has no model in this process: its [model] reads the API key from {var}, \
         which is not set here, and it names no offline script to play it without one",
        definition.name
    )
}

/// Bedrock playing model `id` with the definition's settings.
fn bedrock(settings: &ModelSettings, id: &str) -> BedrockModel {
    BedrockModel::new(id, settings.max_tokens, settings.turn_timeout)
}

/// A tool its caller runs: described here, never called here.
struct CallerTool {
    spec: ToolSpec,
    lease: std::time::Duration,
}

#[async_trait::async_trait]
impl Tool for CallerTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    async fn call(&self, _call: ToolCall<'_>) -> ToolOutcome {
        ToolOutcome::Failed {
            error: format!(
                "{} runs in its caller's process, never in Countersign: not executed",
                self.spec.name
            ),
        }
    }

    fn caller_lease(&self) -> Option<std::time::Duration> {
        Some(self.lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::definition::tests::{POLICY, REFUND_TOOL, listed, load, loaded, refused};

    /// An embedded store in a scratch directory, removed when dropped.
    struct Scratch(std::path::PathBuf, Arc<dyn ItemStore>);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = crate::testing::scratch_dir(name);
            let store = crate::adapters::sqlite::SqliteStore::open_dir(&dir).unwrap();
            Self(dir, Arc::new(store))
        }

        /// A wiring over the store, `${VAR}` read from `env`, driving runs if `drives`.
        fn wiring(&self, env: Lookup<'static>, drives: bool) -> Wiring<'static> {
            Wiring {
                env,
                drives,
                ..Wiring::new(
                    self.1.clone(),
                    Arc::new(crate::ports::clock::SystemClock),
                    crate::example::expense::default_claims(),
                )
            }
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            std::fs::remove_dir_all(&self.0).ok();
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn only_a_process_that_drives_runs_builds_the_http_tools_client_when_binding() {
        let scratch = Scratch::new("wiring");
        let refunds = crate::agents::shipped_one("refunds").unwrap();
        assert!(matches!(refunds.tools[0].binding, ToolBinding::Http(_)));
        for drives in [false, true] {
            let wiring = scratch.wiring(&env_template::process_env, drives);
            wiring.build(&refunds).expect("the refunds agent binds");
            assert_eq!(wiring.http.is_built(), drives, "drives: {drives}");
        }
    }

    #[test]
    fn a_process_that_drives_runs_without_the_models_key_says_which_variable_it_lacks() {
        let scratch = Scratch::new("no-key");
        let oai = listed(
            "[model]\nprovider = \"openai\"\nid = \"gpt-4o\"\napi_key_env = \"OAI_TEST_KEY\"\n",
        );

        let agent = scratch.wiring(&no_env, true).build(&oai).unwrap();

        assert!(agent.model.is_none());
        let Err(error) = agent.model_here() else {
            panic!("no model without its key");
        };
        assert_eq!(error.code(), "not_configured");
        assert_eq!(
            error.to_string(),
            "the agent orders has no model in this process: its [model] reads the API key from \
             OAI_TEST_KEY, which is not set here, and it names no offline script to play it \
             without one"
        );
        let with_key = |var: &str| (var == "OAI_TEST_KEY").then(|| "sk-test".to_string());
        let keyed = Wiring {
            env: &with_key,
            ..scratch.wiring(&no_env, true)
        };
        assert!(keyed.build(&oai).unwrap().model_here().is_ok());
    }

    /// What building `agent` under the test policy, with no environment, is refused with.
    fn build_refused(agent: &str) -> DefinitionError {
        let scratch = Scratch::new("http-binding");
        let Err(error) = scratch.wiring(&no_env, false).build(&loaded(agent)) else {
            panic!("the definition should not build");
        };
        error
    }

    #[test]
    fn an_http_url_with_credentials_is_refused_naming_the_file_and_field_not_the_credentials() {
        let error = build_refused(&format!(
            "{REFUND_TOOL}[tools.issue_refund.http]\nmethod = \"POST\"\n\
             url = \"http://refunder:hunter22@orders.example/orders/{{order_id}}/refunds\"\n"
        ));
        assert_eq!(error.file, "test/agent.toml");
        assert_eq!(error.field, "tools.issue_refund.http.url");
        assert!(error.message.contains("in a header"), "{error}");
        assert!(!error.to_string().contains("hunter22"), "{error}");
    }

    #[test]
    fn a_lookup_query_argument_the_schema_lacks_names_its_field() {
        let error = build_refused(&format!(
            "{REFUND_TOOL}[tools.issue_refund.http]\nmethod = \"POST\"\n\
             url = \"http://orders.example/orders/{{order_id}}/refunds\"\n\
             [tools.issue_refund.http.reconcile]\nmethod = \"GET\"\n\
             url = \"http://orders.example/refunds/by-key/{{idempotency_key}}\"\n\
             query = [\"customer\"]\n"
        ));
        assert_eq!(error.file, "test/agent.toml");
        assert_eq!(error.field, "tools.issue_refund.http.reconcile.query");
        assert!(
            error
                .message
                .contains("customer is not one of the tool's arguments"),
            "{error}"
        );
    }

    /// An HTTP refund tool whose amount is `amount_cents`, an integer the schema requires.
    const GATED_REFUND_TOOL: &str = r#"
[tools.issue_refund]
description = "Refunds an order."
input_schema = { type = "object", properties = { order_id = { type = "string" }, amount_cents = { type = "integer" }, note = { type = "string" }, tip = { type = "number" } }, required = ["order_id", "amount_cents"] }
http = { method = "POST", url = "http://127.0.0.1:9/orders/{order_id}/refunds" }
"#;

    /// Building `tool` under a policy gating it with `rule` (its `amount_field`).
    fn built_gated(tool: &str, rule: &str) -> Result<(), DefinitionError> {
        let policy = format!(
            "name = \"refunds\"\nversion = 1\ndefault_ttl = \"1h\"\n[tools.issue_refund]\ndecision = \"approve\"\napprover_role = \"finance\"\n{rule}\n[[tools.issue_refund.thresholds]]\nabove = \"$100\"\nquorum = 1\nreason = \"Large refunds need finance.\"\n"
        );
        let definition = load(tool, &policy).expect("the files parse");
        let scratch = Scratch::new("amount-field");
        let wiring = scratch.wiring(&env_template::process_env, false);
        wiring.build(&definition).map(|_| ())
    }

    #[test]
    fn a_policy_amount_field_must_be_a_required_integer_argument_of_its_tool() {
        assert_eq!(
            built_gated(GATED_REFUND_TOOL, "amount_field = \"amount_cents\""),
            Ok(())
        );
        let cases = [
            (
                "amount_field = \"amount\"",
                "tools.issue_refund.amount_field",
                "amount is not one of issue_refund's arguments",
            ),
            (
                "amount_field = \"tip\"",
                "tools.issue_refund.amount_field",
                "issue_refund's argument tip must have type \"integer\" (whole cents)",
            ),
            (
                "amount_field = \"note\"",
                "tools.issue_refund.amount_field",
                "issue_refund's argument note must have type \"integer\" (whole cents)",
            ),
        ];
        for (rule, field, message) in cases {
            let error = built_gated(GATED_REFUND_TOOL, rule).expect_err(rule);
            assert_eq!(error.file, "test/policy.toml", "{rule}");
            assert_eq!(error.field, field, "{rule}");
            assert_eq!(error.message, message, "{rule}");
        }
    }

    #[test]
    fn a_policy_amount_field_the_schema_does_not_require_is_refused() {
        let optional = GATED_REFUND_TOOL.replace(
            r#"required = ["order_id", "amount_cents"]"#,
            r#"required = ["order_id"]"#,
        );
        let error = built_gated(&optional, "amount_field = \"amount_cents\"").expect_err("refused");
        assert_eq!(error.field, "tools.issue_refund.amount_field");
        assert_eq!(
            error.message,
            "issue_refund's input schema must list amount_cents under required"
        );
    }

    #[test]
    fn an_openai_model_is_played_by_its_api_when_its_key_is_set_and_offline_otherwise() {
        let definition = listed(
            "[model]\nprovider = \"openai\"\nid = \"gpt-4o\"\n\
             base_url = \"${LLM_URL:-http://127.0.0.1:4000}/v1\"\napi_key_env = \"LLM_KEY\"\n",
        );
        let with_key = |var: &str| (var == "LLM_KEY").then(|| "sk-test".to_string());
        let model = model_of(&definition, &with_key)
            .unwrap()
            .expect("the API plays it");
        assert_eq!(model.name(), "gpt-4o");
        assert!(
            model_of(&definition, &|_| None).unwrap().is_none(),
            "no key and no offline script: no model here"
        );
        let keyless = listed(
            "[model]\nprovider = \"openai\"\nid = \"llama3.1\"\n\
             base_url = \"http://127.0.0.1:11434/v1\"\napi_key_env = \"\"\n",
        );
        assert!(model_of(&keyless, &|_| None).unwrap().is_some());
    }

    #[test]
    fn bedrock_plays_a_bedrock_definition_and_any_api_definition_once_the_deployment_names_its_model()
     {
        let bedrock = listed(
            "[model]\nprovider = \"bedrock\"\nid = \"us.anthropic.claude-sonnet-4-5-20250929-v1:0\"\n",
        );
        let model = model_of(&bedrock, &|_| None).unwrap().unwrap();
        assert_eq!(model.name(), "us.anthropic.claude-sonnet-4-5-20250929-v1:0");
        let no_id = refused("[model]\nprovider = \"bedrock\"\n", POLICY);
        assert_eq!(no_id.field, "model.id");

        let deployed = |var: &str| {
            (var == BEDROCK_MODEL_VAR).then(|| "anthropic.claude-3-5-haiku-20241022-v1:0".into())
        };
        for table in [
            "[model]\nprovider = \"anthropic\"\n",
            "[model]\nprovider = \"openai\"\nid = \"gpt-4o\"\n",
        ] {
            let model = model_of(&listed(table), &deployed).unwrap().unwrap();
            assert_eq!(
                model.name(),
                "anthropic.claude-3-5-haiku-20241022-v1:0",
                "{table}"
            );
        }
    }
}
