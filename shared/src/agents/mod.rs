//! Agent definitions as data: a directory holding `agent.toml` (name, model settings, system
//! prompt, tools and how each is reached) and the policy it names (`policy.toml`). The local
//! binary loads every definition it is given at start-up; a bad one fails at once, naming the
//! file and the field. A function reads each one's [`Head`] at start and the rest when its agent
//! is first needed ([`Pending`]). [`Wiring::build`] binds the tools and the model and yields the engine's
//! [`crate::engine::Agent`].
//!
//! ```toml
//! name = "refunds"
//! system_prompt = "You issue refunds for the orders service..."
//! recovery_owner = "finance_manager"   # who answers "did this take effect?"
//!
//! [model]
//! provider = "anthropic"               # or "openai" (with base_url, api_key_env), "bedrock",
//!                                      # or "scripted": always the offline script
//! id = "claude-sonnet-4-5"
//! turn_timeout = "90s"                 # one turn, its retries included
//! max_turns = 12
//! max_tokens = 1024
//! offline = "script.toml"              # plays the agent without ANTHROPIC_API_KEY
//!
//! [tools.issue_refund]
//! description = "Refund part or all of an order."
//! input_schema = { type = "object", properties = { ... }, required = [...] }
//! claimant = "customer"                # an argument naming a person who may not approve
//! http = { method = "POST", url = "${ORDERS_URL}/orders/{order_id}/refunds" }
//!
//! [tools.reimburse]
//! builtin = "expense.reimburse"        # a tool written in Rust, shipped with Countersign
//!
//! [mcp.orders]                         # a Streamable HTTP MCP server, named as you choose
//! url = "${ORDERS_MCP_URL}"
//! headers = { Authorization = "Bearer ${ORDERS_MCP_TOKEN}" }   # never shown, never logged
//! timeout = "10s"                      # per request, at most 60s (30s)
//! tools = "*"                          # optional: "*" or ["get_order", ...] adds the tools
//!                                      # the server lists, named as it names them
//!
//! [tools.refund]                       # one tool of a server, under a name of your own
//! mcp = { server = "orders", tool = "issue_refund" }
//! description = "..."                  # optional: else the server's; so is input_schema
//! ```
//!
//! MCP tools are reached lazily (see `mcp.rs`): building an agent never touches a server, so a
//! server that is down stops no process. A process drives a run only after [`prepare`] has
//! listed the agent's servers (specs and hints then fixed for the process); if one is down the
//! run is refused as unavailable (HTTP 503) and nothing is written. What needs the listing is
//! checked then, with the same file-and-field errors: a bound tool the server does not list, a
//! listed name that is another tool's, and, for a definition with a `tools = "*"` server, a
//! policy rule for a tool neither defined nor listed. Everything else is checked at load.

mod definition;
mod mcp;
mod policy_files;
mod schema;
mod wiring;

use std::path::{Path, PathBuf};

pub use definition::{
    ApiEndpoint, Definition, Head, ModelSettings, Offline, Provider, ToolBinding, ToolDefinition,
};
pub use wiring::{BEDROCK_MODEL_VAR, Environment, Wiring};

/// A candidate policy for `agent`, read from the manifest at `path` (its Cedar files beside
/// it) and checked against the agent's tools, where all of them are known here, and the roles
/// people hold: the same checks its own policy passed.
pub fn candidate_policy(
    path: &Path,
    agent: &crate::engine::Agent,
    definition: &Definition,
    roles: Option<&std::collections::BTreeSet<String>>,
) -> Result<crate::domain::policy::Policy, DefinitionError> {
    let refuse = |message: &str| DefinitionError::new(&path.display().to_string(), "", message);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Err(refuse("a candidate policy is a file: policy.toml"));
    };
    let dir = match dir.as_os_str().is_empty() {
        true => Path::new("."),
        false => dir,
    };
    let (policy, files) = definition::load_policy(&Dir(dir.to_path_buf()), name)?;
    if !definition.needs_listing() {
        let known: Vec<(String, serde_json::Value)> = agent
            .tools
            .specs()
            .iter()
            .map(|spec| (spec.name.clone(), spec.input_schema.clone()))
            .collect();
        files.check(&policy, &known, roles)?;
    }
    Ok(policy)
}

