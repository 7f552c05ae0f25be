//! The use cases: start a run, decide, resume, cancel, sweep, read the history. Each writes
//! its transitions through the conditional item store, and nothing else.

mod agents;
mod cancel;
mod claim;
mod comment;
mod decide;
mod drive;
pub mod error;
mod figures;
mod gate;
mod history;
mod notify;
pub mod records;
mod replay;
mod resume;
mod snapshot;
mod sweep;
mod tally;
mod waiters;

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

pub use agents::{Agent, Agents, BuildAgent, Limits, Unfit};
pub use claim::Reported;
pub use decide::DecisionReport;
pub use drive::StartRun;
pub use error::{EngineError, ErrorKind};
pub use figures::{AgentFigures, DecisionTimes, Figures, Ruled};
pub use gate::{ATTACHABLE, CallState, CallStatus, Executor, GateCall, REREAD};
pub use history::{
    History, MAX_PENDING_PAGE, MAX_RESOLVED, PENDING_PAGE, PendingCursor, PendingPage, Resolved,
    RunState, WaitingOn,
};
pub use notify::{DEFAULT_REMIND_BEFORE, MAX_NOTICE_ATTEMPTS, NoticeReport};
pub use replay::{Changed, Compared, Outcomes, Replay};
pub use resume::ResumeReport;
pub use snapshot::{Shown, Snapshot};
pub use sweep::SweepReport;
pub use waiters::GLANCE;

use crate::domain::action::{Action, ActionStatus};
use crate::domain::approval::Approval;
use crate::domain::ids::{ActionId, ActionVersion, AgentName, ApprovalId, RunId, TenantId};
use crate::domain::policy::MAX_TTL;
use crate::domain::policy::Policy;
use crate::domain::run::{Run, RunStatus};
use crate::ports::clock::{Clock, SystemClock};
use crate::ports::counters::{Count, Counters, Series};
use crate::ports::notifier::Notifier;
use crate::ports::queue::ResumeQueue;
use crate::ports::scheduler::{Scheduler, SweepOnly};
use crate::ports::store::{ItemStore, Refused, StoreError, Write, query_all};
use records::{
    CountRefused, Opening, OutboxEntry, Outgoing, OverCap, Stored, Tx, count_writes, decode,
    decode_approval, keys, load, resume_message,
};

/// How a settled action's resume message reaches the run.
#[derive(Clone)]
pub enum Delivery {
    /// The writer resumes the run itself, right after its transaction (the embedded mode).
    InProcess,
    /// The writer publishes to a queue and a consumer resumes the run (SQS in AWS).
    Queue(Arc<dyn ResumeQueue>),
}

/// What a decision left to deliver once its caller has answered: in the embedded mode, the
/// resume of the run it settled and the notices that go with it (with a queue, a decision
/// publishes at once and leaves nothing). [`Engine::deliver_deferred`] delivers it; if it never
/// is (the process stopped first), the settled action waits in the outbox index and the sweep
/// resumes the run.
#[derive(Debug, Default)]
#[must_use = "deliver it with Engine::deliver_deferred, or the run waits for the sweep"]
pub struct Deferred {
    resumes: Vec<Stored<Action>>,
    notices: Vec<Stored<OutboxEntry>>,
}

impl Deferred {
    pub fn is_empty(&self) -> bool {
        self.resumes.is_empty() && self.notices.is_empty()
    }

    /// What a committed transaction handed over, kept for later.
    fn keep(&mut self, outgoing: Outgoing) {
        self.notices.extend(just_written(outgoing.notices));
        self.resumes.extend(outgoing.resumes);
    }

    /// Resume messages read back as still due (a replayed decision's), kept for later.
    fn keep_stored(&mut self, resumes: Vec<Stored<Action>>) {
        self.resumes.extend(resumes);
    }
}

/// Outbox entries a transaction of this process just wrote, at their first item version.
fn just_written(notices: Vec<OutboxEntry>) -> impl Iterator<Item = Stored<OutboxEntry>> {
    notices.into_iter().map(|value| Stored { value, ver: 1 })
}

