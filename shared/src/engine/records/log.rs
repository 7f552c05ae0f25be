//! A run's log and conversation in its partition: audit items, the run's item, and the run
//! read back from them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Stored, decode, keys};
use crate::domain::action::Action;
use crate::domain::approval::Approval;
use crate::domain::audit::{AuditEntry, AuditEvent};
use crate::domain::budget;
use crate::domain::conversation::Message;
use crate::domain::identity::{Actor, Standing};
use crate::domain::ids::{AgentName, PersonId, RunId, TenantId};
use crate::domain::is_zero;
use crate::domain::log_slot::LogSlot;
use crate::domain::run::{GateOrigin, PausedTurn, Run, RunStatus};
use crate::engine::error::EngineError;
use crate::ports::store::{IndexKey, Item};

/// The length of an [`audit_order`]: 17 digits, `#`, 8 hex digits.
pub(super) const AUDIT_ORDER_LEN: usize = 26;

/// Audit keys sort in the order this process wrote them, and never collide across processes.
pub(super) fn audit_order() -> String {
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
pub(super) struct LoggedEvent {
    pub(super) at: DateTime<Utc>,
    pub(super) actor: Actor,
    #[serde(flatten)]
    pub(super) event: AuditEvent,
}

/// The audit item of one transaction about one run: its events, oldest first, and the messages
/// of the run's conversation that transaction adds (the turns since the run was last written).
/// Written once, must-not-exist, in the transaction whose change it records; never rewritten.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(super) struct AuditItem {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) events: Vec<LoggedEvent>,
    /// The position of the first of `messages` in the conversation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) from: usize,
    /// The transaction's events about the run so far, those its records hold counted.
    #[serde(skip)]
    pub(super) places: usize,
}

/// Between a transaction's audit key and the number of a part past its first
/// (`RUN#<order>~01`): parts sort after the first and in order, and read back as one item.
pub(super) const AUDIT_PART: char = '~';

