//! The totals of the policy's history windows a proposed call is decided on, and the slots its
//! transaction takes ([`records::windows`](super::records)): each window's subject is read once
//! a turn, and the calls a turn proposes count against the ones after them, in order, whether
//! they ran at once or wait for the turn's pause.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::records::{CountedCall, Tx, keys, read_counted};
use super::{Agent, Engine, EngineError};
use crate::domain::args::Args;
use crate::domain::ids::ActionId;
use crate::domain::policy::Total;
use crate::domain::policy::history::{HistorySlot, Window};
use crate::domain::run::Asker;

/// What one turn knows of the windows' subjects it read, and the calls it counted there.
#[derive(Default)]
pub(super) struct Tally {
    parts: BTreeMap<String, Part>,
}

/// One subject's partition, as read and then written by this turn.
struct Part {
    /// The newest slot's number.
    newest: u64,
    /// How far back it was read: every call after this is in `calls`.
    since: DateTime<Utc>,
    calls: Vec<Entry>,
}

struct Entry {
    call: CountedCall,
    /// False while the call waits for the turn's pause, which takes its slot.
    written: bool,
}

/// The slot one call takes in one window, before its transaction commits.
#[derive(Debug, Clone)]
pub(super) struct Claim {
    pub slot: HistorySlot,
    pub action_id: ActionId,
    pub amount: i64,
}

/// The partition of `window`'s subject for a call of `asker`'s with `args`, if it has one.
fn partition(agent: &Agent, asker: Asker<'_>, window: &Window, args: &Args) -> Option<String> {
    let subject = window.subject(agent.name.as_str(), asker.person.as_str(), args)?;
    Some(keys::history_pk(
        asker.tenant,
        &agent.name,
        &window.name,
        &subject,
    ))
}

/// The windows a call of `tool` counts in, with their partitions.
fn counting<'a>(
    agent: &'a Agent,
    asker: Asker<'a>,
    tool: &'a str,
    args: &'a Args,
) -> impl Iterator<Item = (&'a Window, String)> + 'a {
    agent
        .policy
        .history
        .values()
        .filter(move |window| window.tool == tool)
        .filter_map(move |window| Some((window, partition(agent, asker, window, args)?)))
}

impl Tally {
    /// Counts a call that waits for the turn's pause: the calls decided after it see it.
    pub(super) fn hold(
        &mut self,
        agent: &Agent,
        asker: Asker<'_>,
        (tool, args): (&str, &Args),
        action_id: &ActionId,
        at: DateTime<Utc>,
    ) {
        for (window, pk) in counting(agent, asker, tool, args) {
            if let Some(part) = self.parts.get_mut(&pk) {
                part.calls.push(Entry {
                    call: CountedCall {
                        at,
                        amount: window.amount(args),
                        action_id: action_id.clone(),
                    },
                    written: false,
                });
            }
        }
    }

    /// The slots a call of `tool` with `args` takes, each the next after the newest this turn
    /// knows of and those `taken` by calls earlier in the same transaction.
    pub(super) fn claims(
        &self,
        agent: &Agent,
        asker: Asker<'_>,
        (tool, args): (&str, &Args),
        action_id: &ActionId,
        at: DateTime<Utc>,
        taken: &mut BTreeMap<String, u64>,
    ) -> Vec<Claim> {
        counting(agent, asker, tool, args)
            .map(|(window, pk)| {
                let newest = self.parts.get(&pk).map_or(0, |part| part.newest);
                let seq = newest.max(taken.get(&pk).copied().unwrap_or(0)) + 1;
                taken.insert(pk.clone(), seq);
                Claim {
                    slot: HistorySlot {
                        window: window.name.clone(),
                        pk,
                        seq,
                        at,
                    },
                    action_id: action_id.clone(),
                    amount: window.amount(args),
                }
            })
            .collect()
    }

    /// The claims' transaction committed: their slots are the newest, their calls written.
    pub(super) fn written(&mut self, claims: &[Claim]) {
        for claim in claims {
            let Some(part) = self.parts.get_mut(&claim.slot.pk) else {
                continue;
            };
            part.newest = part.newest.max(claim.slot.seq);
            let held = part
                .calls
                .iter_mut()
                .find(|e| !e.written && e.call.action_id == claim.action_id);
            match held {
                Some(entry) => entry.written = true,
                None => part.calls.push(Entry {
                    call: CountedCall {
                        at: claim.slot.at,
                        amount: claim.amount,
                        action_id: claim.action_id.clone(),
                    },
                    written: true,
                }),
            }
        }
    }

    /// Another call was counted since the reads: everything is read again, and the calls that
    /// waited are decided again (and held again).
    pub(super) fn forget(&mut self) {
        self.parts.clear();
    }
}

/// Writes `claims` in `tx`: each slot must not be taken yet.
pub(super) fn count_in(tx: &mut Tx, claims: &[Claim]) {
    for claim in claims {
        tx.count_call(&claim.slot, &claim.action_id, claim.amount);
    }
}

impl Engine {
    /// The totals of the windows `agent`'s policy declares that a call of `tool` with `args`
    /// needs (its own tool's, and any a rule reads), as `asker` reads them at `at`: the calls counted after the window's start, the turn's own
    /// included, `own` (an edited call's earlier version) left out. Each subject is read once a
    /// turn.
    pub(super) async fn totals(
        &self,
        agent: &Agent,
        asker: Asker<'_>,
        (tool, args): (&str, &Args),
        at: DateTime<Utc>,
        tally: &mut Tally,
        own: Option<&ActionId>,
    ) -> Result<BTreeMap<String, Total>, EngineError> {
        let mut totals = BTreeMap::new();
        // A window of the call's own tool is read for its next slot; another only if a rule
        // reads it. A window left out is zero to the rules, and none reads it.
        let windows = agent.policy.history.values();
        for window in windows.filter(|w| w.tool == tool || w.read_by_rules) {
            let Some(pk) = partition(agent, asker, window, args) else {
                continue;
            };
            let since = window.since(at);
            let read = tally.parts.get(&pk).is_some_and(|part| part.since <= since);
            if !read {
                let counted = read_counted(self.store.as_ref(), &pk, since).await?;
                // Calls this turn holds for its pause stay held.
                let held = tally
                    .parts
                    .remove(&pk)
                    .into_iter()
                    .flat_map(|part| part.calls)
                    .filter(|e| !e.written);
                let calls = counted
                    .calls
                    .into_iter()
                    .map(|call| Entry {
                        call,
                        written: true,
                    })
                    .chain(held)
                    .collect();
                let part = Part {
                    newest: counted.newest,
                    since,
                    calls,
                };
                tally.parts.insert(pk.clone(), part);
            }
            let part = &tally.parts[&pk];
            let counted = part
                .calls
                .iter()
                .map(|e| &e.call)
                .filter(|call| call.at > since && Some(&call.action_id) != own);
            let mut total = Total::default();
            for call in counted {
                total.count += 1;
                total.sum = total.sum.saturating_add(call.amount);
            }
            totals.insert(window.name.clone(), total);
        }
        Ok(totals)
    }
}