pub struct Engine {
    store: Arc<dyn ItemStore>,
    agents: Agents,
    clock: Arc<dyn Clock>,
    delivery: Delivery,
    scheduler: Arc<dyn Scheduler>,
    /// Where notices go; without one, none are written.
    notifier: Option<Arc<dyn Notifier>>,
    /// How long before an approval's deadline its reminder goes out.
    remind_before: chrono::Duration,
    /// How many partitions each index every tenant writes is split over.
    index_shards: records::IndexShards,
    /// Sweeps so far: each starts reading the shards one further on, so a shard with more due
    /// than one sweep's budget does not keep the ones after it waiting.
    sweeps: std::sync::atomic::AtomicU32,
    /// Tenants this engine has written to the tenant registry. The registry is one partition
    /// every tenant writes, so a run start writes it only the first time this process starts a
    /// run of the tenant (an entry is never removed), not on every start.
    registered: std::sync::Mutex<std::collections::HashSet<TenantId>>,
    /// Callers of this process waiting on a gated call, woken by the commits that move it.
    waiters: waiters::Waiters,
    /// The most approvals one requester may have waiting on people at once.
    max_open_approvals: u32,
    /// Whether decisions, executions and rulings are counted where the store keeps counts.
    keep_counts: bool,
}

/// Builds an engine from the ports a process has; each entry point supplies only what it uses.
pub struct EngineBuilder {
    engine: Engine,
}

impl EngineBuilder {
    /// An agent this engine runs; a run names its agent, and only an engine that has it can
    /// start, resume or reconcile the run's calls, or rule on an edit of them.
    pub fn agent(mut self, agent: Agent) -> Self {
        self.engine.agents.insert(agent);
        self
    }

    pub fn agents(mut self, agents: impl IntoIterator<Item = Agent>) -> Self {
        for agent in agents {
            self.engine.agents.insert(agent);
        }
        self
    }

    /// An agent this engine runs, serving `tenants`, that `build` makes when a call first names
    /// it: for a process that may never need it. Until then only its name and tenants are known.
    pub fn agent_when_needed(
        mut self,
        name: AgentName,
        tenants: Option<BTreeSet<TenantId>>,
        build: BuildAgent,
    ) -> Self {
        self.engine.agents.insert_lazy(name, tenants, build);
        self
    }

    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.engine.clock = clock;
        self
    }

    pub fn delivery(mut self, delivery: Delivery) -> Self {
        self.engine.delivery = delivery;
        self
    }

    pub fn scheduler(mut self, scheduler: Arc<dyn Scheduler>) -> Self {
        self.engine.scheduler = scheduler;
        self
    }

    /// Notices of approvals that open, and reminders before their deadlines, go here.
    pub fn notifier(mut self, notifier: Arc<dyn Notifier>) -> Self {
        self.engine.notifier = Some(notifier);
        self
    }

    /// How long before an approval's deadline its reminder goes out (one hour by default).
    pub fn remind_before(mut self, lead: std::time::Duration) -> Self {
        self.engine.remind_before =
            chrono::Duration::from_std(lead).unwrap_or(chrono::Duration::MAX);
        self
    }

    /// The most approvals one requester may have waiting on people at once
    /// ([`DEFAULT_MAX_OPEN_APPROVALS`] by default); a call past it is not proposed.
    pub fn max_open_approvals(mut self, cap: u32) -> Self {
        self.engine.max_open_approvals = cap;
        self
    }

    /// How many partitions each index every tenant writes is split over (16 by default).
    pub fn index_shards(mut self, shards: records::IndexShards) -> Self {
        self.engine.index_shards = shards;
        self
    }

    /// Whether decisions, executions, policy rulings, model requests and failed resumes are
    /// counted, where the store keeps counts (on by default): off only to measure what
    /// counting costs.
    pub fn keep_counts(mut self, keep: bool) -> Self {
        self.engine.keep_counts = keep;
        self
    }

    pub fn build(self) -> Engine {
        self.engine
    }
}

impl Engine {
    pub fn builder(store: Arc<dyn ItemStore>) -> EngineBuilder {
        EngineBuilder {
            engine: Engine {
                store,
                agents: Agents::default(),
                clock: Arc::new(SystemClock),
                delivery: Delivery::InProcess,
                scheduler: Arc::new(SweepOnly),
                notifier: None,
                remind_before: notify::default_lead(),
                index_shards: records::IndexShards::DEFAULT,
                sweeps: Default::default(),
                registered: Default::default(),
                waiters: Default::default(),
                max_open_approvals: DEFAULT_MAX_OPEN_APPROVALS,
                keep_counts: true,
            },
        }
    }

    fn is_registered(&self, tenant: &TenantId) -> bool {
        self.registered
            .lock()
            .map(|set| set.contains(tenant))
            .unwrap_or(false)
    }

