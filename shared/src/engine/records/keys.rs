use chrono::{DateTime, SecondsFormat, Utc};

use crate::domain::ids::{
    ActionId, ActionVersion, AgentName, ApprovalId, PersonId, RunId, TenantId,
};
use crate::ports::store::IndexKey;

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

pub const RUN_SK: &str = "RUN";
pub const APPROVAL_SK: &str = "APPROVAL";
pub const ACTION_PREFIX: &str = "ACTION#";
/// The item that finds a call from outside by its key ([`call_pk`]).
pub const CALL_SK: &str = "CALL";
/// Audit items sort after their run's item, and share its prefix, so one query reads a run
/// with its conversation (which its audit items carry).
pub const AUDIT_PREFIX: &str = "RUN#";
pub const OUTBOX_PREFIX: &str = "OUTBOX#";
pub const TENANTS_PK: &str = "TENANTS";
/// Index partitions written by every tenant: the undelivered outbox (notices' items, and
/// decided actions awaiting their resume, by when they are due), actions whose outcome is
/// not settled, runs being driven (by when their lease runs out), approvals with an
/// escalation to come. Each is split over [`IndexShards`] partitions, `OUTBOX#0` to
/// `OUTBOX#n-1` and so on, so no one partition key takes every tenant's writes;
/// [`shard_pks`] names them all for the sweep.
pub const OUTBOX_INDEX: &str = "OUTBOX";
pub const RECONCILE_INDEX: &str = "RECONCILE";
pub const RUNNING_INDEX: &str = "RUNNING";
/// Approvals with an escalation step to come, by when it is due.
pub const ESCALATE_INDEX: &str = "ESCALATE";
/// The marker item, with its approval, that puts it in the escalation index.
pub const ESCALATION_SK: &str = "ESCALATION";

/// The item that counts a requester's open approvals ([`requester_pk`]).
pub const OPEN_APPROVALS_SK: &str = "OPEN_APPROVALS";
/// A requester's open approvals, one slot each ([`open_slot_sk`]).
pub const OPEN_SLOT_PREFIX: &str = "OPEN#";

/// A requester of a tenant: the partition of their open approvals and their count.
pub fn requester_pk(tenant: &TenantId, person: &PersonId) -> String {
    format!("TENANT#{tenant}#PERSON#{person}")
}

/// The slot of an open approval, by its action: every version of the call holds the same.
pub fn open_slot_sk(action: &ActionId) -> String {
    format!("{OPEN_SLOT_PREFIX}{action}")
}

/// The calls one history window counts for one subject, one slot each ([`history_slot_sk`]).
/// `subject` is what [`Window::subject`] names: `requester#…`, `agent#…` or `arg#…`.
///
/// [`Window::subject`]: crate::domain::policy::history::Window::subject
pub fn history_pk(tenant: &TenantId, agent: &AgentName, window: &str, subject: &str) -> String {
    format!("TENANT#{tenant}#HISTORY#{agent}#{window}#{subject}")
}

/// A history window's calls, in the order they were counted ([`history_slot_sk`]).
pub const HISTORY_SLOT_PREFIX: &str = "SLOT#";

/// The `seq`th call a window counted for its subject: fixed width, so the order of the keys is
/// the order of the calls.
pub fn history_slot_sk(seq: u64) -> String {
    format!("{HISTORY_SLOT_PREFIX}{seq:020}")
}

/// A call from outside, by its key: a partition of its own, so no tenant's calls share one.
pub fn call_pk(tenant: &TenantId, key: &str) -> String {
    format!("TENANT#{tenant}#CALL#{key}")
}

pub fn run_pk(tenant: &TenantId, run: &RunId) -> String {
    format!("{}{run}", runs_prefix(tenant))
}

/// What every run partition of `tenant` starts with.
pub fn runs_prefix(tenant: &TenantId) -> String {
    format!("TENANT#{tenant}#RUN#")
}

/// The run of a run partition's key.
pub fn run_of(pk: &str) -> Option<&str> {
    pk.strip_prefix("TENANT#")?
        .split_once("#RUN#")
        .map(|(_, run)| run)
}

pub fn action_sk(action: &ActionId, version: ActionVersion) -> String {
    format!("{ACTION_PREFIX}{action}#V{:06}", version.get())
}

