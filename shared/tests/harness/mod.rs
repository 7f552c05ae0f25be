//! The scenario harness: a fresh store and clock per test, the expense example on top, and
//! "another process" as a new engine over a new connection to the same store.
//!
//! The store is pluggable: a [`Backend`] knows where one test's store lives and opens it again.
//! Only the embedded SQLite backend exists today; a DynamoDB backend (moto) plugs in the same way.

// Each test binary uses a different part of the harness.
#![allow(dead_code, unused_macros)]

use std::ops::Deref;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use shared::adapters::env_template::Lookup;
use shared::adapters::sqlite::SqliteStore;
use shared::agents::{self, Environment, Wiring};
use shared::domain::action::ToolOutcome;
use shared::domain::approval::{Approval, Choice, DecisionRequest};
use shared::domain::audit::{AuditEntry, AuditEvent};
use shared::domain::conversation::Speaker;
use shared::domain::conversation::{Block, ToolResultText};
use shared::domain::identity::{Actor, Directory, Identity};
use shared::domain::ids::{ActionVersion, ApprovalId, DecisionId, RunId, TenantId};
use shared::domain::money::Amount;
use shared::domain::policy::Policy;
use shared::domain::run::Run;
use shared::engine::records::{IndexShards, keys};
use shared::engine::{
    Agent, DecisionReport, Delivery, Engine, EngineBuilder, EngineError, RunReport,
};
use shared::example::expense::{
    self, Claims, Ledger, OfflineExpenseAgent, Settlement, default_claims, default_directory,
    default_policy, task_for,
};
use shared::ports::clock::ManualClock;
use shared::ports::model::{Model, ModelError, ModelReply, ModelRequest, ToolSpec};
use shared::ports::notifier::Notifier;
use shared::ports::queue::{DriveMessage, QueueError, ResumeMessage, ResumeQueue};
use shared::ports::store::{Item, ItemStore, Page, Query, StoreError, Write};
use shared::ports::tools::{Tool, ToolCall, Toolbox};
pub use shared::testing::Script;

/// Where one test's store lives. `connect` opens it again, as another process would: a new
/// connection to the same data, never a handle shared with the first.
#[async_trait]
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;

    async fn connect(&self) -> Arc<dyn ItemStore>;
}

/// The embedded store: one SQLite file in a directory of its own, removed after the test.
pub struct Embedded {
    dir: PathBuf,
}

impl Embedded {
    pub fn fresh() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "countersign-scenario-{}-{}-{:016x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            rand::random::<u64>()
        );
        Self {
            dir: std::env::temp_dir().join(name),
        }
    }

    /// Where its files are, for a test that reads what was written to disk.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Every byte of every file the store wrote.
    pub fn bytes(&self) -> Vec<u8> {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(&self.dir).unwrap() {
            all.extend(std::fs::read(entry.unwrap().path()).unwrap());
        }
        all
    }
}

#[async_trait]
impl Backend for Embedded {
    fn name(&self) -> &'static str {
        "embedded"
    }

    async fn connect(&self) -> Arc<dyn ItemStore> {
        Arc::new(SqliteStore::open_dir(&self.dir).expect("the embedded store opens"))
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Instantiates each scenario as a `#[tokio::test]` on one backend, in a module named after it.
/// `on_backend!(embedded, harness::Embedded::fresh(), [scenario_a, scenario_b]);`
macro_rules! on_backend {
    ($module:ident, $backend:expr, [$($scenario:ident),* $(,)?]) => {
        mod $module {
            use super::*;
            $(
                #[tokio::test]
                async fn $scenario() {
                    let harness = $crate::harness::Harness::new($backend).await;
                    super::$scenario(&harness).await;
                }
            )*
        }
    };
}

/// The moment every test's clock starts at.
pub fn start_of_test() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 10, 9, 0, 0).unwrap()
}

pub fn acme() -> TenantId {
    TenantId::parse("acme").unwrap()
}

/// One test: a store, a clock every process reads, and the expense example's data.
pub struct Harness {
    backend: Box<dyn Backend>,
    pub clock: Arc<ManualClock>,
    pub policy: Arc<Policy>,
    pub claims: Arc<Claims>,
    pub directory: Directory,
}

