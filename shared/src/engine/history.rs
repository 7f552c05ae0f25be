//! Reading what happened: pending approvals, one approval, a run's full history.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::records::{
    Stored, decode, decode_approval, held_by_action, held_by_approval, keys, run_from_items,
};
use super::snapshot::Shown;
use super::{Engine, EngineError, RunReport};
use crate::domain::action::{Action, ActionStatus};
use crate::domain::approval::{Approval, ApprovalStatus, DecisionEffect};
use crate::domain::audit::{AuditEntry, AuditEvent};
use crate::domain::ids::{ActionId, ActionVersion, ApprovalId, Role, RunId, TenantId};
use crate::domain::run::{Run, RunStatus};
use crate::ports::store::{Item, query_all};

/// An approval that no longer waits, with its call as it stands now: the version it let run
/// (an edit's new one) or the one it stopped. What a reviewer arriving late reads.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Resolved {
    pub approval: Approval,
    pub call: Option<Action>,
}

/// The most resolved approvals one read lists.
pub const MAX_RESOLVED: usize = 50;

/// The most waiting approvals one page lists.
pub const MAX_PENDING_PAGE: usize = 200;

/// How many waiting approvals a page lists unless asked for another number.
pub const PENDING_PAGE: usize = 50;

/// A page of the approvals that wait, soonest deadline first.
#[derive(Debug, Clone)]
pub struct PendingPage {
    pub approvals: Vec<Shown>,
    /// Where the next page starts; `None` on the last.
    pub next: Option<PendingCursor>,
}

/// Where a page of waiting approvals ends: the last one's place in its tenant's list (its
/// deadline, then its id), the same in every tenant's, opaque to whoever holds it. A page from
/// it lists the approvals after that place that still wait.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PendingCursor(String);

impl PendingCursor {
    /// The place of `approval` in its tenant's list of waiting approvals.
    pub fn after(approval: &Approval) -> Self {
        Self(keys::pending(&approval.tenant, approval.expires_at, &approval.id).sk)
    }

    /// The cursor as a client carries it: URL-safe, no padding.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(&self.0)
    }

    /// A cursor a page gave; anything else is bad input.
    pub fn parse(text: &str) -> Result<Self, EngineError> {
        let refused = || {
            EngineError::BadInput(format!(
                "cursor {:?} is not one a page of waiting approvals gave",
                text.chars().take(40).collect::<String>()
            ))
        };
        let decoded = URL_SAFE_NO_PAD
            .decode(text)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(refused)?;
        let (deadline, id) = decoded.split_once('#').ok_or_else(refused)?;
        let deadline = DateTime::parse_from_rfc3339(deadline).map_err(|_| refused())?;
        let id = ApprovalId::parse(id).map_err(|_| refused())?;
        let cursor = Self(format!("{}#{id}", keys::sortable(deadline.to_utc())));
        match cursor.0 == decoded {
            true => Ok(cursor),
            false => Err(refused()),
        }
    }
}

/// The one field of a run's item a reviewer's list reads.
#[derive(serde::Deserialize)]
struct TaskOf {
    task: String,
}

/// One run's history, reconstructed from the audit log and the records.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct History {
    pub run: Run,
    /// Every action version, in the order they were proposed.
    pub actions: Vec<Action>,
    pub approvals: Vec<Approval>,
    /// The audit log, oldest first.
    pub entries: Vec<AuditEntry>,
}

/// Where one run stands: its status, its answer or error once it ended, the approvals it waits
/// on, and everything it waits on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunState {
    #[serde(flatten)]
    pub run: RunReport,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Empty once the run ended.
    pub waiting_on: Vec<WaitingOn>,
}

/// One thing a run that has not ended waits on.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WaitingOn {
    /// A person's decision: who may decide, how many, by when.
    Approval {
        approval_id: ApprovalId,
        tool: String,
        approver_role: Role,
        quorum: u8,
        expires_at: DateTime<Utc>,
    },
    /// A call that is running.
    ToolCall {
        action_id: ActionId,
        version: ActionVersion,
        tool: String,
    },
    /// A call whose outcome is not known yet: the sweep asks its tool, or its recovery owner
    /// is asked.
    UnknownOutcome {
        action_id: ActionId,
        version: ActionVersion,
        tool: String,
    },
    /// An approved call its caller runs (`executor = "caller"`): the caller claims it, nothing
    /// here runs it.
    CallerClaim {
        action_id: ActionId,
        version: ActionVersion,
        tool: String,
    },
    /// The model's next turn (a running run with no call running).
    ModelTurn,
    /// Every call of its paused turn is settled: the run resumes.
    Resume,
}

