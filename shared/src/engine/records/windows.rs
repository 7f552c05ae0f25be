//! The calls history windows count, kept so that calls proposed at once from any number of
//! processes cannot pass a window's limit together, at one read per window per call:
//!
//! - a partition per window and subject ([`keys::history_pk`]), and in it a slot per counted
//!   call, numbered in the order the calls were counted ([`keys::history_slot_sk`]);
//! - a proposal reads the partition's newest slots backwards until one older than its window,
//!   and its transaction writes the next number, which must not exist: two proposals that read
//!   the same newest slot cannot both commit, and the one refused reads again and is decided
//!   again;
//! - a call that stops counting (rejected, expired, cancelled) keeps its slot, voided, and an
//!   edit rewrites it with the new amount: unconditionally, with no read, as the approval that
//!   settles keeps where its call is counted. A slot is never deleted, so its number stays
//!   taken and a proposal that read an older newest slot is still refused.
//!
//! Slots older than every window are never read again; they stay stored.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{corrupt, keys};
use crate::domain::ids::ActionId;
use crate::domain::policy::history::HistorySlot;
use crate::engine::error::EngineError;
use crate::ports::store::{Condition, Item, ItemStore, Query, Write};

/// How many slots one page of a backwards read holds: a window of a few calls is one request.
const PAGE: usize = 100;

/// A slot's body: when its call was proposed, which call, and what it adds to the sum; a
/// voided one adds nothing and counts no more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SlotBody {
    at: DateTime<Utc>,
    action_id: ActionId,
    #[serde(default, skip_serializing_if = "is_zero")]
    amount: i64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    void: bool,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// One call a window counts, as read or as written by this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountedCall {
    pub at: DateTime<Utc>,
    pub amount: i64,
    pub action_id: ActionId,
}

/// A subject's partition as read: the number of its newest slot (0 when it has none), and the
/// calls it counts after the moment the read went back to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counted {
    pub newest: u64,
    pub calls: Vec<CountedCall>,
}

/// Reads the partition `pk` backwards, the newest slot first, until a slot of a call made at or
/// before `since`: the newest slot's number and the calls counted after `since`.
pub async fn read_counted(
    store: &dyn ItemStore,
    pk: &str,
    since: DateTime<Utc>,
) -> Result<Counted, EngineError> {
    let mut counted = Counted::default();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .page(
                Query::partition(pk, keys::HISTORY_SLOT_PREFIX, after.as_deref(), PAGE)
                    .newest_first(),
            )
            .await?;
        for item in &page.items {
            let (seq, body) = read_slot(item)?;
            counted.newest = counted.newest.max(seq);
            if body.at <= since {
                return Ok(counted);
            }
            if !body.void {
                counted.calls.push(CountedCall {
                    at: body.at,
                    amount: body.amount,
                    action_id: body.action_id,
                });
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(counted),
        }
    }
}

fn read_slot(item: &Item) -> Result<(u64, SlotBody), EngineError> {
    let seq = item
        .sk
        .strip_prefix(keys::HISTORY_SLOT_PREFIX)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| corrupt(item, "not a history slot"))?;
    let body = serde_json::from_str(&item.body).map_err(|e| corrupt(item, e))?;
    Ok((seq, body))
}

/// The write of one slot: its call, and what it adds to the sum (nothing, once `void`).
fn slot_write(
    slot: &HistorySlot,
    action_id: &ActionId,
    (amount, void): (i64, bool),
    condition: Condition,
) -> Write {
    let body = SlotBody {
        at: slot.at,
        action_id: action_id.clone(),
        amount,
        void,
    };
    Write::Put {
        item: Item {
            pk: slot.pk.clone(),
            sk: keys::history_slot_sk(slot.seq),
            gsi1: None,
            ver: 1,
            body: serde_json::to_string(&body).expect("engine records serialize"),
        },
        condition,
    }
}

/// Takes the slot for a new call: it must not exist, or another call took it since the read.
pub(super) fn claim(slot: &HistorySlot, action_id: &ActionId, amount: i64) -> Write {
    slot_write(slot, action_id, (amount, false), Condition::NotExists)
}

/// Rewrites a call's slot with the amount of its new version (an edit): the same place.
pub(super) fn recount(slot: &HistorySlot, action_id: &ActionId, amount: i64) -> Write {
    slot_write(slot, action_id, (amount, false), Condition::Always)
}

/// Voids a call's slot: it no longer counts, and its number stays taken.
pub(super) fn void(slot: &HistorySlot, action_id: &ActionId) -> Write {
    slot_write(slot, action_id, (0, true), Condition::Always)
}

/// The partition of the slot `write` takes for a new call, if it is such a claim: the write a
/// proposal loses when another counted a call there since its read.
pub fn claimed_partition(write: &Write) -> Option<&str> {
    match write {
        Write::Put {
            item,
            condition: Condition::NotExists,
        } if item.sk.starts_with(keys::HISTORY_SLOT_PREFIX) => Some(&item.pk),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_voided_slot_keeps_its_place_and_when_and_counts_nothing() {
        let slot = HistorySlot {
            window: "sent_1h".into(),
            pk: "TENANT#acme#HISTORY#payments#sent_1h#requester#lee".into(),
            seq: 7,
            at: "2026-12-07T12:00:00Z".parse().unwrap(),
        };
        let action = ActionId::generate();
        let claimed = claim(&slot, &action, 10_000);
        assert_eq!(claimed_partition(&claimed), Some(slot.pk.as_str()));
        let voided = void(&slot, &action);
        assert_eq!(claimed.key(), voided.key());
        assert_eq!(
            claimed_partition(&voided),
            None,
            "a void takes no new place"
        );
        let Write::Put { item, .. } = voided else {
            unreachable!("a put")
        };
        let (seq, body) = read_slot(&item).unwrap();
        assert_eq!(
            (seq, body.at, body.void, body.amount),
            (7, slot.at, true, 0)
        );
        assert_eq!(item.sk, "SLOT#00000000000000000007");
    }
}