/// Who decides: a name in the shipped directory, or an identity as authentication gives it
/// (roles changed, another tenant).
pub trait Decider {
    fn identity(self, h: &Harness) -> Identity;
}

impl Decider for &str {
    fn identity(self, h: &Harness) -> Identity {
        h.person(self)
    }
}

impl Decider for &Identity {
    fn identity(self, _: &Harness) -> Identity {
        self.clone()
    }
}

/// One process: an engine over its own connection to the test's store.
pub struct Process {
    pub engine: Engine,
    pub store: Arc<dyn ItemStore>,
}

impl Process {
    /// The items of each shard of the sharded index `index`, whatever they are due.
    pub async fn index_shards(&self, index: &str, shards: IndexShards) -> Vec<Vec<Item>> {
        let mut all = Vec::new();
        for shard in keys::shard_pks(index, shards) {
            let page = self
                .store
                .query_index(&shard, "", "\u{10FFFF}", None, 1_000)
                .await
                .expect("the index reads");
            all.push(page.items);
        }
        all
    }
}

impl Deref for Process {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
}

impl Harness {
    pub async fn new(backend: impl Backend + 'static) -> Self {
        Self {
            backend: Box::new(backend),
            clock: Arc::new(ManualClock::new(start_of_test())),
            policy: default_policy(),
            claims: default_claims(),
            directory: default_directory(),
        }
    }

    pub fn backend(&self) -> &str {
        self.backend.name()
    }

    /// A new process running the shipped expense agent.
    pub async fn process(&self) -> Process {
        self.process_with(|tools| tools, Delivery::InProcess).await
    }

    /// A new process whose expense tools are adjusted (a tool wrapped or replaced), delivering
    /// resume messages as told.
    pub async fn process_with(
        &self,
        adjust: impl FnOnce(Toolbox) -> Toolbox,
        delivery: Delivery,
    ) -> Process {
        self.process_of(Arc::new(OfflineExpenseAgent), adjust, delivery)
            .await
    }

    /// A new process whose model follows a script instead of the expense agent.
    pub async fn scripted_process(&self, script: Script) -> Process {
        self.process_of(Arc::new(script), |tools| tools, Delivery::InProcess)
            .await
    }

    /// A new process of the expense agent whose notices go to `notifier`.
    pub async fn notifying(&self, notifier: Arc<dyn Notifier>) -> Process {
        self.process_configured(
            Arc::new(OfflineExpenseAgent),
            |store| store,
            |b| b.notifier(notifier),
        )
        .await
    }

    /// A new process whose store connection the test may wrap and whose engine it configures
    /// further (a notifier, a scheduler), with the model given and the shipped expense tools.
    pub async fn process_configured(
        &self,
        model: Arc<dyn Model>,
        wrap: impl FnOnce(Arc<dyn ItemStore>) -> Arc<dyn ItemStore>,
        configure: impl FnOnce(EngineBuilder) -> EngineBuilder,
    ) -> Process {
        let store = wrap(self.backend.connect().await);
        let agent = self.expense_agent(&store, model, |tools| tools);
        let builder = Engine::builder(store.clone())
            .agent(agent)
            .clock(self.clock.clone());
        Process {
            engine: configure(builder).build(),
            store,
        }
    }

    /// The shipped expense definition over `store`, played by `model`, its tools adjusted.
    pub fn expense_agent(
        &self,
        store: &Arc<dyn ItemStore>,
        model: Arc<dyn Model>,
        adjust: impl FnOnce(Toolbox) -> Toolbox,
    ) -> Agent {
        let wiring = Wiring::new(store.clone(), self.clock.clone(), self.claims.clone());
        let mut agent = agents::shipped_one(expense::AGENT)
            .and_then(|definition| wiring.build(&definition))
            .expect("the shipped expense agent builds")
            .with_model(model);
        agent.tools = adjust(std::mem::take(&mut agent.tools));
        agent
    }