impl Engine {
    /// Where one run of the tenant stands; another tenant's run is not found.
    pub async fn run_state(&self, tenant: &TenantId, id: &RunId) -> Result<RunState, EngineError> {
        let run = self.run(tenant, id).await?;
        let (mut waiting_on, mut approvals) = (Vec::new(), Vec::new());
        if !run.status.is_finished() {
            let actions = self.actions_of(tenant, id).await?;
            for action in &actions {
                let (action_id, version, tool) =
                    (action.id.clone(), action.version, action.tool.clone());
                match action.status {
                    ActionStatus::Executing => waiting_on.push(WaitingOn::ToolCall {
                        action_id,
                        version,
                        tool,
                    }),
                    ActionStatus::Unknown => waiting_on.push(WaitingOn::UnknownOutcome {
                        action_id,
                        version,
                        tool,
                    }),
                    ActionStatus::Approved if self.runs_in_caller(&run, action) => {
                        waiting_on.push(WaitingOn::CallerClaim {
                            action_id,
                            version,
                            tool,
                        })
                    }
                    _ => {}
                }
            }
            approvals = self
                .open_approvals_among(tenant, actions)
                .await?
                .into_iter()
                .map(|s| s.value)
                .collect();
            for approval in &approvals {
                waiting_on.push(WaitingOn::Approval {
                    approval_id: approval.id.clone(),
                    tool: approval.tool.clone(),
                    approver_role: approval.approver_role.clone(),
                    quorum: approval.quorum,
                    expires_at: approval.expires_at,
                });
            }
            if waiting_on.is_empty() {
                waiting_on.push(match run.status {
                    RunStatus::Running => WaitingOn::ModelTurn,
                    _ => WaitingOn::Resume,
                });
            }
        }
        Ok(RunState {
            run: RunReport::of(&run, approvals),
            created_at: run.created_at,
            updated_at: run.updated_at,
            waiting_on,
        })
    }

    /// Approvals that wait on a decision in this tenant, soonest deadline first. Overdue ones
    /// the sweep has not expired yet are included: deciding them expires them.
    pub async fn pending(&self, tenant: &TenantId) -> Result<Vec<Approval>, EngineError> {
        let items = self.pending_items(tenant).await?;
        let pending: Vec<Approval> = items
            .iter()
            .map(|item| Ok(decode_approval(item)?.value))
            .collect::<Result<_, EngineError>>()?;
        Ok(pending
            .into_iter()
            .filter(|a| self.agents.admits(tenant, &a.agent))
            .collect())
    }

    /// One page of [`Engine::pending`]: at most `limit` approvals (up to [`MAX_PENDING_PAGE`]),
    /// those after `after`, each with the snapshot a decision on it may bring back, and where
    /// the next page starts if there is one. An agent that does not serve the tenant shows
    /// none of its approvals.
    pub async fn pending_page(
        &self,
        tenant: &TenantId,
        after: Option<&PendingCursor>,
        limit: usize,
    ) -> Result<PendingPage, EngineError> {
        let limit = limit.clamp(1, MAX_PENDING_PAGE);
        let index = keys::pending_index(tenant);
        // From the cursor's own place: it is left out below if it still waits.
        let from = after.map_or("", |cursor| cursor.0.as_str());
        let mut approvals: Vec<Shown> = Vec::new();
        let mut resume: Option<String> = None;
        // One more than the page says whether another follows.
        while approvals.len() <= limit {
            let page = self
                .store
                .query_index(&index, from, "\u{10FFFF}", resume.as_deref(), limit + 2)
                .await?;
            for item in page.items.iter().filter(|item| {
                after.is_none_or(|cursor| item.gsi1.as_ref().is_some_and(|k| k.sk > cursor.0))
            }) {
                let shown = Shown::of(item)?;
                if self.agents.admits(tenant, &shown.approval.agent) {
                    approvals.push(shown);
                }
            }
            match page.next {
                Some(next) => resume = Some(next),
                None => break,
            }
        }
        let more = approvals.len() > limit;
        approvals.truncate(limit);
        let next = match more {
            true => approvals
                .last()
                .map(|last| PendingCursor::after(&last.approval)),
            false => None,
        };
        Ok(PendingPage { approvals, next })
    }