use crate::domain::ids::{AgentName, RunId, TenantId};
use crate::engine::{Engine, EngineError, ResumeReport};
use crate::ports::queue::{QueueMessage, ResumeMessage};

/// Why a definition cannot be loaded or built: the file, the field, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {field}{}{message}", if field.is_empty() { "" } else { ": " })]
pub struct DefinitionError {
    pub file: String,
    pub field: String,
    pub message: String,
}

impl DefinitionError {
    pub(crate) fn new(file: &str, field: &str, message: impl Into<String>) -> Self {
        Self {
            file: file.to_string(),
            field: field.to_string(),
            message: message.into(),
        }
    }
}

/// The file in an agent's directory that defines it.
pub const DEFINITION_FILE: &str = "agent.toml";

/// Where a definition's files come from: a directory on disk, or files compiled into the binary.
pub trait Files {
    /// How errors name the file: a path, or `shipped:<agent>/<file>`.
    fn label(&self, file: &str) -> String;
    fn read(&self, file: &str) -> Result<String, DefinitionError>;
}

/// A definition's directory on disk.
pub struct Dir(pub PathBuf);

/// The largest definition file (agent, policy, script) read: far above any real one, far below
/// what would hold up a process at start-up.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

impl Files for Dir {
    fn label(&self, file: &str) -> String {
        self.0.join(file).display().to_string()
    }

    /// Reads a file of the directory: the name, once every link in it is resolved, must stay
    /// inside the directory, and be a regular file of at most [`MAX_FILE_BYTES`].
    fn read(&self, file: &str) -> Result<String, DefinitionError> {
        let relative = Path::new(file);
        let refuse = |message: String| DefinitionError::new(&self.label(file), "", message);
        // Files a definition names stay inside its directory.
        if relative.is_absolute() || relative.components().any(|c| c.as_os_str() == "..") {
            return Err(DefinitionError::new(
                &self.label(DEFINITION_FILE),
                "",
                format!("{file:?} must be a file inside the agent's directory"),
            ));
        }
        let cannot_read = |e: std::io::Error| refuse(format!("cannot read it: {e}"));
        let root = self.0.canonicalize().map_err(cannot_read)?;
        let path = self.0.join(relative).canonicalize().map_err(cannot_read)?;
        if !path.starts_with(&root) {
            return Err(refuse(format!(
                "it leads outside the agent's directory {}; a definition reads only files inside it",
                root.display()
            )));
        }
        // Checked before opening: opening a FIFO would wait for a writer.
        let metadata = std::fs::metadata(&path).map_err(cannot_read)?;
        if !metadata.is_file() {
            return Err(refuse("it is not a regular file".into()));
        }
        let too_large = || {
            refuse(format!(
                "it has more than {MAX_FILE_BYTES} bytes (1 MiB), the most a definition file may have"
            ))
        };
        if metadata.len() > MAX_FILE_BYTES {
            return Err(too_large());
        }
        let file = std::fs::File::open(&path).map_err(cannot_read)?;
        let mut text = String::new();
        // No further than one byte past the limit, should the file have grown since.
        let read = std::io::Read::read_to_string(
            &mut std::io::Read::take(file, MAX_FILE_BYTES + 1),
            &mut text,
        )
        .map_err(cannot_read)?;
        if read as u64 > MAX_FILE_BYTES {
            return Err(too_large());
        }
        Ok(text)
    }
}

/// A definition's files held in memory (the shipped ones, compiled in; a test's), named in
/// errors as if they sat in `dir`.
pub struct InMemory<'a> {
    pub dir: &'a str,
    pub files: &'a [(&'a str, &'a str)],
}

impl Files for InMemory<'_> {
    fn label(&self, file: &str) -> String {
        format!("{}/{file}", self.dir)
    }

    fn read(&self, file: &str) -> Result<String, DefinitionError> {
        self.files
            .iter()
            .find(|(name, _)| *name == file)
            .map(|(_, text)| text.to_string())
            .ok_or_else(|| DefinitionError::new(&self.label(file), "", "no such file"))
    }
}

