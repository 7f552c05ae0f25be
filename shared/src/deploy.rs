//! Where Countersign keeps its state, chosen by environment: the embedded SQLite store (the
//! default), or AWS (DynamoDB, SQS FIFO, EventBridge Scheduler). The standard AWS variables
//! (`AWS_REGION`, `AWS_ENDPOINT_URL`, credentials) configure the clients. Notices go to the
//! webhooks `COUNTERSIGN_WEBHOOKS` names, in every mode.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use crate::adapters::aws_sdk::sdk_config;
use crate::adapters::dynamodb::DynamoStore;
use crate::adapters::emf::Emf;
use crate::adapters::env_template::setting;
use crate::adapters::scheduler::{EventBridgeScheduler, ScheduleTarget};
use crate::adapters::slack::{self, SigningSecret, SlackApp, SlackChannel, WebApi};
use crate::adapters::sqs::SqsQueue;
use crate::adapters::webhook::{self, Webhooks};
use crate::agents::{self, Definition, Environment, Head, Pending, Wiring};
use crate::domain::identity::Directory;
use crate::engine::records::IndexShards;
use crate::engine::{
    DEFAULT_MAX_OPEN_APPROVALS, DEFAULT_REMIND_BEFORE, Delivery, Engine, EngineBuilder,
};
use crate::example::expense::{self, Claims};
use crate::ports::clock::{Clock, SystemClock};
use crate::ports::notifier::{Notifier, Several};
use crate::ports::scheduler::{Scheduler, SweepOnly};
use crate::ports::store::ItemStore;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Embedded,
    DynamoDb,
}

impl StoreKind {
    /// `COUNTERSIGN_STORE`: `embedded` (the default) or `dynamodb`.
    pub fn from_env() -> Result<Self, ConfigError> {
        match setting("COUNTERSIGN_STORE").as_deref() {
            None | Some("embedded") => Ok(StoreKind::Embedded),
            Some("dynamodb") => Ok(StoreKind::DynamoDb),
            Some(other) => Err(ConfigError(format!(
                "COUNTERSIGN_STORE={other:?}: use embedded or dynamodb"
            ))),
        }
    }
}

/// The AWS resources, named by environment as template.yaml sets them on every function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsSettings {
    pub table: String,
    pub queue_url: String,
    /// One-time wake-ups; without them the recurring sweep alone finds what is due.
    pub schedule: Option<(String, String, String)>,
}

const HINT: &str = "for a local stack: eval \"$(infra/local-stack up)\"";

impl AwsSettings {
    pub fn from_env() -> Result<Self, ConfigError> {
        let required = |name: &str, what: &str| {
            setting(name)
                .ok_or_else(|| ConfigError(format!("{name} must name the {what} ({HINT})")))
        };
        let table = required("COUNTERSIGN_TABLE", "DynamoDB table")?;
        let queue_url = required("COUNTERSIGN_QUEUE_URL", "SQS FIFO resume queue's URL")?;
        let schedule = match (
            setting("COUNTERSIGN_SCHEDULE_GROUP"),
            setting("COUNTERSIGN_SCHEDULER_ROLE_ARN"),
            setting("COUNTERSIGN_SWEEP_ARN"),
        ) {
            (Some(group), Some(role), Some(target)) => Some((group, role, target)),
            (None, None, None) => None,
            _ => {
                return Err(ConfigError(
                    "COUNTERSIGN_SCHEDULE_GROUP, COUNTERSIGN_SCHEDULER_ROLE_ARN and COUNTERSIGN_SWEEP_ARN go together".into(),
                ));
            }
        };
        Ok(Self {
            table,
            queue_url,
            schedule,
        })
    }
}

/// The AWS adapters, each built once from one SDK configuration.
#[derive(Clone)]
pub struct Aws {
    pub store: Arc<DynamoStore>,
    pub queue: Arc<SqsQueue>,
    pub scheduler: Arc<dyn Scheduler>,
}

