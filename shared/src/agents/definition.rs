//! One agent definition: `agent.toml` parsed and checked, its policy and offline script read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::mcp::{self, BoundMcpTool, LazyServer, McpTools};
use super::{DEFINITION_FILE, DefinitionError, Files, Wiring, schema};
use crate::adapters::anthropic::AnthropicModel;
use crate::adapters::bedrock::BedrockModel;
use crate::adapters::env_template::{self, BindingError, Lookup};
use crate::adapters::http_tool::{HttpBinding, HttpTool, parse_duration};
use crate::adapters::mcp_tool::{McpServerBinding, McpToolBinding, SERVER_FORMS};
use crate::adapters::model_api::DEFAULT_TURN_TIMEOUT;
use crate::adapters::openai::{self, OpenAiEndpoint, OpenAiModel};
use crate::adapters::scripted::{Script, ScriptedModel};
use crate::adapters::secrets::Secrets;
use crate::domain::action::ToolOutcome;
use crate::domain::ids::{AgentName, Role};
use crate::domain::policy::Policy;
use crate::engine::{Agent, Limits};
use crate::example::expense::{self, OfflineExpenseAgent};
use crate::ports::model::{Model, ToolSpec};
use crate::ports::tools::{Tool, Toolbox};

/// The most model turns and tokens a definition may ask for, and the longest time per turn.
const MAX_TURNS: u32 = 64;
const MAX_TOKENS: u32 = 64_000;
const MAX_TURN_TIMEOUT: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// The Anthropic Messages API when `ANTHROPIC_API_KEY` is set, else the offline model.
    Anthropic,
    /// An OpenAI-compatible Chat Completions API when its key's variable is set (or it takes
    /// no key), else the offline model.
    #[serde(rename = "openai")]
    OpenAi,
    /// Amazon Bedrock's Converse API, with the process's AWS credentials and region.
    Bedrock,
    /// Always the offline script, even with a key.
    Scripted,
}

/// What plays the agent without a model API.
#[derive(Debug, Clone, PartialEq)]
pub enum Offline {
    /// A scripted conversation from a file of the definition.
    Script(Script),
    /// The expense agent's offline model, written in Rust.
    Expense,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelSettings {
    pub provider: Provider,
    pub id: String,
    pub max_turns: u32,
    pub max_tokens: u32,
    /// How long one turn may take, retries and their waits included.
    pub turn_timeout: Duration,
    /// Where an `openai` provider's API is.
    pub endpoint: Option<ApiEndpoint>,
    pub offline: Option<Offline>,
}

/// An OpenAI-compatible API: its base URL (`${VAR}` filled when built) and the variable that
/// holds its key, if it takes one.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiEndpoint {
    pub base_url: String,
    pub api_key_env: Option<String>,
}

/// How a tool is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolBinding {
    /// A tool written in Rust and shipped with Countersign, such as `expense.reimburse`.
    Builtin(String),
    /// An HTTP endpoint; its `${VAR}` are filled when it is built.
    Http(HttpBinding),
    /// A tool of a server under `[mcp.*]`; the entry's description and schema, if given, stand
    /// in for the listed ones.
    Mcp {
        binding: McpToolBinding,
        description: Option<String>,
        input_schema: Option<Value>,
    },
    /// No binding: its caller runs it (`executor = "caller"`) after claiming the approved call
    /// for `lease`.
    Caller { lease: std::time::Duration },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    pub name: String,
    /// What the model reads; a built-in tool describes itself, an MCP server lists its own.
    pub spec: Option<ToolSpec>,
    pub binding: ToolBinding,
    /// The argument naming a person who may not approve the call.
    pub claimant: Option<String>,
}

