//! The engine a `countersign` process works with: the embedded SQLite store by default, or
//! AWS when `COUNTERSIGN_STORE=dynamodb`; every agent its definitions name, each with its model.

use std::path::Path;

#[cfg(debug_assertions)]
use chrono::{DateTime, Utc};
use std::sync::Arc;

use shared::adapters::sqlite::SqliteStore;
use shared::agents::Environment;
use shared::deploy::{self, Aws, Backing, Setup, StoreKind};
use shared::domain::identity::{Directory, Identity};
use shared::domain::ids::{AgentName, TenantId};
use shared::engine::{Delivery, Engine, EngineError};
use shared::example::expense::{self, Claims, Ledger};
use shared::ports::clock::{Clock, SystemClock};
use shared::ports::scheduler::SweepOnly;
use shared::ports::store::ItemStore;

use crate::cli::Global;
use crate::fail::Failure;

pub struct Local {
    pub engine: Engine,
    pub directory: Directory,
    pub claims: Arc<Claims>,
    pub ledger: Ledger,
    /// The AWS adapters, when the store is DynamoDB.
    pub aws: Option<Aws>,
}

fn read(path: &Path, what: &str) -> Result<String, Failure> {
    std::fs::read_to_string(path).map_err(|e| {
        Failure::usage(format!(
            "cannot read the {what} file {}: {e}",
            path.display()
        ))
    })
}

/// What a process loads besides its store: the agent definitions and the claims file (through
/// [`Setup`]), and the people directory (the shipped one by default).
fn load(global: &Global) -> Result<(Setup, Directory), Failure> {
    let mut setup = Setup::load(global.agents.as_deref(), global.claims.as_deref())
        .map_err(|e| Failure::usage(e.to_string()))?;
    setup.max_open_approvals = global.max_open_approvals;
    let directory = match &global.people {
        Some(path) => Directory::from_toml(&read(path, "people")?)
            .map_err(|e| Failure::usage(e.to_string()))?,
        None => expense::default_directory(),
    };
    setup.roles = Some(directory.roles());
    Ok((setup, directory))
}

/// The system's time, moved ahead by `--clock-offset` in a debug build: a testing aid that lets
/// the sweep act as if every deadline and lease had passed (the fault campaign uses it).
#[cfg(debug_assertions)]
fn clock(global: &Global) -> Result<Arc<dyn Clock>, Failure> {
    let Some(offset) = global.clock_offset else {
        return Ok(Arc::new(SystemClock));
    };
    let offset = chrono::Duration::from_std(offset)
        .ok()
        .filter(|o| Utc::now().checked_add_signed(*o).is_some())
        .ok_or_else(|| Failure::usage("--clock-offset is too far ahead"))?;
    Ok(Arc::new(AheadClock(offset)))
}

/// A release build keeps the system's time, and says so rather than ignore the variable: it
/// cannot be told to expire things early.
#[cfg(not(debug_assertions))]
fn clock(_: &Global) -> Result<Arc<dyn Clock>, Failure> {
    if std::env::var_os(crate::cli::CLOCK_OFFSET_ENV).is_some() {
        return Err(Failure::usage(format!(
            "{} is a testing aid of debug builds; a release build keeps the system's time",
            crate::cli::CLOCK_OFFSET_ENV
        )));
    }
    Ok(Arc::new(SystemClock))
}

/// The system's time plus a fixed offset.
#[cfg(debug_assertions)]
struct AheadClock(chrono::Duration);

#[cfg(debug_assertions)]
impl Clock for AheadClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.0
    }
}

impl Local {
    /// The embedded mode: the store is a SQLite file in the state directory, and a decision
    /// resumes its run in this process where it can run the agent's tools. `environment` says
    /// when this command needs the variables the agents' bindings read.
    pub fn open(global: &Global, environment: Environment) -> Result<Self, Failure> {
        let store: Arc<dyn ItemStore> =
            Arc::new(SqliteStore::open_dir(&global.state).map_err(EngineError::from)?);
        let backing = Backing {
            store,
            delivery: Delivery::InProcess,
            scheduler: Arc::new(SweepOnly),
            clock: clock(global)?,
        };
        Self::assemble(global, backing, None, environment)
    }

    /// The store `COUNTERSIGN_STORE` names: embedded (the default), or DynamoDB with SQS and
    /// EventBridge Scheduler, where a decision queues its resume message for a worker.
    pub async fn connect(global: &Global, environment: Environment) -> Result<Self, Failure> {
        match StoreKind::from_env().map_err(|e| Failure::usage(e.to_string()))? {
            StoreKind::Embedded => Self::open(global, environment),
            StoreKind::DynamoDb => {
                let aws = Aws::from_env()
                    .await
                    .map_err(|e| Failure::usage(e.to_string()))?;
                let backing = Backing {
                    store: aws.store.clone(),
                    delivery: Delivery::Queue(aws.queue.clone()),
                    scheduler: aws.scheduler.clone(),
                    clock: clock(global)?,
                };
                Self::assemble(global, backing, Some(aws), environment)
            }
        }
    }

    /// Every command may drive a run (a decision resumes it in the embedded mode), so each
    /// agent gets its model.
    fn assemble(
        global: &Global,
        backing: Backing,
        aws: Option<Aws>,
        environment: Environment,
    ) -> Result<Self, Failure> {
        let (setup, directory) = load(global)?;
        let store = backing.store.clone();
        let engine = deploy::engine(backing, &setup, true, environment)
            .map_err(|e| Failure::usage(e.to_string()))?;
        Ok(Self {
            engine,
            directory,
            claims: setup.claims,
            ledger: Ledger::new(store),
            aws,
        })
    }

    /// A person from the directory; anyone else is refused.
    pub fn identify(&self, name: &str) -> Result<Identity, Failure> {
        self.directory
            .identify(name)
            .map_err(|e| Failure::from(EngineError::from(e)))
    }

    /// Whether this process has the agent for `tenant`: without it, it cannot start, decide or
    /// resume the agent's runs, and the user is told how to load its definition. An agent that
    /// does not serve the tenant is not loaded for it, in the same words.
    pub fn loaded(&self, tenant: &TenantId, name: &AgentName) -> Result<(), Failure> {
        if self.engine.agent(tenant, name).is_ok() {
            return Ok(());
        }
        let loaded: Vec<String> = self
            .engine
            .agents()
            .iter()
            .filter(|agent| agent.serves(tenant))
            .map(|agent| agent.name.to_string())
            .collect();
        Err(Failure {
            code: "not_found",
            message: format!(
                "agent {name} is not loaded here (loaded: {}): give its definition's directory \
                 with --agents DIR or COUNTERSIGN_AGENTS=DIR, to this command and to every \
                 command that decides or resumes its runs",
                match loaded.is_empty() {
                    true => "none".to_string(),
                    false => loaded.join(", "),
                }
            ),
            exit: 1,
        })
    }

    /// Every tenant that has started a run, for views across the whole local deployment.
    pub async fn tenants(&self) -> Result<Vec<TenantId>, Failure> {
        Ok(self.engine.tenants().await?)
    }
}