impl Aws {
    pub fn new(config: &aws_config::SdkConfig, settings: &AwsSettings) -> Self {
        let store = Arc::new(DynamoStore::new(
            aws_sdk_dynamodb::Client::new(config),
            &settings.table,
        ));
        let queue = Arc::new(SqsQueue::new(
            aws_sdk_sqs::Client::new(config),
            &settings.queue_url,
        ));
        let scheduler: Arc<dyn Scheduler> = match &settings.schedule {
            Some((group, role_arn, target_arn)) => Arc::new(EventBridgeScheduler::new(
                aws_sdk_scheduler::Client::new(config),
                ScheduleTarget {
                    group: group.clone(),
                    role_arn: role_arn.clone(),
                    target_arn: target_arn.clone(),
                },
            )),
            None => Arc::new(SweepOnly),
        };
        Self {
            store,
            queue,
            scheduler,
        }
    }

    pub async fn from_env() -> Result<Self, ConfigError> {
        let settings = AwsSettings::from_env()?;
        Ok(Self::new(&sdk_config().await, &settings))
    }
}

const MAX_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// Notices of approvals and reminders before their deadlines.
#[derive(Clone)]
pub struct Notifications {
    /// Where notices go; `None` writes none (no outbox entry, no audit event).
    pub notifier: Option<Arc<dyn Notifier>>,
    pub remind_before: Duration,
    /// The review page's public address (`COUNTERSIGN_PUBLIC_URL`): notices link there.
    pub public_url: Option<reqwest::Url>,
}

impl Default for Notifications {
    fn default() -> Self {
        Self {
            notifier: None,
            remind_before: DEFAULT_REMIND_BEFORE,
            public_url: None,
        }
    }
}

fn duration_var(name: &str) -> Result<Option<Duration>, ConfigError> {
    setting(name)
        .map(|text| {
            humantime::parse_duration(&text).map_err(|e| {
                ConfigError(format!(
                    "{name}={text:?} is not a duration such as 1h or 30m: {e}"
                ))
            })
        })
        .transpose()
}

impl Notifications {
    /// `COUNTERSIGN_WEBHOOKS`: comma-separated http(s) URLs, each posted every notice (none:
    /// no notices). `COUNTERSIGN_REMIND_BEFORE`: how long before a deadline the reminder goes
    /// out (default 1h; 0s: no reminders). `COUNTERSIGN_WEBHOOK_TIMEOUT`: how long one post
    /// may take (default 5s). `COUNTERSIGN_PUBLIC_URL`: the review page's public address, which
    /// every notice links to (none: no link).
    pub fn from_env() -> Result<Self, ConfigError> {
        let public_url = setting("COUNTERSIGN_PUBLIC_URL")
            .map(|text| webhook::public_url(&text))
            .transpose()
            .map_err(|e| ConfigError(format!("COUNTERSIGN_PUBLIC_URL: {e}")))?;
        let remind_before =
            duration_var("COUNTERSIGN_REMIND_BEFORE")?.unwrap_or(DEFAULT_REMIND_BEFORE);
        let timeout =
            duration_var("COUNTERSIGN_WEBHOOK_TIMEOUT")?.unwrap_or(webhook::DEFAULT_TIMEOUT);
        // A post must end well inside the two minutes a claimed notice is held for.
        if timeout.is_zero() || timeout > MAX_WEBHOOK_TIMEOUT {
            return Err(ConfigError(
                "COUNTERSIGN_WEBHOOK_TIMEOUT must be above zero and at most 1m".into(),
            ));
        }
        let rendering = webhook::Rendering {
            public_url: public_url.clone(),
            buttons: setting(SLACK_SIGNING_SECRET).is_some(),
        };
        let urls = webhook::split_list(&setting("COUNTERSIGN_WEBHOOKS").unwrap_or_default());
        let mut notifiers: Vec<Arc<dyn Notifier>> = Vec::new();
        if !urls.is_empty() {
            let webhooks = Webhooks::new(&urls, timeout)
                .map_err(|e| ConfigError(format!("COUNTERSIGN_WEBHOOKS: {e}")))?
                .with_rendering(rendering.clone());
            notifiers.push(Arc::new(webhooks));
        }
        match (
            setting("COUNTERSIGN_SLACK_BOT_TOKEN"),
            setting("COUNTERSIGN_SLACK_CHANNEL"),
        ) {
            (Some(token), Some(channel)) => {
                let api =
                    setting("COUNTERSIGN_SLACK_API_URL").unwrap_or(slack::SLACK_API_URL.into());
                let channel = SlackChannel::new(&api, &token, &channel, timeout)
                    .map_err(|e| ConfigError(format!("COUNTERSIGN_SLACK_CHANNEL: {e}")))?
                    .with_rendering(rendering);
                notifiers.push(Arc::new(channel));
            }
            (None, None) => {}
            _ => {
                return Err(ConfigError(
                    "COUNTERSIGN_SLACK_BOT_TOKEN and COUNTERSIGN_SLACK_CHANNEL go together".into(),
                ));
            }
        }
        let notifier: Option<Arc<dyn Notifier>> = match notifiers.len() {
            0 => None,
            1 => notifiers.pop(),
            _ => Some(Arc::new(Several(notifiers))),
        };
        Ok(Self {
            notifier,
            remind_before,
            public_url,
        })
    }