impl ToolDefinition {
    /// Whether its input schema is the one its MCP server lists (the entry gives none).
    fn schema_is_listed(&self) -> bool {
        matches!(
            self.binding,
            ToolBinding::Mcp {
                input_schema: None,
                ..
            }
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub name: AgentName,
    pub description: Option<String>,
    /// Where it was loaded from, as errors name it.
    pub file: String,
    /// Where its policy was loaded from.
    pub policy_file: String,
    pub policy: Arc<Policy>,
    pub system_prompt: String,
    /// `None` without a `[model]` table: an agent used only through the MCP gateway and the
    /// gate API, whose caller's own agent proposes each call; no run can be started with it.
    pub model: Option<ModelSettings>,
    pub tools: Vec<ToolDefinition>,
    /// `[mcp.<server>]`: the MCP servers its tools come from, by the name it gives them.
    pub mcp: BTreeMap<String, McpServerBinding>,
    pub recovery_owner: Option<Role>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefinition {
    name: String,
    description: Option<String>,
    #[serde(default = "default_policy_file")]
    policy: String,
    system_prompt: String,
    recovery_owner: Option<String>,
    model: Option<RawModel>,
    #[serde(default)]
    tools: BTreeMap<String, RawTool>,
    #[serde(default)]
    mcp: BTreeMap<String, toml::Value>,
}

fn default_policy_file() -> String {
    "policy.toml".into()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    provider: Option<Provider>,
    id: Option<String>,
    base_url: Option<String>,
    api_key_env: Option<String>,
    turn_timeout: Option<String>,
    max_turns: Option<u32>,
    max_tokens: Option<u32>,
    offline: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    description: Option<String>,
    input_schema: Option<toml::Value>,
    claimant: Option<String>,
    builtin: Option<String>,
    http: Option<toml::Value>,
    mcp: Option<toml::Value>,
    /// `"caller"`: the caller runs it in its own process, after claiming the approved call.
    executor: Option<String>,
    /// How long a caller's claim waits for its outcome (15 minutes unless given).
    lease: Option<String>,
}

/// How long a caller's claim of a call waits for its outcome unless the tool says.
pub const DEFAULT_LEASE: std::time::Duration = std::time::Duration::from_secs(15 * 60);
/// The longest lease a tool may give its caller's claims.
const MAX_LEASE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The built-in tools a definition may bind, by name.
const BUILTINS: [&str; 5] = [
    "expense.get_claim",
    "expense.get_policy",
    "expense.find_similar_claims",
    "expense.reimburse",
    "expense.decline",
];

impl Definition {
    /// Reads and checks a definition and the files it names.
    pub fn load(files: &dyn Files) -> Result<Self, DefinitionError> {
        let file = files.label(DEFINITION_FILE);
        let err = |field: &str, message: String| DefinitionError::new(&file, field, message);
        let text = files.read(DEFINITION_FILE)?;
        let raw: RawDefinition =
            crate::domain::toml_text::from_str(&text).map_err(|e| err("", e.to_string()))?;
        let name = AgentName::parse(&raw.name).map_err(|e| err("name", e.to_string()))?;
        if raw.system_prompt.trim().is_empty() {
            return Err(err("system_prompt", "must say what the agent does".into()));
        }
        let recovery_owner = raw
            .recovery_owner
            .as_deref()
            .map(Role::parse)
            .transpose()
            .map_err(|e| err("recovery_owner", e.to_string()))?;

        let policy_file = files.label(&raw.policy);
        let policy = Policy::from_toml(&files.read(&raw.policy)?)
            .map_err(|e| DefinitionError::new(&policy_file, "", e.to_string()))?;

        let model = raw
            .model
            .map(|model| model_settings(model, files, &file))
            .transpose()?;

        let mut servers = BTreeMap::new();
        for (server, value) in raw.mcp {
            let field = format!("mcp.{server}");
            if !valid_name(&server) {
                return Err(err(
                    &field,
                    "a server name has 1 to 64 letters, digits, '_' or '-'".into(),
                ));
            }
            let binding: McpServerBinding = value.try_into().map_err(|e: toml::de::Error| {
                let message = e.message();
                match message.contains(SERVER_FORMS) {
                    true => err(&field, message.to_string()),
                    false => err(&field, format!("{message}; {SERVER_FORMS}")),
                }
            })?;
            servers.insert(server, binding);
        }

        let mut tools = Vec::new();
        for (tool, raw_tool) in raw.tools {
            tools.push(tool_definition(&tool, raw_tool, &file)?);
        }
        for tool in &tools {
            if let ToolBinding::Mcp { binding, .. } = &tool.binding
                && !servers.contains_key(&binding.server)
            {
                return Err(err(
                    &format!("tools.{}.mcp.server", tool.name),
                    format!(
                        "no MCP server named {}: define it under [mcp.{}]",
                        binding.server, binding.server
                    ),
                ));
            }
        }
        let selections = servers.iter().map(|(name, s)| (name, s.tools.as_ref()));
        let mut known: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
        for (name, server_field) in mcp::named_selections(selections) {
            let same_tool = |t: &ToolDefinition| match &t.binding {
                ToolBinding::Mcp { binding, .. } => {
                    format!("mcp.{}", binding.server) == server_field && binding.tool == name
                }
                _ => false,
            };
            if let Some(entry) = tools.iter().find(|t| t.name == name) {
                if !same_tool(entry) {
                    return Err(err(
                        &format!("{server_field}.tools"),
                        format!(
                            "{server_field} lists {name}, which is also the name of tools.{name}"
                        ),
                    ));
                }
            } else if known.contains(&name) {
                return Err(err(
                    &format!("{server_field}.tools"),
                    format!("{server_field} lists {name}, which another MCP server lists too"),
                ));
            } else {
                known.push(name);
            }
        }
        // With `tools = "*"`, a name only the listing can provide is checked once listed.
        let listing_decides = mcp::lists_everything(servers.values().map(|s| s.tools.as_ref()));
        for tool in policy.tools.keys() {
            if !listing_decides && !known.contains(tool) {
                return Err(DefinitionError::new(
                    &policy_file,
                    &format!("tools.{tool}"),
                    format!("the policy has a rule for {tool}, which {file} does not define"),
                ));
            }
        }
        if let Some(Offline::Script(script)) = model.as_ref().and_then(|m| m.offline.as_ref())
            && !listing_decides
            && let Some(unknown) = script.tools().find(|t| !known.iter().any(|k| k == t))
        {
            return Err(err(
                "model.offline",
                format!("the script calls {unknown}, which the definition does not define"),
            ));
        }
        Ok(Self {
            name,
            description: raw.description,
            file,
            policy_file,
            policy: Arc::new(policy),
            system_prompt: raw.system_prompt,
            model,
            tools,
            mcp: servers,
            recovery_owner,
        })
    }

    /// The servers under `[mcp.*]` that this process would start (`command = ...`), by name.
    pub fn stdio_servers(&self) -> impl Iterator<Item = &str> {
        self.mcp
            .iter()
            .filter(|(_, binding)| binding.is_stdio())
            .map(|(name, _)| name.as_str())
    }

    /// Binds the tools (resolving `${VAR}` from the environment) and, for a process that drives
    /// runs, the model: the Anthropic API with `ANTHROPIC_API_KEY`, else the offline one.
    pub fn build(&self, wiring: &Wiring<'_>) -> Result<Agent, DefinitionError> {
        let mut toolbox = Toolbox::new();
        let mut claimant_args = BTreeMap::new();
        let builtins = expense::toolbox(
            wiring.claims.clone(),
            self.policy.clone(),
            wiring.store.clone(),
            wiring.clock.clone(),
        );
        let mut servers = BTreeMap::new();
        for (name, binding) in &self.mcp {
            let resolved = binding
                .resolve(&format!("mcp.{name}"), wiring.env)
                .map_err(|e| binding_error(&self.file, e))?;
            servers.insert(name.clone(), LazyServer::new(resolved));
        }
        for tool in &self.tools {
            let field = format!("tools.{}", tool.name);
            let bound: Arc<dyn Tool> = match &tool.binding {
                ToolBinding::Builtin(name) => {
                    let short = name.trim_start_matches("expense.");
                    builtins.get(short).cloned().ok_or_else(|| {
                        DefinitionError::new(&self.file, &field, format!("no built-in tool {name}"))
                    })?
                }
                ToolBinding::Http(binding) => {
                    let resolved = binding
                        .resolve(&format!("{field}.http"), wiring.env)
                        .map_err(|e| binding_error(&self.file, e))?;
                    let spec = tool.spec.clone().expect("an HTTP tool has its spec");
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
                            &self.file,
                            &format!("{field}.http.{at}"),
                            format!("{named} is not one of the tool's arguments"),
                        ));
                    }
                    if wiring.drives {
                        wiring.http.get();
                    }
                    Arc::new(HttpTool::new(spec, resolved, wiring.http.clone()))
                }
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
                    &self.file,
                    &field,
                    format!("the built-in tool is named {}", bound.spec().name),
                ));
            }
            // An MCP entry without a schema of its own is checked once its server lists it.
            if !tool.schema_is_listed() {
                self.policy
                    .check_fields(&tool.name, &bound.spec().input_schema)
                    .map_err(|(field, why)| DefinitionError::new(&self.policy_file, &field, why))?;
            }
            toolbox = toolbox.with(bound);
            if let Some(arg) = &tool.claimant {
                claimant_args.insert(tool.name.clone(), arg.clone());
            }
        }
        if !servers.is_empty() {
            // An entry's own schema was checked at load; the listing's is checked once listed.
            let schema_listed = || self.tools.iter().filter(|tool| tool.schema_is_listed());
            toolbox = toolbox.with_source(Arc::new(McpTools {
                file: self.file.clone(),
                policy_file: self.policy_file.clone(),
                servers,
                entries: self
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
                policy: self.policy.clone(),
                script_tools: match self.model.as_ref().and_then(|m| m.offline.as_ref()) {
                    Some(Offline::Script(script)) => script.tools().map(str::to_string).collect(),
                    _ => Vec::new(),
                },
                listed: Default::default(),
            }));
        }
        let mut agent = Agent::new(self.name.clone(), self.policy.clone())
            .with_tools(toolbox)
            .with_system_prompt(self.system_prompt.clone())
            .with_limits(Limits {
                max_model_turns: self
                    .model
                    .as_ref()
                    .map_or(Limits::default().max_model_turns, |m| m.max_turns),
                ..Limits::default()
            });
        agent.gateway_only = self.model.is_none();
        agent.claimant_args = claimant_args;
        agent.recovery_owner = self.recovery_owner.clone();
        if wiring.drives
            && let Some(model) = self.model(wiring.env)?
        {
            agent = agent.with_model(model);
        }
        Ok(agent)
    }

    /// The model that plays this agent here: the provider's API when its key is set (Claude
    /// with `ANTHROPIC_API_KEY`; an OpenAI-compatible API with its `api_key_env`, or without a
    /// key when it names none), else the offline one, if the definition has one.
    fn model(&self, env: Lookup<'_>) -> Result<Option<Arc<dyn Model>>, DefinitionError> {
        let Some(settings) = self.model.as_ref() else {
            return Ok(None);
        };
        let refused = |field: &str, why: String| DefinitionError::new(&self.file, field, why);
        let on_bedrock = env(BEDROCK_MODEL_VAR).filter(|id| !id.trim().is_empty());
        match (settings.provider, on_bedrock) {
            (Provider::Scripted, _) => {}
            (_, Some(id)) => return Ok(Some(Arc::new(settings.bedrock(id.trim())))),
            (Provider::Bedrock, None) => return Ok(Some(Arc::new(settings.bedrock(&settings.id)))),
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
                    )
                    .map_err(|e| binding_error(&self.file, BindingError::Env(e)))?;
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
                format!("{}-script", self.name),
                script.clone(),
            ))),
            Some(Offline::Expense) => Some(Arc::new(OfflineExpenseAgent)),
        })
    }
}

