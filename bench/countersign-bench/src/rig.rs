//! The engine a bench drives: the shipped expense tools and policy over a fresh embedded store,
//! or over the DynamoDB table, SQS queue and schedule group the environment names, every store
//! call and AWS request counted.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aws_smithy_types::retry::RetryConfig;
use shared::adapters::dynamodb::DynamoStore;
use shared::adapters::scheduler::{EventBridgeScheduler, ScheduleTarget};
use shared::adapters::sqlite::SqliteStore;
use shared::adapters::sqlite_vfs::WalWrites;
use shared::adapters::sqs::SqsQueue;
use shared::agents::{self, Wiring};
use shared::deploy::AwsSettings;
use shared::domain::identity::Identity;
use shared::domain::ids::{Role, TenantId};
use shared::domain::policy::Policy;
use shared::engine::records::IndexShards;
use shared::engine::{Delivery, Engine};
use shared::example::expense::{self, Claims};
use shared::ports::clock::Clock;
use shared::ports::scheduler::{Scheduler, SweepOnly};
use shared::ports::store::ItemStore;
use shared::testing::{ScriptedAgent, SkewedClock};

use crate::meter::{AwsMeter, Meter, MeteredStore};
use crate::script;
use crate::{BenchError, BenchStore};

/// Attempts per AWS request (the SDK's default is 3).
const MOTO_ATTEMPTS: u32 = 10;

pub struct Rig {
    pub engine: Arc<Engine>,
    /// The generated claims the engine's expense tools read.
    pub claims: Arc<Claims>,
    pub store: Arc<dyn ItemStore>,
    pub meter: Arc<Meter>,
    pub clock: Arc<SkewedClock>,
    pub tenant: TenantId,
    /// A finance approver of the tenant; never the employee who filed a claim.
    pub approver: Identity,
    /// On DynamoDB, decisions queue their resume messages here and the bench consumes them.
    pub queue: Option<Arc<SqsQueue>>,
    /// Whether decisions schedule and unschedule deadline wake-ups on EventBridge Scheduler.
    pub schedules: bool,
    /// How many partitions each index every tenant writes is split over
    /// (`COUNTERSIGN_INDEX_SHARDS`, as the functions read it).
    pub shards: IndexShards,
    /// The embedded store itself, to read how many commits its writer made.
    embedded: Option<SqliteStore>,
    scratch: Option<PathBuf>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(dir) = &self.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn approver(tenant: &TenantId) -> Identity {
    let role = |r: &str| Role::parse(r).expect("a well-formed role");
    Identity {
        tenant: tenant.clone(),
        person: shared::domain::ids::PersonId::parse("dana").expect("a well-formed person"),
        roles: BTreeSet::from([role("employee"), role("finance")]),
        claims: Default::default(),
    }
}

/// What a lifecycle bench changes in the engine, to measure what a feature costs.
#[derive(Debug, Clone, Copy)]
pub struct Variation {
    /// The expense policy with a history window on `reimburse` ([`WINDOW`]): what counting
    /// every reimbursement costs an approval.
    pub history_window: bool,
    /// Decisions, executions and rulings counted where the store keeps counts (the product's
    /// default): off, what the metrics' counts cost a lifecycle.
    pub keep_counts: bool,
}

impl Default for Variation {
    fn default() -> Self {
        Self {
            history_window: false,
            keep_counts: true,
        }
    }
}

impl Rig {
    /// A rig with `claims` generated claims.
    pub async fn new(kind: BenchStore, claims: usize) -> Result<Self, BenchError> {
        Self::varied(kind, claims, Variation::default()).await
    }