    /// The engine being built sends these notices.
    pub fn apply(&self, builder: EngineBuilder) -> EngineBuilder {
        let builder = builder.remind_before(self.remind_before);
        match &self.notifier {
            Some(notifier) => builder.notifier(notifier.clone()),
            None => builder,
        }
    }
}

const SLACK_SIGNING_SECRET: &str = "COUNTERSIGN_SLACK_SIGNING_SECRET";

/// The longest `COUNTERSIGN_MCP_WAIT` may be: longer, a client gives up first.
const MAX_MCP_WAIT: Duration = Duration::from_secs(600);

/// The MCP gateway's settings: `COUNTERSIGN_MCP_WAIT`, how long a call that waits on a person
/// is held open (default 45s, at most 10m; the decide function's is 25s, under API Gateway's
/// 30 s), and `COUNTERSIGN_PUBLIC_URL`, the review page its answers link each approval to.
pub fn mcp_settings_from_env() -> Result<crate::api::mcp::Settings, ConfigError> {
    let wait = duration_var("COUNTERSIGN_MCP_WAIT")?.unwrap_or(crate::api::mcp::DEFAULT_WAIT);
    if wait > MAX_MCP_WAIT {
        return Err(ConfigError(
            "COUNTERSIGN_MCP_WAIT must be at most 10m".into(),
        ));
    }
    let public_url = setting("COUNTERSIGN_PUBLIC_URL")
        .map(|text| webhook::public_url(&text))
        .transpose()
        .map_err(|e| ConfigError(format!("COUNTERSIGN_PUBLIC_URL: {e}")))?;
    Ok(crate::api::mcp::Settings { wait, public_url })
}

/// The Slack app that takes clicks on the notices' buttons, when
/// `COUNTERSIGN_SLACK_SIGNING_SECRET` is set (then notices carry Approve and Reject buttons).
/// Slack users are people by the `slack` ids of `COUNTERSIGN_SLACK_PEOPLE` (a people directory
/// file), or else of `directory` (the local server's people directory). Answers go only to
/// `response_url`s under `COUNTERSIGN_SLACK_HOOKS_URL` (default Slack's own, `https://hooks.slack.com/`).
pub fn slack_from_env(directory: Option<&Directory>) -> Result<Option<Arc<SlackApp>>, ConfigError> {
    let Some(secret) = setting(SLACK_SIGNING_SECRET) else {
        return Ok(None);
    };
    let secret = SigningSecret::new(&secret)
        .map_err(|e| ConfigError(format!("{SLACK_SIGNING_SECRET}: {e}")))?;
    let people = match setting("COUNTERSIGN_SLACK_PEOPLE") {
        Some(path) => {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                ConfigError(format!("COUNTERSIGN_SLACK_PEOPLE: cannot read {path}: {e}"))
            })?;
            Directory::from_toml(&text)
                .map_err(|e| ConfigError(format!("COUNTERSIGN_SLACK_PEOPLE {path}: {e}")))?
        }
        None => directory.cloned().ok_or_else(|| {
            ConfigError(format!(
                "{SLACK_SIGNING_SECRET} is set: COUNTERSIGN_SLACK_PEOPLE must name the file that \
                 maps Slack users to people"
            ))
        })?,
    };
    let hooks = setting("COUNTERSIGN_SLACK_HOOKS_URL").unwrap_or(slack::SLACK_HOOKS_URL.into());
    // With the bot token, Edit opens its form through the Web API; Slack's trigger lasts 3 s.
    let web = setting("COUNTERSIGN_SLACK_BOT_TOKEN")
        .map(|token| {
            let api = setting("COUNTERSIGN_SLACK_API_URL").unwrap_or(slack::SLACK_API_URL.into());
            WebApi::new(&api, &token, Duration::from_secs(2))
                .map_err(|e| ConfigError(format!("COUNTERSIGN_SLACK_BOT_TOKEN: {e}")))
        })
        .transpose()?;
    let app = SlackApp::new(secret, people, &hooks)
        .map_err(|e| ConfigError(format!("COUNTERSIGN_SLACK_HOOKS_URL: {e}")))?
        .with_web_api(web);
    Ok(Some(Arc::new(app)))
}