impl ModelSettings {
    /// Bedrock playing model `id` with these settings.
    fn bedrock(&self, id: &str) -> BedrockModel {
        BedrockModel::new(id, self.max_tokens, self.turn_timeout)
    }
}

/// Set (a model id or inference profile), every definition whose provider is a model API is
/// played by Bedrock with that model: how an AWS deployment moves its agents to Bedrock
/// without editing them.
pub const BEDROCK_MODEL_VAR: &str = "COUNTERSIGN_BEDROCK_MODEL";

fn model_settings(
    raw: RawModel,
    files: &dyn Files,
    file: &str,
) -> Result<ModelSettings, DefinitionError> {
    let err = |field: &str, message: String| DefinitionError::new(file, field, message);
    let max_turns = raw.max_turns.unwrap_or(Limits::default().max_model_turns);
    if !(1..=MAX_TURNS).contains(&max_turns) {
        return Err(err("model.max_turns", format!("must be 1 to {MAX_TURNS}")));
    }
    let max_tokens = raw.max_tokens.unwrap_or(1024);
    if !(1..=MAX_TOKENS).contains(&max_tokens) {
        return Err(err(
            "model.max_tokens",
            format!("must be 1 to {MAX_TOKENS}"),
        ));
    }
    let offline = match raw.offline.as_deref() {
        None => None,
        Some("builtin:expense") => Some(Offline::Expense),
        Some(path) => {
            let script = Script::from_toml(&files.read(path)?)
                .map_err(|e| DefinitionError::new(&files.label(path), "", e.to_string()))?;
            Some(Offline::Script(script))
        }
    };
    let provider = raw.provider.unwrap_or(Provider::Anthropic);
    if provider == Provider::Scripted && !matches!(offline, Some(Offline::Script(_))) {
        return Err(err(
            "model.offline",
            "the scripted provider plays a script: name its file".into(),
        ));
    }
    let turn_timeout = match raw.turn_timeout.as_deref() {
        None => DEFAULT_TURN_TIMEOUT,
        Some(text) => parse_duration(
            "model.turn_timeout",
            text,
            Duration::from_secs(1),
            MAX_TURN_TIMEOUT,
        )
        .map_err(|e| binding_error(file, e))?,
    };
    let endpoint = match provider {
        Provider::OpenAi => Some(api_endpoint(raw.base_url, raw.api_key_env, file)?),
        _ => {
            let only_openai = |field: &str| {
                err(
                    field,
                    "is for provider = \"openai\" only (Anthropic's endpoint is ANTHROPIC_BASE_URL; Bedrock's region AWS_REGION)"
                        .into(),
                )
            };
            if raw.base_url.is_some() {
                return Err(only_openai("model.base_url"));
            }
            if raw.api_key_env.is_some() {
                return Err(only_openai("model.api_key_env"));
            }
            None
        }
    };
    let id = match (raw.id, provider) {
        (Some(id), _) if id.trim().is_empty() => {
            return Err(err("model.id", "must name the model".into()));
        }
        (Some(id), _) => id,
        (None, Provider::OpenAi) => {
            return Err(err(
                "model.id",
                "an OpenAI-compatible API needs the model's id, such as \"gpt-4o\"".into(),
            ));
        }
        (None, Provider::Bedrock) => {
            return Err(err(
                "model.id",
                "Bedrock needs the model's id or inference profile, such as \"us.anthropic.claude-sonnet-4-5-20250929-v1:0\"".into(),
            ));
        }
        (None, _) => crate::adapters::anthropic::DEFAULT_MODEL.into(),
    };
    Ok(ModelSettings {
        provider,
        id,
        max_turns,
        max_tokens,
        turn_timeout,
        endpoint,
        offline,
    })
}