    /// A new process whose expense agent names `owner` as the role that answers "did this
    /// take effect?" when a call's outcome is unknown and its tool cannot reconcile it.
    pub async fn process_recovering(
        &self,
        adjust: impl FnOnce(Toolbox) -> Toolbox,
        owner: &str,
    ) -> Process {
        let store = self.backend.connect().await;
        let mut agent = self.expense_agent(&store, Arc::new(OfflineExpenseAgent), adjust);
        agent.recovery_owner = Some(shared::domain::ids::Role::parse(owner).unwrap());
        let engine = Engine::builder(store.clone())
            .agent(agent)
            .clock(self.clock.clone())
            .build();
        Process { engine, store }
    }

    pub async fn process_of(
        &self,
        model: Arc<dyn Model>,
        adjust: impl FnOnce(Toolbox) -> Toolbox,
        delivery: Delivery,
    ) -> Process {
        let store = self.backend.connect().await;
        let agent = self.expense_agent(&store, model, adjust);
        let engine = Engine::builder(store.clone())
            .agent(agent)
            .clock(self.clock.clone())
            .delivery(delivery)
            .build();
        Process { engine, store }
    }

    /// A new process running agents of the test's own definitions, over its store and clock.
    pub async fn process_of_definitions(&self, definitions: &[agents::Definition]) -> Process {
        self.process_of_definitions_with(definitions, Delivery::InProcess)
            .await
    }

    /// [`Harness::process_of_definitions`], delivering resume messages as told.
    pub async fn process_of_definitions_with(
        &self,
        definitions: &[agents::Definition],
        delivery: Delivery,
    ) -> Process {
        let env = shared::adapters::env_template::process_env;
        self.process_of_definitions_in(definitions, delivery, &env, Environment::AtStart)
            .await
    }

    /// [`Harness::process_of_definitions_with`], the variables the bindings read taken from
    /// `env` and needed as `environment` says.
    pub async fn process_of_definitions_in(
        &self,
        definitions: &[agents::Definition],
        delivery: Delivery,
        env: Lookup<'_>,
        environment: Environment,
    ) -> Process {
        let store = self.backend.connect().await;
        // Its runs are driven here, as the embedded mode drives them: each agent gets its model.
        let wiring = Wiring {
            env,
            environment,
            drives: true,
            ..Wiring::new(store.clone(), self.clock.clone(), self.claims.clone())
        };
        let built = definitions
            .iter()
            .map(|d| wiring.build(d).expect("the definition builds"));
        let engine = Engine::builder(store.clone())
            .agents(built)
            .clock(self.clock.clone())
            .delivery(delivery)
            .build();
        Process { engine, store }
    }

    /// A person as authentication names them today, from the shipped directory.
    pub fn person(&self, name: &str) -> Identity {
        self.directory.identify(name).expect("a known person")
    }

    /// Starts the agent on one claim and returns where it stopped.
    pub async fn start(&self, engine: &Engine, claim: &str) -> RunReport {
        let task = task_for(&self.claims, claim).expect("a known claim");
        engine.start(task).await.expect("the run starts")
    }

    /// Starts the agent on a claim and expects it to pause on exactly one approval.
    pub async fn start_paused(&self, engine: &Engine, claim: &str) -> (RunReport, Approval) {
        let report = self.start(engine, claim).await;
        assert_eq!(
            report.approvals.len(),
            1,
            "{claim} should pause on one approval: {report:?}"
        );
        let approval = report.approvals[0].clone();
        (report, approval)
    }

    /// A new process, and a run it started on `claim` that paused on one approval.
    pub async fn paused_on(&self, claim: &str) -> (Process, RunReport, Approval) {
        let p = self.process().await;
        let (report, approval) = self.start_paused(&p, claim).await;
        (p, report, approval)
    }

    /// [`Harness::paused_on`] `claim`, then dana's edit `d-edit` of it to `dollars`, taken:
    /// the process, the run's report, the first approval and the edit.
    pub async fn edited_by_dana(
        &self,
        claim: &str,
        dollars: u32,
    ) -> (Process, RunReport, Approval, DecisionReport) {
        let (p, report, approval) = self.paused_on(claim).await;
        let edited = self
            .decided(&p, "dana", &approval.id, edit("d-edit", dollars))
            .await;
        (p, report, approval, edited)
    }

    /// The ledger, over a connection of its own.
    pub async fn ledger(&self) -> Ledger {
        Ledger::new(self.backend.connect().await)
    }