pub fn approval_pk(tenant: &TenantId, approval: &ApprovalId) -> String {
    format!("TENANT#{tenant}#APPROVAL#{approval}")
}

/// The tenant and approval id an approval's partition key names, if it is one.
pub fn approval_of(pk: &str) -> Option<(&str, &str)> {
    pk.strip_prefix("TENANT#")?.split_once("#APPROVAL#")
}

pub fn tenant_sk(tenant: &TenantId) -> String {
    format!("TENANT#{tenant}")
}

/// Pending approvals of a tenant, by deadline.
pub fn pending_index(tenant: &TenantId) -> String {
    format!("TENANT#{tenant}#PENDING")
}

pub fn pending(tenant: &TenantId, expires_at: DateTime<Utc>, approval: &ApprovalId) -> IndexKey {
    IndexKey {
        pk: pending_index(tenant),
        sk: format!("{}#{approval}", sortable(expires_at)),
    }
}

/// Resolved approvals of a tenant, the newest first.
pub fn decided_index(tenant: &TenantId) -> String {
    format!("TENANT#{tenant}#DECIDED")
}

/// A resolved approval in its tenant's list of them. The key sorts the newest first (the
/// milliseconds from `resolved_at` to a far date) and is short: it is written on the
/// approval's item, which stays within one write unit once decided.
pub fn decided(tenant: &TenantId, resolved_at: DateTime<Utc>) -> IndexKey {
    IndexKey {
        pk: decided_index(tenant),
        sk: newest_first(resolved_at),
    }
}

/// A time as a key that sorts later times first: fixed width, milliseconds.
pub fn newest_first(at: DateTime<Utc>) -> String {
    // 2286-11-20T17:46:39.999Z: the last millisecond thirteen digits hold.
    const FAR: i64 = 9_999_999_999_999;
    format!("{:013}", (FAR - at.timestamp_millis()).clamp(0, FAR))
}

/// The partition of a sharded index that holds the record `id`: the same one every time,
/// so a record that is rewritten (a lease that moves, a notice retried) stays in it.
pub fn shard_pk(index: &str, shards: IndexShards, id: &str) -> String {
    format!("{index}#{}", shards.of(id))
}

/// Every partition of a sharded index, in shard order.
pub fn shard_pks(index: &str, shards: IndexShards) -> Vec<String> {
    (0..shards.get()).map(|n| format!("{index}#{n}")).collect()
}

/// An approval's next escalation step, by when it is due.
pub fn escalation(
    shards: IndexShards,
    at: DateTime<Utc>,
    tenant: &TenantId,
    approval: &ApprovalId,
) -> IndexKey {
    let id = approval_pk(tenant, approval);
    IndexKey {
        pk: shard_pk(ESCALATE_INDEX, shards, &id),
        sk: format!("{}#{id}", sortable(at)),
    }
}

/// A running run, by when the lease of the process driving it runs out.
pub fn lease(
    shards: IndexShards,
    tenant: &TenantId,
    run: &RunId,
    until: DateTime<Utc>,
) -> IndexKey {
    let id = run_pk(tenant, run);
    IndexKey {
        pk: shard_pk(RUNNING_INDEX, shards, &id),
        sk: format!("{}#{id}", sortable(until)),
    }
}

/// A timestamp that sorts as text: fixed width, UTC, milliseconds.
pub fn sortable(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// An entry of the outbox index, by when it is next due: an outbox item (a notice) at its
/// next attempt or the end of its claim; an action whose resume message is due at when it
/// was decided. `id` is the outbox item's id, or the action's `action_id:version`.
pub fn outbox(shards: IndexShards, at: DateTime<Utc>, id: &str) -> IndexKey {
    IndexKey {
        pk: shard_pk(OUTBOX_INDEX, shards, id),
        sk: format!("{}#{id}", sortable(at)),
    }
}

/// Whether an index key is in the outbox index.
pub fn is_outbox(key: &IndexKey) -> bool {
    key.pk
        .strip_prefix(OUTBOX_INDEX)
        .is_some_and(|shard| shard.starts_with('#'))
}

/// The upper bound of index keys due at `at`.
pub fn due_until(at: DateTime<Utc>) -> String {
    format!("{}#\u{10FFFF}", sortable(at))
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
        assert_eq!(shard_pks(OUTBOX_INDEX, one), ["OUTBOX#0"]);
    }
}
