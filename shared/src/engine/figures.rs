//! What an operator watches, per tenant and agent: the approvals waiting on people and how
//! long the oldest has waited, and the calls whose outcome is unknown, read from the index
//! entries the engine already keeps (so right across processes and after a restart); and the
//! counts of decisions, executions, policy rulings, model requests and tokens and failed
//! resumes, where the store keeps them.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::records::{decode, decode_approval, keys};
use super::{Engine, EngineError};
use crate::domain::action::{Action, ActionStatus};
use crate::domain::approval::ApprovalKind;
use crate::domain::ids::{AgentName, RunId, TenantId};
use crate::domain::policy::VerdictKind;
use crate::ports::counters::{
    DECISION_BUCKETS, DecisionOutcome, ExecutionOutcome, Kept, ModelOutcome, RuleMode, Series,
    TokenKind,
};

/// The figures of a deployment (or one tenant of it) at one moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    pub at: DateTime<Utc>,
    /// Whether the store keeps counts (the embedded one does); without them every count is 0.
    pub counted: bool,
    /// One entry per tenant and agent with anything to show, or loaded for the tenant.
    pub agents: Vec<AgentFigures>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentFigures {
    pub tenant: TenantId,
    pub agent: AgentName,
    /// Approvals of calls waiting on people (a recovery's question is an unknown outcome).
    pub approvals_waiting: u64,
    /// How long the oldest of them has waited; 0 when none waits.
    pub oldest_wait_seconds: f64,
    /// Calls whose outcome is unknown: waiting for the sweep to reconcile them through their
    /// tool, or for the recovery owner to say whether they took effect.
    pub unknown_outcomes: u64,
    pub decisions: BTreeMap<DecisionOutcome, u64>,
    pub decision_seconds: DecisionTimes,
    pub executions: BTreeMap<ExecutionOutcome, u64>,
    pub policy_outcomes: Vec<Ruled>,
    pub model_requests: BTreeMap<ModelOutcome, u64>,
    pub model_tokens: BTreeMap<TokenKind, u64>,
    /// Queued resume or drive messages whose handling failed, one per failed delivery.
    pub resume_failures: u64,
}

/// How long decisions took, from an approval's creation: a histogram's buckets, each with its
/// own count as the store keeps it (the Prometheus encoder adds them up as it writes them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionTimes {
    /// Each bucket's upper bound in seconds with how many decisions came within it and no
    /// earlier one.
    pub buckets: Vec<(f64, u64)>,
    /// How many came past the last bound.
    pub beyond: u64,
    pub count: u64,
    pub sum: f64,
}

/// How many calls policy ruled one way, enforced or log-only.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ruled {
    pub outcome: VerdictKind,
    pub mode: RuleMode,
    pub count: u64,
}

impl AgentFigures {
    /// Nothing waiting and nothing counted yet: every series there, at zero.
    pub fn new(tenant: TenantId, agent: AgentName) -> Self {
        Self {
            tenant,
            agent,
            approvals_waiting: 0,
            oldest_wait_seconds: 0.0,
            unknown_outcomes: 0,
            decisions: DecisionOutcome::ALL.iter().map(|o| (*o, 0)).collect(),
            decision_seconds: DecisionTimes {
                buckets: DECISION_BUCKETS.iter().map(|b| (*b, 0)).collect(),
                beyond: 0,
                count: 0,
                sum: 0.0,
            },
            executions: ExecutionOutcome::ALL.iter().map(|o| (*o, 0)).collect(),
            policy_outcomes: VerdictKind::ALL
                .iter()
                .flat_map(|outcome| {
                    RuleMode::ALL.iter().map(|mode| Ruled {
                        outcome: *outcome,
                        mode: *mode,
                        count: 0,
                    })
                })
                .collect(),
            model_requests: ModelOutcome::ALL.iter().map(|o| (*o, 0)).collect(),
            model_tokens: TokenKind::ALL.iter().map(|k| (*k, 0)).collect(),
            resume_failures: 0,
        }
    }

