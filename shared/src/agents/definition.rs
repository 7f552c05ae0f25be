//! One agent definition: `agent.toml` parsed and checked, its policy and offline script read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::mcp;
use super::policy_files::PolicyFiles;
use super::{DEFINITION_FILE, DefinitionError, Files, schema};
use crate::adapters::env_template::{self, BindingError};
use crate::adapters::http_tool::{HttpBinding, parse_duration};
use crate::adapters::mcp_tool::{
    Endpoint as McpEndpoint, McpServerBinding, McpToolBinding, SERVER_FORMS,
};
use crate::adapters::model_api::DEFAULT_TURN_TIMEOUT;
use crate::adapters::openai;
use crate::adapters::scripted::Script;
use crate::domain::ids::{AgentName, Role, TenantId};
use crate::domain::policy::Policy;
use crate::engine::Limits;
use crate::ports::model::ToolSpec;

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
    pub(super) fn schema_is_listed(&self) -> bool {
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
    /// Where each file of its policy was read from, as errors name them.
    pub policy_files: PolicyFiles,
    pub policy: Arc<Policy>,
    pub system_prompt: String,
    /// `None` without a `[model]` table: an agent used only through the MCP gateway and the
    /// gate API, whose caller's own agent proposes each call; no run can be started with it.
    pub model: Option<ModelSettings>,
    pub tools: Vec<ToolDefinition>,
    /// `[mcp.<server>]`: the MCP servers its tools come from, by the name it gives them.
    pub mcp: BTreeMap<String, McpServerBinding>,
    pub recovery_owner: Option<Role>,
    /// The tenants that may use the agent (`tenants = ["acme"]`); `None`: every tenant.
    pub tenants: Option<BTreeSet<TenantId>>,
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
    tenants: Option<Vec<String>>,
    model: Option<RawModel>,
    #[serde(default)]
    tools: BTreeMap<String, RawTool>,
    #[serde(default)]
    mcp: BTreeMap<String, toml::Value>,
}

/// What a process knows of a definition before it needs the agent: its name, the tenants that
/// may use it, and the MCP server it would start as a local process, if any. Read from
/// `agent.toml` alone; everything else is checked when the whole definition is loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    pub name: AgentName,
    pub tenants: Option<BTreeSet<TenantId>>,
    pub stdio_server: Option<String>,
    /// Where `agent.toml` was read from.
    pub file: String,
}

/// The fields of `agent.toml` a [`Head`] reads; the others wait for the whole definition.
#[derive(Deserialize)]
struct RawHead {
    name: String,
    tenants: Option<Vec<String>>,
    #[serde(default)]
    mcp: BTreeMap<String, toml::Value>,
}

impl Head {
    pub fn read(files: &dyn Files) -> Result<Self, DefinitionError> {
        let file = files.label(DEFINITION_FILE);
        let err = |field: &str, message: String| DefinitionError::new(&file, field, message);
        let raw: RawHead = crate::domain::toml_text::from_str(&files.read(DEFINITION_FILE)?)
            .map_err(|e| err("", e.to_string()))?;
        let (name, tenants) = name_and_tenants(&raw.name, raw.tenants, &err)?;
        // A server whose binding does not parse is refused when the whole definition loads.
        let stdio_server = raw.mcp.into_iter().find_map(|(name, server)| {
            let binding: McpServerBinding = server.try_into().ok()?;
            binding.is_stdio().then_some(name)
        });
        Ok(Self {
            name,
            tenants,
            stdio_server,
            file,
        })
    }
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
        let (name, tenants) = name_and_tenants(&raw.name, raw.tenants, &err)?;
        if raw.system_prompt.trim().is_empty() {
            return Err(err("system_prompt", "must say what the agent does".into()));
        }
        let recovery_owner = raw
            .recovery_owner
            .as_deref()
            .map(Role::parse)
            .transpose()
            .map_err(|e| err("recovery_owner", e.to_string()))?;