    /// The tenant is in the registry: its registration committed.
    fn registered(&self, tenant: &TenantId) {
        if let Ok(mut set) = self.registered.lock() {
            // Bounded memory in a long-lived process: forgetting only costs a rewrite.
            if set.len() >= 100_000 {
                set.clear();
            }
            set.insert(tenant.clone());
        }
    }

    /// The agent of this name for `tenant`, or `not_found`: one it does not serve does not
    /// exist for that tenant ([`Agents::get`]).
    pub fn agent(&self, tenant: &TenantId, name: &AgentName) -> Result<&Arc<Agent>, EngineError> {
        self.agents.get(tenant, name)
    }

    /// The agent of a run, for the run's tenant.
    pub(crate) fn agent_of(&self, run: &Run) -> Result<&Arc<Agent>, EngineError> {
        self.agent(&run.tenant, &run.agent)
    }

    pub fn agents(&self) -> &Agents {
        &self.agents
    }

    /// The policy of an agent for `tenant`, as a reviewer's view needs it.
    pub fn policy_of(&self, tenant: &TenantId, agent: &AgentName) -> Result<&Policy, EngineError> {
        Ok(&self.agent(tenant, agent)?.policy)
    }

    /// `not_found` for a record of `agent` that `tenant` may no longer read: its definition,
    /// changed since, names other tenants ([`Agents::admits`]).
    pub(super) fn readable(
        &self,
        tenant: &TenantId,
        agent: &AgentName,
        what: impl std::fmt::Display,
    ) -> Result<(), EngineError> {
        match self.agents.admits(tenant, agent) {
            true => Ok(()),
            false => Err(EngineError::not_found(what)),
        }
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Applies one transaction; on success what it hands over for delivery is returned.
    async fn commit(&self, tx: Tx) -> Result<Outgoing, StoreError> {
        if !tx.opens_approvals() {
            // Most transactions: no count to read, one request.
            let (writes, counted, outgoing) = tx.into_parts();
            let touched = self.waiters.touched(&writes);
            self.send(writes, &counted)
                .await
                .map_err(|refused| refused.error)?;
            waiters::wake(touched);
            return Ok(outgoing);
        }
        self.commit_capped(tx, None)
            .await
            .map_err(|refused| match refused {
                Uncommitted::Refused(refused) => refused.error,
                Uncommitted::OverCap(_) => unreachable!("no cap, so nothing goes past it"),
                Uncommitted::HistoryMoved { failed } => StoreError::ConditionFailed { failed },
            })
    }

    /// [`Engine::commit`], with the counts of open approvals of the requesters whose approvals
    /// the transaction opens; where `cap` is given, an opening it would take past the cap
    /// writes nothing.
    async fn commit_capped(&self, tx: Tx, cap: Option<u32>) -> Result<Outgoing, Uncommitted> {
        let openings = tx.openings();
        let (writes, counted, outgoing) = tx.into_parts();
        let touched = self.waiters.touched(&writes);
        self.transact_counted(writes, &counted, &openings, cap)
            .await?;
        waiters::wake(touched);
        Ok(outgoing)
    }

    /// Applies `writes` with the count items of `openings`, counted now and compare-and-set on
    /// what was read. A refusal that is only a count's lost compare-and-set (another opening of
    /// the requester committed first) counts again and tries again: the transaction's own
    /// conditions held. A refusal says what each failed write found.
    async fn transact_counted(
        &self,
        writes: Vec<Write>,
        counted: &[Count],
        openings: &[Opening],
        cap: Option<u32>,
    ) -> Result<(), Uncommitted> {
        // The history slots this transaction takes for new calls, by index. A refusal whose
        // failed writes are only those (and counts) means another call was counted there since
        // this one's read.
        let claims: Vec<usize> = (0..writes.len())
            .filter(|&i| records::claimed_partition(&writes[i]).is_some())
            .collect();
        let own = writes.len();
        let history_moved = |refused: Refused| match refused.error {
            StoreError::ConditionFailed { failed }
                if failed.iter().any(|i| claims.contains(i))
                    && failed.iter().all(|i| claims.contains(i) || *i >= own) =>
            {
                Uncommitted::HistoryMoved { failed }
            }
            _ => Uncommitted::Refused(refused),
        };
        if openings.is_empty() {
            return self.send(writes, counted).await.map_err(history_moved);
        }
        for attempt in 0..WINDOW_ATTEMPTS {
            back_off(attempt).await;
            let counts = match count_writes(self.store.as_ref(), openings, cap).await {
                Ok(counts) => counts,
                Err(CountRefused::OverCap(over)) => return Err(Uncommitted::OverCap(over)),
                Err(CountRefused::Store(error)) => {
                    return Err(Uncommitted::Refused(Refused {
                        error,
                        found: Vec::new(),
                    }));
                }
            };
            let mut all = writes.clone();
            all.extend(counts);
            match self.send(all, counted).await {
                Err(refused)
                    if matches!(&refused.error, StoreError::ConditionFailed { failed }
                        if failed.iter().all(|&i| i >= own)) => {}
                sent => return sent.map_err(history_moved),
            }
        }
        Err(Uncommitted::Refused(Refused {
            error: StoreError::Contended,
            found: Vec::new(),
        }))
    }

    /// [`Engine::commit`], and when it is refused, what the write to the item `watched` found
    /// if its condition failed: `Some(None)` when the item was gone, `None` when the store did
    /// not say or another write's condition failed.
    async fn commit_watching(
        &self,
        tx: Tx,
        watched: (&str, &str),
    ) -> Result<Outgoing, (StoreError, Option<Option<crate::ports::store::Item>>)> {
        let openings = tx.openings();
        let (writes, counted, outgoing) = tx.into_parts();
        let index = writes.iter().position(|w| w.key() == watched);
        let touched = self.waiters.touched(&writes);
        let sent = self
            .transact_counted(writes, &counted, &openings, None)
            .await;
        match sent {
            Ok(()) => {
                waiters::wake(touched);
                Ok(outgoing)
            }
            Err(Uncommitted::Refused(refused)) => {
                let found = index.and_then(|i| refused.found(i).cloned());
                Err((refused.error, found))
            }
            Err(Uncommitted::OverCap(_)) => unreachable!("no cap, so nothing goes past it"),
            Err(Uncommitted::HistoryMoved { failed }) => {
                Err((StoreError::ConditionFailed { failed }, None))
            }
        }
    }

    /// Sends `writes`, and where the store keeps counts, `counted` in the same transaction.
    async fn send(&self, writes: Vec<Write>, counted: &[Count]) -> Result<(), Refused> {
        match self.counters() {
            Some(counters) if !counted.is_empty() => {
                counters.transact_counting(writes, counted).await
            }
            _ => self.store.transact_or_found(writes).await,
        }
    }

    /// Counts one of `run`'s things that no transaction records, where the store keeps counts.
    /// A count the store cannot keep now is logged: it never fails what it counted.
    async fn count_alone(&self, tenant: &TenantId, agent: &AgentName, series: Series) {
        let Some(counters) = self.counters() else {
            return;
        };
        let count = Count::one(tenant, agent, series);
        if let Err(error) = counters.count(&[count]).await {
            tracing::warn!(%error, ?series, "a count was not kept");
        }
    }

    /// Counts a queued resume or drive message of `run` whose handling failed and that will be
    /// delivered again, under the run's agent: one per failed delivery. A run that cannot be
    /// read now (the store may be what failed) leaves it uncounted, with a warning.
    pub async fn count_resume_failure(&self, tenant: &TenantId, run: &RunId) {
        if self.counters().is_none() {
            return;
        }
        match self.agent_of_run(tenant, run).await {
            Ok(Some(agent)) => {
                self.count_alone(tenant, &agent, Series::ResumeFailures)
                    .await
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, run = %run, "a failed resume was not counted: its run could not be read")
            }
        }
    }

