//! The transaction builder: records, their audit events and their outbox messages, written
//! together.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::approval::approval_body;
use super::index::{action_index, approval_index, resume_key, run_index};
use super::keys::IndexShards;
use super::log::{
    AUDIT_ORDER_LEN, AUDIT_PART, AuditItem, FINAL_EVENTS, FINISHED_RUN_ITEM, LoggedEvent, OwnFinal,
    RunBodies, audit_order, write_units, write_units_of,
};
use super::open::{self, Opening, SlotChange};
use super::outbox::{OutboxEntry, OutboxMessage, Outgoing};
use super::windows;
use super::{Stored, keys};
use crate::domain::action::Action;
use crate::domain::action::ActionStatus;
use crate::domain::approval::{Approval, ApprovalKind, ApprovalStatus};
use crate::domain::audit::AuditEntry;
use crate::domain::budget;
use crate::domain::conversation::TurnUsage;
use crate::domain::ids::{ActionId, AgentName, OutboxId, RunId, TenantId};
use crate::domain::log_slot::LogSlot;
use crate::domain::policy::VerdictKind;
use crate::domain::policy::history::HistorySlot;
use crate::domain::run::Run;
use crate::ports::counters::{
    Count, DECISION_BUCKETS, DecisionOutcome, ExecutionOutcome, ModelOutcome, RuleMode, Series,
    TokenKind,
};
use crate::ports::store::{Condition, IndexKey, Item, Write};

/// Where an action version is kept: in its run's partition.
fn action_key(action: &Action) -> (String, String) {
    (
        keys::run_pk(&action.tenant, &action.run_id),
        keys::action_sk(&action.id, action.version),
    )
}

/// One atomic change: records, their audit events and their outbox messages.
#[derive(Default)]
pub struct Tx {
    writes: Vec<Write>,
    outgoing: Outgoing,
    /// The audit events of this transaction, by the partition of the run they are about.
    audit: Vec<(String, AuditItem)>,
    /// The writes of runs that finish here, with their answer and error: each holds this
    /// transaction's events about its run.
    finished: Vec<(usize, OwnFinal)>,
    /// Where this transaction sits in its runs' logs: its audit items' key, made when first needed.
    order: Option<String>,
    /// What it does to requesters' open approvals, one change per approval's slot.
    open: Vec<SlotChange>,
    /// What it counts, kept with it where the store keeps counts ([`Counters`]).
    ///
    /// [`Counters`]: crate::ports::counters::Counters
    counts: Vec<Count>,
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
    /// gives it; one that waits on a person is its requester's open approval.
    pub fn create_approval(&mut self, approval: &Approval) {
        if approval.status == ApprovalStatus::AwaitingApproval {
            open::count(&mut self.open, approval, 1);
        }
        self.put_approval(approval, Condition::NotExists);
    }

    /// An approval that stopped waiting (decided, superseded, expired, cancelled, answered),
    /// holding on `read` as [`Tx::update_approval_if`] does: its requester has one approval
    /// fewer open, unless the new version of an edit in this transaction waits in its place.
    /// A call that will not run (rejected, expired, cancelled) stops counting in the history
    /// windows: its slots are voided, with no read.
    pub fn settle_approval(&mut self, approval: &Approval, read: Condition) {
        debug_assert_ne!(approval.status, ApprovalStatus::AwaitingApproval);
        open::count(&mut self.open, approval, -1);
        self.count_decision(approval);
        let voided = matches!(
            approval.status,
            ApprovalStatus::Rejected | ApprovalStatus::Expired | ApprovalStatus::Cancelled
        );
        if voided {
            let voids = approval
                .counted
                .iter()
                .map(|slot| windows::void(slot, &approval.action_id));
            self.writes.extend(voids);
        }
        self.put_approval(approval, read);
    }

    /// Counts one of `agent`'s things in this transaction, with the seconds it took.
    pub fn count(&mut self, tenant: &TenantId, agent: &AgentName, series: Series, seconds: f64) {
        self.counts.push(Count {
            seconds,
            ..Count::one(tenant, agent, series)
        });
    }

    /// A model request that came back, with the tokens its answer says it spent.
    pub fn count_model_turn(&mut self, run: &Run, usage: &TurnUsage) {
        let (tenant, agent) = (&run.tenant, &run.agent);
        self.count(tenant, agent, Series::ModelRequests(ModelOutcome::Ok), 0.0);
        let spent = [usage.input_tokens, usage.output_tokens];
        for (kind, tokens) in TokenKind::ALL.into_iter().zip(spent) {
            if let Some(n) = tokens.filter(|n| *n > 0) {
                self.counts.push(Count {
                    n,
                    ..Count::one(tenant, agent, Series::ModelTokens(kind))
                });
            }
        }
    }