/// The agent definitions a process runs: `paths` comma-separated (each an agent's directory or
/// a directory of them), or else the ones shipped with Countersign.
pub fn definitions(paths: Option<&str>) -> Result<Vec<Definition>, ConfigError> {
    let loaded = match split_paths(paths) {
        Some(paths) => agents::load_paths(&paths),
        None => agents::shipped(),
    };
    loaded.map_err(|e| ConfigError(e.to_string()))
}

fn split_paths(paths: Option<&str>) -> Option<Vec<PathBuf>> {
    let paths = paths.map(str::trim).filter(|p| !p.is_empty())?;
    Some(
        paths
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect(),
    )
}

/// A process's agent definitions: loaded whole at start (the local binary, which refuses a bad
/// one before it serves anything), or read by their heads at start and each loaded, checked
/// and bound when the first call that names its agent arrives (a function, which may never
/// need most of them: its cold start pays for none).
pub enum Definitions {
    Loaded(Vec<Definition>),
    WhenNeeded(Vec<Pending>),
}

/// Refuses, naming the agent and the server, a definition that would start an MCP server as a
/// local process: Lambda has no place to keep one running between invocations.
pub fn refuse_stdio_servers(definitions: &[Pending]) -> Result<(), ConfigError> {
    for Head {
        name,
        stdio_server,
        file,
        ..
    } in definitions.iter().map(|pending| &pending.head)
    {
        if let Some(server) = stdio_server {
            return Err(ConfigError(format!(
                "{file}: mcp.{server}: the agent {name} starts the MCP server {server} as a local process \
                 (command = ...), which cannot run in AWS Lambda; reach it by url (Streamable \
                 HTTP) there, or run this agent with the local binary (countersign serve or \
                 countersign mcp)"
            )));
        }
    }
    Ok(())
}

/// What every engine of a process is built from, whatever its store.
pub struct Setup {
    pub definitions: Definitions,
    pub notifications: Notifications,
    /// The expense example's claims, for its built-in tools (`COUNTERSIGN_CLAIMS` or the shipped).
    pub claims: Arc<Claims>,
    /// The most approvals one requester may have waiting on people at once
    /// ([`max_open_approvals`]).
    pub max_open_approvals: u32,
    /// The roles people hold, where the process has a people file: every role a policy rule
    /// names must be one of them. On AWS the identity provider holds the people, and role
    /// names go unchecked at start (`countersign policy test` checks them with a people file).
    pub roles: Option<BTreeSet<String>>,
}