        let (policy, policy_files) = load_policy(files, &raw.policy)?;
        let policy_file = policy_files.manifest.clone();

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
            policy_files,
            policy: Arc::new(policy),
            system_prompt: raw.system_prompt,
            model,
            tools,
            mcp: servers,
            recovery_owner,
            tenants,
        })
    }

    /// Where a definition open to every tenant (no `tenants`) binds a secret: the first field
    /// of a binding that holds one (a header, a value a `${VAR}` fills in, a stdio server's
    /// env). Such an agent lends whatever the secret opens to every tenant of the deployment.
    pub fn secret_open_to_every_tenant(&self) -> Option<String> {
        if self.tenants.is_some() {
            return None;
        }
        let http = self.tools.iter().filter_map(|tool| match &tool.binding {
            ToolBinding::Http(binding) => Some((format!("tools.{}.http", tool.name), binding)),
            _ => None,
        });
        for (field, binding) in http {
            let lookup = binding.reconcile.as_ref().map(|r| (&r.url, &r.headers));
            let requests = [(field.clone(), &binding.url, &binding.headers)]
                .into_iter()
                .chain(lookup.map(|(url, headers)| (format!("{field}.reconcile"), url, headers)));
            for (field, url, headers) in requests {
                if let Some(header) = headers.0.keys().next() {
                    return Some(format!("{field}.headers.{header}"));
                }
                if env_template::mentions_env(url) {
                    return Some(format!("{field}.url"));
                }
            }
        }
        for (name, server) in &self.mcp {
            let field = format!("mcp.{name}");
            let texts: Vec<(&str, &String)> = match &server.endpoint {
                McpEndpoint::Http { url, headers } => {
                    if let Some(header) = headers.keys().next() {
                        return Some(format!("{field}.headers.{header}"));
                    }
                    vec![("url", url)]
                }
                McpEndpoint::Stdio {
                    command,
                    args,
                    env,
                    cwd,
                } => {
                    if let Some(var) = env.keys().next() {
                        return Some(format!("{field}.env.{var}"));
                    }
                    let mut texts = vec![("command", command)];
                    texts.extend(args.iter().map(|arg| ("args", arg)));
                    texts.extend(cwd.iter().map(|cwd| ("cwd", cwd)));
                    texts
                }
            };
            if let Some((at, _)) = texts.iter().find(|(_, t)| env_template::mentions_env(t)) {
                return Some(format!("{field}.{at}"));
            }
        }
        None
    }

    /// Whether some of its tools are known only once an MCP server lists them: its rules are
    /// checked against its tools then, not when it is built.
    pub fn needs_listing(&self) -> bool {
        self.tools.iter().any(|t| t.schema_is_listed())
            || self.mcp.values().any(|server| server.tools.is_some())
    }
}

/// The policy `name` of `files` (its manifest, and each Cedar file the manifest names), and
/// where each was read from.
pub(crate) fn load_policy(
    files: &dyn Files,
    name: &str,
) -> Result<(Policy, PolicyFiles), DefinitionError> {
    let manifest = files.read(name)?;
    let mut cedar = BTreeMap::new();
    let policy = Policy::load(&manifest, &mut |name| {
        cedar.insert(name.to_string(), files.label(name));
        files.read(name).map_err(|e| e.to_string())
    });
    let policy_files = PolicyFiles {
        manifest: files.label(name),
        cedar,
    };
    let policy = policy.map_err(|e| policy_files.error(e))?;
    Ok((policy, policy_files))
}

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

/// `tenants = [...]`: at least one tenant id, none twice.
/// The agent's name and the tenants that may use it, as `agent.toml` gives them; a fault is
/// `err(field, why)`.
fn name_and_tenants(
    name: &str,
    tenants_named: Option<Vec<String>>,
    err: &dyn Fn(&str, String) -> DefinitionError,
) -> Result<(AgentName, Option<BTreeSet<TenantId>>), DefinitionError> {
    let name = AgentName::parse(name).map_err(|e| err("name", e.to_string()))?;
    let tenants = tenants_named
        .map(|names| tenants(&names).map_err(|why| err("tenants", why)))
        .transpose()?;
    Ok((name, tenants))
}