    /// Where this engine's counts are kept: in its store's transactions, where it keeps them
    /// and counting is on.
    fn counters(&self) -> Option<&dyn Counters> {
        self.keep_counts.then(|| self.store.counters()).flatten()
    }

    /// Delivers what a transaction handed over, right after it committed. A resume message's
    /// action stays in the outbox index until its consumer acts on it (the claim, or the
    /// result held, takes it out), so the decision's own transaction is its only write; one
    /// nobody acted on is the sweep's to hand over again after a grace period, and again after
    /// each lease until something acts on it. Delivery is idempotent.
    async fn deliver(&self, outgoing: Outgoing) -> NoticeReport {
        let notices = just_written(outgoing.notices).collect();
        self.deliver_stored(outgoing.resumes, notices).await
    }

    /// Delivers what is due, read back or just written (the sweep's stragglers in the embedded
    /// mode, a replayed decision's): resume messages one by one (a run resumed in this process
    /// may write more), then the notices, posted together.
    async fn deliver_stored(
        &self,
        resumes: Vec<Stored<Action>>,
        notices: Vec<Stored<OutboxEntry>>,
    ) -> NoticeReport {
        self.deliver_reporting(resumes, notices).await.0
    }

    /// [`Engine::deliver_stored`], and why each resume message that was not delivered was not
    /// (its action stays in the outbox index for the sweep).
    async fn deliver_reporting(
        &self,
        resumes: Vec<Stored<Action>>,
        mut notices: Vec<Stored<OutboxEntry>>,
    ) -> (NoticeReport, Vec<String>) {
        let mut undelivered = Vec::new();
        let mut pending: VecDeque<Stored<Action>> = resumes.into();
        while let Some(action) = pending.pop_front() {
            let message = resume_message(&action.value);
            // Whether the action is still in the outbox index, to take out now.
            let delivered = match &self.delivery {
                // The resume took it out with the write that acted on the message, unless it
                // had nothing to do.
                // On the heap: a resumed run drives the model and runs tools, far deeper than the
                // decision that delivers it, and a debug build's futures are large.
                Delivery::InProcess => match Box::pin(self.resume_once(&message)).await {
                    Ok((report, more)) => {
                        pending.extend(more.resumes);
                        notices.extend(just_written(more.notices));
                        Ok(matches!(report, ResumeReport::Ignored { .. }))
                    }
                    Err(e) => {
                        self.count_resume_failure(&message.tenant, &message.run_id)
                            .await;
                        Err(e.to_string())
                    }
                },
                // Left to the consumer: until it acts on the message, the entry is what the
                // sweep hands over again should the message be lost on the way.
                Delivery::Queue(queue) => match queue.publish(&message).await {
                    Ok(()) => Ok(false),
                    Err(e) => Err(e.to_string()),
                },
            };
            match delivered {
                Ok(false) => {}
                Ok(true) => self.dequeue(&action).await,
                Err(error) => {
                    tracing::warn!(action = %action.value.key(), %error, "not delivered; the sweep will try again");
                    undelivered.push(format!("{}: {error}", action.value.key()));
                }
            }
        }
        (self.post_notices(notices).await, undelivered)
    }

