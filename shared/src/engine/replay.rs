//! A candidate policy tried on the calls an agent was really asked to make: each stored
//! proposal decided again, as its requester stood then, with the history windows' totals as
//! they were, so a team sees what a rule would change before it is enforced.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{Agent, Engine, EngineError, History};
use crate::domain::action::ActionStatus;
use crate::domain::args::Args;
use crate::domain::audit::AuditEvent;
use crate::domain::ids::{ActionId, PersonId, RunId, TenantId};
use crate::domain::policy::history::Per;
use crate::domain::policy::{Policy, Total, VerdictKind};
use crate::engine::records::keys;

/// How many calls each outcome got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Outcomes {
    pub allow: usize,
    pub approve: usize,
    pub deny: usize,
}

impl Outcomes {
    fn count(&mut self, kind: VerdictKind) {
        match kind {
            VerdictKind::Allow => self.allow += 1,
            VerdictKind::Approve => self.approve += 1,
            VerdictKind::Deny => self.deny += 1,
        }
    }
}

/// One tool's outcomes under the policy that decided its calls and under the candidate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Compared {
    pub before: Outcomes,
    pub after: Outcomes,
}

/// A call whose outcome the candidate changes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Changed {
    pub tenant: TenantId,
    pub run_id: RunId,
    pub action_id: ActionId,
    pub tool: String,
    pub requested_by: PersonId,
    pub at: DateTime<Utc>,
    pub args: Args,
    pub before: VerdictKind,
    pub after: VerdictKind,
    /// The candidate's rules that decided it.
    pub rules: Vec<String>,
}

/// What a candidate policy makes of an agent's stored calls.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Replay {
    /// Calls decided again.
    pub calls: usize,
    /// Per tool, before and after.
    pub tools: BTreeMap<String, Compared>,
    /// Every call whose outcome would change, oldest first.
    pub changed: Vec<Changed>,
}

/// One stored proposal, as policy ruled on it.
struct Proposal {
    tenant: TenantId,
    run: RunId,
    action: ActionId,
    requested_by: PersonId,
    at: DateTime<Utc>,
    tool: String,
    args: Args,
    before: VerdictKind,
    /// It ran or may still run: it counts in the history windows of the calls after it.
    counts: bool,
    index: usize,
}

impl Engine {
    /// Decides again, under `candidate`, every call `agent` was asked to make since `since`
    /// (in every tenant that has runs), each for its requester as authentication said of them
    /// then, at the time it was proposed. A history window's totals are those of the stored
    /// calls before it in the window that ran or may still run: the outcomes they really got,
    /// not the candidate's. Reads every run's partition: an operator's command, not a request's.
    pub async fn replay_policy(
        &self,
        agent: &Agent,
        candidate: &Policy,
        since: DateTime<Utc>,
    ) -> Result<Replay, EngineError> {
        let mut runs = Vec::new();
        for tenant in self.tenants().await? {
            for pk in self.store.partitions(&keys::runs_prefix(&tenant)).await? {
                let Some(run) = keys::run_of(&pk) else {
                    continue;
                };
                let Ok(run) = RunId::parse(run) else {
                    continue;
                };
                // The run's own item first: only the agent's runs changed since `since` can
                // hold a call to replay, and only theirs are read whole.
                match self.run(&tenant, &run).await {
                    Ok(found) if found.agent == agent.name && found.updated_at >= since => {
                        runs.push(self.history(&tenant, &run).await?)
                    }
                    Ok(_) => {}
                    Err(e) if e.code() == "not_found" => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let mut proposals = proposals_of(&runs, since);
        proposals.sort_by_key(|p| (p.at, p.index));
        let by_run: BTreeMap<&RunId, &History> = runs.iter().map(|h| (&h.run.id, h)).collect();

        let mut replay = Replay::default();
        for proposal in &proposals {
            let run = &by_run[&proposal.run].run;
            let totals = totals_before(candidate, &proposals, proposal);
            let ruling = agent.decide(
                candidate,
                run.asker(),
                &proposal.tool,
                &proposal.args,
                agent.hints(&proposal.tool),
                &totals,
                proposal.at,
            );
            let after = VerdictKind::of(&ruling.verdict);
            replay.calls += 1;
            let compared = replay.tools.entry(proposal.tool.clone()).or_default();
            compared.before.count(proposal.before);
            compared.after.count(after);
            if after != proposal.before {
                replay.changed.push(Changed {
                    tenant: proposal.tenant.clone(),
                    run_id: proposal.run.clone(),
                    action_id: proposal.action.clone(),
                    tool: proposal.tool.clone(),
                    requested_by: proposal.requested_by.clone(),
                    at: proposal.at,
                    args: proposal.args.clone(),
                    before: proposal.before,
                    after,
                    rules: ruling.rules,
                });
            }
        }
        Ok(replay)
    }
}

/// The first version of every call policy ruled on in `runs` since `since`.
fn proposals_of(runs: &[History], since: DateTime<Utc>) -> Vec<Proposal> {
    let mut proposals = Vec::new();
    for history in runs {
        for entry in history.entries.iter().filter(|e| e.at >= since) {
            let AuditEvent::Proposed {
                action_id,
                version,
                tool,
                args,
                verdict,
                ..
            } = &entry.event
            else {
                continue;
            };
            if version.get() != 1 {
                continue;
            }
            let before = VerdictKind::of(verdict);
            let status = history
                .actions
                .iter()
                .rev()
                .find(|a| &a.id == action_id)
                .map(|a| a.status);
            let counts = before != VerdictKind::Deny
                && !matches!(
                    status,
                    Some(ActionStatus::Rejected | ActionStatus::Expired | ActionStatus::Cancelled)
                );
            proposals.push(Proposal {
                tenant: history.run.tenant.clone(),
                run: history.run.id.clone(),
                action: action_id.clone(),
                requested_by: history.run.requested_by.clone(),
                at: entry.at,
                tool: tool.clone(),
                args: args.clone(),
                before,
                counts,
                index: proposals.len(),
            });
        }
    }
    proposals
}

/// The totals of `candidate`'s history windows for `call`: the earlier calls of each window's
/// tool within its time, of the same requester, agent or argument value, that count.
fn totals_before(
    candidate: &Policy,
    proposals: &[Proposal],
    call: &Proposal,
) -> BTreeMap<String, Total> {
    let mut totals = BTreeMap::new();
    for (name, window) in &candidate.history {
        let Ok(span) = chrono::Duration::from_std(window.window) else {
            continue;
        };
        let same_subject = |earlier: &Proposal| match &window.per {
            Per::Requester => {
                earlier.tenant == call.tenant && earlier.requested_by == call.requested_by
            }
            Per::Agent => earlier.tenant == call.tenant,
            Per::Arg(arg) => {
                earlier.tenant == call.tenant
                    && earlier.args.as_value().get(arg).is_some()
                    && earlier.args.as_value().get(arg) == call.args.as_value().get(arg)
            }
        };
        let mut total = Total::default();
        for earlier in proposals.iter().filter(|p| {
            (p.at, p.index) < (call.at, call.index)
                && p.at > call.at - span
                && p.counts
                && p.tool == window.tool
                && same_subject(p)
        }) {
            total.count += 1;
            if let Some(sum) = &window.sum {
                total.sum += earlier.args.int(sum).unwrap_or(0);
            }
        }
        totals.insert(name.clone(), total);
    }
    totals
}
