//! How engine records sit in the item store: keys, the sparse index, and the transaction
//! builder that writes a change and its audit events together: the events of one transaction
//! about one run go into one append-only audit item, in the order they were added.
//!
//! - [`keys`]: where each record sits, tenant first, and how the index partitions are sharded;
//! - `index`: the sparse index: which entry each record holds;
//! - `approval`: an approval's stored form and its escalation marker;
//! - `outbox`: what waits for delivery after a commit;
//! - `open`: each requester's open approvals, and their count;
//! - `windows`: the calls history windows count, a slot each;
//! - `log`: audit items, the run's item and the log read back from them;
//! - `tx`: the transaction builder.

use serde::de::DeserializeOwned;

use super::error::EngineError;
use crate::domain::approval::Approval;
use crate::ports::store::{Item, ItemStore};

mod approval;
mod index;
mod log;
mod open;
mod outbox;
mod tx;
mod windows;

/// Keys carry the tenant first, so an IAM `dynamodb:LeadingKeys` condition can isolate tenants.
pub mod keys;

use approval::read_approval;

pub use approval::EscalationDue;
pub(crate) use index::{STALE_EXECUTION, action_index, lease_end, reconcile_key};
pub use keys::IndexShards;
pub use log::{RunRead, held_by_action, held_by_approval, run_alone_from_items, run_from_items};
pub use open::{CountRefused, OpenApprovals, Opening, OverCap, count_writes, open_slots};
pub use outbox::{NotifyMessage, OutboxEntry, OutboxMessage, Outgoing, outbox_key, resume_message};
pub use tx::Tx;
pub use windows::{Counted, CountedCall, claimed_partition, read_counted};

/// A record and the item version it was read at, for compare-and-set.
#[derive(Debug, Clone)]
pub struct Stored<T> {
    pub value: T,
    pub ver: u64,
}

/// A record from its item. An approval's item holds its stored form ([`approval_body`]),
/// filled back here, so every reader of an approval's item reads the whole approval; one read as
/// an [`Approval`] takes [`decode_approval`], which reads it without a JSON value between.
///
/// [`approval_body`]: approval::approval_body
pub fn decode<T: DeserializeOwned>(item: &Item) -> Result<Stored<T>, EngineError> {
    let value = match item.sk == keys::APPROVAL_SK {
        true => {
            let approval = decode_approval(item)?.value;
            serde_json::from_value(
                serde_json::to_value(approval).expect("engine records serialize"),
            )
        }
        false => serde_json::from_str(&item.body),
    };
    value
        .map(|value| Stored {
            value,
            ver: item.ver,
        })
        .map_err(|e| corrupt(item, e))
}

/// An approval from its item ([`decode`], as an [`Approval`]).
pub fn decode_approval(item: &Item) -> Result<Stored<Approval>, EngineError> {
    let value = read_approval(item).map_err(|why| corrupt(item, why))?;
    Ok(Stored {
        value,
        ver: item.ver,
    })
}

fn corrupt(item: &Item, why: impl std::fmt::Display) -> EngineError {
    EngineError::Corrupt(format!("{}/{}: {why}", item.pk, item.sk))
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