    /// A decision people made on an approval they were asked for (approved, edited, rejected),
    /// or that nobody made in time (expired), timed from the approval's creation. A
    /// cancellation decides nothing, and a recovery's answer settles a call, not an approval.
    fn count_decision(&mut self, approval: &Approval) {
        let outcome = match approval.status {
            _ if approval.kind != ApprovalKind::Action => return,
            ApprovalStatus::Approved => DecisionOutcome::Approved,
            ApprovalStatus::Superseded => DecisionOutcome::Edited,
            ApprovalStatus::Rejected => DecisionOutcome::Rejected,
            ApprovalStatus::Expired => DecisionOutcome::Expired,
            _ => return,
        };
        let resolved = approval.resolved_at.unwrap_or(approval.created_at);
        let seconds = (resolved - approval.created_at).num_milliseconds().max(0) as f64 / 1000.0;
        let bucket = DECISION_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(DECISION_BUCKETS.len());
        let (tenant, agent) = (&approval.tenant, &approval.agent);
        self.count(tenant, agent, Series::Decisions(outcome), seconds);
        self.count(tenant, agent, Series::DecidedWithin(bucket), 0.0);
    }

    /// Counts policy's ruling on a proposed call of `agent`'s, and what its log-only rules would
    /// have made of it, where it has some.
    pub fn count_ruling(&mut self, agent: &AgentName, action: &Action, verdict: VerdictKind) {
        let tenant = &action.tenant;
        self.count(
            tenant,
            agent,
            Series::Rulings(verdict, RuleMode::Enforce),
            0.0,
        );
        if let Some(log_only) = &action.log_only {
            let series = Series::Rulings(log_only.outcome, RuleMode::LogOnly);
            self.count(tenant, agent, series, 0.0);
        }
    }

    /// Counts the outcome first recorded for a call of `agent`'s that ran.
    pub fn count_execution(&mut self, agent: &AgentName, action: &Action) {
        let outcome = match action.status {
            ActionStatus::Succeeded => ExecutionOutcome::Succeeded,
            ActionStatus::Failed => ExecutionOutcome::Failed,
            ActionStatus::Unknown => ExecutionOutcome::Unknown,
            _ => return,
        };
        self.count(&action.tenant, agent, Series::Executions(outcome), 0.0);
    }

    /// Counts a new call in a history window: its slot, which must not be taken yet.
    pub fn count_call(&mut self, slot: &HistorySlot, action: &ActionId, amount: i64) {
        self.writes.push(windows::claim(slot, action, amount));
    }

    /// Counts an edited call's new amount in the slot its first version took.
    pub fn recount_call(&mut self, slot: &HistorySlot, action: &ActionId, amount: i64) {
        self.writes.push(windows::recount(slot, action, amount));
    }

    /// The requesters whose approvals this transaction opens: the engine checks and writes
    /// each one's count with it ([`open::count_writes`]).
    pub fn openings(&self) -> Vec<Opening> {
        open::openings(&self.open)
    }

    /// Whether this transaction opens any approval (and so has counts to check).
    pub fn opens_approvals(&self) -> bool {
        self.open.iter().any(|change| change.opens())
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
    ///
    /// [`run_from_items`]: super::run_from_items
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
    /// run ride in it ([`Tx::into_parts`]) instead of an audit item of their own. The model
    /// turns the run has not counted yet are counted with it. After the commit,
    /// [`Stored::written`].
    ///
    /// [`started`]: super::log::started
    pub fn run(&mut self, shards: IndexShards, run: &mut Stored<Run>) {
        let turns = std::mem::take(&mut run.value.uncounted_turns);
        if turns > 0 {
            let asked = Series::ModelRequests(ModelOutcome::Ok);
            self.counts.push(Count {
                n: turns,
                ..Count::one(&run.value.tenant, &run.value.agent, asked)
            });
        }
        let logged = run.value.stored_messages.min(run.value.messages.len());
        let bodies = RunBodies::new(&run.value, logged);
        let value = &run.value;
        let pk = keys::run_pk(&value.tenant, &value.id);
        let index = run_index(shards, value);
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
            self.write_run(run, (logged, keep), index, body, condition);
            self.finished
                .push((self.writes.len() - 1, OwnFinal::of(&run.value)));
            return;
        }
        let audit = self
            .audit
            .iter()
            .find(|(p, _)| *p == pk)
            .map(|(_, item)| item);
        let order_len = keys::AUDIT_PREFIX.len() + AUDIT_ORDER_LEN;
        let audit_units = |body_len| write_units_of(&pk, order_len, None, body_len);
        // The transaction's audit item as it stands (its events), and the same without any
        // messages, which a split then adds.
        let (unmoved, events_only) = match audit {
            None => (0, String::from("{}")),
            Some(item) => {
                let serialize = |item: &AuditItem| {
                    serde_json::to_string(item).expect("engine records serialize")
                };
                // Most often it holds its events alone: then the two are one, serialized once.
                let alone = item.messages.is_empty() && item.from == 0;
                let only_events = || AuditItem {
                    events: item.events.clone(),
                    ..AuditItem::default()
                };
                let events_only = match alone {
                    true => serialize(item),
                    false => serialize(&only_events()),
                };
                debug_assert!(!alone || events_only == serialize(&only_events()));
                let unmoved = if item.events.is_empty() && item.messages.is_empty() {
                    0
                } else if alone {
                    audit_units(events_only.len())
                } else {
                    audit_units(serialize(item).len())
                };
                (unmoved, events_only)
            }
        };
        let mut best: Option<(usize, usize, String)> = None;
        for keep in (logged..=value.messages.len()).rev() {
            let body = bodies.body(keep);
            let run_units = write_units(&pk, keys::RUN_SK.len(), index.as_ref(), &body);
            if run_units > 1 && keep < value.messages.len() {
                // A message kept in the run's item is paid again at each of its writes.
                continue;
            }
            let units = run_units
                + match keep > logged {
                    true => audit_units(bodies.moved_len(&events_only, keep)),
                    false => unmoved,
                };
            if best.as_ref().is_none_or(|(least, _, _)| units < *least) {
                best = Some((units, keep, body));
            }
        }
        let (_, keep, body) = best.expect("at least one split");
        self.write_run(run, (logged, keep), index, body, condition);
    }