/// The definitions shipped with Countersign, compiled in so the binaries run from anywhere.
const SHIPPED: &[InMemory<'static>] = &[
    InMemory {
        dir: "shipped:expense",
        files: &[
            (
                "agent.toml",
                include_str!("../../../agents/expense/agent.toml"),
            ),
            (
                "policy.toml",
                include_str!("../../../agents/expense/policy.toml"),
            ),
        ],
    },
    InMemory {
        dir: "shipped:refunds",
        files: &[
            (
                "agent.toml",
                include_str!("../../../agents/refunds/agent.toml"),
            ),
            (
                "policy.toml",
                include_str!("../../../agents/refunds/policy.toml"),
            ),
            (
                "script.toml",
                include_str!("../../../agents/refunds/script.toml"),
            ),
        ],
    },
];

/// The shipped definitions: the expense agent and the refunds agent.
pub fn shipped() -> Result<Vec<Definition>, DefinitionError> {
    SHIPPED
        .iter()
        .map(|files| Definition::load(files))
        .collect()
}

/// One shipped definition by name.
pub fn shipped_one(name: &str) -> Result<Definition, DefinitionError> {
    let files = SHIPPED
        .iter()
        .find(|s| s.dir.strip_prefix("shipped:") == Some(name))
        .ok_or_else(|| DefinitionError::new("shipped", "", format!("no shipped agent {name}")))?;
    Definition::load(files)
}

/// Loads definitions from paths: each an agent's directory (it holds `agent.toml`) or a
/// directory of agent directories. Two definitions with one name are refused.
pub fn load_paths(paths: &[PathBuf]) -> Result<Vec<Definition>, DefinitionError> {
    let definitions = agent_dirs(paths)?
        .into_iter()
        .map(|dir| Definition::load(&Dir(dir)))
        .collect::<Result<Vec<_>, _>>()?;
    refuse_twins(definitions.iter().map(|d| (&d.name, d.file.as_str())))?;
    Ok(definitions)
}

/// A definition known by its [`Head`] until its agent is needed, then loaded whole from where
/// it was found: for a process that may never need it.
#[derive(Clone)]
pub struct Pending {
    pub head: Head,
    source: Source,
}

#[derive(Clone)]
enum Source {
    Shipped(&'static InMemory<'static>),
    Dir(PathBuf),
}

impl Source {
    /// `read` over this definition's files, wherever they are.
    fn read<T>(&self, read: impl FnOnce(&dyn Files) -> T) -> T {
        match self {
            Source::Shipped(files) => read(*files),
            Source::Dir(dir) => read(&Dir(dir.clone())),
        }
    }
}

impl Pending {
    /// The whole definition, checked as [`Definition::load`] checks it.
    pub fn load(&self) -> Result<Definition, DefinitionError> {
        self.source.read(Definition::load)
    }
}

/// The definitions under `paths` (as [`load_paths`] finds them), or else the shipped ones, each
/// known by its head until it is loaded. Two with one name are refused.
pub fn pending(paths: Option<&[PathBuf]>) -> Result<Vec<Pending>, DefinitionError> {
    let sources: Vec<Source> = match paths {
        Some(paths) => agent_dirs(paths)?.into_iter().map(Source::Dir).collect(),
        None => SHIPPED.iter().map(Source::Shipped).collect(),
    };
    let pending = sources
        .into_iter()
        .map(|source| {
            Ok(Pending {
                head: source.read(Head::read)?,
                source,
            })
        })
        .collect::<Result<Vec<_>, DefinitionError>>()?;
    refuse_twins(pending.iter().map(|p| (&p.head.name, p.head.file.as_str())))?;
    Ok(pending)
}