impl Setup {
    /// `COUNTERSIGN_AGENTS` names the definitions (else the shipped ones), `COUNTERSIGN_CLAIMS`
    /// the expense example's claims file (else the shipped one), and the notices as
    /// [`Notifications::from_env`] reads them.
    ///
    /// Only Lambda functions set up this way: each definition is read by its head at start and
    /// loaded when its agent is first needed, and one with an MCP server started as a local
    /// process (`command = ...`) is refused at start: a function cannot keep one running.
    pub fn from_env() -> Result<Self, ConfigError> {
        let paths = split_paths(setting("COUNTERSIGN_AGENTS").as_deref());
        let pending = agents::pending(paths.as_deref()).map_err(|e| ConfigError(e.to_string()))?;
        refuse_stdio_servers(&pending)?;
        Self::with(
            Definitions::WhenNeeded(pending),
            setting("COUNTERSIGN_CLAIMS").map(PathBuf::from).as_deref(),
        )
    }

    /// Every definition loaded and checked now (`agents` as [`definitions`] reads it).
    pub fn load(agents: Option<&str>, claims: Option<&Path>) -> Result<Self, ConfigError> {
        Self::with(Definitions::Loaded(definitions(agents)?), claims)
    }

    fn with(definitions: Definitions, claims: Option<&Path>) -> Result<Self, ConfigError> {
        let claims = match claims {
            Some(path) => {
                let shown = path.display();
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError(format!("cannot read the claims file {shown}: {e}"))
                })?;
                Arc::new(
                    Claims::from_toml(&text).map_err(|e| ConfigError(format!("{shown}: {e}")))?,
                )
            }
            None => expense::default_claims(),
        };
        Ok(Self {
            definitions,
            notifications: Notifications::from_env()?,
            claims,
            max_open_approvals: max_open_approvals()?,
            roles: None,
        })
    }
}

/// Where an engine keeps state and how it resumes runs.
pub struct Backing {
    pub store: Arc<dyn ItemStore>,
    pub delivery: Delivery,
    pub scheduler: Arc<dyn Scheduler>,
    pub clock: Arc<dyn Clock>,
}

/// `COUNTERSIGN_INDEX_SHARDS`: how many partitions each index every tenant writes is split
/// over (default 16, at most 256). Every process of a deployment must read the same number.
pub fn index_shards() -> Result<IndexShards, ConfigError> {
    match setting(INDEX_SHARDS) {
        None => Ok(IndexShards::DEFAULT),
        Some(text) => text
            .parse()
            .map_err(|e| ConfigError(format!("{INDEX_SHARDS}: {e}"))),
    }
}

const INDEX_SHARDS: &str = "COUNTERSIGN_INDEX_SHARDS";

/// `COUNTERSIGN_MAX_OPEN_APPROVALS`: the most approvals one requester may have waiting on
/// people at once (default [`DEFAULT_MAX_OPEN_APPROVALS`], 1 to [`MOST_OPEN_APPROVALS`]); a
/// call past it is not proposed. Every process of a deployment should read the same number.
pub fn max_open_approvals() -> Result<u32, ConfigError> {
    let Some(text) = setting(MAX_OPEN_APPROVALS) else {
        return Ok(DEFAULT_MAX_OPEN_APPROVALS);
    };
    text.trim()
        .parse()
        .ok()
        .filter(|cap| (1..=MOST_OPEN_APPROVALS).contains(cap))
        .ok_or_else(|| {
            ConfigError(format!(
                "{MAX_OPEN_APPROVALS}={text:?} is not a whole number from 1 to {MOST_OPEN_APPROVALS}"
            ))
        })
}

const MAX_OPEN_APPROVALS: &str = "COUNTERSIGN_MAX_OPEN_APPROVALS";

/// The highest cap of open approvals a deployment may set.
pub const MOST_OPEN_APPROVALS: u32 = 100_000;