    /// The payments in the ledger, read through a connection of their own.
    pub async fn payments(&self) -> Vec<Settlement> {
        let ledger = self.ledger().await;
        ledger.payments(&acme()).await.expect("the ledger reads")
    }

    pub async fn run(&self, engine: &Engine, id: &RunId) -> Run {
        engine.run(&acme(), id).await.expect("the run exists")
    }

    /// A new process whose reimburse calls `calls` counts (shared, so several processes can
    /// count together).
    pub async fn counted_process(&self, calls: &Arc<AtomicUsize>) -> Process {
        self.reimbursing_through(Counted::new(calls)).await
    }

    /// A new process whose reimburse calls go through `around`.
    pub async fn reimbursing_through(&self, around: impl Around) -> Process {
        self.process_with(on_reimburse(around), Delivery::InProcess)
            .await
    }

    /// `who` decides on `approval` through `engine`, and the decision is taken.
    pub async fn decided(
        &self,
        engine: &Engine,
        who: impl Decider,
        approval: &ApprovalId,
        request: DecisionRequest,
    ) -> DecisionReport {
        let who = who.identity(self);
        engine
            .decide(&who, approval, request)
            .await
            .unwrap_or_else(|e| panic!("{}'s decision is taken: {}: {e}", who.person, e.code()))
    }

    /// `who` decides on `approval` through `engine`, and is refused: the refusal.
    pub async fn refused(
        &self,
        engine: &Engine,
        who: impl Decider,
        approval: &ApprovalId,
        request: DecisionRequest,
    ) -> EngineError {
        let who = who.identity(self);
        match engine.decide(&who, approval, request).await {
            Ok(report) => panic!("{}'s decision should be refused: {report:?}", who.person),
            Err(refused) => refused,
        }
    }
}

pub fn decision(id: &str, version: ActionVersion, choice: Choice) -> DecisionRequest {
    DecisionRequest {
        decision_id: DecisionId::parse(id).unwrap(),
        action_version: version,
        choice,
    }
}

pub fn approve(id: &str) -> DecisionRequest {
    decision(id, ActionVersion::FIRST, Choice::Approve)
}

pub fn reject(id: &str, reason: &str) -> DecisionRequest {
    decision(
        id,
        ActionVersion::FIRST,
        Choice::Reject {
            reason: reason.into(),
        },
    )
}

pub fn edit(id: &str, dollars: u32) -> DecisionRequest {
    decision(
        id,
        ActionVersion::FIRST,
        Choice::Edit {
            amount: Amount::from_dollars(dollars),
            note: None,
        },
    )
}

/// The resume message that wakes a run for one action version.
pub fn resume_message(approval: &Approval) -> ResumeMessage {
    ResumeMessage {
        tenant: approval.tenant.clone(),
        run_id: approval.run_id.clone(),
        action_id: approval.action_id.clone(),
        version: approval.action_version,
        resent: 0,
    }
}

/// Paid amounts, in cents, with the call that paid each.
pub fn paid(payments: &[Settlement]) -> Vec<(String, i64, String)> {
    payments
        .iter()
        .map(|s| match &s.outcome {
            shared::example::expense::SettlementOutcome::Paid { amount } => (
                s.claim_id.clone(),
                amount.cents(),
                s.idempotency_key.clone(),
            ),
            other => panic!("not a payment: {other:?}"),
        })
        .collect()
}

/// What the model was told about its last call of `tool`.
pub fn told_about(run: &Run, tool: &str) -> ToolResultText {
    let ids: Vec<&str> = run
        .messages
        .iter()
        .flat_map(|m| m.tool_uses())
        .filter(|u| u.name == tool)
        .map(|u| u.id)
        .collect();
    let id = ids
        .last()
        .unwrap_or_else(|| panic!("the model never called {tool}"));
    run.messages
        .iter()
        .flat_map(|m| &m.content)
        .find_map(|b| match b {
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } if tool_use_id == id => Some(ToolResultText {
                content: content.clone(),
                is_error: *is_error,
                mcp: None,
            }),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the model was never told about its {tool} call"))
}

/// Each action's status, in the order they were proposed.
pub fn statuses(history: &shared::engine::History) -> Vec<shared::domain::action::ActionStatus> {
    history.actions.iter().map(|a| a.status).collect()
}

pub fn event_names(entries: &[AuditEntry]) -> Vec<&'static str> {
    entries.iter().map(|e| e.event.name()).collect()
}

