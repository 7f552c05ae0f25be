//! The engine a `countersign` process works with: the embedded SQLite store by default, or
//! AWS when `COUNTERSIGN_STORE=dynamodb`; the expense example; the model named by the environment.

use std::path::Path;
use std::sync::Arc;

use shared::adapters::anthropic::AnthropicModel;
use shared::adapters::sqlite::SqliteStore;
use shared::deploy::{Aws, Notifications, StoreKind};
use shared::domain::identity::{Directory, Identity};
use shared::domain::policy::Policy;
use shared::engine::records::{decode, keys};
use shared::engine::{Delivery, Engine, EngineError};
use shared::example::expense::{self, Claims, Ledger, OfflineExpenseAgent};
use shared::ports::clock::{Clock, SystemClock};
use shared::ports::model::Model;
use shared::ports::scheduler::{Scheduler, SweepOnly};
use shared::ports::store::{ItemStore, query_all};

use crate::cli::Global;
use crate::fail::Failure;

pub struct Local {
    pub engine: Engine,
    pub directory: Directory,
    pub claims: Arc<Claims>,
    pub ledger: Ledger,
    store: Arc<dyn ItemStore>,
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

/// The model: Claude when `ANTHROPIC_API_KEY` is set, otherwise the offline expense agent.
pub fn model_from_env() -> Arc<dyn Model> {
    match AnthropicModel::from_env() {
        Some(model) => Arc::new(model),
        None => Arc::new(OfflineExpenseAgent),
    }
}

/// Notices go to `COUNTERSIGN_WEBHOOKS`, as in the functions; without it none are written.
fn notifications_from_env() -> Result<Notifications, Failure> {
    Notifications::from_env().map_err(|e| Failure::usage(e.to_string()))
}

/// The data files a process loads: policy, people, claims (the shipped ones by default).
struct Data {
    policy: Arc<Policy>,
    directory: Directory,
    claims: Arc<Claims>,
}

impl Data {
    fn load(global: &Global) -> Result<Self, Failure> {
        let policy = match &global.policy {
            Some(path) => Arc::new(
                Policy::from_toml(&read(path, "policy")?)
                    .map_err(|e| Failure::usage(e.to_string()))?,
            ),
            None => expense::default_policy(),
        };
        let directory = match &global.people {
            Some(path) => Directory::from_toml(&read(path, "people")?)
                .map_err(|e| Failure::usage(e.to_string()))?,
            None => expense::default_directory(),
        };
        let claims = match &global.claims {
            Some(path) => Arc::new(
                Claims::from_toml(&read(path, "claims")?)
                    .map_err(|e| Failure::usage(e.to_string()))?,
            ),
            None => expense::default_claims(),
        };
        Ok(Self {
            policy,
            directory,
            claims,
        })
    }
}

impl Local {
    /// The embedded mode: the store is a SQLite file in the state directory, and a decision
    /// resumes its run in this process.
    pub fn open(global: &Global) -> Result<Self, Failure> {
        let store: Arc<dyn ItemStore> =
            Arc::new(SqliteStore::open_dir(&global.state).map_err(EngineError::from)?);
        Ok(Self::assemble(
            Data::load(global)?,
            store,
            Delivery::InProcess,
            Arc::new(SweepOnly),
            &notifications_from_env()?,
            None,
        ))
    }

    /// The store `COUNTERSIGN_STORE` names: embedded (the default), or DynamoDB with SQS and
    /// EventBridge Scheduler, where a decision queues its resume message for a worker.
    pub async fn connect(global: &Global) -> Result<Self, Failure> {
        match StoreKind::from_env().map_err(|e| Failure::usage(e.to_string()))? {
            StoreKind::Embedded => Self::open(global),
            StoreKind::DynamoDb => {
                let aws = Aws::from_env()
                    .await
                    .map_err(|e| Failure::usage(e.to_string()))?;
                let delivery = Delivery::Queue(aws.queue.clone());
                Ok(Self::assemble(
                    Data::load(global)?,
                    aws.store.clone(),
                    delivery,
                    aws.scheduler.clone(),
                    &notifications_from_env()?,
                    Some(aws),
                ))
            }
        }
    }

    fn assemble(
        data: Data,
        store: Arc<dyn ItemStore>,
        delivery: Delivery,
        scheduler: Arc<dyn Scheduler>,
        notifications: &Notifications,
        aws: Option<Aws>,
    ) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let tools = expense::toolbox(
            data.claims.clone(),
            data.policy.clone(),
            store.clone(),
            clock.clone(),
        );
        let engine = notifications
            .apply(Engine::builder(store.clone(), data.policy))
            .model(model_from_env())
            .tools(tools)
            .system_prompt(expense::SYSTEM_PROMPT)
            .clock(clock)
            .delivery(delivery)
            .scheduler(scheduler)
            .build();
        let ledger = Ledger::new(store.clone());
        Self {
            engine,
            directory: data.directory,
            claims: data.claims,
            ledger,
            store,
            aws,
        }
    }

    /// A person from the directory; anyone else is refused.
    pub fn identify(&self, name: &str) -> Result<Identity, Failure> {
        self.directory
            .identify(name)
            .map_err(|e| Failure::from(EngineError::from(e)))
    }

    /// Every tenant that has started a run, for views across the whole local deployment.
    pub async fn tenants(&self) -> Result<Vec<shared::domain::ids::TenantId>, Failure> {
        let items = query_all(self.store.as_ref(), keys::TENANTS_PK, "")
            .await
            .map_err(EngineError::from)?;
        Ok(items
            .iter()
            .map(|i| decode(i).map(|s| s.value))
            .collect::<Result<_, _>>()?)
    }
}
