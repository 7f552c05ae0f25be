//! One agent definition: `agent.toml` parsed and checked, its policy and offline script read.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::{DEFINITION_FILE, DefinitionError, Files, Wiring, schema};
use crate::adapters::anthropic::AnthropicModel;
use crate::adapters::http_tool::{HttpBinding, HttpTool, http_client};
use crate::adapters::scripted::{Script, ScriptedModel};
use crate::domain::ids::{AgentName, Role};
use crate::domain::policy::Policy;
use crate::engine::{Agent, Limits};
use crate::example::expense::{self, OfflineExpenseAgent};
use crate::ports::model::{Model, ToolSpec};
use crate::ports::tools::{Tool, Toolbox};

/// The most model turns and tokens a definition may ask for.
const MAX_TURNS: u32 = 64;
const MAX_TOKENS: u32 = 64_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// The Anthropic Messages API when `ANTHROPIC_API_KEY` is set, else the offline model.
    Anthropic,
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
    pub offline: Option<Offline>,
}

/// How a tool is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolBinding {
    /// A tool written in Rust and shipped with Countersign, such as `expense.reimburse`.
    Builtin(String),
    /// An HTTP endpoint; its `${VAR}` are filled when it is built.
    Http(HttpBinding),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    pub name: String,
    /// What the model reads; a built-in tool describes itself.
    pub spec: Option<ToolSpec>,
    pub binding: ToolBinding,
    /// The argument naming a person who may not approve the call.
    pub claimant: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub name: AgentName,
    pub description: Option<String>,
    /// Where it was loaded from, as errors name it.
    pub file: String,
    pub policy: Arc<Policy>,
    pub system_prompt: String,
    pub model: ModelSettings,
    pub tools: Vec<ToolDefinition>,
    pub recovery_owner: Option<Role>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefinition {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default = "default_policy_file")]
    policy: String,
    system_prompt: String,
    #[serde(default)]
    recovery_owner: Option<String>,
    #[serde(default)]
    model: RawModel,
    #[serde(default)]
    tools: BTreeMap<String, RawTool>,
}

fn default_policy_file() -> String {
    "policy.toml".into()
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawModel {
    provider: Option<Provider>,
    id: Option<String>,
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
}

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
        let raw: RawDefinition = toml::from_str(&text).map_err(|e| err("", e.to_string()))?;
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

        let model = model_settings(raw.model, files, &file)?;

        let mut tools = Vec::new();
        for (tool, raw_tool) in raw.tools {
            tools.push(tool_definition(&tool, raw_tool, &file)?);
        }
        for tool in policy.tools.keys() {
            if !tools.iter().any(|t| t.name == *tool) {
                return Err(DefinitionError::new(
                    &policy_file,
                    &format!("tools.{tool}"),
                    format!("the policy has a rule for {tool}, which {file} does not define"),
                ));
            }
        }
        if let Some(Offline::Script(script)) = &model.offline
            && let Some(unknown) = script.tools().find(|t| !tools.iter().any(|d| d.name == *t))
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
            policy: Arc::new(policy),
            system_prompt: raw.system_prompt,
            model,
            tools,
            recovery_owner,
        })
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
                        .map_err(|e| DefinitionError::new(&self.file, "", e.to_string()))?;
                    let spec = tool.spec.clone().expect("an HTTP tool has its spec");
                    if let Some(missing) = resolved
                        .path_arguments()
                        .into_iter()
                        .find(|arg| spec.input_schema["properties"].get(*arg).is_none())
                    {
                        return Err(DefinitionError::new(
                            &self.file,
                            &format!("{field}.http.url"),
                            format!("{{{missing}}} is not one of the tool's arguments"),
                        ));
                    }
                    let client = wiring.http.get_or_init(http_client).clone();
                    Arc::new(HttpTool::new(spec, resolved, client))
                }
            };
            if bound.spec().name != tool.name {
                return Err(DefinitionError::new(
                    &self.file,
                    &field,
                    format!("the built-in tool is named {}", bound.spec().name),
                ));
            }
            toolbox = toolbox.with(bound);
            if let Some(arg) = &tool.claimant {
                claimant_args.insert(tool.name.clone(), arg.clone());
            }
        }
        let mut agent = Agent::new(self.name.clone(), self.policy.clone())
            .with_tools(toolbox)
            .with_system_prompt(self.system_prompt.clone())
            .with_limits(Limits {
                max_model_turns: self.model.max_turns,
                ..Limits::default()
            });
        agent.claimant_args = claimant_args;
        agent.recovery_owner = self.recovery_owner.clone();
        if wiring.drives
            && let Some(model) = self.model()
        {
            agent = agent.with_model(model);
        }
        Ok(agent)
    }

    /// The model that plays this agent here: Claude when `ANTHROPIC_API_KEY` is set and the
    /// provider is `anthropic`, else the offline one, if the definition has one.
    pub fn model(&self) -> Option<Arc<dyn Model>> {
        if self.model.provider == Provider::Anthropic
            && let Some(model) = AnthropicModel::from_env_for(&self.model.id, self.model.max_tokens)
        {
            return Some(Arc::new(model));
        }
        match self.model.offline.as_ref()? {
            Offline::Script(script) => Some(Arc::new(ScriptedModel::new(
                format!("{}-script", self.name),
                script.clone(),
            ))),
            Offline::Expense => Some(Arc::new(OfflineExpenseAgent)),
        }
    }
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
    Ok(ModelSettings {
        provider,
        id: raw
            .id
            .unwrap_or_else(|| crate::adapters::anthropic::DEFAULT_MODEL.into()),
        max_turns,
        max_tokens,
        offline,
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
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        return Err(err(
            "",
            "a tool name has 1 to 64 letters, digits, '_' or '-'".into(),
        ));
    }
    let binding = match (raw.builtin, raw.http) {
        (Some(builtin), None) => {
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
        (None, Some(http)) => ToolBinding::Http(
            http.try_into()
                .map_err(|e: toml::de::Error| err("http", e.message().to_string()))?,
        ),
        (None, None) => return Err(err("", "needs one binding: builtin or http".into())),
        (Some(_), Some(_)) => return Err(err("", "has two bindings; keep one".into())),
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