/// The first audit entry of `event`'s kind records `event`, by `actor`.
#[track_caller]
pub fn assert_recorded(entries: &[AuditEntry], event: AuditEvent, actor: Actor) {
    let name = event.name();
    let entry = entries
        .iter()
        .find(|e| e.event.name() == name)
        .unwrap_or_else(|| panic!("no {name} entry in {:?}", event_names(entries)));
    assert_eq!(entry.event, event);
    assert_eq!(entry.actor, actor);
}

/// A stand-in's part around the tool it wraps, in [`wrap`]: how it calls, and whether and how
/// it reconciles; what it leaves out is the [`Tool`] default (it cannot reconcile).
#[async_trait]
pub trait Around: Send + Sync + 'static {
    async fn call(&self, inner: &dyn Tool, call: ToolCall<'_>) -> ToolOutcome;

    fn reconciles(&self, _inner: &dyn Tool) -> bool {
        false
    }

    async fn reconcile(&self, _inner: &dyn Tool, _call: ToolCall<'_>) -> Option<ToolOutcome> {
        None
    }
}

/// `tools` with its tool `name` wrapped in `around`: the same spec, `around`'s calls.
pub fn wrap(tools: Toolbox, name: &str, around: impl Around) -> Toolbox {
    let inner = tools.get(name).expect("the tool exists").clone();
    tools.with(Arc::new(Wrapped { inner, around }))
}

/// What wraps reimburse in `around`, for [`Harness::process_with`].
pub fn on_reimburse(around: impl Around) -> impl FnOnce(Toolbox) -> Toolbox {
    move |tools| wrap(tools, "reimburse", around)
}

struct Wrapped<A> {
    inner: Arc<dyn Tool>,
    around: A,
}

#[async_trait]
impl<A: Around> Tool for Wrapped<A> {
    fn spec(&self) -> ToolSpec {
        self.inner.spec()
    }

    async fn call(&self, call: ToolCall<'_>) -> ToolOutcome {
        self.around.call(&*self.inner, call).await
    }

    fn reconciles(&self) -> bool {
        self.around.reconciles(&*self.inner)
    }

    fn reads_only(&self) -> bool {
        self.inner.reads_only()
    }

    async fn reconcile(&self, call: ToolCall<'_>) -> Option<ToolOutcome> {
        self.around.reconcile(&*self.inner, call).await
    }
}

/// Counts the calls and otherwise is the tool it wraps. The counter may be shared, so several
/// processes can count together.
pub struct Counted {
    pub calls: Arc<AtomicUsize>,
}

impl Counted {
    pub fn new(calls: &Arc<AtomicUsize>) -> Self {
        Self {
            calls: calls.clone(),
        }
    }
}

#[async_trait]
impl Around for Counted {
    async fn call(&self, inner: &dyn Tool, call: ToolCall<'_>) -> ToolOutcome {
        self.calls.fetch_add(1, Ordering::SeqCst);
        inner.call(call).await
    }

    fn reconciles(&self, inner: &dyn Tool) -> bool {
        inner.reconciles()
    }

    async fn reconcile(&self, inner: &dyn Tool, call: ToolCall<'_>) -> Option<ToolOutcome> {
        inner.reconcile(call).await
    }
}

/// A counted call that takes effect but whose answer is lost: it always reports `Unknown`, and
/// cannot tell afterwards either.
pub struct AnswerLost(pub Counted);

#[async_trait]
impl Around for AnswerLost {
    async fn call(&self, inner: &dyn Tool, call: ToolCall<'_>) -> ToolOutcome {
        let _ = self.0.call(inner, call).await;
        ToolOutcome::Unknown {
            detail: "the connection dropped after the request was sent".into(),
        }
    }
}

/// A resume queue that only records what was published, for a test to deliver by hand.
#[derive(Default)]
pub struct RecordingQueue {
    published: Mutex<Vec<ResumeMessage>>,
    drives: Mutex<Vec<DriveMessage>>,
}

/// A resume queue that is down.
pub struct QueueDown;

