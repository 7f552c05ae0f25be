//! How engine records sit in the item store: keys, the sparse index, and the transaction
//! builder that writes a change and its audit events together: the events of one transaction
//! about one run go into one append-only audit item, in the order they were added.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::error::EngineError;
use crate::domain::action::{Action, ActionStatus};
use crate::domain::approval::{Approval, ApprovalStatus};
use crate::domain::args::{Args, ArgsHash};
use crate::domain::audit::{AuditEntry, AuditEvent, LogSlot};
use crate::domain::budget;
use crate::domain::conversation::Message;
use crate::domain::identity::Actor;
use crate::domain::ids::{
    ActionId, ActionVersion, AgentName, ApprovalId, OutboxId, RunId, TenantId,
};
use crate::domain::notice::NoticeKind;
use crate::domain::run::{Run, RunStatus};
use crate::ports::queue::ResumeMessage;
use crate::ports::store::{Condition, IndexKey, Item, ItemStore, Write};

/// Keys carry the tenant first, so an IAM `dynamodb:LeadingKeys` condition can isolate tenants.
pub mod keys {
    use super::*;

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

    /// A call from outside, by its key: a partition of its own, so no tenant's calls share one.
    pub fn call_pk(tenant: &TenantId, key: &str) -> String {
        format!("TENANT#{tenant}#CALL#{key}")
    }

