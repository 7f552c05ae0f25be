//! The sparse index: the entry each record holds in it.

use super::keys::{self, IndexShards};
use crate::domain::action::{Action, ActionStatus};
use crate::domain::approval::{Approval, ApprovalStatus};
use crate::domain::run::{Run, RunStatus};
use crate::ports::store::IndexKey;

/// How long an action may sit in `executing` before the sweep asks its tool what happened.
pub(crate) const STALE_EXECUTION: chrono::Duration = chrono::Duration::minutes(15);

/// The index entry that brings an unsettled action back to the sweep at `due`.
pub(crate) fn reconcile_key(
    shards: IndexShards,
    action: &Action,
    due: chrono::DateTime<chrono::Utc>,
) -> IndexKey {
    let id = action.key();
    IndexKey {
        pk: keys::shard_pk(keys::RECONCILE_INDEX, shards, &id),
        sk: format!("{}#{id}", keys::sortable(due)),
    }
}

/// How long a run may stay `running` without its record being written before the sweep takes
/// the process driving it for dead.
pub(crate) const RUN_LEASE: chrono::Duration = chrono::Duration::minutes(15);

/// When the lease of a running run runs out: [`RUN_LEASE`] after it was last written.
pub(crate) fn lease_end(run: &Run) -> chrono::DateTime<chrono::Utc> {
    run.updated_at + RUN_LEASE
}

/// The index entry of a run in its current state: a running run holds a lease until
/// [`lease_end`], renewed each time it is written running (started, driven, resumed, or
/// stored before a model turn).
pub(crate) fn run_index(shards: IndexShards, run: &Run) -> Option<IndexKey> {
    (run.status == RunStatus::Running)
        .then(|| keys::lease(shards, &run.tenant, &run.id, lease_end(run)))
}

/// The index entry of an approval: its tenant's pending list, by deadline, while it waits;
/// then its tenant's resolved ones, newest first. Its write that resolves it moves the entry
/// (one index unit more than leaving the pending list for nothing).
pub(crate) fn approval_index(approval: &Approval) -> Option<IndexKey> {
    Some(match approval.status {
        ApprovalStatus::AwaitingApproval => {
            keys::pending(&approval.tenant, approval.expires_at, &approval.id)
        }
        _ => keys::decided(
            &approval.tenant,
            approval.resolved_at.unwrap_or(approval.created_at),
        ),
    })
}

/// The index entry of an action in its current state, if it has one.
pub(crate) fn action_index(shards: IndexShards, action: &Action) -> Option<IndexKey> {
    match action.status {
        // A caller's claim is awaited until its lease ends, a call run here until it is stale.
        ActionStatus::Executing => Some(reconcile_key(
            shards,
            action,
            action
                .caller_claim()
                .map_or(action.updated_at + STALE_EXECUTION, |c| c.lease_expires_at),
        )),
        ActionStatus::Unknown => Some(reconcile_key(shards, action, action.updated_at)),
        _ => None,
    }
}

/// The index entry of an action whose resume message is due: the outbox index, at when the
/// action was decided (or settled), so the action's own item is the pending delivery of that
/// message until its resume claims it (the claim moves it to the reconcile index) or holds its
/// result. The sweep, handing the message over again, moves the entry to when that hand-over's
/// lease runs out.
pub(crate) fn resume_key(shards: IndexShards, action: &Action) -> IndexKey {
    keys::outbox(shards, action.updated_at, &action.key())
}