#[async_trait]
impl ResumeQueue for QueueDown {
    async fn publish(&self, _: &ResumeMessage) -> Result<(), QueueError> {
        Err(QueueError("the queue is down".into()))
    }

    async fn publish_drive(&self, _: &DriveMessage) -> Result<(), QueueError> {
        Err(QueueError("the queue is down".into()))
    }
}

impl RecordingQueue {
    pub fn published(&self) -> Vec<ResumeMessage> {
        self.published.lock().unwrap().clone()
    }

    pub fn drives(&self) -> Vec<DriveMessage> {
        self.drives.lock().unwrap().clone()
    }
}

#[async_trait]
impl ResumeQueue for RecordingQueue {
    async fn publish(&self, message: &ResumeMessage) -> Result<(), QueueError> {
        self.published.lock().unwrap().push(message.clone());
        Ok(())
    }

    async fn publish_drive(&self, message: &DriveMessage) -> Result<(), QueueError> {
        self.drives.lock().unwrap().push(message.clone());
        Ok(())
    }
}

/// A model that plays a script for its first turns and then never answers, as a process that
/// stops (hangs or dies) while it drives the run.
pub struct Stalls {
    script: Script,
    after_turns: usize,
    stalled: AtomicUsize,
}

impl Stalls {
    /// Never answers, from the first turn on.
    pub fn at_once() -> Arc<Self> {
        Self::after(Script::default(), 0)
    }

    /// Plays `turns` turns of the script, then never answers.
    pub fn after(script: Script, turns: usize) -> Arc<Self> {
        Arc::new(Self {
            script,
            after_turns: turns,
            stalled: AtomicUsize::new(0),
        })
    }