/// An `openai` provider's endpoint: an http(s) base URL (checked now unless it names a
/// `${VAR}`), and the key's variable: a variable's name, or `""` for a server without keys.
fn api_endpoint(
    base_url: Option<String>,
    api_key_env: Option<String>,
    file: &str,
) -> Result<ApiEndpoint, DefinitionError> {
    let base_url = base_url.unwrap_or_else(|| openai::DEFAULT_BASE_URL.into());
    if !env_template::mentions_env(&base_url) {
        openai::completions_url(&base_url)
            .map_err(|why| DefinitionError::new(file, "model.base_url", why))?;
    }
    let api_key_env = match api_key_env {
        None => Some(openai::DEFAULT_KEY_VARIABLE.to_string()),
        Some(var) if var.is_empty() => None,
        Some(var) => {
            let mut chars = var.chars();
            let first = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
            if !first || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(DefinitionError::new(
                    file,
                    "model.api_key_env",
                    format!(
                        "{var:?} is not an environment variable's name (letters, digits, '_'); \"\" for a server that takes no key"
                    ),
                ));
            }
            Some(var)
        }
    };
    Ok(ApiEndpoint {
        base_url,
        api_key_env,
    })
}

fn tool_definition(
    name: &str,
    raw: RawTool,
    file: &str,
) -> Result<ToolDefinition, DefinitionError> {
    let field = format!("tools.{name}");
    let err = |at: &str, message: String| {
        let at = if at.is_empty() {
            field.clone()
        } else {
            format!("{field}.{at}")
        };
        DefinitionError::new(file, &at, message)
    };
    if !valid_name(name) {
        return Err(err(
            "",
            "a tool name has 1 to 64 letters, digits, '_' or '-'".into(),
        ));
    }
    let caller = match raw.executor.as_deref() {
        None => false,
        Some("caller") => true,
        Some(other) => {
            return Err(err(
                "executor",
                format!(
                    "{other:?} is not an executor; \"caller\" is the one there is (leave it out for a bound tool)"
                ),
            ));
        }
    };
    if !caller && raw.lease.is_some() {
        return Err(err(
            "lease",
            "only a tool its caller runs (executor = \"caller\") has a lease".into(),
        ));
    }
    if caller && (raw.builtin.is_some() || raw.http.is_some() || raw.mcp.is_some()) {
        return Err(err(
            "executor",
            "a tool its caller runs has no builtin, http or mcp binding: Countersign never calls it".into(),
        ));
    }
    let lease = match raw.lease.as_deref().map(humantime::parse_duration) {
        None => DEFAULT_LEASE,
        Some(Ok(lease)) if !lease.is_zero() && lease <= MAX_LEASE => lease,
        Some(_) => {
            return Err(err(
                "lease",
                "a lease is a duration from 1s to 24h, such as \"5m\"".into(),
            ));
        }
    };
    let binding = match (raw.builtin, raw.http, raw.mcp) {
        (None, None, None) if caller => ToolBinding::Caller { lease },
        (Some(builtin), None, None) => {
            if !BUILTINS.contains(&builtin.as_str()) {
                return Err(err(
                    "builtin",
                    format!(
                        "no built-in tool {builtin}; there are {}",
                        BUILTINS.join(", ")
                    ),
                ));
            }
            if raw.description.is_some() || raw.input_schema.is_some() {
                return Err(err(
                    "builtin",
                    "a built-in tool describes itself: no description or input_schema".into(),
                ));
            }
            ToolBinding::Builtin(builtin)
        }
        (None, Some(http), None) => ToolBinding::Http(
            http.try_into()
                .map_err(|e: toml::de::Error| err("http", e.message().to_string()))?,
        ),
        (None, None, Some(mcp)) => {
            let binding: McpToolBinding = mcp
                .try_into()
                .map_err(|e: toml::de::Error| err("mcp", e.message().to_string()))?;
            let description = match raw.description {
                Some(d) if d.trim().is_empty() => {
                    return Err(err(
                        "description",
                        "leave it out or say what it does".into(),
                    ));
                }
                other => other,
            };
            let input_schema = raw
                .input_schema
                .map(|schema| {
                    let schema: Value = serde_json::to_value(schema)
                        .map_err(|e| err("input_schema", e.to_string()))?;
                    schema::check(&schema).map_err(|why| err("input_schema", why))?;
                    Ok(schema)
                })
                .transpose()?;
            if let (Some(claimant), Some(schema)) = (&raw.claimant, &input_schema)
                && schema["properties"].get(claimant).is_none()
            {
                return Err(err(
                    "claimant",
                    format!("{claimant} is not one of the tool's arguments"),
                ));
            }
            return Ok(ToolDefinition {
                name: name.to_string(),
                spec: None,
                binding: ToolBinding::Mcp {
                    binding,
                    description,
                    input_schema,
                },
                claimant: raw.claimant,
            });
        }
        (None, None, None) => {
            return Err(err(
                "",
                "needs one binding: builtin, http or mcp (or executor = \"caller\")".into(),
            ));
        }
        _ => return Err(err("", "has more than one binding; keep one".into())),
    };
    let spec = match binding {
        ToolBinding::Builtin(_) => None,
        _ => {
            let description = raw
                .description
                .filter(|d| !d.trim().is_empty())
                .ok_or_else(|| err("description", "the model needs to know what it does".into()))?;
            let schema = raw.input_schema.ok_or_else(|| {
                err(
                    "input_schema",
                    "the model needs the arguments' schema".into(),
                )
            })?;
            let schema: Value =
                serde_json::to_value(schema).map_err(|e| err("input_schema", e.to_string()))?;
            schema::check(&schema).map_err(|why| err("input_schema", why))?;
            Some(ToolSpec {
                name: name.to_string(),
                description,
                input_schema: schema,
            })
        }
    };
    if let (Some(claimant), Some(spec)) = (&raw.claimant, &spec)
        && spec.input_schema["properties"].get(claimant).is_none()
    {
        return Err(err(
            "claimant",
            format!("{claimant} is not one of the tool's arguments"),
        ));
    }
    Ok(ToolDefinition {
        name: name.to_string(),
        spec,
        binding,
        claimant: raw.claimant,
    })
}