    /// Delivers what [`Engine::decide_deferred`] left to deliver: in the embedded mode, resumes
    /// the run the decision settled, here. Returns why each resume that failed did (its action
    /// stays in the outbox index, and the sweep resumes the run); empty when all went through.
    pub async fn deliver_deferred(&self, deferred: Deferred) -> Vec<String> {
        self.deliver_reporting(deferred.resumes, deferred.notices)
            .await
            .1
    }

    /// Takes an action out of the outbox index once its resume message was acted on (or
    /// found nothing to do): a plain write of the action as it was read, compare-and-set on its version
    /// (its index entry is then the one its status gives it: none for a decided action). A
    /// newer write wins: a claim already moved it, or another process took it out.
    async fn dequeue(&self, action: &Stored<Action>) {
        let mut tx = Tx::new();
        tx.update_action(self.index_shards, &action.value, action.ver);
        match self.commit(tx).await {
            Ok(_) => {}
            Err(StoreError::ConditionFailed { .. }) => {
                tracing::debug!(action = %action.value.key(), "already moved on");
            }
            Err(error) => {
                tracing::warn!(action = %action.value.key(), %error, "acted on, but the action stays in the outbox index; the sweep will deliver it again, to no effect")
            }
        }
    }

    /// The actions of one run whose resume message is still due (in the outbox index), oldest
    /// first.
    async fn awaiting_resume(
        &self,
        tenant: &TenantId,
        run: &RunId,
    ) -> Result<Vec<Stored<Action>>, EngineError> {
        let pk = keys::run_pk(tenant, run);
        let items = query_all(self.store.as_ref(), &pk, keys::ACTION_PREFIX).await?;
        let mut actions: Vec<Stored<Action>> = items
            .iter()
            .filter(|item| item.gsi1.as_ref().is_some_and(keys::is_outbox))
            .map(decode)
            .collect::<Result<_, _>>()?;
        // A claimed one keeps its entry while its call runs: its message was consumed.
        actions.retain(|action| action.value.status != ActionStatus::Executing);
        actions.sort_by_key(|action| action.value.updated_at);
        Ok(actions)
    }

    async fn load_run(
        &self,
        tenant: &TenantId,
        run: &RunId,
    ) -> Result<Option<Stored<Run>>, EngineError> {
        // The run's item and its audit items, which carry its conversation: one query.
        let items = query_all(
            self.store.as_ref(),
            &keys::run_pk(tenant, run),
            keys::RUN_SK,
        )
        .await?;
        records::run_alone_from_items(&items)
    }