    /// Returns once a request has stalled `n` times in all.
    pub async fn until_stalled(&self, n: usize) {
        while self.stalled.load(Ordering::SeqCst) < n {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

#[async_trait]
impl Model for Stalls {
    fn name(&self) -> &str {
        "stalls"
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelReply, ModelError> {
        let turn = request.turn();
        if turn < self.after_turns {
            return self.script.respond(request).await;
        }
        self.stalled.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

/// A store connection that refuses, once, a transaction that writes an action version whose
/// stored body `picks` picks out, as DynamoDB refuses a write past the table's rate; every
/// other write and read goes through.
pub struct RefusesWrites {
    inner: Arc<dyn ItemStore>,
    picks: fn(&str) -> bool,
    refused: std::sync::atomic::AtomicBool,
}

impl RefusesWrites {
    pub fn an_action_once(
        inner: Arc<dyn ItemStore>,
        picks: fn(&str) -> bool,
    ) -> Arc<dyn ItemStore> {
        Arc::new(Self {
            inner,
            picks,
            refused: Default::default(),
        })
    }

    fn refuses(&self, write: &Write) -> bool {
        match write {
            Write::Put { item, .. } => {
                item.sk.starts_with(keys::ACTION_PREFIX) && (self.picks)(&item.body)
            }
            _ => false,
        }
    }
}

#[async_trait]
impl ItemStore for RefusesWrites {
    async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, StoreError> {
        self.inner.get(pk, sk).await
    }

    async fn page(&self, query: Query<'_>) -> Result<Page, StoreError> {
        self.inner.page(query).await
    }

    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        if writes.iter().any(|w| self.refuses(w)) && !self.refused.swap(true, Ordering::SeqCst) {
            return Err(StoreError::Throttled(
                "ProvisionedThroughputExceededException: the write rate is over the table's".into(),
            ));
        }
        self.inner.transact(writes).await
    }
}

/// A call that never returns, as a process that dies while the call is in flight: before the
/// call took effect, or after it did and before its answer was recorded. Its calls are counted
/// once they hang.
pub struct Hangs {
    pub calls: Arc<AtomicUsize>,
    pub takes_effect: bool,
}

impl Hangs {
    pub fn before_effect(calls: Arc<AtomicUsize>) -> Self {
        Self {
            calls,
            takes_effect: false,
        }
    }

    pub fn after_effect(calls: Arc<AtomicUsize>) -> Self {
        Self {
            calls,
            takes_effect: true,
        }
    }
}

#[async_trait]
impl Around for Hangs {
    async fn call(&self, inner: &dyn Tool, call: ToolCall<'_>) -> ToolOutcome {
        if self.takes_effect {
            let _ = inner.call(call).await;
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

/// A tool that cannot tell what became of a call, and says so only once every reconciliation
/// sharing its barrier is asking: sweeps that all read the action before any of them writes.
pub struct ReconcilesTogether {
    pub together: Arc<tokio::sync::Barrier>,
}

#[async_trait]
impl Around for ReconcilesTogether {
    async fn call(&self, inner: &dyn Tool, call: ToolCall<'_>) -> ToolOutcome {
        inner.call(call).await
    }

    async fn reconcile(&self, _: &dyn Tool, _: ToolCall<'_>) -> Option<ToolOutcome> {
        self.together.wait().await;
        None
    }
}

/// Where a slow call waits until the test lets it through, and what each call answered then.
pub struct Gate {
    arrived: AtomicUsize,
    open: tokio::sync::Semaphore,
    outcomes: Mutex<Vec<ToolOutcome>>,
}

impl Gate {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            arrived: AtomicUsize::new(0),
            open: tokio::sync::Semaphore::new(0),
            outcomes: Mutex::new(Vec::new()),
        })
    }

    /// Returns once a call is waiting at the gate.
    pub async fn call_in_flight(&self) {
        while self.arrived.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Lets every call through, now and later.
    pub fn open(&self) {
        self.open.add_permits(1_000);
    }

    /// What the calls that went through answered, in order.
    pub fn outcomes(&self) -> Vec<ToolOutcome> {
        self.outcomes.lock().unwrap().clone()
    }
}

/// A call that waits at a gate before it reaches the tool it wraps: a call that is slow, not
/// dead, and lands whenever the test opens the gate.
pub struct Slow {
    pub gate: Arc<Gate>,
}

#[async_trait]
impl Around for Slow {
    async fn call(&self, inner: &dyn Tool, call: ToolCall<'_>) -> ToolOutcome {
        self.gate.arrived.fetch_add(1, Ordering::SeqCst);
        let _pass = self.gate.open.acquire().await.expect("the gate stays");
        let outcome = inner.call(call).await;
        self.gate.outcomes.lock().unwrap().push(outcome.clone());
        outcome
    }

    fn reconciles(&self, inner: &dyn Tool) -> bool {
        inner.reconciles()
    }

    async fn reconcile(&self, inner: &dyn Tool, call: ToolCall<'_>) -> Option<ToolOutcome> {
        inner.reconcile(call).await
    }
}

/// The tool results of the one user message that answers the assistant's `turn`th message.
pub fn results_after_turn(run: &Run, turn: usize) -> Vec<(String, ToolResultText)> {
    let at = run
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Speaker::Assistant)
        .nth(turn)
        .map(|(i, _)| i)
        .expect("the model had that turn");
    let answer = run.messages.get(at + 1).expect("the turn was answered");
    assert_eq!(answer.role, Speaker::User);
    answer
        .content
        .iter()
        .map(|b| match b {
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => (
                tool_use_id.clone(),
                ToolResultText {
                    content: content.clone(),
                    is_error: *is_error,
                    mcp: None,
                },
            ),
            other => panic!("only tool results answer a turn: {other:?}"),
        })
        .collect()
}

/// A run of the scripted model on behalf of `requester` of acme.
pub fn scripted_task(requester: &str) -> shared::engine::StartRun {
    shared::engine::StartRun {
        tenant: acme(),
        agent: shared::domain::ids::AgentName::parse(expense::AGENT).unwrap(),
        requested_by: shared::domain::ids::PersonId::parse(requester).unwrap(),
        started_by: None,
        task: "Settle the claims of the script.".into(),
        approval_ttl: None,
        standing: Default::default(),
    }
}

/// A policy named `name` that lets each of `tools` run, and rules on nothing else.
pub fn allowing(name: &str, tools: &[&str]) -> String {
    let mut text = format!("name = \"{name}\"\nversion = 1\ndefault_ttl = \"1h\"\n");
    for tool in tools {
        text.push_str(&format!("\n[tools.{tool}]\ndecision = \"allow\"\n"));
    }
    text
}
