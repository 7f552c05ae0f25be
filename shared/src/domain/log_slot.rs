//! Where an event a record holds sits in its run's audit log.

use serde::{Deserialize, Serialize};

/// Where an event that a record holds, rather than an audit item, sits in its run's log: the
/// order of the transaction that wrote it (an audit item's key sorts by the same order) and its
/// place among that transaction's events about the run. Made by the transaction that writes the
/// record (`engine::records::Tx::log_slot`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LogSlot(String);

impl LogSlot {
    pub(crate) fn new(order: &str, place: usize) -> Self {
        Self(format!("{order}/{place}"))
    }

    /// The transaction's order and the event's place among its events; `None` if malformed.
    pub(crate) fn parts(&self) -> Option<(&str, usize)> {
        let (order, place) = self.0.rsplit_once('/')?;
        Some((order, place.parse().ok()?))
    }
}