/// The one way every entry point builds its engine: each definition bound into an agent (a
/// model attached only where `drives`: the processes that start and resume runs; the variables
/// its bindings read needed as `environment` says), notices as configured, over the given
/// store.
pub fn engine(
    backing: Backing,
    setup: &Setup,
    drives: bool,
    environment: Environment,
) -> Result<Engine, ConfigError> {
    let wiring = Wiring {
        drives,
        environment,
        roles: setup.roles.clone(),
        ..Wiring::new(
            backing.store.clone(),
            backing.clock.clone(),
            setup.claims.clone(),
        )
    };
    let mut builder = Engine::builder(backing.store.clone());
    match &setup.definitions {
        Definitions::Loaded(definitions) => {
            let agents = wiring
                .build_all(definitions)
                .map_err(|e| ConfigError(e.to_string()))?;
            builder = builder.agents(agents);
        }
        Definitions::WhenNeeded(pending) => {
            let wiring = Arc::new(wiring);
            for pending in pending {
                let (wiring, source) = (wiring.clone(), pending.clone());
                builder = builder.agent_when_needed(
                    pending.head.name.clone(),
                    pending.head.tenants.clone(),
                    Box::new(move || {
                        let definition = source.load().map_err(|e| e.to_string())?;
                        wiring.build(&definition).map_err(|e| e.to_string())
                    }),
                );
            }
        }
    }
    let builder = builder
        .index_shards(index_shards()?)
        .max_open_approvals(setup.max_open_approvals)
        .clock(backing.clock)
        .delivery(backing.delivery)
        .scheduler(backing.scheduler);
    Ok(setup.notifications.apply(builder).build())
}

/// The engine of a function over AWS: resume messages go to the queue, deadlines to the
/// scheduler. Every function may run a tool (start and resume drive runs, decide takes gate
/// calls, the sweep asks lookups), so a variable a binding reads that is unset refuses the
/// agent's calls when it is built, at its first call ([`Definitions::WhenNeeded`]). What it counts (decisions, executions, policy rulings, model requests, failed resumes) it writes to stdout as
/// CloudWatch metric lines as each commits.
pub fn aws_engine(aws: &Aws, setup: &Setup, drives: bool) -> Result<Engine, ConfigError> {
    let backing = Backing {
        // What a function counts goes to its stdout as metric lines, for CloudWatch.
        store: Arc::new(aws.store.as_ref().clone().emitting(Emf::stdout())),
        delivery: Delivery::Queue(aws.queue.clone()),
        scheduler: aws.scheduler.clone(),
        clock: Arc::new(SystemClock),
    };
    engine(backing, setup, drives, Environment::AtStart)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_definition_that_starts_a_stdio_server_loads_locally_and_is_refused_for_lambda() {
        let dir = crate::testing::scratch_dir("stdio-lambda");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("agent.toml"),
            "name = \"files\"\nsystem_prompt = \"Edit files.\"\n\
             [mcp.files]\ncommand = \"npx\"\nargs = [\"-y\", \"@modelcontextprotocol/server-filesystem\", \"/srv\"]\n\
             env = { GITHUB_TOKEN = \"${NOT_NEEDED_TO_LOAD}\" }\ntools = \"*\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("policy.toml"),
            "name = \"files\"\nversion = 1\ndefault_ttl = \"1h\"\n",
        )
        .unwrap();

        definitions(Some(dir.to_str().unwrap())).expect("the local binary loads it");
        let pending = agents::pending(Some(std::slice::from_ref(&dir))).expect("its head reads");
        let refused = refuse_stdio_servers(&pending).unwrap_err().to_string();
        assert!(refused.contains("agent.toml: mcp.files"), "{refused}");
        assert!(
            refused.contains("the agent files starts the MCP server files as a local process"),
            "{refused}"
        );
        assert!(refused.contains("cannot run in AWS Lambda"), "{refused}");
        assert!(refuse_stdio_servers(&agents::pending(None).unwrap()).is_ok());
        std::fs::remove_dir_all(dir).ok();
    }
}

#[cfg(test)]
mod when_needed {
    use super::*;
    use crate::adapters::sqlite::SqliteStore;
    use crate::domain::ids::{AgentName, TenantId};
    use crate::engine::EngineError;
    use crate::ports::scheduler::SweepOnly;

    /// An engine over a fresh SQLite store whose agents are `definitions`, as a function's.
    fn engine_of(definitions: Definitions, name: &str) -> Result<Engine, ConfigError> {
        let store = Arc::new(SqliteStore::open_dir(&crate::testing::scratch_dir(name)).unwrap());
        let backing = Backing {
            store,
            delivery: Delivery::InProcess,
            scheduler: Arc::new(SweepOnly),
            clock: Arc::new(SystemClock),
        };
        let setup = Setup {
            definitions,
            notifications: Notifications::default(),
            claims: expense::default_claims(),
            max_open_approvals: DEFAULT_MAX_OPEN_APPROVALS,
            roles: None,
        };
        engine(backing, &setup, false, Environment::AtStart)
    }