fn tenants(names: &[String]) -> Result<BTreeSet<TenantId>, String> {
    if names.is_empty() {
        return Err(
            "names no tenant, so none could use the agent: name at least one, or leave tenants \
             out for every tenant"
                .into(),
        );
    }
    let mut tenants = BTreeSet::new();
    for name in names {
        let tenant = TenantId::parse(name).map_err(|e| e.to_string())?;
        if !tenants.insert(tenant) {
            return Err(format!("names {name} twice"));
        }
    }
    Ok(tenants)
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
pub(super) fn binding_error(file: &str, error: BindingError) -> DefinitionError {
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::adapters::mcp_tool::Endpoint;
    use crate::agents::InMemory;

    /// Refunds wait for finance; tools the server calls read-only run.
    pub(crate) const POLICY: &str = crate::testing::ORDERS_POLICY;

    pub(crate) fn load(agent: &str, policy: &str) -> Result<Definition, DefinitionError> {
        let agent = format!("name = \"orders\"\nsystem_prompt = \"Refund orders.\"\n{agent}");
        Definition::load(&InMemory {
            dir: "test",
            files: &[("agent.toml", &agent), ("policy.toml", policy)],
        })
    }

    /// The definition of `agent` under the test policy, which must load.
    pub(crate) fn loaded(agent: &str) -> Definition {
        load(agent, POLICY).expect("the definition loads")
    }

    pub(crate) fn refused(agent: &str, policy: &str) -> DefinitionError {
        load(agent, policy).expect_err("the definition is refused")
    }

    /// The agent file is refused at `field` of itself, saying `says`.
    fn refused_at(agent: &str, policy: &str, field: &str, says: &str) -> DefinitionError {
        let error = refused(agent, policy);
        assert_eq!(
            (error.file.as_str(), error.field.as_str()),
            ("test/agent.toml", field),
            "{agent}: {error}"
        );
        assert!(error.to_string().contains(says), "{agent}: {error}");
        error
    }

    pub(crate) const REFUND_TOOL: &str = r#"
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
            refused_at(&agent, POLICY, field, saying);
        }
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
            refused_at(
                &format!("[mcp.orders]\n{body}\n"),
                "name = \"o\"\nversion = 1\ndefault_ttl = \"1h\"\n",
                "mcp.orders",
                says,
            );
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
            let error = refused_at(
                &format!("[mcp.files]\n{body}\n"),
                "name = \"o\"\nversion = 1\ndefault_ttl = \"1h\"\n",
                "mcp.files",
                "url = \"https://...\"",
            );
            assert!(
                error
                    .message
                    .contains("command = \"npx\" with optional args"),
                "{body}: {error}"
            );
        }
    }

    #[test]
    fn a_server_started_by_command_loads_with_its_args_env_and_cwd() {
        let agent = r#"
[mcp.files]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "${FILES_ROOT}"]
env = { NODE_OPTIONS = "--max-old-space-size=256" }
cwd = "/srv"
tools = "*"
"#;
        let definition = load(agent, "name = \"o\"\nversion = 1\ndefault_ttl = \"1h\"\n")
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
        let head = Head::read(&InMemory {
            dir: "test",
            files: &[("agent.toml", &format!("name = \"orders\"\n{agent}"))],
        })
        .expect("its head reads");
        assert_eq!(head.stdio_server.as_deref(), Some("files"));
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
            refused_at(&format!("{server}{tool}"), POLICY, field, "");
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
    pub(crate) fn listed(model: &str) -> Definition {
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
            refused_at(&format!("[model]\n{table}\n"), POLICY, field, "");
        }
        let unknown = refused("[model]\nprovider = \"gemini\"\n", POLICY);
        assert!(unknown.message.contains("openai"), "{unknown}");
    }

    #[test]
    fn tenants_name_who_may_use_the_agent_and_an_empty_or_repeated_list_is_refused() {
        let named = listed("tenants = [\"acme\", \"globex\"]");
        let names: Vec<&str> = named.tenants.iter().flatten().map(|t| t.as_str()).collect();
        assert_eq!(names, ["acme", "globex"]);
        assert_eq!(listed("").tenants, None, "without it, every tenant");

        for (line, says) in [
            ("tenants = []", "name at least one"),
            ("tenants = [\"acme\", \"acme\"]", "names acme twice"),
            ("tenants = [\"acme corp\"]", "is not valid"),
        ] {
            refused_at(
                &format!("{line}\n[mcp.orders]\nurl = \"http://x/mcp\"\ntools = \"*\"\n"),
                POLICY,
                "tenants",
                says,
            );
        }
    }

    #[test]
    fn a_definition_open_to_every_tenant_names_the_first_binding_that_holds_a_secret() {
        let policy = "name = \"o\"\nversion = 1\ndefault_ttl = \"1h\"\n";
        let secret = |agent: &str| load(agent, policy).unwrap().secret_open_to_every_tenant();
        let http = |extra: &str| {
            format!(
                "{REFUND_TOOL}[tools.issue_refund.http]\nmethod = \"POST\"\n{extra}\n\
                 [tools.issue_refund.http.reconcile]\nmethod = \"GET\"\n\
                 url = \"http://o.example/refunds/by-key/{{idempotency_key}}\"\n"
            )
        };
        let plain = http("url = \"http://o.example/refunds\"");
        assert_eq!(secret(&plain), None);
        assert_eq!(
            secret(&http(
                "url = \"http://o.example/refunds\"\nheaders = { Authorization = \"Bearer t\" }"
            )),
            Some("tools.issue_refund.http.headers.Authorization".into())
        );
        assert_eq!(
            secret(&http("url = \"${ORDERS_URL:-http://o.example}/refunds\"")),
            Some("tools.issue_refund.http.url".into())
        );
        let server = |body: &str| format!("[mcp.files]\n{body}\ntools = \"*\"\n");
        assert_eq!(
            secret(&server(
                "command = \"npx\"\nenv = { GITHUB_TOKEN = \"ghp\" }"
            )),
            Some("mcp.files.env.GITHUB_TOKEN".into())
        );
        assert_eq!(
            secret(&server(
                "command = \"npx\"\nargs = [\"-y\", \"${NOTES_DIR}\"]"
            )),
            Some("mcp.files.args".into())
        );
        assert_eq!(secret(&server("url = \"http://x/mcp\"")), None);
        assert_eq!(
            secret(&format!(
                "tenants = [\"acme\"]\n{}",
                server("url = \"${MCP_URL}\"")
            )),
            None,
            "named tenants: nothing lent to others"
        );
    }
}