/// 1 to 64 letters, digits, '_' or '-': a tool's or a server's name.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A binding's error as the definition's, naming the field it sits at.
fn binding_error(file: &str, error: BindingError) -> DefinitionError {
    use crate::adapters::env_template::EnvError;
    match error {
        BindingError::Env(EnvError::Unset { field, var }) => DefinitionError::new(
            file,
            &field,
            format!("the environment variable {var} is not set"),
        ),
        BindingError::Env(EnvError::Malformed { field }) => DefinitionError::new(
            file,
            &field,
            "`${` must close with `}` around a variable name (A-Z, 0-9, _)",
        ),
        BindingError::Invalid { field, reason } => DefinitionError::new(file, &field, reason),
    }
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

    async fn call(&self, _call: crate::ports::tools::ToolCall<'_>) -> ToolOutcome {
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
    use crate::adapters::mcp_tool::Endpoint;
    use crate::agents::InMemory;

    /// Refunds wait for finance; tools the server calls read-only run.
    const POLICY: &str = include_str!("../../tests/fixtures/policies/orders-refunds.toml");

    fn load(agent: &str, policy: &str) -> Result<Definition, DefinitionError> {
        let agent = format!("name = \"orders\"\nsystem_prompt = \"Refund orders.\"\n{agent}");
        Definition::load(&InMemory {
            dir: "test",
            files: &[("agent.toml", &agent), ("policy.toml", policy)],
        })
    }

    /// The definition of `agent` under the test policy, which must load.
    fn loaded(agent: &str) -> Definition {
        load(agent, POLICY).expect("the definition loads")
    }

    fn refused(agent: &str, policy: &str) -> DefinitionError {
        load(agent, policy).expect_err("the definition is refused")
    }

    #[test]
    fn only_a_process_that_drives_runs_builds_the_http_tools_client_when_binding() {
        let dir = crate::testing::scratch_dir("wiring");
        let store: Arc<dyn crate::ports::store::ItemStore> =
            Arc::new(crate::adapters::sqlite::SqliteStore::open_dir(&dir).unwrap());
        let refunds = crate::agents::shipped_one("refunds").unwrap();
        assert!(matches!(refunds.tools[0].binding, ToolBinding::Http(_)));
        for drives in [false, true] {
            let wiring = Wiring {
                drives,
                ..Wiring::new(
                    store.clone(),
                    Arc::new(crate::ports::clock::SystemClock),
                    crate::example::expense::default_claims(),
                )
            };
            refunds.build(&wiring).expect("the refunds agent binds");
            assert_eq!(wiring.http.is_built(), drives, "drives: {drives}");
        }
        std::fs::remove_dir_all(dir).ok();
    }

    /// What building `agent` under the test policy, with no environment, is refused with.
    fn build_refused(agent: &str) -> DefinitionError {
        let dir = crate::testing::scratch_dir("http-binding");
        let store: Arc<dyn crate::ports::store::ItemStore> =
            Arc::new(crate::adapters::sqlite::SqliteStore::open_dir(&dir).unwrap());
        let wiring = Wiring {
            env: &|_| None,
            ..Wiring::new(
                store,
                Arc::new(crate::ports::clock::SystemClock),
                crate::example::expense::default_claims(),
            )
        };
        let Err(error) = loaded(agent).build(&wiring) else {
            panic!("the definition should not build");
        };
        std::fs::remove_dir_all(dir).ok();
        error
    }

    const REFUND_TOOL: &str = r#"
[tools.issue_refund]
description = "Refund an order."
input_schema = { type = "object", properties = { order_id = { type = "string" } } }
"#;

    #[test]
    fn a_tool_its_caller_runs_has_no_binding_and_a_lease_of_15_minutes_unless_it_gives_one() {
        let default = loaded(&format!("{REFUND_TOOL}executor = \"caller\"\n"));
        let given = loaded(&format!(
            "{REFUND_TOOL}executor = \"caller\"\nlease = \"5m\"\n"
        ));

        assert_eq!(
            default.tools[0].binding,
            ToolBinding::Caller {
                lease: DEFAULT_LEASE
            }
        );
        assert_eq!(
            given.tools[0].binding,
            ToolBinding::Caller {
                lease: std::time::Duration::from_secs(300)
            }
        );
        assert!(
            default.tools[0].spec.is_some(),
            "described for the policy and the schema gate"
        );
    }

    #[test]
    fn a_caller_run_tool_with_a_binding_a_lease_without_it_or_another_executor_is_refused() {
        let http = "http = { method = \"POST\", url = \"http://127.0.0.1:9/refunds\" }\n";
        let cases = [
            (
                format!("{REFUND_TOOL}executor = \"caller\"\n{http}"),
                "tools.issue_refund.executor",
                "no builtin, http or mcp binding",
            ),
            (
                format!("{REFUND_TOOL}lease = \"5m\"\n{http}"),
                "tools.issue_refund.lease",
                "only a tool its caller runs",
            ),
            (
                format!("{REFUND_TOOL}executor = \"countersign\"\n{http}"),
                "tools.issue_refund.executor",
                "is not an executor",
            ),
            (
                format!("{REFUND_TOOL}executor = \"caller\"\nlease = \"0s\"\n"),
                "tools.issue_refund.lease",
                "from 1s to 24h",
            ),
        ];
        for (agent, field, saying) in cases {
            let error = refused(&agent, POLICY);

            assert_eq!(error.field, field, "{agent}");
            assert!(error.to_string().contains(saying), "{error}");
        }
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
        let dir = crate::testing::scratch_dir("amount-field");
        let store: Arc<dyn crate::ports::store::ItemStore> =
            Arc::new(crate::adapters::sqlite::SqliteStore::open_dir(&dir).unwrap());
        let wiring = Wiring::new(
            store,
            Arc::new(crate::ports::clock::SystemClock),
            crate::example::expense::default_claims(),
        );
        let built = definition.build(&wiring).map(|_| ());
        std::fs::remove_dir_all(dir).ok();
        built
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
    fn an_mcp_tool_binds_a_server_of_the_definition_and_needs_no_spec() {
        let definition = loaded(
            r#"
[mcp.orders]
url = "${ORDERS_MCP_URL}"
headers = { Authorization = "Bearer ${ORDERS_MCP_TOKEN}" }
tools = "*"

[tools.issue_refund]
mcp = { server = "orders", tool = "issue_refund" }
"#,
        );

        assert_eq!(
            definition.mcp["orders"].endpoint,
            Endpoint::Http {
                url: "${ORDERS_MCP_URL}".into(),
                headers: [(
                    "Authorization".to_string(),
                    "Bearer ${ORDERS_MCP_TOKEN}".to_string()
                )]
                .into()
            }
        );
        let [tool] = definition.tools.as_slice() else {
            panic!("one tool: {:?}", definition.tools);
        };
        assert_eq!(
            tool.binding,
            ToolBinding::Mcp {
                binding: McpToolBinding {
                    server: "orders".into(),
                    tool: "issue_refund".into()
                },
                description: None,
                input_schema: None,
            }
        );
    }

    #[test]
    fn an_mcp_tool_may_give_its_own_description_and_schema() {
        let definition = loaded(
            r#"
[mcp.orders]
url = "http://127.0.0.1:1/mcp"

[tools.issue_refund]
description = "Refund an order, in cents."
input_schema = { type = "object", properties = { order_id = { type = "string" } } }
mcp = { server = "orders", tool = "refund" }
"#,
        );

        let ToolBinding::Mcp {
            description,
            input_schema,
            ..
        } = &definition.tools[0].binding
        else {
            panic!("{:?}", definition.tools[0]);
        };
        assert_eq!(description.as_deref(), Some("Refund an order, in cents."));
        assert_eq!(
            input_schema.as_ref().unwrap()["properties"]["order_id"]["type"],
            "string"
        );
    }

    #[test]
    fn a_tool_naming_an_undefined_server_is_refused() {
        let error = refused(
            r#"
[tools.issue_refund]
mcp = { server = "orderz", tool = "issue_refund" }
"#,
            POLICY,
        );
        assert_eq!(error.file, "test/agent.toml");
        assert_eq!(error.field, "tools.issue_refund.mcp.server");
        assert!(
            error.message.contains("no MCP server named orderz"),
            "{error}"
        );
    }

    #[test]
    fn a_bad_server_table_names_the_server() {
        for (body, says) in [
            ("method = \"POST\"\nurl = \"http://x\"", "unknown field"),
            ("url = \"http://x\"\ntools = \"all\"", "tools must be"),
            ("headers = {}", "url"),
        ] {
            let error = refused(
                &format!("[mcp.orders]\n{body}\n"),
                "name = \"o\"\nversion = 1\ndefault_ttl = \"1h\"\n",
            );
            assert_eq!(error.field, "mcp.orders", "{body}: {error}");
            assert!(error.message.contains(says), "{body}: {error}");
        }
    }

    #[test]
    fn a_malformed_server_says_which_forms_a_server_may_take() {
        for body in [
            "url = \"http://x\"\nargs = [\"-y\"]",
            "command = \"npx\"\nheaders = { A = \"b\" }",
            "url = \"http://x\"\ncommand = \"npx\"",
            "tools = \"*\"",
            "url = \"http://x\"\nmethod = \"POST\"",
        ] {
            let error = refused(
                &format!("[mcp.files]\n{body}\n"),
                "name = \"o\"\nversion = 1\ndefault_ttl = \"1h\"\n",
            );
            assert_eq!(error.field, "mcp.files", "{body}: {error}");
            assert!(
                error.message.contains("url = \"https://...\"")
                    && error
                        .message
                        .contains("command = \"npx\" with optional args"),
                "{body}: {error}"
            );
        }
    }

    #[test]
    fn a_server_started_by_command_loads_with_its_args_env_and_cwd() {
        let definition = load(
            r#"
[mcp.files]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "${FILES_ROOT}"]
env = { NODE_OPTIONS = "--max-old-space-size=256" }
cwd = "/srv"
tools = "*"
"#,
            "name = \"o\"\nversion = 1\ndefault_ttl = \"1h\"\n",
        )
        .expect("the definition loads");
        assert_eq!(
            definition.mcp["files"].endpoint,
            Endpoint::Stdio {
                command: "npx".into(),
                args: vec![
                    "-y".into(),
                    "@modelcontextprotocol/server-filesystem".into(),
                    "${FILES_ROOT}".into()
                ],
                env: [(
                    "NODE_OPTIONS".to_string(),
                    "--max-old-space-size=256".to_string()
                )]
                .into(),
                cwd: Some("/srv".into()),
            }
        );
        assert_eq!(definition.stdio_servers().collect::<Vec<_>>(), ["files"]);
    }

    #[test]
    fn a_bad_mcp_binding_or_two_bindings_are_refused() {
        let server = "[mcp.orders]\nurl = \"http://x\"\n";
        let cases = [
            (
                "[tools.issue_refund]\nmcp = { server = \"orders\" }\n",
                "tools.issue_refund.mcp",
            ),
            (
                "[tools.issue_refund]\nmcp = { server = \"orders\", tool = \"t\" }\nbuiltin = \"expense.decline\"\n",
                "tools.issue_refund",
            ),
            (
                "[tools.issue_refund]\nmcp = { server = \"orders\", tool = \"t\" }\ndescription = \" \"\n",
                "tools.issue_refund.description",
            ),
            (
                "[tools.issue_refund]\nmcp = { server = \"orders\", tool = \"t\" }\ninput_schema = { type = \"string\" }\n",
                "tools.issue_refund.input_schema",
            ),
            (
                "[tools.issue_refund]\nmcp = { server = \"orders\", tool = \"t\" }\nclaimant = \"customer\"\ninput_schema = { type = \"object\", properties = {} }\n",
                "tools.issue_refund.claimant",
            ),
        ];
        for (tool, field) in cases {
            let error = refused(&format!("{server}{tool}"), POLICY);
            assert_eq!(error.field, field, "{tool}: {error}");
            assert_eq!(error.file, "test/agent.toml");
        }
    }

    #[test]
    fn a_listed_name_that_is_another_tools_name_is_refused_naming_both() {
        let error = refused(
            r#"
[mcp.orders]
url = "http://x/mcp"
tools = ["get_order", "issue_refund"]

[tools.issue_refund]
builtin = "expense.decline"
"#,
            POLICY,
        );
        assert_eq!(error.field, "mcp.orders.tools");
        assert!(
            error.message.contains("mcp.orders lists issue_refund")
                && error.message.contains("tools.issue_refund"),
            "{error}"
        );

        let error = refused(
            r#"
[mcp.orders]
url = "http://x/mcp"
tools = ["issue_refund"]

[mcp.billing]
url = "http://y/mcp"
tools = ["issue_refund"]
"#,
            POLICY,
        );
        assert!(error.message.contains("another MCP server"), "{error}");
    }

    #[test]
    fn an_entry_binding_the_listed_tool_itself_is_no_collision() {
        loaded(
            r#"
[mcp.orders]
url = "http://x/mcp"
tools = ["get_order", "issue_refund"]

[tools.issue_refund]
mcp = { server = "orders", tool = "issue_refund" }
description = "Refund an order."
"#,
        );
    }

    #[test]
    fn a_policy_rule_for_a_tool_only_a_full_listing_may_provide_waits_for_the_listing() {
        let everything = "[mcp.orders]\nurl = \"http://x/mcp\"\ntools = \"*\"\n";
        assert!(load(everything, POLICY).is_ok());

        let some = "[mcp.orders]\nurl = \"http://x/mcp\"\ntools = [\"get_order\"]\n";
        let error = refused(some, POLICY);
        assert_eq!(error.file, "test/policy.toml");
        assert_eq!(error.field, "tools.issue_refund");

        let named = "[mcp.orders]\nurl = \"http://x/mcp\"\ntools = [\"issue_refund\"]\n";
        assert!(load(named, POLICY).is_ok());
    }

    /// `model` over an MCP server that lists every tool of the test policy.
    fn listed(model: &str) -> Definition {
        loaded(&format!(
            "{model}\n[mcp.orders]\nurl = \"http://x/mcp\"\ntools = \"*\"\n"
        ))
    }

    #[test]
    fn an_openai_model_table_names_its_endpoint_its_key_variable_and_its_model() {
        let openai = listed(
            "[model]\nprovider = \"openai\"\nid = \"llama3.1\"\n\
             base_url = \"http://127.0.0.1:11434/v1\"\napi_key_env = \"\"\nturn_timeout = \"45s\"\n",
        );
        let openai = openai.model.expect("a [model] table");
        assert_eq!(openai.provider, Provider::OpenAi);
        assert_eq!(openai.id, "llama3.1");
        assert_eq!(openai.turn_timeout, Duration::from_secs(45));
        assert_eq!(
            openai.endpoint,
            Some(ApiEndpoint {
                base_url: "http://127.0.0.1:11434/v1".into(),
                api_key_env: None,
            })
        );
        let defaults = listed("[model]\nprovider = \"openai\"\nid = \"gpt-4o\"\n")
            .model
            .expect("a [model] table");
        assert_eq!(
            defaults.endpoint,
            Some(ApiEndpoint {
                base_url: openai::DEFAULT_BASE_URL.into(),
                api_key_env: Some("OPENAI_API_KEY".into()),
            })
        );
        assert_eq!(defaults.turn_timeout, DEFAULT_TURN_TIMEOUT);
    }

    #[test]
    fn a_bad_model_table_is_refused_naming_its_field() {
        for (table, field) in [
            ("provider = \"openai\"", "model.id"),
            (
                "provider = \"openai\"\nid = \"gpt-4o\"\nbase_url = \"api.openai.com/v1\"",
                "model.base_url",
            ),
            (
                "provider = \"openai\"\nid = \"gpt-4o\"\napi_key_env = \"sk-live-123\"",
                "model.api_key_env",
            ),
            ("base_url = \"http://127.0.0.1:4000\"", "model.base_url"),
            ("api_key_env = \"OPENAI_API_KEY\"", "model.api_key_env"),
            ("turn_timeout = \"20m\"", "model.turn_timeout"),
        ] {
            let error = refused(&format!("[model]\n{table}\n"), POLICY);
            assert_eq!(error.field, field, "{table}: {error}");
        }
        let unknown = refused("[model]\nprovider = \"gemini\"\n", POLICY);
        assert!(unknown.message.contains("openai"), "{unknown}");
    }

    #[test]
    fn an_openai_model_is_played_by_its_api_when_its_key_is_set_and_offline_otherwise() {
        let definition = listed(
            "[model]\nprovider = \"openai\"\nid = \"gpt-4o\"\n\
             base_url = \"${LLM_URL:-http://127.0.0.1:4000}/v1\"\napi_key_env = \"LLM_KEY\"\n",
        );
        let with_key = |var: &str| (var == "LLM_KEY").then(|| "sk-test".to_string());
        let model = definition
            .model(&with_key)
            .unwrap()
            .expect("the API plays it");
        assert_eq!(model.name(), "gpt-4o");
        assert!(
            definition.model(&|_| None).unwrap().is_none(),
            "no key and no offline script: no model here"
        );
        let keyless = listed(
            "[model]\nprovider = \"openai\"\nid = \"llama3.1\"\n\
             base_url = \"http://127.0.0.1:11434/v1\"\napi_key_env = \"\"\n",
        );
        assert!(keyless.model(&|_| None).unwrap().is_some());
    }

    #[test]
    fn bedrock_plays_a_bedrock_definition_and_any_api_definition_once_the_deployment_names_its_model()
     {
        let bedrock = listed(
            "[model]\nprovider = \"bedrock\"\nid = \"us.anthropic.claude-sonnet-4-5-20250929-v1:0\"\n",
        );
        let model = bedrock.model(&|_| None).unwrap().unwrap();
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
            let model = listed(table).model(&deployed).unwrap().unwrap();
            assert_eq!(
                model.name(),
                "anthropic.claude-3-5-haiku-20241022-v1:0",
                "{table}"
            );
        }
    }
}