impl AuditItem {
    /// This item's body, or the bodies of the parts it is split into where it is past
    /// [`budget::AUDIT_ITEM`]: the events, then the messages, in order, each part as full as
    /// it may be. Every event and message is within its share, so each part fits the store.
    pub(super) fn bodies(self) -> Vec<String> {
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
pub(super) const FINAL_EVENTS: &str = "events";
/// A finished run's own answer and error, which the events that finished it, held in its item,
/// need not repeat: a `done` event's answer and a `failed` event's error are held once, in the
/// run's field of the same name.
pub(super) struct OwnFinal {
    answer: Option<String>,
    error: Option<String>,
}

impl OwnFinal {
    pub(super) fn of(run: &Run) -> Self {
        Self {
            answer: run.answer.clone(),
            error: run.error.clone(),
        }
    }

    /// The events as the run's item holds them ([`FINAL_EVENTS`]), serialized straight from
    /// them: a `done` event's answer or a `failed` event's error is left out where it is the
    /// run's own.
    pub(super) fn events(&self, events: &[LoggedEvent]) -> String {
        /// An event without its one field, which is the run's.
        #[derive(Serialize)]
        struct Bare<'a> {
            at: &'a DateTime<Utc>,
            actor: &'a Actor,
            event: &'a str,
        }
        #[derive(Serialize)]
        #[serde(untagged)]
        enum Held<'a> {
            Whole(&'a LoggedEvent),
            Bare(Bare<'a>),
        }
        let held: Vec<Held> = events
            .iter()
            .map(|logged| {
                let own = match &logged.event {
                    AuditEvent::Done { answer } => self.answer.as_ref() == Some(answer),
                    AuditEvent::Failed { error } => self.error.as_ref() == Some(error),
                    _ => false,
                };
                match own {
                    true => Held::Bare(Bare {
                        at: &logged.at,
                        actor: &logged.actor,
                        event: logged.event.name(),
                    }),
                    false => Held::Whole(logged),
                }
            })
            .collect();
        serde_json::to_string(&held).expect("engine records serialize")
    }

    /// An event as [`OwnFinal::events`] wrote it, its one field filled back where it was left
    /// out (a field the event holds is kept).
    fn fill(&self, event: &mut serde_json::Value) {
        let own = match event["event"].as_str() {
            Some("done") => self.answer.as_ref().map(|answer| ("answer", answer)),
            Some("failed") => self.error.as_ref().map(|error| ("error", error)),
            _ => None,
        };
        if let (Some((field, own)), Some(event)) = (own, event.as_object_mut()) {
            event.entry(field).or_insert_with(|| own.as_str().into());
        }
    }
}
const RECENT_MESSAGES: &str = "messages_recent";

/// What a run's item may weigh and still be one write unit on DynamoDB (1 KB): the messages
/// after the logged ones ride in the run's item while it stays within this, and move into the
/// audit item of the write that would take it past.
const RUN_ITEM_BUDGET: usize = 1024;

/// What a finished run's item, written for the last time, may hold with its messages and its
/// last transaction's events: past it, they go to audit items instead.
pub(super) const FINISHED_RUN_ITEM: usize = budget::AUDIT_ITEM / 2;

/// A run's item for each split of its conversation (the messages from `keep` on in the item,
/// those before in audit items): the run's own fields and each message serialized once, not
/// once per split tried.
pub(super) struct RunBodies {
    /// The run's fields but its conversation: a JSON object without its closing brace.
    fields: String,
    /// The messages from `from` on, each serialized.
    messages: Vec<String>,
    from: usize,
}

/// A run's own fields as its item holds them, serialized straight from the run: every field
/// but its conversation (serialized message by message, [`RunBodies`]), in the run's order, an
/// unset one left out (it reads back unset).
#[derive(Serialize)]
struct StoredRun<'a> {
    id: &'a RunId,
    tenant: &'a TenantId,
    agent: &'a AgentName,
    requested_by: &'a PersonId,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_by: Option<&'a PersonId>,
    #[serde(skip_serializing_if = "Standing::is_empty")]
    standing: &'a Standing,
    task: &'a str,
    status: RunStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    paused: Option<&'a PausedTurn>,
    #[serde(skip_serializing_if = "Option::is_none")]
    answer: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    policy_version: u32,
    /// In seconds, as the run's own form has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    approval_ttl: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gate: Option<&'a GateOrigin>,
    #[serde(skip_serializing_if = "is_zero")]
    drives: u32,
    #[serde(skip_serializing_if = "is_zero")]
    redriven: u32,
    created_at: &'a DateTime<Utc>,
    updated_at: &'a DateTime<Utc>,
}

impl<'a> StoredRun<'a> {
    fn of(run: &'a Run) -> Self {
        // Every field named: one added to `Run` fails to compile here until it is stored.
        let Run {
            id,
            tenant,
            agent,
            requested_by,
            started_by,
            standing,
            task,
            status,
            messages: _,
            paused,
            answer,
            error,
            policy_version,
            approval_ttl,
            gate,
            drives,
            redriven,
            created_at,
            updated_at,
            stored_messages: _,
            logging_messages: _,
            written_messages: _,
            uncounted_turns: _,
        } = run;
        Self {
            id,
            tenant,
            agent,
            requested_by,
            started_by: started_by.as_ref(),
            standing,
            task,
            status: *status,
            paused: paused.as_ref(),
            answer: answer.as_deref(),
            error: error.as_deref(),
            policy_version: *policy_version,
            approval_ttl: approval_ttl.map(|ttl| ttl.as_secs()),
            gate: gate.as_ref(),
            drives: *drives,
            redriven: *redriven,
            created_at,
            updated_at,
        }
    }
}

impl RunBodies {
    pub(super) fn new(run: &Run, from: usize) -> Self {
        // The fields alone: the messages are serialized one by one below, not twice.
        let mut fields =
            serde_json::to_string(&StoredRun::of(run)).expect("engine records serialize");
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

    /// How long an audit item whose JSON without messages is `events_only` becomes with the
    /// messages from `from` to `keep` (past `from`) moved into it, as serde_json writes it:
    /// counted from the messages serialized here, not by serializing it once per split tried.
    pub(super) fn moved_len(&self, events_only: &str, keep: usize) -> usize {
        let moved = &self.messages[..keep - self.from];
        let messages = moved.iter().map(String::len).sum::<usize>() + moved.len() - 1;
        // `{}` has no field before the messages to follow with a comma.
        let separator = usize::from(events_only.len() > "{}".len());
        let from = match self.from {
            0 => 0,
            from => ",\"from\":".len() + from.to_string().len(),
        };
        events_only.len() - "}".len()
            + separator
            + "\"messages\":[".len()
            + messages
            + "]".len()
            + from
            + "}".len()
    }

    /// The item with the messages from `keep` on (`keep` at least `from`).
    pub(super) fn body(&self, keep: usize) -> String {
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
pub(super) fn write_units(pk: &str, sk_len: usize, index: Option<&IndexKey>, body: &str) -> usize {
    write_units_of(pk, sk_len, index, body.len())
}

/// [`write_units`] of a body `body_len` bytes long.
pub(super) fn write_units_of(
    pk: &str,
    sk_len: usize,
    index: Option<&IndexKey>,
    body_len: usize,
) -> usize {
    let index = index.map_or(0, |k| {
        "gsi1pk".len() + k.pk.len() + "gsi1sk".len() + k.sk.len()
    });
    let ver = "ver".len() + 21;
    let bytes = "pk".len() + pk.len() + "sk".len() + sk_len + ver + "body".len() + body_len;
    (bytes + index).div_ceil(RUN_ITEM_BUDGET).max(1)
}

/// A run as the items of its partition hold it.
pub struct RunRead {
    /// With its whole conversation.
    pub run: Stored<Run>,
    /// Its audit log, oldest first.
    pub log: Vec<AuditEntry>,
}

/// The conversation an audit item adds, its events skipped unread: all a driver needs of it.
#[derive(Deserialize)]
struct LoggedMessages {
    #[serde(default)]
    messages: Vec<Message>,
    #[serde(default)]
    from: usize,
}

/// The run alone, as [`run_from_items`] reads it, without its log: a driver needs the
/// conversation, not the history, so the audit items' events are skipped unread.
pub fn run_alone_from_items(items: &[Item]) -> Result<Option<Stored<Run>>, EngineError> {
    let (record, logged) = partition(items, |_, item| {
        let part = decode::<LoggedMessages>(item)?.value;
        Ok((part.from, part.messages))
    })?;
    match record {
        Some(record) => Ok(Some(decode_run(record, logged)?.0)),
        None => Ok(None),
    }
}

/// The conversation the audit items of a run add: each item's messages with the position of
/// the first of them, in the order the items were read.
type Logged = Vec<(usize, Vec<Message>)>;

/// A run's partition as its readers take it: the run's item, and the conversation its audit
/// items add, each audit item given to `audit` with its transaction's order (a transaction's
/// item split in parts: each part continues the one before).
fn partition<'a>(
    items: &'a [Item],
    mut audit: impl FnMut(&'a str, &Item) -> Result<(usize, Vec<Message>), EngineError>,
) -> Result<(Option<&'a Item>, Logged), EngineError> {
    let mut record = None;
    let mut logged = Vec::new();
    for item in items {
        if item.sk == keys::RUN_SK {
            record = Some(item);
        } else if let Some(order) = item.sk.strip_prefix(keys::AUDIT_PREFIX) {
            let order = order.split(AUDIT_PART).next().unwrap_or(order);
            let (from, messages) = audit(order, item)?;
            if !messages.is_empty() {
                logged.push((from, messages));
            }
        }
    }
    Ok((record, logged))
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
    let mut log = Log::default();
    let (record, logged) = partition(items, |order, item| {
        let audit = decode::<AuditItem>(item)?.value;
        log.listed(order, audit.events);
        Ok((audit.from, audit.messages))
    })?;
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
pub(super) fn started(run: &Run) -> AuditEntry {
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

/// A run's item as read back: [`StoredRun`]'s fields, in the forms [`Run`]'s own are
/// serialized in, and the item's own fields, named as the constants name them
/// ([`LOGGED_MESSAGES`], [`RECENT_MESSAGES`], [`FINAL_EVENTS`]). Deserialized straight from the
/// body, not through a JSON value.
#[derive(Deserialize)]
struct LoadedRun {
    id: RunId,
    tenant: TenantId,
    agent: AgentName,
    requested_by: PersonId,
    #[serde(default)]
    started_by: Option<PersonId>,
    #[serde(default)]
    standing: Standing,
    task: String,
    status: RunStatus,
    #[serde(default)]
    paused: Option<PausedTurn>,
    #[serde(default)]
    answer: Option<String>,
    #[serde(default)]
    error: Option<String>,
    policy_version: u32,
    /// In seconds.
    #[serde(default)]
    approval_ttl: Option<u64>,
    #[serde(default)]
    gate: Option<GateOrigin>,
    #[serde(default)]
    drives: u32,
    #[serde(default)]
    redriven: u32,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    messages_logged: usize,
    /// Absent when empty, as the other lists.
    #[serde(default)]
    messages_recent: Vec<Message>,
    /// Each as [`OwnFinal::events`] wrote it.
    #[serde(default)]
    events: Vec<serde_json::Value>,
}

/// A run from its item and its conversation: the messages its audit items hold (each item's,
/// from its position; `parts` is every audit item's with messages), then those the run's item
/// carries. With it, the events the item holds if the run is finished.
fn decode_run(
    item: &Item,
    mut parts: Logged,
) -> Result<(Stored<Run>, Vec<LoggedEvent>), EngineError> {
    let corrupt = |why: String| EngineError::Corrupt(format!("{}/{}: {why}", item.pk, item.sk));
    let loaded: LoadedRun = serde_json::from_str(&item.body).map_err(|e| corrupt(e.to_string()))?;
    if !loaded.events.is_empty() && !loaded.status.is_finished() {
        let status = loaded.status;
        return Err(corrupt(format!("a {status} run holds final events")));
    }
    let (logged, recent, finals) = (
        loaded.messages_logged,
        loaded.messages_recent,
        loaded.events,
    );
    // Every field named: one added to `Run` fails to compile here until it is read.
    let mut run = Run {
        id: loaded.id,
        tenant: loaded.tenant,
        agent: loaded.agent,
        requested_by: loaded.requested_by,
        started_by: loaded.started_by,
        standing: loaded.standing,
        messages: vec![Message::user_text(loaded.task.clone())],
        task: loaded.task,
        status: loaded.status,
        paused: loaded.paused,
        answer: loaded.answer,
        error: loaded.error,
        policy_version: loaded.policy_version,
        approval_ttl: loaded.approval_ttl.map(std::time::Duration::from_secs),
        gate: loaded.gate,
        drives: loaded.drives,
        redriven: loaded.redriven,
        created_at: loaded.created_at,
        updated_at: loaded.updated_at,
        stored_messages: logged,
        logging_messages: None,
        written_messages: 0,
        uncounted_turns: 0,
    };
    // Only a finished run's item holds events, and only they need its answer and error.
    let last = match finals.is_empty() {
        true => Vec::new(),
        false => {
            let own = OwnFinal::of(&run);
            finals
                .into_iter()
                .map(|mut event| {
                    own.fill(&mut event);
                    serde_json::from_value(event).map_err(|e| corrupt(e.to_string()))
                })
                .collect::<Result<Vec<LoggedEvent>, _>>()?
        }
    };
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
    run.written_messages = run.messages.len();
    let run = Stored {
        value: run,
        ver: item.ver,
    };
    Ok((run, last))
}

impl Stored<Run> {
    /// The run's write ([`Tx::run`]) committed: its item is one version on, and the messages
    /// that write moved into its audit item are logged, and every message it holds is written.
    ///
    /// [`Tx::run`]: super::Tx::run
    pub fn written(&mut self) {
        if let Some(logged) = self.value.logging_messages.take() {
            self.value.stored_messages = logged;
        }
        self.value.written_messages = self.value.messages.len();
        self.ver += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::{ApprovalId, TenantId};
    use crate::domain::run::RunStatus;
    use crate::engine::records::{IndexShards, Tx};
    use crate::ports::store::{Condition, Write};

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

    #[test]
    fn a_run_read_alone_skips_its_events_and_is_the_run_its_whole_read_gives() {
        use crate::domain::conversation::{Block, Speaker};
        let mut run = started_run();
        let mut items = Vec::new();
        write_and_read(&mut run, &mut items);
        for (n, len) in [900, 1_500, 30].into_iter().enumerate() {
            run.value.messages.push(Message {
                role: Speaker::Assistant,
                content: vec![Block::Text {
                    text: format!("{n}:{}", "x".repeat(len)),
                }],
            });
            let mut tx = Tx::new();
            let event = AuditEvent::Resumed {
                results: n,
                why: None,
            };
            let at = run.value.updated_at;
            tx.audit(
                &run.value.tenant,
                AuditEntry::new(&run.value.id, Actor::system("test"), event, at),
            );
            tx.run(IndexShards::DEFAULT, &mut run);
            items.extend(written(tx));
            run.written();
        }
        items.sort_by(|a, b| a.sk.cmp(&b.sk));
        let whole = run_from_items(&items, []).unwrap().unwrap();
        assert_eq!(
            whole.log.len(),
            4,
            "started and the three events: {:?}",
            whole.log
        );
        let alone = run_alone_from_items(&items).unwrap().expect("the run");
        assert_eq!(alone.value, whole.run.value);
        assert_eq!(alone.value.messages, run.value.messages);
        assert_eq!(
            (
                alone.ver,
                alone.value.stored_messages,
                alone.value.written_messages
            ),
            (whole.run.ver, whole.run.value.stored_messages, 4)
        );
        let audit_only: Vec<Item> = items
            .iter()
            .filter(|i| i.sk != keys::RUN_SK)
            .cloned()
            .collect();
        assert!(run_alone_from_items(&audit_only).unwrap().is_none());
    }

    #[test]
    fn an_audit_items_length_with_moved_messages_is_counted_as_serde_json_writes_it() {
        use crate::domain::conversation::{Block, Speaker};
        let mut run = started_run().value;
        for n in 0..4 {
            run.messages.push(Message {
                role: Speaker::Assistant,
                content: vec![Block::Text {
                    text: format!("{n}: \"quoted\", é, {}", "x".repeat(n * 7)),
                }],
            });
        }
        let event = LoggedEvent {
            at: run.updated_at,
            actor: Actor::system("test"),
            event: AuditEvent::Resumed {
                results: 2,
                why: None,
            },
        };
        for events in [vec![], vec![event.clone()], vec![event.clone(), event]] {
            let events_only = AuditItem {
                events: events.clone(),
                ..AuditItem::default()
            };
            let events_only = serde_json::to_string(&events_only).unwrap();
            for from in 0..run.messages.len() {
                let bodies = RunBodies::new(&run, from);
                for keep in from + 1..=run.messages.len() {
                    let moved = AuditItem {
                        events: events.clone(),
                        messages: run.messages[from..keep].to_vec(),
                        from,
                        places: 0,
                    };
                    let written = serde_json::to_string(&moved).unwrap();
                    assert_eq!(
                        bodies.moved_len(&events_only, keep),
                        written.len(),
                        "{} events, messages {from}..{keep}: {written}",
                        events.len()
                    );
                }
            }
        }
    }

    #[test]
    fn a_runs_item_holds_the_runs_own_fields_but_its_conversation_and_its_unset_ones() {
        use crate::domain::run::{GateOrigin, GateVia, PausedTurn};
        let mut run = started_run().value;
        run.started_by = Some(PersonId::parse("ops").unwrap());
        run.standing = crate::domain::identity::Standing {
            roles: [crate::domain::ids::Role::parse("finance").unwrap()].into(),
            claims: [("department".to_string(), "treasury".to_string())].into(),
        };
        run.paused = Some(PausedTurn { calls: vec![] });
        run.answer = Some("paid".into());
        run.error = Some("none".into());
        run.approval_ttl = Some(std::time::Duration::from_secs(3600));
        run.gate = Some(GateOrigin {
            via: GateVia::Api,
            call_key: "k".into(),
            call_id: Some("c".into()),
            conversation: None,
            asked: None,
        });
        run.drives = 2;
        run.redriven = 1;
        let own_fields = |run: &Run| {
            let mut own = serde_json::to_value(run).unwrap();
            let own = own.as_object_mut().unwrap();
            own.remove("messages");
            own.retain(|_, value| !value.is_null());
            own.clone()
        };
        let stored = |run: &Run| {
            let body = RunBodies::new(run, 1).body(1);
            let mut stored: serde_json::Value = serde_json::from_str(&body).unwrap();
            let stored = stored.as_object_mut().unwrap();
            assert!(stored.remove(LOGGED_MESSAGES).is_some());
            assert!(stored.remove(RECENT_MESSAGES).is_some());
            stored.clone()
        };
        // And each reads back as it was.
        let read = |run: &Run| {
            let item = Item {
                pk: keys::run_pk(&run.tenant, &run.id),
                sk: keys::RUN_SK.into(),
                gsi1: None,
                ver: 1,
                body: RunBodies::new(run, 1).body(1),
            };
            let (read, last) = decode_run(&item, Vec::new()).unwrap();
            assert!(last.is_empty());
            assert_eq!(read.value.messages, run.messages);
            read.value
        };
        assert_eq!(stored(&run), own_fields(&run), "every field set");
        assert_eq!(own_fields(&read(&run)), own_fields(&run), "every field set");
        let unset = started_run().value;
        assert_eq!(stored(&unset), own_fields(&unset), "none of them set");
        assert_eq!(own_fields(&read(&unset)), own_fields(&unset), "none set");
        assert!(!stored(&unset).contains_key("answer"));
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
        let (writes, _, _) = tx.into_parts();
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
        let (writes, _, _) = tx.into_parts();
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
    fn a_final_event_leaves_out_only_the_field_that_is_its_runs_own_and_reads_back_whole() {
        let (mut run, mut items) = created_run();
        let now = run.value.created_at + chrono::Duration::seconds(3);
        run.value.fail("the ledger refused".into(), now).unwrap();
        let failed = AuditEvent::Failed {
            error: "the ledger refused".into(),
        };
        // Not the run's own error: held whole.
        let other = AuditEvent::Failed {
            error: "a retry failed first".into(),
        };
        let mut tx = Tx::new();
        for event in [&other, &failed] {
            let entry = AuditEntry::new(&run.value.id, Actor::Agent, event.clone(), now);
            tx.audit(&run.value.tenant, entry);
        }
        tx.run(IndexShards::DEFAULT, &mut run);
        let (writes, _, _) = tx.into_parts();
        let [Write::Put { item, .. }] = &writes[..] else {
            panic!("one write, no audit item: {writes:?}")
        };
        assert_eq!(
            item.body.matches("the ledger refused").count(),
            1,
            "{}",
            item.body
        );
        assert_eq!(
            item.body.matches("a retry failed first").count(),
            1,
            "{}",
            item.body
        );

        items.retain(|i| i.sk != keys::RUN_SK);
        items.push(item.clone());
        let read = run_from_items(&items, []).unwrap().unwrap();
        let events: Vec<&AuditEvent> = read.log.iter().skip(1).map(|e| &e.event).collect();
        assert_eq!(events, [&other, &failed]);
        assert_eq!(read.run.value.status, RunStatus::Failed);
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

    #[test]
    fn an_audit_order_is_as_long_as_a_write_sizes_it() {
        assert_eq!(audit_order().len(), AUDIT_ORDER_LEN);
    }
}
