//! Each requester's open approvals, kept so that calls proposed at once from any number of
//! processes cannot open more than the cap between them, and so that settling one costs no
//! read (a decision from a snapshot stays one request to the store):
//!
//! - a slot item per open approval, in the requester's partition, keyed by its action (so the
//!   new version an edit leaves waiting keeps the slot): created in the transaction that opens
//!   the approval, deleted unconditionally in the one that settles it;
//! - the requester's count item, compare-and-set in every transaction that opens approvals:
//!   an opening reads it, then counts the slots, and commits only if no other opening of the
//!   requester committed in between. Settling only takes slots away, so a count can only be
//!   too high for the moment it is read, never too low.
//!
//! Only approvals that ask whether a call may run count; a recovery ("did it take effect?") is
//! the engine's own question and never refused. An approval opened before slots existed holds
//! none, and settling it deletes nothing.

use serde::{Deserialize, Serialize};

use super::keys;
use crate::domain::approval::{Approval, ApprovalKind};
use crate::ports::store::{Condition, Item, ItemStore, StoreError, Write};

/// The count item's body: how many approvals its requester had open at their last opening.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenApprovals {
    pub open: u32,
}

/// What a transaction does to one open approval's slot: +1 opens it, -1 settles it (an edit
/// that leaves a new version waiting nets to nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SlotChange {
    /// The requester's partition ([`keys::requester_pk`]).
    pk: String,
    sk: String,
    by: i64,
}

impl SlotChange {
    /// It opens the slot.
    pub(super) fn opens(&self) -> bool {
        self.by > 0
    }
}

/// The requester's partition and the slot of `approval`, if it counts at all.
fn slot_of(approval: &Approval) -> Option<(String, String)> {
    if approval.kind != ApprovalKind::Action {
        return None;
    }
    let requester = approval.requested_by.first()?;
    Some((
        keys::requester_pk(&approval.tenant, requester),
        keys::open_slot_sk(&approval.action_id),
    ))
}

/// Adds `by` to what `changes` does to `approval`'s slot.
pub(super) fn count(changes: &mut Vec<SlotChange>, approval: &Approval, by: i64) {
    let Some((pk, sk)) = slot_of(approval) else {
        return;
    };
    match changes.iter_mut().find(|c| c.pk == pk && c.sk == sk) {
        Some(change) => change.by += by,
        None => changes.push(SlotChange { pk, sk, by }),
    }
}

/// The slot writes of `changes`: a put for each slot opened, a delete for each settled.
pub(super) fn slot_writes(changes: &[SlotChange]) -> impl Iterator<Item = Write> + '_ {
    changes
        .iter()
        .filter(|c| c.by != 0)
        .map(|c| match c.by > 0 {
            true => Write::Put {
                item: Item {
                    pk: c.pk.clone(),
                    sk: c.sk.clone(),
                    gsi1: None,
                    ver: 1,
                    body: "{}".into(),
                },
                condition: Condition::Always,
            },
            false => Write::Delete {
                pk: c.pk.clone(),
                sk: c.sk.clone(),
                condition: Condition::Always,
            },
        })
}

/// The requesters whose approvals `changes` opens, and how many each.
pub(super) fn openings(changes: &[SlotChange]) -> Vec<Opening> {
    let mut openings: Vec<Opening> = Vec::new();
    for change in changes.iter().filter(|c| c.opens()) {
        match openings.iter_mut().find(|o| o.pk == change.pk) {
            Some(opening) => opening.opens += 1,
            None => openings.push(Opening {
                pk: change.pk.clone(),
                opens: 1,
            }),
        }
    }
    openings
}

/// Approvals a transaction opens for one requester.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opening {
    /// The requester's partition.
    pub pk: String,
    pub opens: u32,
}

/// An opening that would take its requester past the cap: nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverCap {
    /// The requester's partition.
    pub pk: String,
    /// Approvals they have open now.
    pub open: u32,
}

/// Why the count items' writes could not be made.
#[derive(Debug, Clone, PartialEq)]
pub enum CountRefused {
    OverCap(OverCap),
    Store(StoreError),
}

/// The count items' writes for `openings`, each compare-and-set on the count as read, after
/// counting the requester's slots as `store` holds them now; an opening that would take them
/// past `cap` is refused.
pub async fn count_writes(
    store: &dyn ItemStore,
    openings: &[Opening],
    cap: Option<u32>,
) -> Result<Vec<Write>, CountRefused> {
    let mut writes = Vec::new();
    for opening in openings {
        // Read before the slots: an opening that commits after this read fails this one's
        // compare-and-set, whatever the count below saw of it.
        let read = store
            .get(&opening.pk, keys::OPEN_APPROVALS_SK)
            .await
            .map_err(CountRefused::Store)?;
        let open = open_slots(store, &opening.pk, cap.map(|cap| cap + 1))
            .await
            .map_err(CountRefused::Store)?;
        if let Some(cap) = cap
            && open + opening.opens > cap
        {
            return Err(CountRefused::OverCap(OverCap {
                pk: opening.pk.clone(),
                open,
            }));
        }
        let (condition, ver) = match &read {
            Some(item) => (Condition::VersionIs(item.ver), item.ver + 1),
            None => (Condition::NotExists, 1),
        };
        let body = OpenApprovals {
            open: open + opening.opens,
        };
        writes.push(Write::Put {
            item: Item {
                pk: opening.pk.clone(),
                sk: keys::OPEN_APPROVALS_SK.into(),
                gsi1: None,
                ver,
                body: serde_json::to_string(&body).expect("engine records serialize"),
            },
            condition,
        });
    }
    Ok(writes)
}

/// How many approvals the requester of partition `pk` has open: their slots, counted up to
/// `enough` at most.
pub async fn open_slots(
    store: &dyn ItemStore,
    pk: &str,
    enough: Option<u32>,
) -> Result<u32, StoreError> {
    let mut open = 0;
    let mut after: Option<String> = None;
    loop {
        let page = store
            .query(pk, keys::OPEN_SLOT_PREFIX, after.as_deref(), 1_000)
            .await?;
        open += page.items.len() as u32;
        if enough.is_some_and(|enough| open >= enough) {
            return Ok(open);
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(open),
        }
    }
}