    /// Adds one kept series.
    fn add(&mut self, kept: &Kept) {
        match kept.series {
            Series::Decisions(outcome) => {
                *self.decisions.entry(outcome).or_default() += kept.n;
                self.decision_seconds.count += kept.n;
                self.decision_seconds.sum += kept.seconds;
            }
            Series::DecidedWithin(bucket) => match self.decision_seconds.buckets.get_mut(bucket) {
                Some((_, within)) => *within += kept.n,
                None => self.decision_seconds.beyond += kept.n,
            },
            Series::Executions(outcome) => *self.executions.entry(outcome).or_default() += kept.n,
            Series::Rulings(outcome, mode) => {
                if let Some(ruled) = self
                    .policy_outcomes
                    .iter_mut()
                    .find(|r| r.outcome == outcome && r.mode == mode)
                {
                    ruled.count += kept.n;
                }
            }
            Series::ModelRequests(outcome) => {
                *self.model_requests.entry(outcome).or_default() += kept.n
            }
            Series::ModelTokens(kind) => *self.model_tokens.entry(kind).or_default() += kept.n,
            Series::ResumeFailures => self.resume_failures += kept.n,
        }
    }
}

/// The figures of `tenant`'s `agent`, entered at zero the first time.
fn entry<'a>(
    figures: &'a mut BTreeMap<(TenantId, AgentName), AgentFigures>,
    tenant: &TenantId,
    agent: &AgentName,
) -> &'a mut AgentFigures {
    figures
        .entry((tenant.clone(), agent.clone()))
        .or_insert_with(|| AgentFigures::new(tenant.clone(), agent.clone()))
}

/// The one field of a run's item the figures read.
#[derive(serde::Deserialize)]
struct AgentOf {
    agent: AgentName,
}

impl Engine {
    /// The agent of `run`, read from its item alone; `None` when there is no such run.
    pub(super) async fn agent_of_run(
        &self,
        tenant: &TenantId,
        run: &RunId,
    ) -> Result<Option<AgentName>, EngineError> {
        let item = self
            .store
            .get(&keys::run_pk(tenant, run), keys::RUN_SK)
            .await?;
        item.map(|item| Ok(decode::<AgentOf>(&item)?.value.agent))
            .transpose()
    }

    /// The figures of `tenant`, or of every tenant that has started a run. Reads each tenant's
    /// pending approvals, every shard of the reconcile index and, for each call there whose
    /// outcome is unknown, its run's item; and the counts where the store keeps them. A read
    /// for an operator (a scrape, `countersign stats`), never on a request's path.
    pub async fn figures(&self, tenant: Option<&TenantId>) -> Result<Figures, EngineError> {
        let now = self.now();
        let tenants: BTreeSet<TenantId> = match tenant {
            Some(tenant) => BTreeSet::from([tenant.clone()]),
            None => self.tenants().await?.into_iter().collect(),
        };
        let mut figures = BTreeMap::new();
        for tenant in &tenants {
            // By name and tenants alone: a function builds no agent to count its approvals.
            for name in self
                .agents
                .names()
                .filter(|name| self.agents.admits(tenant, name))
            {
                entry(&mut figures, tenant, name);
            }
        }
        for tenant in &tenants {
            for item in self.pending_items(tenant).await? {
                let approval = decode_approval(&item)?.value;
                let shown = entry(&mut figures, &approval.tenant, &approval.agent);
                match approval.kind {
                    ApprovalKind::Recovery => shown.unknown_outcomes += 1,
                    ApprovalKind::Action => {
                        shown.approvals_waiting += 1;
                        let waited = (now - approval.created_at).num_milliseconds().max(0);
                        let waited = waited as f64 / 1000.0;
                        shown.oldest_wait_seconds = shown.oldest_wait_seconds.max(waited);
                    }
                }
            }
        }
        for shard in keys::shard_pks(keys::RECONCILE_INDEX, self.index_shards) {
            for item in self.index_items(&shard).await? {
                let action = decode::<Action>(&item)?.value;
                // Still running (or its caller's claim still held): not unknown yet.
                if action.status != ActionStatus::Unknown || !tenants.contains(&action.tenant) {
                    continue;
                }
                let Some(agent) = self.agent_of_run(&action.tenant, &action.run_id).await? else {
                    continue;
                };
                entry(&mut figures, &action.tenant, &agent).unknown_outcomes += 1;
            }
        }
        let counters = self.counters().filter(|counters| counters.reads_back());
        if let Some(counters) = counters {
            for kept in counters.kept(tenant).await? {
                if !tenants.contains(&kept.tenant) {
                    continue;
                }
                entry(&mut figures, &kept.tenant, &kept.agent).add(&kept);
            }
        }
        Ok(Figures {
            at: now,
            counted: counters.is_some(),
            agents: figures.into_values().collect(),
        })
    }
}
