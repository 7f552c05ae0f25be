//! Snapshots: an approval as a reviewer was shown it, which their decision brings back.
//!
//! A snapshot is the stored approval item's version and body, written as one opaque string
//! (base64url). A decision that brings one is ruled on that approval without reading it, and
//! its transaction holds only if the stored approval is still exactly that
//! ([`Condition::Unchanged`](crate::ports::store::Condition::Unchanged)): every rule the domain
//! applied (status, version, deadline, role, separation of duties) holds as if the approval had
//! been read first, and the rules stay written once, in the domain. A snapshot is not trusted
//! for anything else: a ruling on it that writes nothing (a refusal, a replay) is made again on
//! the stored approval, and a stale or forged one fails the condition, after which the decision
//! rules on the approval the refusal found, as it does after a lost race.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::records::{Stored, decode_approval, keys};
use super::{Engine, EngineError};
use crate::domain::approval::Approval;
use crate::domain::identity::Identity;
use crate::domain::ids::{ApprovalId, TenantId};
use crate::ports::store::{Condition, Item};

/// An approval item as it was stored when it was shown: its version and exact body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    ver: u64,
    body: String,
}

/// What a snapshot that cannot be decoded is told.
const NOT_OURS: &str = "the snapshot is not one Countersign gave";

impl Snapshot {
    pub(super) fn of(item: &Item) -> Self {
        Self {
            ver: item.ver,
            body: item.body.clone(),
        }
    }

    /// Reads a snapshot a client sent back; a clear refusal if it is not one this engine gave.
    pub fn parse(text: &str) -> Result<Self, EngineError> {
        let not_ours = || EngineError::BadInput(NOT_OURS.into());
        let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| not_ours())?;
        let text = String::from_utf8(bytes).map_err(|_| not_ours())?;
        let (ver, body) = text.split_once('.').ok_or_else(not_ours)?;
        let ver = ver.parse().map_err(|_| not_ours())?;
        Ok(Self {
            ver,
            body: body.to_string(),
        })
    }

    /// The opaque string a client keeps and sends back with its decision.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!("{}.{}", self.ver, self.body))
    }

    /// The approval this snapshot holds, if it is the caller's approval `id`, and the condition
    /// its write must meet: the stored approval is still exactly this one. `None` when it is of
    /// another approval or tenant (the decision then reads the approval); a refusal when its
    /// body is not an approval at all.
    pub(super) fn approval(
        self,
        who: &Identity,
        id: &ApprovalId,
    ) -> Result<Option<(Stored<Approval>, Condition)>, EngineError> {
        let item = Item {
            pk: keys::approval_pk(&who.tenant, id),
            sk: keys::APPROVAL_SK.into(),
            gsi1: None,
            ver: self.ver,
            body: self.body,
        };
        let stored = decode_approval(&item).map_err(|_| EngineError::BadInput(NOT_OURS.into()))?;
        if stored.value.tenant != who.tenant || stored.value.id != *id {
            return Ok(None);
        }
        let unchanged = Condition::Unchanged {
            ver: item.ver,
            body: item.body,
        };
        Ok(Some((stored, unchanged)))
    }
}

/// An approval as a reviewer is shown it, and the snapshot their decision may bring back.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    pub approval: Approval,
    pub snapshot: String,
}

impl Shown {
    pub(super) fn of(item: &Item) -> Result<Self, EngineError> {
        Ok(Self {
            approval: decode_approval(item)?.value,
            snapshot: Snapshot::of(item).encode(),
        })
    }
}

impl Engine {
    /// One approval of `tenant`, with its snapshot.
    pub async fn approval_shown(
        &self,
        tenant: &TenantId,
        id: &ApprovalId,
    ) -> Result<Shown, EngineError> {
        let item = self
            .store
            .get(&keys::approval_pk(tenant, id), keys::APPROVAL_SK)
            .await?;
        let item = item.ok_or_else(|| EngineError::not_found(format!("approval {id}")))?;
        Shown::of(&item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_reads_back_as_it_was_given() {
        let snapshot = Snapshot {
            ver: 7,
            body: r#"{"id":"ap-1","note":"a.b"}"#.into(),
        };
        assert_eq!(Snapshot::parse(&snapshot.encode()).unwrap(), snapshot);
    }

    #[test]
    fn a_string_that_is_not_a_snapshot_is_bad_input() {
        let no_version = URL_SAFE_NO_PAD.encode("{}");
        let bad_version = URL_SAFE_NO_PAD.encode("x.{}");
        for text in ["", "not base64!", no_version.as_str(), bad_version.as_str()] {
            match Snapshot::parse(text) {
                Err(EngineError::BadInput(message)) => assert_eq!(message, NOT_OURS),
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }
}