    async fn load_approval(
        &self,
        tenant: &TenantId,
        approval: &ApprovalId,
    ) -> Result<Option<Stored<Approval>>, EngineError> {
        let pk = keys::approval_pk(tenant, approval);
        match self.store.get(&pk, keys::APPROVAL_SK).await? {
            Some(item) => decode_approval(&item).map(Some),
            None => Ok(None),
        }
    }

    async fn load_action(
        &self,
        tenant: &TenantId,
        run: &RunId,
        action: &ActionId,
        version: ActionVersion,
    ) -> Result<Option<Stored<Action>>, EngineError> {
        load(
            self.store.as_ref(),
            &keys::run_pk(tenant, run),
            &keys::action_sk(action, version),
        )
        .await
    }
}

/// Where a run stands after a call into the engine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    pub run_id: RunId,
    pub tenant: TenantId,
    pub agent: AgentName,
    pub status: RunStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The approvals the run now waits on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<Approval>,
}

impl RunReport {
    pub fn of(run: &Run, approvals: Vec<Approval>) -> Self {
        Self {
            run_id: run.id.clone(),
            tenant: run.tenant.clone(),
            agent: run.agent.clone(),
            status: run.status,
            answer: run.answer.clone(),
            error: run.error.clone(),
            approvals,
        }
    }
}

/// When an approval opened at `now` with this time to decide expires. Policy and `start` keep
/// times to decide within [`MAX_TTL`]; anything else is refused rather than overflowing.
pub(crate) fn deadline(
    now: chrono::DateTime<chrono::Utc>,
    ttl: chrono::Duration,
) -> Result<chrono::DateTime<chrono::Utc>, EngineError> {
    let bounded = chrono::Duration::from_std(MAX_TTL).is_ok_and(|max| ttl <= max);
    now.checked_add_signed(ttl)
        .filter(|_| bounded)
        .ok_or_else(|| {
            EngineError::BadInput(format!(
                "a time to decide of {}s is longer than 90 days",
                ttl.num_seconds()
            ))
        })
}

/// An approval's action item is written once when the approval opens and first changes when the
/// approval resolves, so while it waits its item version is always this.
const AWAITING_ACTION_VER: u64 = 1;

/// How many times a use case re-reads and tries again after losing a compare-and-set.
const CAS_ATTEMPTS: usize = 8;

/// How many times a call is decided again after losing a race for an item many calls write:
/// the next slot of a history window (an agent-wide window takes one for every call of its
/// tool), a requester's count of open approvals. Each loss is another call counted first, so
/// the calls as a whole move on; a busy window's calls win in turn, and a bound this high only
/// stops a call that never does (in the fault campaign, eight processes proposing at once
/// through one window each won within 30 tries against the serial moto).
const WINDOW_ATTEMPTS: usize = 64;

/// The longest pause before a call's second try for the items many calls write, and the
/// longest before any.
const FIRST_BACKOFF: std::time::Duration = std::time::Duration::from_millis(5);
const MOST_BACKOFF: std::time::Duration = std::time::Duration::from_millis(80);

/// Before a call's try number `attempt` (from 0) for the items many calls write (a window's
/// next slot, a requester's count of open approvals), ahead of the try's read: nothing before
/// the first; after a loss, a random pause of up to [`FIRST_BACKOFF`], doubled with each loss
/// up to [`MOST_BACKOFF`]. The calls that lost spread out instead of reading and writing again
/// all at once, where all but one would lose again. (A use case that lost a record's
/// compare-and-set, a rarer race, tries again at once.)
async fn back_off(attempt: usize) {
    let Some(losses) = attempt.checked_sub(1) else {
        return;
    };
    let most = FIRST_BACKOFF
        .saturating_mul(1 << losses.min(16))
        .min(MOST_BACKOFF);
    tokio::time::sleep(most.mul_f64(rand::random::<f64>())).await;
}

/// The most approvals one requester may have waiting on people at once, unless configured:
/// far more than a person works through in a sitting, far fewer than a runaway agent opens.
pub const DEFAULT_MAX_OPEN_APPROVALS: u32 = 100;

/// Why a transaction was not committed.
enum Uncommitted {
    /// The store refused it (with what each failed write found, where it was asked).
    Refused(Refused),
    /// A requester's count of open approvals would pass the cap: nothing was sent.
    OverCap(OverCap),
    /// Another call was counted in a history window since this transaction's calls were
    /// decided (their slots were taken): nothing was written, and they are decided again.
    HistoryMoved { failed: Vec<usize> },
}