    /// The run's item with `body`, the messages from `logged` to `keep` moved into this
    /// transaction's audit item (those after stay in the run's item).
    fn write_run(
        &mut self,
        run: &mut Stored<Run>,
        (logged, keep): (usize, usize),
        index: Option<IndexKey>,
        body: String,
        condition: Condition,
    ) {
        let pk = keys::run_pk(&run.value.tenant, &run.value.id);
        if keep > logged {
            let item = self.audit_item(pk.clone());
            item.from = logged;
            item.messages = run.value.messages[logged..keep].to_vec();
        }
        run.value.logging_messages = Some(keep);
        self.put_body(pk, keys::RUN_SK.to_string(), index, body, condition);
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

    /// The writes, each run's audit item last (a finished run's events in its own item), what
    /// they count, and what to deliver once they commit.
    pub fn into_parts(mut self) -> (Vec<Write>, Vec<Count>, Outgoing) {
        let slots: Vec<Write> = open::slot_writes(&self.open).collect();
        self.writes.extend(slots);
        for (at, own) in std::mem::take(&mut self.finished) {
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
            let events = own.events(&audit.events);
            if item.body.len() + events.len() > budget::AUDIT_ITEM {
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
        (self.writes, self.counts, self.outgoing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::identity::Actor;
    use crate::engine::records::approval::tests::approval;
    use crate::engine::records::{
        STALE_EXECUTION, decode, held_by_action, reconcile_key, resume_message,
    };

    /// The action `approval` asks for, approved when the approval opened.
    fn approved_action(approval: &Approval) -> Action {
        let mut action = approval.awaiting_action();
        action
            .approve(approval.authorized_by(), approval.created_at)
            .unwrap();
        action
    }

    /// The slot writes of a transaction, as (put or delete, sort key).
    fn slots(tx: Tx) -> Vec<(&'static str, String)> {
        tx.into_parts()
            .0
            .into_iter()
            .filter(|w| w.key().1.starts_with(keys::OPEN_SLOT_PREFIX))
            .map(|w| match w {
                Write::Put { item, .. } => ("put", item.sk),
                Write::Delete { sk, .. } => ("delete", sk),
            })
            .collect()
    }

    #[test]
    fn an_approval_opened_takes_a_slot_settled_frees_it_and_edited_to_a_version_that_waits_keeps_it()
     {
        let waiting = approval();
        let slot = keys::open_slot_sk(&waiting.action_id);
        let resolved = |status| {
            let mut resolved = waiting.clone();
            resolved.status = status;
            resolved.resolved_at = Some(waiting.created_at);
            resolved
        };
        let settled = resolved(ApprovalStatus::Approved);
        let mut next = waiting.clone();
        next.id = crate::domain::ids::ApprovalId::generate();
        next.action_version = waiting.action_version.next();

        let mut opened = Tx::new();
        opened.create_approval(&waiting);
        assert_eq!(opened.openings().len(), 1);
        assert_eq!(slots(opened), [("put", slot.clone())]);

        let mut decided = Tx::new();
        decided.settle_approval(&settled, Condition::VersionIs(1));
        assert!(decided.openings().is_empty(), "settling reads no count");
        assert_eq!(slots(decided), [("delete", slot)]);

        let mut edited = Tx::new();
        let superseded = resolved(ApprovalStatus::Superseded);
        edited.settle_approval(&superseded, Condition::VersionIs(1));
        edited.create_approval(&next);
        assert!(edited.openings().is_empty());
        assert!(slots(edited).is_empty(), "the new version keeps the slot");

        let mut recovery = waiting.clone();
        recovery.kind = crate::domain::approval::ApprovalKind::Recovery;
        let mut asked = Tx::new();
        asked.create_approval(&recovery);
        assert!(slots(asked).is_empty(), "a recovery is never counted");
    }

    #[test]
    fn a_decided_action_is_its_own_outbox_entry_handed_over_at_the_version_it_is_written() {
        let action = approved_action(&approval());
        let mut tx = Tx::new();
        tx.resume_action(IndexShards::DEFAULT, &action, Condition::VersionIs(1));
        let (writes, _, outgoing) = tx.into_parts();

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
}
