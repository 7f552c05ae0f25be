//! The sparse index: how its partitions are sharded, and the entry each record holds in it.

use super::keys;
use crate::domain::action::{Action, ActionStatus};
use crate::domain::approval::{Approval, ApprovalStatus};
use crate::domain::run::{Run, RunStatus};
use crate::ports::store::IndexKey;

// ---------------------------------------------------------------- index shards

/// How many partitions each index written by every tenant is split over
/// (`COUNTERSIGN_INDEX_SHARDS`). DynamoDB holds one partition key to about 1,000 write units a
/// second; n shards raise that ceiling n times, and cost the sweep n queries per index instead
/// of one. Every process of a deployment must use the same number: an entry in a shard the
/// sweep does not read waits until it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexShards(u32);

impl IndexShards {
    pub const DEFAULT: IndexShards = IndexShards(16);
    /// More would make every sweep slow for no gain a deployment could measure.
    pub const MAX: u32 = 256;

    pub fn new(n: u32) -> Result<Self, String> {
        match n {
            1..=Self::MAX => Ok(Self(n)),
            _ => Err(format!(
                "{n} index shards: the number must be from 1 to {}",
                Self::MAX
            )),
        }
    }

    pub fn get(self) -> u32 {
        self.0
    }

    /// The shard of the record `id`: FNV-1a, which (unlike std's hasher) never changes between
    /// releases or processes.
    pub fn of(self, id: &str) -> u32 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in id.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        (hash % u64::from(self.0)) as u32
    }
}

impl Default for IndexShards {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl std::str::FromStr for IndexShards {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let n = text
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("{text:?} is not a whole number of index shards"))?;
        Self::new(n)
    }
}

// ---------------------------------------------------------------- index rules

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_shards_are_refused_outside_one_to_the_maximum() {
        assert_eq!("16".parse::<IndexShards>(), Ok(IndexShards::DEFAULT));
        for bad in ["0", "257", "-1", "four", ""] {
            let error = bad.parse::<IndexShards>().unwrap_err();
            assert!(error.contains("index shards"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn a_record_keeps_its_shard_across_processes_and_releases() {
        // Pinned: a changed hash would strand every entry written before the change.
        let shards = IndexShards::new(16).unwrap();
        assert_eq!(shards.of("TENANT#acme#RUN#r-1"), 9);
        let seen: std::collections::BTreeSet<u32> =
            (0..200).map(|n| shards.of(&format!("ob-{n}"))).collect();
        assert_eq!(seen.len(), 16, "ids spread over every shard");
        let one = IndexShards::new(1).unwrap();
        assert_eq!(keys::shard_pks(keys::OUTBOX_INDEX, one), ["OUTBOX#0"]);
    }
}