    /// [`Rig::new`], its engine changed as `variation` says.
    pub async fn varied(
        kind: BenchStore,
        claims: usize,
        variation: Variation,
    ) -> Result<Self, BenchError> {
        let meter = Meter::new();
        let clock = Arc::new(SkewedClock::default());
        let shards =
            shared::deploy::index_shards().map_err(|e| BenchError::Setup(e.to_string()))?;
        let backing = match kind {
            BenchStore::Embedded => {
                // A directory of this run's own, removed when the rig is dropped.
                let dir = shared::testing::scratch_dir("bench");
                let sqlite = SqliteStore::open_dir(&dir)
                    .map_err(|e| BenchError::Setup(format!("the embedded store: {e}")))?;
                Backing {
                    tenant: TenantId::parse("bench").expect("a well-formed tenant"),
                    store: Arc::new(sqlite.clone()),
                    delivery: Delivery::InProcess,
                    scheduler: Arc::new(SweepOnly),
                    queue: None,
                    schedules: false,
                    embedded: Some(sqlite),
                    scratch: Some(dir),
                }
            }
            BenchStore::Dynamodb => {
                let settings =
                    AwsSettings::from_env().map_err(|e| BenchError::Setup(e.to_string()))?;
                // moto is not safe under concurrency: it answers a transaction that races another
                // with a 500. Retrying more than the default keeps the bench going; the meter
                // counts those attempts as errors.
                let sdk = shared::deploy::sdk_config()
                    .await
                    .into_builder()
                    .retry_config(RetryConfig::standard().with_max_attempts(MOTO_ATTEMPTS))
                    .build();
                let interceptor = AwsMeter(meter.clone());
                let dynamodb = aws_sdk_dynamodb::Client::from_conf(
                    aws_sdk_dynamodb::config::Builder::from(&sdk)
                        .interceptor(interceptor.clone())
                        .build(),
                );
                let sqs = aws_sdk_sqs::Client::from_conf(
                    aws_sdk_sqs::config::Builder::from(&sdk)
                        .interceptor(interceptor.clone())
                        .build(),
                );
                let table =
                    DynamoStore::new(dynamodb, &settings.table).reporting_consumed_capacity();
                let queue = Arc::new(SqsQueue::new(sqs, &settings.queue_url));
                let scheduler: Arc<dyn Scheduler> = match &settings.schedule {
                    Some((group, role_arn, target_arn)) => Arc::new(EventBridgeScheduler::new(
                        aws_sdk_scheduler::Client::from_conf(
                            aws_sdk_scheduler::config::Builder::from(&sdk)
                                .interceptor(interceptor)
                                .build(),
                        ),
                        ScheduleTarget {
                            group: group.clone(),
                            role_arn: role_arn.clone(),
                            target_arn: target_arn.clone(),
                        },
                    )),
                    None => Arc::new(SweepOnly),
                };
                Backing {
                    // A tenant of this run's own: the table is shared with earlier runs.
                    tenant: TenantId::parse(&format!("bench-{:08x}", rand::random::<u32>()))
                        .expect("a well-formed tenant"),
                    store: Arc::new(table),
                    delivery: Delivery::Queue(queue.clone()),
                    scheduler,
                    queue: Some(queue),
                    schedules: settings.schedule.is_some(),
                    embedded: None,
                    scratch: None,
                }
            }
        };
        let store: Arc<dyn ItemStore> = Arc::new(MeteredStore::new(backing.store, meter.clone()));
        let claims = script::claims(&backing.tenant, claims);
        let engine = engine(
            store.clone(),
            claims.clone(),
            clock.clone(),
            backing.delivery,
            backing.scheduler,
            shards,
            variation,
        );
        Ok(Self {
            engine: Arc::new(engine),
            claims,
            store,
            meter,
            clock,
            approver: approver(&backing.tenant),
            tenant: backing.tenant,
            queue: backing.queue,
            schedules: backing.schedules,
            shards,
            embedded: backing.embedded,
            scratch: backing.scratch,
        })
    }
}

/// What a rig's store brings: the tenant, the store itself, how resumes and wake-ups travel.
struct Backing {
    tenant: TenantId,
    store: Arc<dyn ItemStore>,
    delivery: Delivery,
    scheduler: Arc<dyn Scheduler>,
    queue: Option<Arc<SqsQueue>>,
    schedules: bool,
    embedded: Option<SqliteStore>,
    scratch: Option<PathBuf>,
}

impl Rig {
    /// On the embedded store: the directory its file is in.
    pub fn store_dir(&self) -> Option<&Path> {
        self.embedded.as_ref().and(self.scratch.as_deref())
    }

    /// On the embedded store: what its commits, checkpoints and log writes came to so far.
    pub fn commits(&self) -> Option<CommitCounts> {
        self.embedded.as_ref().map(|s| {
            let c = s.commits();
            let (commits, transactions) = c.counts();
            CommitCounts {
                commits,
                transactions,
                in_place: c.in_place(),
                checkpoints: c.checkpoints(),
                checkpoints_in_place: c.checkpoints_in_place(),
                wal_writes: s.wal_writes().unwrap_or_default(),
            }
        })
    }
}

/// The embedded store's counts ([`shared::adapters::sqlite::Commits`]) at one moment.
#[derive(Debug, Clone, Copy)]
pub struct CommitCounts {
    /// SQL commits, one fsync each.
    pub commits: u64,
    /// The transactions they held.
    pub transactions: u64,
    /// Commits made on their caller's thread.
    pub in_place: u64,
    /// Checkpoints the checkpointer thread made beside the commits.
    pub checkpoints: u64,
    /// Checkpoints a commit made, finishing the checkpointer's.
    pub checkpoints_in_place: u64,
    /// The writes SQLite asked of the log, and the write calls they were folded into.
    pub wal_writes: WalWrites,
}

/// The window `--history-window` adds to the shipped expense policy: the reimbursements of each
/// requester's day, summed. No rule reads it; it is counted and read all the same.
pub const WINDOW: &str = r#"
[history.reimbursed_1d]
tool = "reimburse"
window = "1d"
per = "requester"
sum = "amount_cents"
"#;

fn engine(
    store: Arc<dyn ItemStore>,
    claims: Arc<Claims>,
    clock: Arc<SkewedClock>,
    delivery: Delivery,
    scheduler: Arc<dyn Scheduler>,
    shards: IndexShards,
    variation: Variation,
) -> Engine {
    let clock: Arc<dyn Clock> = clock;
    let wiring = Wiring::new(store.clone(), clock.clone(), claims);
    // The shipped expense definition, played by the bench's own scripted model.
    let mut agent = agents::shipped_one(expense::AGENT)
        .and_then(|definition| wiring.build(&definition))
        .expect("the shipped expense agent builds")
        .with_model(Arc::new(ScriptedAgent));
    // The bench runs it for a tenant of its own, not the shipped definition's acme.
    agent.tenants = None;
    if variation.history_window {
        let counted = format!("{}{WINDOW}", expense::POLICY_TOML);
        let policy = Policy::from_toml(&counted).expect("the expense policy with a window loads");
        agent.policy = Arc::new(policy);
    }
    Engine::builder(store)
        .agent(agent)
        .clock(clock)
        .delivery(delivery)
        .scheduler(scheduler)
        .index_shards(shards)
        .keep_counts(variation.keep_counts)
        .build()
}