    /// A payments agent of the tenant acme whose one Cedar rule names an argument its tool
    /// does not have.
    fn acme_payments_with_a_bad_rule() -> PathBuf {
        let dir = crate::testing::scratch_dir("bad-rule-when-needed");
        std::fs::create_dir_all(&dir).unwrap();
        for (file, text) in [
            (
                "agent.toml",
                "name = \"payments\"\nsystem_prompt = \"Move money.\"\ntenants = [\"acme\"]\n\
                 [tools.send_transfer]\nexecutor = \"caller\"\ndescription = \"Sends cents.\"\n\
                 input_schema = { type = \"object\", properties = { amount_cents = { type = \"integer\" } } }\n",
            ),
            (
                "policy.toml",
                "name = \"payments\"\nversion = 1\ndefault_ttl = \"4h\"\ncedar = [\"rules.cedar\"]\n",
            ),
            (
                "rules.cedar",
                "@id(\"x\")\npermit (principal, action == Action::\"send_transfer\", resource)\n  when { context.input.amount > 5 };\n",
            ),
        ] {
            std::fs::write(dir.join(file), text).unwrap();
        }
        dir
    }

    #[test]
    fn given_a_bad_rule_a_function_starts_and_refuses_the_first_call_that_needs_the_agent_naming_the_file_the_line_and_the_reason()
     {
        let dir = acme_payments_with_a_bad_rule();
        let loaded = Definitions::Loaded(definitions(dir.to_str()).unwrap());
        let at_start = engine_of(loaded, "bad-rule-at-start")
            .err()
            .expect("the local binary refuses it at start");
        let pending = agents::pending(Some(std::slice::from_ref(&dir))).expect("its head reads");
        let engine = engine_of(Definitions::WhenNeeded(pending), "bad-rule-engine").unwrap();

        let payments = AgentName::parse("payments").unwrap();
        let (acme, globex) = (
            TenantId::parse("acme").unwrap(),
            TenantId::parse("globex").unwrap(),
        );
        assert!(engine.agents().admits(&acme, &payments));
        assert!(
            !engine.agents().admits(&globex, &payments),
            "its tenants are known from its head"
        );
        assert!(matches!(
            engine.agent(&globex, &payments),
            Err(EngineError::NotFound { .. })
        ));

        let refused = engine
            .agent(&acme, &payments)
            .err()
            .expect("building it refuses it");
        assert!(
            matches!(refused, EngineError::NotConfigured(_)),
            "{refused:?}"
        );
        let refused = refused.to_string();
        for said in [
            "rules.cedar",
            "line 3",
            "send_transfer has no argument amount",
        ] {
            assert!(refused.contains(said), "{refused}");
            assert!(at_start.to_string().contains(said), "{at_start}");
        }
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn given_the_shipped_agents_a_function_builds_each_once_when_first_needed_and_as_the_local_binary_does()
     {
        let pending = agents::pending(None).expect("the shipped heads read");
        let names: Vec<AgentName> = pending.iter().map(|p| p.head.name.clone()).collect();
        let loaded = definitions(None).unwrap();
        assert_eq!(
            names,
            loaded.iter().map(|d| d.name.clone()).collect::<Vec<_>>()
        );
        for (pending, loaded) in pending.iter().zip(&loaded) {
            assert_eq!(&pending.load().unwrap(), loaded);
        }

        let engine = engine_of(Definitions::WhenNeeded(pending), "shipped-when-needed").unwrap();
        let tenant = TenantId::parse("acme").unwrap();
        for name in names {
            let first = engine.agent(&tenant, &name).expect("it builds").clone();
            let again = engine.agent(&tenant, &name).unwrap();
            assert!(Arc::ptr_eq(&first, again), "{name} is built once");
            assert_eq!(first.name, name);
        }
    }
}