/// The agents' directories `paths` name: each one itself, or the agent directories inside it.
fn agent_dirs(paths: &[PathBuf]) -> Result<Vec<PathBuf>, DefinitionError> {
    let mut found = Vec::new();
    for path in paths {
        if path.join(DEFINITION_FILE).is_file() {
            found.push(path.clone());
            continue;
        }
        let entries = std::fs::read_dir(path).map_err(|e| {
            DefinitionError::new(
                &path.display().to_string(),
                "",
                format!(
                    "not an agent directory (no {DEFINITION_FILE}) nor a directory of them: {e}"
                ),
            )
        })?;
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join(DEFINITION_FILE).is_file())
            .collect();
        dirs.sort();
        found.extend(dirs);
    }
    Ok(found)
}

/// Refuses the second of two definitions with one name, naming both files.
fn refuse_twins<'a>(
    definitions: impl Iterator<Item = (&'a AgentName, &'a str)>,
) -> Result<(), DefinitionError> {
    let mut seen: Vec<(&AgentName, &str)> = Vec::new();
    for (name, file) in definitions {
        if let Some((_, twin)) = seen.iter().find(|(seen, _)| *seen == name) {
            return Err(DefinitionError::new(
                file,
                "name",
                format!("{name} is also the name of {twin}"),
            ));
        }
        seen.push((name, file));
    }
    Ok(())
}

/// Makes an agent's tools ready before a run of it is driven: connects to and lists every MCP
/// server of its definition not yet listed in this process. A server that is down refuses the
/// run as unavailable (HTTP 503) before anything is written; the next attempt tries again.
/// Call it before [`Engine::start`]; a resume, a model's turn and an edit list what they need
/// themselves. It returns at once once listed. An agent that does not serve `tenant` is
/// `not_found`, as if it did not exist.
pub async fn prepare(
    engine: &Engine,
    tenant: &TenantId,
    agent: &AgentName,
) -> Result<(), EngineError> {
    engine.agent(tenant, agent)?.list_tools().await
}

/// [`prepare`] for the agent of the run a resume message wakes, so the approved call and the
/// model's next turn see every tool. A run that cannot be read is left to the resume to report.
pub async fn prepare_resume(engine: &Engine, message: &ResumeMessage) -> Result<(), EngineError> {
    prepare_run(engine, &message.tenant, &message.run_id).await
}

/// [`prepare_resume`] for either kind of queue message: the run it drives on.
async fn prepare_queued(engine: &Engine, message: &QueueMessage) -> Result<(), EngineError> {
    let (tenant, run) = message.run();
    prepare_run(engine, tenant, run).await
}

/// Handles one queued message as a consumer of the resume queue does (the resume function,
/// `countersign worker`): its run's agent prepared, then [`Engine::consume`]. A message that
/// fails, to be delivered again, is counted as a resume failure under its run's agent.
pub async fn consume_queued(
    engine: &Engine,
    message: &QueueMessage,
) -> Result<ResumeReport, EngineError> {
    let consumed = match prepare_queued(engine, message).await {
        Ok(()) => engine.consume(message).await,
        Err(error) => Err(error),
    };
    if consumed.is_err() {
        let (tenant, run) = message.run();
        engine.count_resume_failure(tenant, run).await;
    }
    consumed
}