    pub fn run_pk(tenant: &TenantId, run: &RunId) -> String {
        format!("TENANT#{tenant}#RUN#{run}")
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

    pub fn pending(
        tenant: &TenantId,
        expires_at: DateTime<Utc>,
        approval: &ApprovalId,
    ) -> IndexKey {
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
}

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

/// The index entry of a run in its current state: a running run holds a lease until
/// `updated_at + RUN_LEASE`, renewed each time it is written running (started or resumed).
pub(crate) fn run_index(shards: IndexShards, run: &Run) -> Option<IndexKey> {
    (run.status == RunStatus::Running)
        .then(|| keys::lease(shards, &run.tenant, &run.id, run.updated_at + RUN_LEASE))
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

/// Where an action version is kept: in its run's partition.
fn action_key(action: &Action) -> (String, String) {
    (
        keys::run_pk(&action.tenant, &action.run_id),
        keys::action_sk(&action.id, action.version),
    )
}

/// The index entry of an action in its current state, if it has one.
pub(crate) fn action_index(shards: IndexShards, action: &Action) -> Option<IndexKey> {
    match action.status {
        ActionStatus::Executing => Some(reconcile_key(
            shards,
            action,
            action.updated_at + STALE_EXECUTION,
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

/// The message that resumes an action's run: `action_id:version` of that run is settled.
pub fn resume_message(action: &Action) -> ResumeMessage {
    ResumeMessage {
        tenant: action.tenant.clone(),
        run_id: action.run_id.clone(),
        action_id: action.id.clone(),
        version: action.version,
        resent: 0,
    }
}

/// A record and the item version it was read at, for compare-and-set.
#[derive(Debug, Clone)]
pub struct Stored<T> {
    pub value: T,
    pub ver: u64,
}

/// A record from its item. An approval's item holds its stored form ([`approval_body`]),
/// filled back here, so every reader of an approval's item reads the whole approval.
pub fn decode<T: DeserializeOwned>(item: &Item) -> Result<Stored<T>, EngineError> {
    let corrupt = |why: String| EngineError::Corrupt(format!("{}/{}: {why}", item.pk, item.sk));
    let value = match item.sk == keys::APPROVAL_SK {
        true => serde_json::from_value(approval_value(item).map_err(corrupt)?),
        false => serde_json::from_str(&item.body),
    };
    value
        .map(|value| Stored {
            value,
            ver: item.ver,
        })
        .map_err(|e| corrupt(e.to_string()))
}

pub async fn load<T: DeserializeOwned>(
    store: &dyn ItemStore,
    pk: &str,
    sk: &str,
) -> Result<Option<Stored<T>>, EngineError> {
    match store.get(pk, sk).await? {
        Some(item) => decode(&item).map(Some),
        None => Ok(None),
    }
}

// ---------------------------------------------------------------- the stored approval

/// An approval's fields its item leaves out when they are the approval's own: each decision's
/// version and arguments' hash (a decision is about the version the approval asks for).
const DECISION_OWN: [&str; 2] = ["action_version", "args_hash"];
/// An approval's fields its partition key names.
const APPROVAL_KEYED: [&str; 2] = ["id", "tenant"];
/// When an approval was resolved: left out where its last decision resolved it.
const RESOLVED_AT: &str = "resolved_at";

/// The body of an approval's item: the approval's JSON (as the API shows it) less what the
/// item need not repeat, so a decided approval stays one write unit (1 KB) on DynamoDB:
/// - `id` and `tenant`, which its partition key names;
/// - fields that are unset (`null`: `previous`, `superseded_by`, `resolved_at` and
///   `reminded_at` until they are set), which read back as unset;
/// - a decision's `action_version` and `args_hash` where they are the approval's own (always,
///   as [`Approval::decide`] records them; kept where they differ);
/// - its `args_hash` where it is the hash of its own agent, tool and arguments;
/// - `resolved_at` where the last decision resolved it (its `at`): a resolved approval always
///   has a `resolved_at`, so one that reads back without it takes its last decision's.
///
/// [`decode`] fills them back. The `decision` events are the decisions themselves, each with
/// where it sits in the run's log ([`held_by_approval`]).
fn approval_body(approval: &Approval) -> String {
    let mut body = serde_json::to_value(approval).expect("engine records serialize");
    if let Some(fields) = body.as_object_mut() {
        for keyed in APPROVAL_KEYED {
            fields.remove(keyed);
        }
        fields.retain(|_, value| !value.is_null());
        debug_assert!(
            approval.status == ApprovalStatus::AwaitingApproval || approval.resolved_at.is_some(),
            "a resolved approval says when"
        );
        let last_at = approval.decisions.last().map(|d| d.at);
        if approval.resolved_at.is_some() && approval.resolved_at == last_at {
            fields.remove(RESOLVED_AT);
        }
        let own = DECISION_OWN.map(|name| fields.get(name).cloned());
        if let Some(serde_json::Value::Array(decisions)) = fields.get_mut("decisions") {
            for decision in decisions.iter_mut().filter_map(|d| d.as_object_mut()) {
                for (name, own) in DECISION_OWN.iter().zip(&own) {
                    if decision.get(*name) == own.as_ref() {
                        decision.remove(*name);
                    }
                }
            }
        }
        if approval.args_hash == ArgsHash::of_call(&approval.agent, &approval.tool, &approval.args)
        {
            fields.remove(ARGS_HASH);
        }
    }
    body.to_string()
}

/// An approval's hash, left out of its item where it is the one its agent, tool and arguments
/// give (every approval made since the hash covered them), and made again from them on reading.
const ARGS_HASH: &str = "args_hash";

/// The hash an approval's JSON without one stands for: its agent's, tool's and arguments'.
fn own_hash(fields: &serde_json::Map<String, serde_json::Value>) -> Result<String, String> {
    let agent: AgentName = serde_json::from_value(fields.get("agent").cloned().unwrap_or_default())
        .map_err(|e| format!("agent: {e}"))?;
    let tool = fields
        .get("tool")
        .and_then(|t| t.as_str())
        .ok_or("no tool")?;
    let args: Args = serde_json::from_value(fields.get("args").cloned().unwrap_or_default())
        .map_err(|e| format!("args: {e}"))?;
    Ok(ArgsHash::of_call(&agent, tool, &args).as_str().to_string())
}

/// An approval's JSON from its item ([`approval_body`]), the fields left out filled back: its
/// id and tenant from the item's key, its decisions' version and hash from its own. A field the
/// body holds is kept as it is.
fn approval_value(item: &Item) -> Result<serde_json::Value, String> {
    let (tenant, id) = keys::approval_of(&item.pk).ok_or("not an approval's key")?;
    let mut body: serde_json::Value =
        serde_json::from_str(&item.body).map_err(|e| e.to_string())?;
    let fields = body.as_object_mut().ok_or("not an object")?;
    for (name, value) in APPROVAL_KEYED.into_iter().zip([id, tenant]) {
        fields.entry(name).or_insert_with(|| value.into());
    }
    if !fields.contains_key(ARGS_HASH) {
        let hash = own_hash(fields)?;
        fields.insert(ARGS_HASH.into(), hash.into());
    }
    let own = DECISION_OWN.map(|name| fields.get(name).cloned());
    let mut last_at = None;
    if let Some(serde_json::Value::Array(decisions)) = fields.get_mut("decisions") {
        for decision in decisions.iter_mut().filter_map(|d| d.as_object_mut()) {
            for (name, own) in DECISION_OWN.iter().zip(&own) {
                if let Some(own) = own {
                    decision.entry(*name).or_insert_with(|| own.clone());
                }
            }
            last_at = decision.get("at").cloned();
        }
    }
    let awaiting = serde_json::to_value(ApprovalStatus::AwaitingApproval).expect("a status");
    if fields.get("status") != Some(&awaiting)
        && let Some(at) = last_at
    {
        fields.entry(RESOLVED_AT).or_insert(at);
    }
    Ok(body)
}

/// The marker of an approval whose next escalation step is to come.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EscalationDue {
    pub tenant: TenantId,
    pub approval_id: ApprovalId,
}

/// What waits in an outbox item until it is delivered. (A resume message has no item of its
/// own: the decided action waits in the outbox index itself, [`resume_key`].)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OutboxMessage {
    Notify(NotifyMessage),
}

/// A notice about one approval for one destination, and how its delivery is going.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NotifyMessage {
    pub approval_id: ApprovalId,
    pub notice: NoticeKind,
    /// The destination's id; its address stays in configuration.
    pub destination: String,
    /// The destination as the audit log names it.
    pub label: String,
    /// Attempts that failed so far.
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxEntry {
    pub id: OutboxId,
    pub tenant: TenantId,
    pub run_id: RunId,
    pub created_at: DateTime<Utc>,
    pub message: OutboxMessage,
}

impl OutboxEntry {
    pub fn key(&self) -> (String, String) {
        outbox_key(&self.tenant, &self.run_id, &self.id)
    }
}

/// Where an outbox entry is stored: with its run.
pub fn outbox_key(tenant: &TenantId, run: &RunId, id: &OutboxId) -> (String, String) {
    (
        keys::run_pk(tenant, run),
        format!("{}{id}", keys::OUTBOX_PREFIX),
    )
}

/// The length of an [`audit_order`]: 17 digits, `#`, 8 hex digits.
const AUDIT_ORDER_LEN: usize = 26;

/// Audit keys sort in the order this process wrote them, and never collide across processes.
fn audit_order() -> String {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = Utc::now().timestamp_micros().max(0) as u64;
    let mut last = LAST.load(Ordering::Relaxed);
    let tick = loop {
        let next = now.max(last + 1);
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break next,
            Err(seen) => last = seen,
        }
    };
    format!("{tick:017}#{:08x}", rand::random::<u32>())
}

/// One audit event as an audit item holds it: the item's partition names the run, so the
/// event does not repeat it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct LoggedEvent {
    at: DateTime<Utc>,
    actor: Actor,
    #[serde(flatten)]
    event: AuditEvent,
}

/// The audit item of one transaction about one run: its events, oldest first, and the messages
/// of the run's conversation that transaction adds (the turns since the run was last written).
/// Written once, must-not-exist, in the transaction whose change it records; never rewritten.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct AuditItem {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    events: Vec<LoggedEvent>,
    /// The position of the first of `messages` in the conversation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "is_zero")]
    from: usize,
    /// The transaction's events about the run so far, those its records hold counted.
    #[serde(skip)]
    places: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Between a transaction's audit key and the number of a part past its first
/// (`RUN#<order>~01`): parts sort after the first and in order, and read back as one item.
const AUDIT_PART: char = '~';

impl AuditItem {
    /// This item's body, or the bodies of the parts it is split into where it is past
    /// [`budget::AUDIT_ITEM`]: the events, then the messages, in order, each part as full as
    /// it may be. Every event and message is within its share, so each part fits the store.
    fn bodies(self) -> Vec<String> {
        let whole = serde_json::to_string(&self).expect("engine records serialize");
        if whole.len() <= budget::AUDIT_ITEM {
            return vec![whole];
        }
        let mut parts = vec![AuditItem::default()];
        let mut size = 0;
        let next_part = |parts: &mut Vec<AuditItem>, size: &mut usize, len: usize| {
            let last = parts.last().expect("a part");
            let started = !(last.events.is_empty() && last.messages.is_empty());
            if started && *size + len > budget::AUDIT_ITEM {
                parts.push(AuditItem::default());
                *size = 0;
            }
            *size += len;
        };
        for event in self.events {
            let len = serde_json::to_string(&event).map_or(0, |e| e.len() + 1);
            next_part(&mut parts, &mut size, len);
            parts.last_mut().expect("a part").events.push(event);
        }
        for (n, message) in self.messages.into_iter().enumerate() {
            let len = serde_json::to_string(&message).map_or(0, |m| m.len() + 1);
            next_part(&mut parts, &mut size, len);
            let part = parts.last_mut().expect("a part");
            if part.messages.is_empty() {
                part.from = self.from + n;
            }
            part.messages.push(message);
        }
        parts
            .iter()
            .map(|part| serde_json::to_string(part).expect("engine records serialize"))
            .collect()
    }
}

/// The run item's own fields: how many messages its audit items hold (with the task, message
/// 0), and the messages after those, which the run item carries itself while it fits.
const LOGGED_MESSAGES: &str = "messages_logged";
/// A finished run's item: the events of the transaction that finished it, which its item, never
/// written again, holds in place of an audit item.
const FINAL_EVENTS: &str = "events";
/// A final event's field that is its run's own field of the same name (`done`'s answer,
/// `failed`'s error): the run's item holds it once, in the run's field.
const FINAL_FROM_RUN: [(&str, &str); 2] = [("done", "answer"), ("failed", "error")];
const RECENT_MESSAGES: &str = "messages_recent";

/// What a run's item may weigh and still be one write unit on DynamoDB (1 KB): the messages
/// after the logged ones ride in the run's item while it stays within this, and move into the
/// audit item of the write that would take it past.
const RUN_ITEM_BUDGET: usize = 1024;

/// What a finished run's item, written for the last time, may hold with its messages and its
/// last transaction's events: past it, they go to audit items instead.
const FINISHED_RUN_ITEM: usize = budget::AUDIT_ITEM / 2;

/// A run's item for each split of its conversation (the messages from `keep` on in the item,
/// those before in audit items): the run's own fields and each message serialized once, not
/// once per split tried.
struct RunBodies {
    /// The run's fields but its conversation: a JSON object without its closing brace.
    fields: String,
    /// The messages from `from` on, each serialized.
    messages: Vec<String>,
    from: usize,
}

impl RunBodies {
    fn new(run: &Run, from: usize) -> Self {
        let mut fields = serde_json::to_value(run).expect("engine records serialize");
        if let Some(fields) = fields.as_object_mut() {
            fields.remove("messages");
            // Unset fields read back as unset.
            fields.retain(|_, value| !value.is_null());
        }
        let mut fields = fields.to_string();
        fields.pop();
        let messages = run.messages[from..]
            .iter()
            .map(|m| serde_json::to_string(m).expect("engine records serialize"))
            .collect();
        Self {
            fields,
            messages,
            from,
        }
    }

    /// The item with the messages from `keep` on (`keep` at least `from`).
    fn body(&self, keep: usize) -> String {
        let recent = &self.messages[keep - self.from..];
        let mut body = String::with_capacity(
            self.fields.len() + 48 + recent.iter().map(|m| m.len() + 1).sum::<usize>(),
        );
        body.push_str(&self.fields);
        if self.fields.len() > 1 {
            body.push(',');
        }
        body.push_str(&format!(
            "\"{LOGGED_MESSAGES}\":{keep},\"{RECENT_MESSAGES}\":["
        ));
        for (n, message) in recent.iter().enumerate() {
            if n > 0 {
                body.push(',');
            }
            body.push_str(message);
        }
        body.push_str("]}");
        body
    }
}

/// DynamoDB's size of an item (each attribute's name and value, as the adapter writes it),
/// in write units. `sk_len` is its sort key's length: an audit item's is known before its key.
fn write_units(pk: &str, sk_len: usize, index: Option<&IndexKey>, body: &str) -> usize {
    let index = index.map_or(0, |k| {
        "gsi1pk".len() + k.pk.len() + "gsi1sk".len() + k.sk.len()
    });
    let ver = "ver".len() + 21;
    let bytes = "pk".len() + pk.len() + "sk".len() + sk_len + ver + "body".len() + body.len();
    (bytes + index).div_ceil(RUN_ITEM_BUDGET).max(1)
}

/// A run as the items of its partition hold it.
pub struct RunRead {
    /// With its whole conversation.
    pub run: Stored<Run>,
    /// Its audit log, oldest first.
    pub log: Vec<AuditEntry>,
}

/// A run from the items of its partition (all of them, or those from its item on). Each audit
/// item is decoded once, for its events and its messages; items other than the run's and its
/// audit items are passed over. The log opens with the run's `started` ([`started`]), puts the
/// events records hold (`held`: [`held_by_action`], [`held_by_approval`]) at their places among
/// the audit items' and, for a finished run, closes with the events its item holds. `None` when
/// the run's item is not among them.
pub fn run_from_items(
    items: &[Item],
    held: impl IntoIterator<Item = (LogSlot, AuditEntry)>,
) -> Result<Option<RunRead>, EngineError> {
    let mut record = None;
    let mut log = Log::default();
    let mut logged = Vec::new();
    for item in items {
        if item.sk == keys::RUN_SK {
            record = Some(item);
        } else if let Some(order) = item.sk.strip_prefix(keys::AUDIT_PREFIX) {
            // A transaction's audit item split in parts: each part continues the one before.
            let order = order.split(AUDIT_PART).next().unwrap_or(order);
            let audit = decode::<AuditItem>(item)?.value;
            log.listed(order, audit.events);
            if !audit.messages.is_empty() {
                logged.push((audit.from, audit.messages));
            }
        }
    }
    let Some(record) = record else {
        return Ok(None);
    };
    for (slot, entry) in held {
        let (order, place) = slot.parts().ok_or_else(|| {
            EngineError::Corrupt(format!("{}: no log slot in {slot:?}", record.pk))
        })?;
        log.held(order, place, entry);
    }
    let (run, last) = decode_run(record, logged)?;
    let run_id = &run.value.id;
    let log = std::iter::once(started(&run.value))
        .chain(log.in_order(run_id))
        .chain(
            last.into_iter()
                .map(|e| AuditEntry::new(run_id, e.actor, e.event, e.at)),
        )
        .collect();
    Ok(Some(RunRead { run, log }))
}

/// A run's events by the transaction that wrote them (its order): those its audit item lists,
/// in the order listed, and those records hold, each at its place among them.
#[derive(Default)]
struct Log(BTreeMap<String, Written>);

/// One transaction's events about a run: listed by its audit item, held by records (by place).
#[derive(Default)]
struct Written(Vec<LoggedEvent>, Vec<(usize, LoggedEvent)>);

impl Log {
    fn listed(&mut self, order: &str, events: Vec<LoggedEvent>) {
        self.0
            .entry(order.to_string())
            .or_default()
            .0
            .extend(events);
    }

    fn held(&mut self, order: &str, place: usize, entry: AuditEntry) {
        let event = LoggedEvent {
            at: entry.at,
            actor: entry.actor,
            event: entry.event,
        };
        self.0
            .entry(order.to_string())
            .or_default()
            .1
            .push((place, event));
    }

    fn in_order(self, run: &RunId) -> impl Iterator<Item = AuditEntry> {
        self.0.into_values().flat_map(|Written(listed, mut held)| {
            held.sort_by_key(|(place, _)| *place);
            let mut listed = listed.into_iter();
            let mut held = held.into_iter().peekable();
            let mut events = Vec::new();
            while let Some(event) = held
                .next_if(|(place, _)| *place == events.len())
                .map(|(_, event)| event)
                .or_else(|| listed.next())
                .or_else(|| held.next().map(|(_, event)| event))
            {
                events.push(event);
            }
            events
                .into_iter()
                .map(|e| AuditEntry::new(run, e.actor, e.event, e.at))
                .collect::<Vec<_>>()
        })
    }
}

/// The `executing` event a claimed action's item holds ([`Action::claimed`]).
pub fn held_by_action(action: &Action) -> Option<(LogSlot, AuditEntry)> {
    let claimed = action.claimed.as_ref()?;
    let event = AuditEvent::executing(action, &action.authorized_by);
    let entry = AuditEntry::new(&action.run_id, claimed.by.clone(), event, claimed.at);
    Some((claimed.logged.clone(), entry))
}

/// The `decision` events an approval's item holds, one per decision
/// ([`crate::domain::approval::Decision::logged`]).
pub fn held_by_approval(approval: &Approval) -> impl Iterator<Item = (LogSlot, AuditEntry)> + '_ {
    approval.decisions.iter().filter_map(|decision| {
        let event = AuditEvent::Decision {
            approval_id: approval.id.clone(),
            action_id: approval.action_id.clone(),
            version: decision.action_version,
            args_hash: decision.args_hash.clone(),
            choice: decision.choice.clone(),
            effect: decision.effect.clone(),
        };
        let actor = Actor::person(&decision.by);
        let entry = AuditEntry::new(&approval.run_id, actor, event, decision.at);
        Some((decision.logged.clone()?, entry))
    })
}

/// A run's `started` event: the run's own fields, fixed when its item is created and never
/// changed, so its log holds them once, in the run's item.
fn started(run: &Run) -> AuditEntry {
    let event = AuditEvent::Started {
        task: run.task.clone(),
        requested_by: run.requested_by.clone(),
        policy_version: run.policy_version,
    };
    AuditEntry::new(
        &run.id,
        Actor::person(&run.requested_by),
        event,
        run.created_at,
    )
}

/// A run from its item and its conversation: the messages its audit items hold (each item's,
/// from its position; `parts` is every audit item's with messages), then those the run's item
/// carries. With it, the events the item holds if the run is finished.
fn decode_run(
    item: &Item,
    mut parts: Vec<(usize, Vec<Message>)>,
) -> Result<(Stored<Run>, Vec<LoggedEvent>), EngineError> {
    let corrupt = |why: String| EngineError::Corrupt(format!("{}/{}: {why}", item.pk, item.sk));
    let mut body: serde_json::Value =
        serde_json::from_str(&item.body).map_err(|e| corrupt(e.to_string()))?;
    let fields = body
        .as_object_mut()
        .ok_or_else(|| corrupt("not an object".into()))?;
    let logged = fields
        .remove(LOGGED_MESSAGES)
        .and_then(|n| n.as_u64())
        .ok_or_else(|| corrupt(format!("no {LOGGED_MESSAGES}")))? as usize;
    // The run item's own lists, each absent when empty.
    let mut list = |name: &str| {
        fields
            .remove(name)
            .unwrap_or_else(|| serde_json::Value::Array(vec![]))
    };
    let recent: Vec<Message> =
        serde_json::from_value(list(RECENT_MESSAGES)).map_err(|e| corrupt(e.to_string()))?;
    let mut last = list(FINAL_EVENTS);
    for event in last.as_array_mut().into_iter().flatten() {
        for (name, field) in FINAL_FROM_RUN {
            if event["event"] == name
                && let (Some(event), Some(own)) = (event.as_object_mut(), fields.get(field))
            {
                event.entry(field).or_insert_with(|| own.clone());
            }
        }
    }
    let last: Vec<LoggedEvent> =
        serde_json::from_value(last).map_err(|e| corrupt(e.to_string()))?;
    fields.insert("messages".into(), serde_json::Value::Array(vec![]));
    let mut run: Run = serde_json::from_value(body).map_err(|e| corrupt(e.to_string()))?;
    if !last.is_empty() && !run.status.is_finished() {
        return Err(corrupt(format!("a {} run holds final events", run.status)));
    }
    run.messages = vec![Message::user_text(run.task.clone())];
    run.stored_messages = logged;
    parts.sort_by_key(|(from, _)| *from);
    for (from, messages) in parts {
        if from != run.messages.len() {
            return Err(corrupt(format!(
                "turns from message {from} follow {} messages",
                run.messages.len()
            )));
        }
        run.messages.extend(messages);
    }
    if run.messages.len() != logged {
        return Err(corrupt(format!(
            "{} of {logged} logged messages found",
            run.messages.len()
        )));
    }
    run.messages.extend(recent);
    let run = Stored {
        value: run,
        ver: item.ver,
    };
    Ok((run, last))
}

impl Stored<Run> {
    /// The run's write ([`Tx::run`]) committed: its item is one version on, and the messages
    /// that write moved into its audit item are logged.
    pub fn written(&mut self) {
        if let Some(logged) = self.value.logging_messages.take() {
            self.value.stored_messages = logged;
        }
        self.ver += 1;
    }
}

/// What a committed transaction hands over for delivery: the outbox items it wrote (notices),
/// and the actions whose resume message it made due, each at the item version it wrote.
#[derive(Debug, Default)]
pub struct Outgoing {
    pub notices: Vec<OutboxEntry>,
    pub resumes: Vec<Stored<Action>>,
}

impl Outgoing {
    pub fn extend(&mut self, more: Outgoing) {
        self.notices.extend(more.notices);
        self.resumes.extend(more.resumes);
    }
}

/// One atomic change: records, their audit events and their outbox messages.
#[derive(Default)]
pub struct Tx {
    writes: Vec<Write>,
    outgoing: Outgoing,
    /// The audit events of this transaction, by the partition of the run they are about.
    audit: Vec<(String, AuditItem)>,
    /// The writes of runs that finish here: each holds this transaction's events about its run.
    finished: Vec<usize>,
    /// Where this transaction sits in its runs' logs: its audit items' key, made when first needed.
    order: Option<String>,
}

impl Tx {
    pub fn new() -> Self {
        Self::default()
    }

    fn put<T: Serialize>(
        &mut self,
        pk: String,
        sk: String,
        gsi1: Option<IndexKey>,
        value: &T,
        condition: Condition,
    ) -> &Item {
        let body = serde_json::to_string(value).expect("engine records serialize");
        self.put_body(pk, sk, gsi1, body, condition)
    }

    /// [`Tx::put`] of a body already serialized. The item's version follows from the condition:
    /// 1 for an item written without one to compare, the next after the one it expects.
    fn put_body(
        &mut self,
        pk: String,
        sk: String,
        gsi1: Option<IndexKey>,
        body: String,
        condition: Condition,
    ) -> &Item {
        let ver = match &condition {
            Condition::VersionIs(ver) | Condition::Unchanged { ver, .. } => ver + 1,
            Condition::Always | Condition::NotExists => 1,
        };
        self.writes.push(Write::Put {
            item: Item {
                pk,
                sk,
                gsi1,
                ver,
                body,
            },
            condition,
        });
        match self.writes.last() {
            Some(Write::Put { item, .. }) => item,
            _ => unreachable!("a put was just pushed"),
        }
    }

    /// A new item: the write fails if it exists.
    pub fn create<T: Serialize>(
        &mut self,
        pk: String,
        sk: String,
        gsi1: Option<IndexKey>,
        value: &T,
    ) {
        self.put(pk, sk, gsi1, value, Condition::NotExists);
    }

    /// A compare-and-set: the write fails unless the item is still at `ver`.
    pub fn update<T: Serialize>(
        &mut self,
        pk: String,
        sk: String,
        gsi1: Option<IndexKey>,
        value: &T,
        ver: u64,
    ) {
        self.put(pk, sk, gsi1, value, Condition::VersionIs(ver));
    }

    /// A new approval, in its stored form ([`approval_body`]), with the index entry its status
    /// gives it.
    pub fn create_approval(&mut self, approval: &Approval) {
        self.put_approval(approval, Condition::NotExists);
    }

    /// An approval's compare-and-set, in its stored form, with the index entry its status
    /// gives it. Returns the item as written.
    pub fn update_approval(&mut self, approval: &Approval, ver: u64) -> &Item {
        self.put_approval(approval, Condition::VersionIs(ver))
    }

    /// [`Tx::update_approval`] holding on `read`: how the approval ruled on was read (its
    /// version, or the exact snapshot a reviewer was shown).
    pub fn update_approval_if(&mut self, approval: &Approval, read: Condition) {
        self.put_approval(approval, read);
    }

    fn put_approval(&mut self, approval: &Approval, condition: Condition) -> &Item {
        let pk = keys::approval_pk(&approval.tenant, &approval.id);
        let index = approval_index(approval);
        let body = approval_body(approval);
        self.put_body(pk, keys::APPROVAL_SK.into(), index, body, condition)
    }

    /// A new action version, with the reconcile index entry its status gives it.
    pub fn create_action(&mut self, shards: IndexShards, action: &Action) {
        let (pk, sk) = action_key(action);
        self.create(pk, sk, action_index(shards, action), action);
    }

    /// An action version's compare-and-set, with the reconcile index entry its status gives it.
    pub fn update_action(&mut self, shards: IndexShards, action: &Action, ver: u64) {
        let (pk, sk) = action_key(action);
        self.update(pk, sk, action_index(shards, action), action, ver);
    }

    /// An approved action's claim (`approved → executing`), compare-and-set on the version
    /// `approved` was read at. An action that waits in the outbox index for the message being
    /// consumed (`queued`) keeps its entry there as it is: the index updates the entry in place
    /// (1 write unit, where moving it to the reconcile index took a delete and a put), and the
    /// sweep tells a claimed action from an undelivered one by its status, moving a claim that
    /// outlives the grace to the reconcile index then. One taken out of the outbox index already
    /// enters the reconcile index.
    pub fn claim_action(
        &mut self,
        shards: IndexShards,
        approved: &Stored<Action>,
        queued: bool,
        claimed: &Action,
    ) {
        let (pk, sk) = action_key(claimed);
        let index = match queued {
            true => Some(resume_key(shards, &approved.value)),
            false => action_index(shards, claimed),
        };
        self.update(pk, sk, index, claimed, approved.ver);
    }

    /// An action whose resume message is now due (approved, or settled without running), with
    /// `condition` on its item: the action's item enters the outbox index ([`resume_key`]) and
    /// is the message's pending delivery; no outbox item is written. The message goes out after
    /// the commit ([`Tx::into_parts`]).
    pub fn resume_action(&mut self, shards: IndexShards, action: &Action, condition: Condition) {
        let (pk, sk) = action_key(action);
        let index = Some(resume_key(shards, action));
        let ver = self.put(pk, sk, index, action, condition).ver;
        self.outgoing.resumes.push(Stored {
            value: action.clone(),
            ver,
        });
    }

    /// Written whatever is there (idempotent registries).
    pub fn upsert<T: Serialize>(&mut self, pk: String, sk: String, value: &T) {
        self.put(pk, sk, None, value, Condition::Always);
    }

    pub fn delete(&mut self, pk: String, sk: String, condition: Condition) {
        self.writes.push(Write::Delete { pk, sk, condition });
    }

    /// The audit item this transaction writes for the run under `pk`.
    fn audit_item(&mut self, pk: String) -> &mut AuditItem {
        let at = match self.audit.iter().position(|(p, _)| *p == pk) {
            Some(at) => at,
            None => {
                self.audit.push((pk, AuditItem::default()));
                self.audit.len() - 1
            }
        };
        &mut self.audit[at].1
    }

    /// An audit event, written with this transaction in its run's audit item.
    pub fn audit(&mut self, tenant: &TenantId, entry: AuditEntry) {
        let event = LoggedEvent {
            at: entry.at,
            actor: entry.actor,
            event: entry.event,
        };
        let item = self.audit_item(keys::run_pk(tenant, &entry.run_id));
        item.events.push(event);
        item.places += 1;
    }

    /// The place of an event about `run` that a record this transaction writes holds instead of
    /// its audit item (a claim's `executing`, a decision's `decision`): after the events added so
    /// far, before those added next. The reader puts it back there ([`run_from_items`]).
    pub fn log_slot(&mut self, tenant: &TenantId, run: &RunId) -> LogSlot {
        let item = self.audit_item(keys::run_pk(tenant, run));
        let place = item.places;
        item.places += 1;
        LogSlot::new(self.order(), place)
    }

    /// This transaction's audit order ([`audit_order`]): the same for each of its audit items
    /// and the slots of the events its records hold.
    fn order(&mut self) -> &str {
        self.order.get_or_insert_with(audit_order)
    }

    /// The run's item: created if it was never written (version 0), else compare-and-set on
    /// its version. Its `started` event is not written: it is the run's own fields, fixed at
    /// its creation ([`started`]). The messages the audit does not hold yet are split between
    /// the run's item and this transaction's audit item (the events already added to it
    /// counted): the run's item keeps the latest while it stays one write unit (1 KB on
    /// DynamoDB), at the split where the two cost the fewest units, the audit item taking all
    /// it can at no extra cost. So the run's item stays small, a message is logged once, and a
    /// short turn costs no audit write unit of its own. A finished run's item is written for
    /// the last time: it keeps its unlogged messages, and this transaction's events about the
    /// run ride in it ([`Tx::into_parts`]) instead of an audit item of their own. After the
    /// commit, [`Stored::written`].
    pub fn run(&mut self, shards: IndexShards, run: &mut Stored<Run>) {
        let value = &run.value;
        let pk = keys::run_pk(&value.tenant, &value.id);
        let index = run_index(shards, value);
        let logged = value.stored_messages.min(value.messages.len());
        let bodies = RunBodies::new(value, logged);
        let sk = keys::RUN_SK.to_string();
        let condition = match run.ver {
            0 => Condition::NotExists,
            ver => Condition::VersionIs(ver),
        };
        if value.status.is_finished() {
            // It keeps its unlogged messages while they fit its share; older ones go to the
            // audit item (the events then stay there too, [`Tx::into_parts`]).
            let mut keep = logged;
            let mut body = bodies.body(keep);
            while body.len() > FINISHED_RUN_ITEM && keep < value.messages.len() {
                keep += 1;
                body = bodies.body(keep);
            }
            if keep > logged {
                let item = self.audit_item(pk.clone());
                item.from = logged;
                item.messages = value.messages[logged..keep].to_vec();
            }
            run.value.logging_messages = Some(keep);
            self.put_body(pk, sk, index, body, condition);
            self.finished.push(self.writes.len() - 1);
            return;
        }
        let audit = match self.audit.iter().find(|(p, _)| *p == pk) {
            Some((_, item)) => item.clone(),
            None => AuditItem::default(),
        };
        let order_len = keys::AUDIT_PREFIX.len() + AUDIT_ORDER_LEN;
        let mut best: Option<(usize, usize, String)> = None;
        for keep in (logged..=value.messages.len()).rev() {
            let body = bodies.body(keep);
            let mut moved = audit.clone();
            if keep > logged {
                moved.from = logged;
                moved.messages = value.messages[logged..keep].to_vec();
            }
            let run_units = write_units(&pk, keys::RUN_SK.len(), index.as_ref(), &body);
            if run_units > 1 && keep < value.messages.len() {
                // A message kept in the run's item is paid again at each of its writes.
                continue;
            }
            let units = run_units
                + match moved.events.is_empty() && moved.messages.is_empty() {
                    true => 0,
                    false => write_units(
                        &pk,
                        order_len,
                        None,
                        &serde_json::to_string(&moved).expect("engine records serialize"),
                    ),
                };
            if best.as_ref().is_none_or(|(least, _, _)| units < *least) {
                best = Some((units, keep, body));
            }
        }
        let (_, keep, body) = best.expect("at least one split");
        if keep > logged {
            let item = self.audit_item(pk.clone());
            item.from = logged;
            item.messages = value.messages[logged..keep].to_vec();
        }
        run.value.logging_messages = Some(keep);
        self.put_body(pk, sk, index, body, condition);
    }

    pub fn outbox(
        &mut self,
        shards: IndexShards,
        tenant: &TenantId,
        run_id: &RunId,
        message: OutboxMessage,
        now: DateTime<Utc>,
    ) {
        let entry = OutboxEntry {
            id: OutboxId::generate(),
            tenant: tenant.clone(),
            run_id: run_id.clone(),
            created_at: now,
            message,
        };
        let (pk, sk) = entry.key();
        let gsi1 = keys::outbox(shards, now, entry.id.as_str());
        self.put(pk, sk, Some(gsi1), &entry, Condition::NotExists);
        self.outgoing.notices.push(entry);
    }

    /// The writes, each run's audit item last (a finished run's events in its own item), and
    /// what to deliver once they commit.
    pub fn into_parts(mut self) -> (Vec<Write>, Outgoing) {
        for at in std::mem::take(&mut self.finished) {
            let Write::Put { item, .. } = &mut self.writes[at] else {
                unreachable!("a run's write is a put")
            };
            let Some(found) = self.audit.iter().position(|(pk, _)| *pk == item.pk) else {
                continue;
            };
            // Messages the run's item could not keep take its events to their audit item.
            if self.audit[found].1.events.is_empty() || !self.audit[found].1.messages.is_empty() {
                continue;
            }
            let (_, audit) = self.audit.remove(found);
            let run: serde_json::Value =
                serde_json::from_str(&item.body).expect("a run's body just serialized");
            let mut events = serde_json::to_value(&audit.events).expect("engine records serialize");
            for event in events.as_array_mut().into_iter().flatten() {
                for (name, field) in FINAL_FROM_RUN {
                    if event["event"] == name && run.get(field).is_some_and(|v| *v == event[field])
                    {
                        event.as_object_mut().map(|e| e.remove(field));
                    }
                }
            }
            if item.body.len() + events.to_string().len() > budget::AUDIT_ITEM {
                // Too much to ride in the run's item: they keep an audit item of their own.
                self.audit.push((item.pk.clone(), audit));
                continue;
            }
            item.body.pop();
            item.body
                .push_str(&format!(",\"{FINAL_EVENTS}\":{events}}}"));
        }
        // A run whose events this transaction added are all held by its records gets no item.
        self.audit
            .retain(|(_, item)| !(item.events.is_empty() && item.messages.is_empty()));
        if !self.audit.is_empty() {
            let sk = format!("{}{}", keys::AUDIT_PREFIX, self.order());
            for (pk, item) in std::mem::take(&mut self.audit) {
                for (n, body) in item.bodies().into_iter().enumerate() {
                    let sk = match n {
                        0 => sk.clone(),
                        n => format!("{sk}{AUDIT_PART}{n:02}"),
                    };
                    self.put_body(pk.clone(), sk, None, body, Condition::NotExists);
                }
            }
        }
        (self.writes, self.outgoing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `run` as the engine does, and reads it back from the items the writes leave.
    fn write_and_read(run: &mut Stored<Run>, items: &mut Vec<Item>) -> Stored<Run> {
        let mut tx = Tx::new();
        tx.run(IndexShards::DEFAULT, run);
        for item in written(tx) {
            items.retain(|i| (&i.pk, &i.sk) != (&item.pk, &item.sk));
            items.push(item);
        }
        run.written();
        // In key order, as a query of the run's partition returns them.
        items.sort_by(|a, b| a.sk.cmp(&b.sk));
        let read = run_from_items(items, []).unwrap().expect("the run's item");
        let names: Vec<&str> = read.log.iter().map(|e| e.event.name()).collect();
        assert_eq!(names, ["started"], "the log reads back with the run");
        read.run
    }

    #[test]
    fn a_conversation_reads_back_whole_however_it_is_split_between_the_run_and_its_audit() {
        use crate::domain::conversation::{Block, Speaker};
        let mut run = started_run();
        let mut items = Vec::new();
        assert_eq!(write_and_read(&mut run, &mut items).value.messages.len(), 1);
        // Short turns ride in the run's item; long ones push it past 1 KB and go to the audit.
        for (n, len) in [40, 60, 700, 30, 2_000, 20].into_iter().enumerate() {
            run.value.messages.push(Message {
                role: if n % 2 == 0 {
                    Speaker::Assistant
                } else {
                    Speaker::User
                },
                content: vec![Block::Text {
                    text: format!("{n}:{}", "x".repeat(len)),
                }],
            });
            let read = write_and_read(&mut run, &mut items);
            assert_eq!(read.value.messages, run.value.messages, "after message {n}");
            assert_eq!(read.ver, run.ver);
            let record = items.iter().find(|i| i.sk == keys::RUN_SK).unwrap();
            assert!(record.body.len() < 1024, "the run's item stays small");
        }
        let audit = items
            .iter()
            .filter(|i| i.sk.starts_with(keys::AUDIT_PREFIX))
            .count();
        assert!(
            audit >= 2,
            "the long turns were logged: {audit} audit items"
        );
    }

    fn started_run() -> Stored<Run> {
        use crate::domain::ids::{AgentName, PersonId};
        let value = Run::start(
            RunId::parse("run-1").unwrap(),
            TenantId::parse("acme").unwrap(),
            AgentName::parse("expense").unwrap(),
            PersonId::parse("ben").unwrap(),
            None,
            "Settle claim c-102",
            1,
            Utc::now(),
        );
        Stored { value, ver: 0 }
    }

    /// [`started_run`] as its creation leaves it: the run one version on, and its items.
    fn created_run() -> (Stored<Run>, Vec<Item>) {
        let mut run = started_run();
        let mut tx = Tx::new();
        tx.run(IndexShards::DEFAULT, &mut run);
        let items = written(tx);
        run.written();
        (run, items)
    }

    /// The items `tx` writes, as a partition holding only them reads back.
    fn written(tx: Tx) -> Vec<Item> {
        let (writes, _) = tx.into_parts();
        let mut items: Vec<Item> = writes
            .into_iter()
            .map(|write| match write {
                Write::Put { item, .. } => item,
                Write::Delete { .. } => panic!("a run's writes put"),
            })
            .collect();
        items.sort_by(|a, b| a.sk.cmp(&b.sk));
        items
    }

    #[test]
    fn a_new_run_is_one_item_whose_own_fields_are_its_started_event() {
        let (run, items) = created_run();
        assert_eq!(items.len(), 1, "no audit item: {items:?}");
        assert_eq!(items[0].sk, keys::RUN_SK);
        let read = run_from_items(&items, []).unwrap().unwrap();
        let [started] = &read.log[..] else {
            panic!("one event: {:?}", read.log)
        };
        assert_eq!(started.at, run.value.created_at);
        assert_eq!(started.actor, Actor::person(&run.value.requested_by));
        assert_eq!(
            started.event,
            AuditEvent::Started {
                task: "Settle claim c-102".into(),
                requested_by: run.value.requested_by.clone(),
                policy_version: 1,
            }
        );
    }

    #[test]
    fn a_finished_run_holds_the_events_that_finished_it_in_its_own_item_after_the_rest_of_its_log()
    {
        let (mut run, mut items) = created_run();
        let now = run.value.created_at + chrono::Duration::seconds(3);
        run.value
            .messages
            .push(Message::user_text("the claim is paid"));
        run.value.finish("Paid $250.".into(), now).unwrap();
        let mut tx = Tx::new();
        let event = AuditEvent::Done {
            answer: "Paid $250.".into(),
        };
        tx.audit(
            &run.value.tenant,
            AuditEntry::new(&run.value.id, Actor::Agent, event.clone(), now),
        );
        tx.run(IndexShards::DEFAULT, &mut run);
        let (writes, _) = tx.into_parts();
        let [Write::Put { item, condition }] = &writes[..] else {
            panic!("one write, no audit item: {writes:?}")
        };
        assert_eq!(*condition, Condition::VersionIs(1));
        assert!(
            item.gsi1.is_none(),
            "a finished run leaves the running index"
        );
        // The answer is held once, as the run's, and nothing unset is written.
        assert_eq!(item.body.matches("Paid $250.").count(), 1, "{}", item.body);
        assert!(!item.body.contains("null"), "{}", item.body);
        items.retain(|i| i.sk != keys::RUN_SK);
        items.push(item.clone());
        let read = run_from_items(&items, []).unwrap().unwrap();
        let names: Vec<&str> = read.log.iter().map(|e| e.event.name()).collect();
        assert_eq!(names, ["started", "done"]);
        assert_eq!((read.log[1].at, &read.log[1].event), (now, &event));
        assert_eq!(read.run.value.messages, run.value.messages);
        assert_eq!(read.run.value.status, RunStatus::Done);

        // Final events on a run that is not finished are a corrupt item.
        let mut body: serde_json::Value = serde_json::from_str(&item.body).unwrap();
        body["status"] = "running".into();
        let item = Item {
            body: body.to_string(),
            ..item.clone()
        };
        let error = run_from_items(&[item], []).err().expect("refused");
        assert!(matches!(&error, EngineError::Corrupt(why) if why.contains("final events")));
    }

    #[test]
    fn an_event_a_record_holds_reads_back_at_its_place_among_its_transactions_and_after_earlier_ones()
     {
        let (run, mut items) = created_run();
        let (tenant, id) = (run.value.tenant.clone(), run.value.id.clone());
        let paused = |n: usize| AuditEvent::Paused {
            approvals: vec![ApprovalId::parse(&format!("ap-{n}")).unwrap()],
        };
        let entry = |n: usize| AuditEntry::new(&id, Actor::Agent, paused(n), Utc::now());

        // An earlier transaction whose one event a record holds: no audit item at all.
        let mut tx = Tx::new();
        let first = tx.log_slot(&tenant, &id);
        assert!(written(tx).is_empty(), "no audit item for a held event");
        // A later one: an event, a held one, another event.
        let mut tx = Tx::new();
        tx.audit(&tenant, entry(2));
        let held = tx.log_slot(&tenant, &id);
        tx.audit(&tenant, entry(4));
        items.extend(written(tx));
        items.sort_by(|a, b| a.sk.cmp(&b.sk));

        let read = run_from_items(&items, [(held, entry(3)), (first, entry(1))])
            .unwrap()
            .unwrap();
        let events: Vec<&AuditEvent> = read.log.iter().skip(1).map(|e| &e.event).collect();
        assert_eq!(events, [&paused(1), &paused(2), &paused(3), &paused(4)]);

        let error = run_from_items(&items, [(serde_json::from_str("\"x\"").unwrap(), entry(5))])
            .err()
            .expect("refused");
        assert!(matches!(&error, EngineError::Corrupt(why) if why.contains("log slot")));
    }

    /// An approval like the bench's: a reimbursement capped at the limit, one day to decide.
    fn approval() -> Approval {
        use crate::domain::approval::Asking;
        use crate::domain::ids::{AgentName, PersonId, Role};
        use crate::domain::policy::{Requirement, ToolHints};
        let mut call = crate::domain::action::tests::proposed_call(
            "Claim b-000006 is one night of lodging at $480; the limit is $250 a night, so I \
             propose paying $250.",
        );
        call.tenant = TenantId::parse("bench-adf56cda").unwrap();
        call.run_id = RunId::generate();
        call.id = ActionId::generate();
        call.tool_use_id = "toolu_bench_0".into();
        call.args = crate::domain::args::Args::new(serde_json::json!({
            "amount_cents": 25000,
            "claim_id": "b-000006",
            "note": "Lodging is capped at $250 a night.",
        }))
        .unwrap();
        let requirement = Requirement {
            reason: "Reimbursements above $75 need a finance approver.".into(),
            approver_role: Role::parse("finance").unwrap(),
            quorum: 1,
            ttl: std::time::Duration::from_secs(24 * 3600),
            escalate: Vec::new(),
        };
        let now = Utc::now();
        let asking = Asking {
            agent: AgentName::parse("expense").unwrap(),
            hints: ToolHints::default(),
            requested_by: vec![PersonId::parse("emp-000006").unwrap()],
            policy_version: 1,
            opened_at: now,
            expires_at: now + chrono::Duration::hours(24),
        };
        Approval::open(call, &requirement, asking)
    }

    /// The item [`Tx::create_approval`] writes for `approval`.
    fn approval_item(approval: &Approval) -> Item {
        let mut tx = Tx::new();
        tx.create_approval(approval);
        let (mut writes, _) = tx.into_parts();
        assert_eq!(writes.len(), 1);
        let Some(Write::Put { item, .. }) = writes.pop() else {
            panic!("an approval is put")
        };
        item
    }

    fn decided(mut approval: Approval, versions: &[ActionVersion]) -> Approval {
        use crate::domain::approval::{Choice, Decision, DecisionEffect};
        use crate::domain::ids::{DecisionId, PersonId};
        let at = approval.created_at + chrono::Duration::minutes(5);
        for (n, version) in versions.iter().enumerate() {
            let own = *version == approval.action_version;
            approval.decisions.push(Decision {
                decision_id: DecisionId::parse(&format!("bench-{n}")).unwrap(),
                by: PersonId::parse("dana").unwrap(),
                choice: Choice::Approve,
                action_version: *version,
                args_hash: match own {
                    true => approval.args_hash.clone(),
                    false => crate::domain::args::ArgsHash::of_call(
                        &approval.agent,
                        &approval.tool,
                        &crate::domain::args::Args::new(serde_json::json!({"n": n})).unwrap(),
                    ),
                },
                at,
                effect: DecisionEffect::Approved,
                // As the engine writes it: the approval's item holds the `decision` event.
                logged: Some(LogSlot::new(&audit_order(), 0)),
            });
        }
        approval.status = ApprovalStatus::Approved;
        approval.resolved_at = Some(at);
        approval
    }

    #[test]
    fn an_approval_reads_back_whole_from_an_item_that_repeats_neither_its_key_nor_its_own_version()
    {
        let open = approval();
        let other = ActionVersion::FIRST.next();
        let mut full = decided(open.clone(), &[ActionVersion::FIRST, other]);
        full.reminded_at = Some(full.created_at);
        full.superseded_by = Some(ApprovalId::generate());
        for approval in [open, full] {
            let item = approval_item(&approval);
            let body: serde_json::Value = serde_json::from_str(&item.body).unwrap();
            let fields = body.as_object().unwrap();
            assert!(
                !fields.contains_key("args_hash"),
                "its own agent, tool and arguments give it"
            );
            for keyed in ["id", "tenant"] {
                assert!(!fields.contains_key(keyed), "{keyed} is in the key");
            }
            assert!(fields.values().all(|v| !v.is_null()), "{body}");
            let decisions = fields["decisions"].as_array().unwrap();
            for (decision, own) in decisions.iter().zip([true, false]) {
                for name in ["action_version", "args_hash"] {
                    assert_eq!(decision.get(name).is_none(), own, "{name} in {decision}");
                }
            }
            assert_eq!(decode::<Approval>(&item).unwrap().value, approval);
            // The API's form at the same key reads as the same approval.
            let api = Item {
                body: serde_json::to_string(&approval).unwrap(),
                ..item
            };
            assert_eq!(decode::<Approval>(&api).unwrap().value, approval);
        }
    }

    #[test]
    fn an_approval_made_under_the_first_hash_scheme_keeps_its_hash_and_reads_back_whole() {
        let mut legacy = approval();
        legacy.args_hash = serde_json::from_value(serde_json::json!(
            "sha256:b604fd708eeaef79e59d1b70d25ba4a4edcc960282a3aaa0aa2916738bc38b42"
        ))
        .unwrap();
        let item = approval_item(&legacy);
        assert!(
            item.body.contains("\"args_hash\":\"sha256:b604"),
            "{}",
            item.body
        );
        assert_eq!(decode::<Approval>(&item).unwrap().value, legacy);
    }

    #[test]
    fn a_decided_approval_is_one_write_unit_where_its_api_form_is_two() {
        let approval = decided(approval(), &[ActionVersion::FIRST]);
        let item = approval_item(&approval);
        let units = |body: &str| write_units(&item.pk, item.sk.len(), None, body);
        // Its decision resolved it, holding the `decision` event and its place in the log.
        assert!(!item.body.contains(RESOLVED_AT), "{}", item.body);
        assert!(item.body.contains("\"logged\""), "{}", item.body);
        assert_eq!(units(&serde_json::to_string(&approval).unwrap()), 2);
        assert_eq!(units(&item.body), 1);
        // With its entry in the tenant's decided list, and room to spare for longer ids.
        assert!(item.stored_size() <= 1024 - 64, "{}", item.stored_size());
        let open = approval_item(&self::approval());
        assert_eq!(
            write_units(&open.pk, open.sk.len(), open.gsi1.as_ref(), &open.body),
            1
        );
    }

    #[test]
    fn a_resolved_approval_moves_from_its_tenants_pending_list_to_its_resolved_one_newest_first() {
        let open = approval();
        let pending = approval_item(&open)
            .gsi1
            .expect("a waiting approval is listed");
        assert_eq!(pending.pk, keys::pending_index(&open.tenant));
        let decided = decided(open, &[ActionVersion::FIRST]);
        let resolved_at = decided.resolved_at.expect("resolved");
        let listed = approval_item(&decided)
            .gsi1
            .expect("a resolved approval is listed");
        assert_eq!(listed, keys::decided(&decided.tenant, resolved_at));
        assert_eq!(listed.pk, format!("TENANT#{}#DECIDED", decided.tenant));
        // Short and of one width, so a later resolution sorts first as text.
        let later = keys::newest_first(resolved_at + chrono::Duration::milliseconds(1));
        assert_eq!((listed.sk.len(), later.len()), (13, 13));
        assert!(later < listed.sk, "{later} !< {}", listed.sk);
    }

    #[test]
    fn an_approval_item_under_another_key_is_refused_as_corrupt() {
        let item = Item {
            pk: "TENANT#acme#RUN#run-1".into(),
            ..approval_item(&approval())
        };
        let error = decode::<Approval>(&item).unwrap_err();
        assert!(
            matches!(&error, EngineError::Corrupt(why) if why.contains("not an approval's key")),
            "{error}"
        );
    }

    /// The action `approval` asks for, approved when the approval opened.
    fn approved_action(approval: &Approval) -> Action {
        let mut action = approval.awaiting_action();
        action
            .approve(approval.authorized_by(), approval.created_at)
            .unwrap();
        action
    }

    #[test]
    fn a_decided_action_is_its_own_outbox_entry_handed_over_at_the_version_it_is_written() {
        let action = approved_action(&approval());
        let mut tx = Tx::new();
        tx.resume_action(IndexShards::DEFAULT, &action, Condition::VersionIs(1));
        let (writes, outgoing) = tx.into_parts();

        let [Write::Put { item, condition }] = &writes[..] else {
            panic!("one put, and no outbox item: {writes:?}")
        };
        assert_eq!(*condition, Condition::VersionIs(1));
        assert_eq!(item.sk, keys::action_sk(&action.id, action.version));
        let index = item.gsi1.as_ref().expect("in the outbox index");
        assert!(keys::is_outbox(index), "{index:?}");
        assert_eq!(*index, resume_key(IndexShards::DEFAULT, &action));
        assert!(index.sk.starts_with(&keys::sortable(action.updated_at)));
        assert!(outgoing.notices.is_empty());
        let [handed] = &outgoing.resumes[..] else {
            panic!("one resume handed over")
        };
        assert_eq!((handed.ver, &handed.value), (2, &action));
        assert_eq!(resume_message(&handed.value).key(), action.key());
        assert!(!keys::is_outbox(&reconcile_key(
            IndexShards::DEFAULT,
            &action,
            action.updated_at
        )));
    }

    #[test]
    fn a_claim_keeps_the_outbox_entry_it_consumed_and_one_taken_out_enters_the_reconcile_index() {
        let approval = approval();
        let approved = approved_action(&approval);
        let read = Stored {
            value: approved.clone(),
            ver: 2,
        };
        let later = approval.created_at + chrono::Duration::seconds(5);
        for queued in [true, false] {
            let mut tx = Tx::new();
            let logged = tx.log_slot(&approved.tenant, &approved.run_id);
            let mut claimed = approved.clone();
            claimed
                .claim(later, Actor::system("resume"), logged)
                .unwrap();
            tx.claim_action(IndexShards::DEFAULT, &read, queued, &claimed);
            let [Write::Put { item, condition }] = &tx.into_parts().0[..] else {
                panic!("the claim is one write, its event held by the action")
            };
            assert_eq!(*condition, Condition::VersionIs(2));
            let index = item.gsi1.clone().expect("indexed while it runs");
            match queued {
                true => assert_eq!(index, resume_key(IndexShards::DEFAULT, &approved)),
                false => assert_eq!(
                    index,
                    reconcile_key(IndexShards::DEFAULT, &claimed, later + STALE_EXECUTION)
                ),
            }
            let read_back = decode::<Action>(item).unwrap().value;
            let (slot, entry) = held_by_action(&read_back).expect("its executing event");
            assert_eq!(slot.parts().map(|(_, place)| place), Some(0));
            assert_eq!((entry.event.name(), entry.at), ("executing", later));
        }
    }

    #[test]
    fn an_audit_order_is_as_long_as_a_write_sizes_it() {
        assert_eq!(audit_order().len(), AUDIT_ORDER_LEN);
    }

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