    /// The items of the tenant's pending approvals, from the sparse index, every page of it.
    pub(super) async fn pending_items(&self, tenant: &TenantId) -> Result<Vec<Item>, EngineError> {
        self.index_items(&keys::pending_index(tenant)).await
    }

    /// Every item of one partition of the sparse index, every page of it.
    pub(super) async fn index_items(&self, index: &str) -> Result<Vec<Item>, EngineError> {
        let mut items = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .store
                .query_index(index, "", "\u{10FFFF}", after.as_deref(), 500)
                .await?;
            items.extend(page.items);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(items),
            }
        }
    }

    /// The tenant's approvals resolved most recently (decided, expired, cancelled, answered),
    /// newest first: at most `limit`, up to [`MAX_RESOLVED`]. One page of the tenant's
    /// resolved list, then one read of each approval's call.
    pub async fn recently_decided(
        &self,
        tenant: &TenantId,
        limit: usize,
    ) -> Result<Vec<Resolved>, EngineError> {
        let limit = limit.clamp(1, MAX_RESOLVED);
        let page = self
            .store
            .query_index(&keys::decided_index(tenant), "", "\u{10FFFF}", None, limit)
            .await?;
        let mut resolved = Vec::with_capacity(page.items.len());
        for item in &page.items {
            let approval = decode_approval(item)?.value;
            if !self.agents.admits(tenant, &approval.agent) {
                continue;
            }
            let version = match approval.decisions.last().map(|d| &d.effect) {
                Some(DecisionEffect::Edited { new_version }) => *new_version,
                _ => approval.action_version,
            };
            let call = self
                .load_action(tenant, &approval.run_id, &approval.action_id, version)
                .await?
                .map(|stored| stored.value);
            resolved.push(Resolved { approval, call });
        }
        Ok(resolved)
    }

    pub async fn approval(
        &self,
        tenant: &TenantId,
        id: &ApprovalId,
    ) -> Result<Approval, EngineError> {
        let what = || format!("approval {id}");
        let approval = self.load_approval(tenant, id).await?;
        let approval = approval
            .ok_or_else(|| EngineError::not_found(what()))?
            .value;
        self.readable(tenant, &approval.agent, what())?;
        Ok(approval)
    }

    /// Every tenant that has started a run, for views across a whole deployment.
    pub async fn tenants(&self) -> Result<Vec<TenantId>, EngineError> {
        let items = query_all(self.store.as_ref(), keys::TENANTS_PK, "").await?;
        items.iter().map(|i| Ok(decode(i)?.value)).collect()
    }

    pub async fn run(&self, tenant: &TenantId, id: &RunId) -> Result<Run, EngineError> {
        let what = || format!("run {id}");
        let run = self.load_run(tenant, id).await?;
        let run = run.ok_or_else(|| EngineError::not_found(what()))?.value;
        self.readable(tenant, &run.agent, what())?;
        Ok(run)
    }

    /// The task of each of these runs, so a reviewer reads what an approval is for: one read
    /// of each run's own item, not its log. A run that is not found is left out.
    pub async fn tasks<'a>(
        &self,
        tenant: &TenantId,
        runs: impl IntoIterator<Item = &'a RunId>,
    ) -> Result<BTreeMap<RunId, String>, EngineError> {
        let mut tasks = BTreeMap::new();
        for run in runs.into_iter().collect::<BTreeSet<_>>() {
            let item = self
                .store
                .get(&keys::run_pk(tenant, run), keys::RUN_SK)
                .await?;
            if let Some(item) = item {
                tasks.insert(run.clone(), decode::<TaskOf>(&item)?.value.task);
            }
        }
        Ok(tasks)
    }

    pub async fn history(&self, tenant: &TenantId, id: &RunId) -> Result<History, EngineError> {
        let items = query_all(self.store.as_ref(), &keys::run_pk(tenant, id), "").await?;
        let mut actions = Vec::new();
        for item in items
            .iter()
            .filter(|i| i.sk.starts_with(keys::ACTION_PREFIX))
        {
            actions.push(decode::<Action>(item)?.value);
        }
        // Every approval of the run: its actions' and any the log names (a recovery's), read
        // once each. The log read first leaves out the events records hold.
        let listed = run_from_items(&items, [])?
            .ok_or_else(|| EngineError::not_found(format!("run {id}")))?
            .log;
        let named: BTreeSet<&ApprovalId> = actions
            .iter()
            .filter_map(|a| a.approval_id.as_ref())
            .chain(listed.iter().filter_map(|e| e.event.approval_id()))
            .collect();
        let mut approvals = HashMap::new();
        for approval_id in named {
            if let Some(stored) = self.load_approval(tenant, approval_id).await? {
                approvals.insert(approval_id.clone(), stored.value);
            }
        }
        // The claims' `executing` and the decisions' `decision` are held by their records.
        let held = actions
            .iter()
            .filter_map(held_by_action)
            .chain(approvals.values().flat_map(held_by_approval));
        let read = run_from_items(&items, held)?
            .ok_or_else(|| EngineError::not_found(format!("run {id}")))?;
        let (run, entries) = (read.run.value, read.log);
        self.readable(tenant, &run.agent, format!("run {id}"))?;
        let actions = in_proposal_order(actions, &entries);
        let approvals = actions
            .iter()
            .filter_map(|a| approvals.remove(a.approval_id.as_ref()?))
            .collect();
        Ok(History {
            run,
            actions,
            approvals,
            entries,
        })
    }

    /// The history of one approval: its run's history, with the log narrowed to the events about
    /// this approval's action (every version) and the run's own milestones.
    pub async fn history_of_approval(
        &self,
        tenant: &TenantId,
        id: &ApprovalId,
    ) -> Result<History, EngineError> {
        let approval = self.approval(tenant, id).await?;
        let mut history = self.history(tenant, &approval.run_id).await?;
        history.entries.retain(|e| match e.event.action() {
            Some((action, _)) => *action == approval.action_id,
            None => {
                e.event.approval_id().is_none_or(|a| *a == approval.id)
                    && e.event.approval_id().is_some()
                    || matches!(
                        e.event.name(),
                        "started" | "paused" | "resumed" | "done" | "failed" | "cancelled"
                    )
            }
        });
        history.actions.retain(|a| a.id == approval.action_id);
        history
            .approvals
            .retain(|a| a.action_id == approval.action_id);
        Ok(history)
    }

    /// The actions of one run, every version.
    pub(super) async fn actions_of(
        &self,
        tenant: &TenantId,
        run: &RunId,
    ) -> Result<Vec<Action>, EngineError> {
        let items = query_all(
            self.store.as_ref(),
            &keys::run_pk(tenant, run),
            keys::ACTION_PREFIX,
        )
        .await?;
        items
            .iter()
            .map(|item| decode::<Action>(item).map(|a| a.value))
            .collect()
    }

    /// The open approvals a run waits on, with their item versions.
    pub(super) async fn open_approvals_of(
        &self,
        run: &Run,
    ) -> Result<Vec<Stored<Approval>>, EngineError> {
        let actions = self.actions_of(&run.tenant, &run.id).await?;
        self.open_approvals_among(&run.tenant, actions).await
    }

    /// The open approvals among a run's actions, with their item versions.
    async fn open_approvals_among(
        &self,
        tenant: &TenantId,
        actions: impl IntoIterator<Item = Action>,
    ) -> Result<Vec<Stored<Approval>>, EngineError> {
        let mut open = Vec::new();
        for action in actions {
            let Some(approval_id) = action
                .approval_id
                .filter(|_| action.status == ActionStatus::AwaitingApproval)
            else {
                continue;
            };
            if let Some(approval) = self.load_approval(tenant, &approval_id).await?
                && approval.value.status == ApprovalStatus::AwaitingApproval
            {
                open.push(approval);
            }
        }
        Ok(open)
    }

    pub(super) async fn pending_of_run(&self, run: &Run) -> Result<Vec<Approval>, EngineError> {
        Ok(self
            .open_approvals_of(run)
            .await?
            .into_iter()
            .map(|s| s.value)
            .collect())
    }
}