async fn prepare_run(engine: &Engine, tenant: &TenantId, run: &RunId) -> Result<(), EngineError> {
    match engine.run(tenant, run).await {
        Ok(run) => prepare(engine, tenant, &run.agent).await,
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = include_str!("../../../agents/refunds/agent.toml");
    const POLICY: &str = include_str!("../../../agents/refunds/policy.toml");
    const SCRIPT: &str = include_str!("../../../agents/refunds/script.toml");

    /// A fresh directory holding an agent's directory, `agent/`, with the shipped refunds
    /// agent's files; removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            let root = std::env::temp_dir().join(format!(
                "countersign-agents-{name}-{}-{nanos}",
                std::process::id()
            ));
            std::fs::create_dir_all(root.join("agent")).unwrap();
            for (file, text) in [
                ("agent.toml", AGENT),
                ("policy.toml", POLICY),
                ("script.toml", SCRIPT),
            ] {
                std::fs::write(root.join("agent").join(file), text).unwrap();
            }
            Self(root)
        }

        fn agent(&self) -> PathBuf {
            self.0.join("agent")
        }

        fn load(&self) -> Result<Vec<Definition>, DefinitionError> {
            load_paths(&[self.agent()])
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The cookbook's recipes, each an agent's directory under `examples/policies/`.
    fn cookbook_recipes(root: &Path) -> Vec<String> {
        let mut recipes: Vec<String> = std::fs::read_dir(root.join("examples/policies"))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.is_dir())
            .map(|path| {
                let name = path.file_name().unwrap().to_str().unwrap();
                format!("examples/policies/{name}")
            })
            .collect();
        recipes.sort();
        recipes
    }

    /// Every shipped and example policy, and every recipe of the cookbook, loads as a real
    /// agent does (roles checked against its people) and decides its cases as its file says.
    #[test]
    fn every_shipped_and_example_policy_decides_its_cases() {
        use crate::domain::identity::Directory;
        use crate::domain::policy::cases::Cases;
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let shipped_people =
            std::fs::read_to_string(root.join("shared/example/people.toml")).unwrap();
        let mut agents: Vec<String> = [
            "agents/expense",
            "agents/refunds",
            "examples/credits",
            "examples/helpdesk",
        ]
        .map(String::from)
        .to_vec();
        let recipes = cookbook_recipes(&root);
        assert!(recipes.len() >= 8, "{recipes:?}");
        agents.extend(recipes);
        let dir = crate::testing::scratch_dir("policy-cases");
        let store: std::sync::Arc<dyn crate::ports::store::ItemStore> =
            std::sync::Arc::new(crate::adapters::sqlite::SqliteStore::open_dir(&dir).unwrap());
        for path in agents {
            // Beside its policy, a people file for the roles the shipped one lacks.
            let people = match std::fs::read_to_string(root.join(&path).join("people.toml")) {
                Ok(text) => text,
                Err(_) => shipped_people.clone(),
            };
            let people = Directory::from_toml(&people).unwrap();
            let wiring = Wiring::new(
                store.clone(),
                std::sync::Arc::new(crate::ports::clock::SystemClock),
                crate::example::expense::default_claims(),
            )
            .with_roles_of(&people);
            let definition =
                Definition::load(&Dir(root.join(&path))).unwrap_or_else(|e| panic!("{path}: {e}"));
            let agent = wiring
                .build(&definition)
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            let text = std::fs::read_to_string(root.join(&path).join("policy-cases.toml")).unwrap();
            let cases = Cases::from_toml(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
            assert!(cases.cases.len() >= 2, "{path}");
            let failures = agent.run_cases(&cases, &people);
            assert!(failures.is_empty(), "{path}: {failures:#?}");
        }
        std::fs::remove_dir_all(dir).ok();
    }

    /// The rules the cookbook quotes are the recipes' own: every ```cedar block of its section
    /// of docs/policies.md is written, as it stands, in a Cedar file of a recipe, and every
    /// recipe's directory is linked from it.
    #[test]
    fn every_rule_the_cookbook_quotes_is_in_a_recipe_file() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let docs = std::fs::read_to_string(root.join("docs/policies.md")).unwrap();
        let section = docs
            .split("\n## A cookbook\n")
            .nth(1)
            .expect("docs/policies.md has a section ## A cookbook");
        let section = section.split("\n## ").next().unwrap();
        let recipes = cookbook_recipes(&root);
        let mut rules = Vec::new();
        for recipe in &recipes {
            assert!(
                section.contains(&format!("(../{recipe}/)")),
                "the cookbook does not link {recipe}"
            );
            for entry in std::fs::read_dir(root.join(recipe)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "cedar") {
                    rules.push(std::fs::read_to_string(path).unwrap());
                }
            }
        }
        let quoted: Vec<&str> = section
            .split("```cedar\n")
            .skip(1)
            .map(|rest| rest.split("\n```").next().unwrap())
            .collect();
        assert!(quoted.len() >= recipes.len(), "{} quoted", quoted.len());
        for block in quoted {
            assert!(
                rules.iter().any(|file| file.contains(block)),
                "the cookbook quotes a rule no recipe's Cedar file holds:\n{block}"
            );
        }
    }

    const SECRET_LINE: &str = "root:x:0:0:the-first-line-of-a-private-file";

    #[cfg(unix)]
    #[test]
    fn a_policy_linked_outside_the_agents_directory_is_refused_without_its_content() {
        let scratch = Scratch::new("link-out");
        let outside = scratch.0.join("passwd");
        std::fs::write(&outside, format!("{SECRET_LINE}\nsecond:line\n")).unwrap();
        let policy = scratch.agent().join("policy.toml");
        std::fs::remove_file(&policy).unwrap();
        std::os::unix::fs::symlink(&outside, &policy).unwrap();

        let error = scratch.load().unwrap_err();
        assert_eq!(error.file, policy.display().to_string());
        let told = error.to_string();
        assert!(told.contains("outside the agent's directory"), "{told}");
        assert!(!told.contains("root:x"), "{told}");

        // A link to the same file through a directory link is refused the same way.
        std::fs::remove_file(&policy).unwrap();
        std::os::unix::fs::symlink(&scratch.0, scratch.agent().join("up")).unwrap();
        std::fs::write(
            scratch.agent().join("agent.toml"),
            format!("policy = \"up/passwd\"\n{AGENT}"),
        )
        .unwrap();
        let told = scratch.load().unwrap_err().to_string();
        assert!(told.contains("outside the agent's directory"), "{told}");
        assert!(!told.contains("root:x"), "{told}");
    }

    #[cfg(unix)]
    #[test]
    fn a_link_that_stays_inside_the_agents_directory_is_followed() {
        let scratch = Scratch::new("link-in");
        let agent = scratch.agent();
        std::fs::rename(agent.join("policy.toml"), agent.join("refunds-policy.toml")).unwrap();
        std::os::unix::fs::symlink("refunds-policy.toml", agent.join("policy.toml")).unwrap();
        let loaded = scratch.load().unwrap();
        assert_eq!(loaded[0].name.as_str(), "refunds");
    }

    #[test]
    fn a_file_that_is_not_toml_is_refused_naming_the_line_never_quoting_it() {
        let scratch = Scratch::new("not-toml");
        let policy = scratch.agent().join("policy.toml");
        std::fs::write(&policy, format!("{SECRET_LINE}\n")).unwrap();
        let error = scratch.load().unwrap_err();
        assert_eq!(error.file, policy.display().to_string());
        let told = error.to_string();
        assert!(told.contains("line 1, column"), "{told}");
        assert!(!told.contains("root:x"), "{told}");

        let agent = scratch.agent().join("agent.toml");
        std::fs::write(&agent, format!("{AGENT}\n{SECRET_LINE}\n")).unwrap();
        let told = scratch.load().unwrap_err().to_string();
        assert!(told.contains("line "), "{told}");
        assert!(!told.contains("root:x"), "{told}");
    }

    #[test]
    fn a_definition_file_over_one_mib_is_refused_before_it_is_read() {
        let scratch = Scratch::new("large");
        let script = scratch.agent().join("script.toml");
        let padding = format!("# {}\n", "x".repeat(1022)).repeat(1025);
        std::fs::write(&script, format!("{SCRIPT}{padding}")).unwrap();
        let error = scratch.load().unwrap_err();
        assert_eq!(error.file, script.display().to_string());
        assert!(error.message.contains("1 MiB"), "{error}");

        // Just under the limit loads.
        let fits = &padding[..padding.len() - 3 * 1024 - SCRIPT.len()];
        std::fs::write(&script, format!("{SCRIPT}{fits}")).unwrap();
        assert!(scratch.load().is_ok());
    }

    #[cfg(unix)]
    #[test]
    fn a_definition_file_that_is_not_a_regular_file_is_refused() {
        let scratch = Scratch::new("fifo");
        let policy = scratch.agent().join("policy.toml");
        std::fs::remove_file(&policy).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&policy)
            .status()
            .unwrap();
        assert!(made.success());
        let error = scratch.load().unwrap_err();
        assert!(error.message.contains("not a regular file"), "{error}");
    }
}