/// Action versions in the order their `proposed` events were written: audit keys are monotonic
/// per process, where timestamps tie. A version never comes before its predecessor, even when
/// another process with a lagging clock proposed it.
fn in_proposal_order(mut actions: Vec<Action>, entries: &[AuditEntry]) -> Vec<Action> {
    let proposed: HashMap<(&ActionId, ActionVersion), usize> = entries
        .iter()
        .enumerate()
        .filter_map(|(n, entry)| match &entry.event {
            AuditEvent::Proposed {
                action_id, version, ..
            } => Some(((action_id, *version), n)),
            _ => None,
        })
        .collect();
    actions.sort_by(|a, b| (&a.id, a.version).cmp(&(&b.id, b.version)));
    let mut placed: Vec<(usize, Action)> = Vec::with_capacity(actions.len());
    for action in actions {
        // Without its event (never expected), an action goes last, by when it was proposed.
        let own = proposed
            .get(&(&action.id, action.version))
            .copied()
            .unwrap_or(usize::MAX);
        let predecessor = placed
            .last()
            .filter(|(_, previous)| previous.id == action.id)
            .map_or(0, |(at, _)| *at);
        placed.push((own.max(predecessor), action));
    }
    placed.sort_by(|(a_at, a), (b_at, b)| {
        (a_at, a.proposed_at, a.version).cmp(&(b_at, b.proposed_at, b.version))
    });
    placed.into_iter().map(|(_, action)| action).collect()
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use serde_json::json;

    use super::*;
    use crate::domain::action::ProposedCall;
    use crate::domain::args::Args;
    use crate::domain::identity::Actor;
    use crate::domain::ids::TenantId;
    use crate::domain::policy::Verdict;

    fn action(id: &str, version: u32) -> Action {
        let call = ProposedCall {
            agent: crate::domain::ids::AgentName::parse("expense").unwrap(),
            id: ActionId::parse(id).unwrap(),
            version: ActionVersion::new(version).unwrap(),
            tenant: TenantId::parse("acme").unwrap(),
            run_id: RunId::parse("run-1").unwrap(),
            tool_use_id: format!("toolu_{id}"),
            tool: "get_claim".into(),
            args: Args::new(json!({"claim_id": "c-101"})).unwrap(),
            explanation: String::new(),
            rules: Vec::new(),
            log_only: None,
        };
        Action::propose(call, Utc::now())
    }

    fn proposed(action: &Action) -> AuditEntry {
        AuditEntry {
            at: action.proposed_at,
            run_id: action.run_id.clone(),
            actor: Actor::Agent,
            event: AuditEvent::Proposed {
                action_id: action.id.clone(),
                version: action.version,
                tool: action.tool.clone(),
                args: action.args.clone(),
                args_hash: action.args_hash.clone(),
                explanation: String::new(),
                verdict: Box::new(Verdict::Allow),
                approval_id: None,
                rules: Vec::new(),
                log_only: None,
            },
        }
    }

    #[test]
    fn a_version_whose_event_sorts_before_its_predecessors_still_comes_after_it() {
        let (b1, a1, a2) = (action("act-b", 1), action("act-a", 1), action("act-a", 2));
        // act-a v2 was proposed by a process whose audit keys sort before the others'.
        let entries = [proposed(&a2), proposed(&b1), proposed(&a1)];

        let ordered = in_proposal_order(vec![a2, a1, b1], &entries);

        let order: Vec<String> = ordered.iter().map(Action::key).collect();
        assert_eq!(order, ["act-b:1", "act-a:1", "act-a:2"]);
    }

    #[test]
    fn a_cursor_reads_back_as_given_and_one_no_page_gave_is_bad_input() {
        let given = URL_SAFE_NO_PAD.encode("2026-11-10T09:00:00.000Z#ap-7k2m9q4x8p1z");
        let cursor = PendingCursor::parse(&given).unwrap();

        assert_eq!(cursor.encode(), given);
        let no_id = URL_SAFE_NO_PAD.encode("2026-11-10T09:00:00.000Z");
        let no_time = URL_SAFE_NO_PAD.encode("soon#ap-7k2m9q4x8p1z");
        let loose = URL_SAFE_NO_PAD.encode("2026-11-10T09:00:00Z#ap-7k2m9q4x8p1z");
        for text in ["", "not a cursor", &no_id, &no_time, &loose] {
            let refused = PendingCursor::parse(text).unwrap_err();
            assert_eq!(refused.code(), "bad_input", "{text}");
        }
    }
}
