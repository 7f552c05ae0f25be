//! The ledger of settled claims, in the same item store as the engine. Each claim has one item,
//! `CLAIM#<claim_id>`, holding its settlement with the key of the call that settled it
//! (`action_id:version`), and the keys reconciliation voided for it. A first settlement is one
//! write, the item created only if absent; a claim voided for some key is settled under the
//! version read, its voided keys kept. So a claim is never settled twice, and a voided key can
//! never settle anything afterwards: a key is bound to one claim (the args of an action version
//! name the claim and never change), so voiding it on that claim's item is enough.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::ids::{PersonId, RunId, TenantId};
use crate::domain::money::Amount;
use crate::engine::records::Stored;
use crate::ports::store::{Condition, Item, ItemStore, StoreError, Write, query_all};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum SettlementOutcome {
    Paid { amount: Amount },
    Declined { reason: String },
}

/// How one claim was settled, and by which call (`action_id:version`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settlement {
    pub claim_id: String,
    pub employee: PersonId,
    #[serde(flatten)]
    pub outcome: SettlementOutcome,
    pub idempotency_key: String,
    pub run_id: RunId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub at: DateTime<Utc>,
}

/// What became of one call, by its idempotency key (`action_id:version`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum KeyState {
    /// The call with this key settled its claim.
    Settled { settlement: Settlement },
    /// Reconciliation found nothing under this key and voided it (or found the claim settled by
    /// another call), so the call it stands for, if it is still in flight, settles nothing when
    /// it lands.
    Void { at: DateTime<Utc> },
}

/// What recording a settlement found.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    /// Written now.
    New(Settlement),
    /// This same call was recorded before: the same settlement, nothing new.
    Again(Settlement),
    /// The claim was settled by another call.
    Taken(Settlement),
    /// Reconciliation voided this call's key before it landed: nothing was written.
    Void,
}

/// A key reconciliation voided on its claim, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Voided {
    key: String,
    at: DateTime<Utc>,
}

/// A claim's one item: its settlement once there is one, and the keys voided for it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct ClaimItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    settlement: Option<Settlement>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    voided: Vec<Voided>,
}

impl ClaimItem {
    /// What this claim's item says of the call with `key`: it settled the claim, or it is void.
    fn state_of(&self, key: &str) -> Option<KeyState> {
        if let Some(settlement) = &self.settlement
            && settlement.idempotency_key == key
        {
            let settlement = settlement.clone();
            return Some(KeyState::Settled { settlement });
        }
        let voided = self.voided.iter().find(|v| v.key == key)?;
        Some(KeyState::Void { at: voided.at })
    }
}

/// What one write of a claim's item did.
enum Put {
    Written,
    /// Its condition failed: what is stored now, if anything.
    Refused(Option<Stored<ClaimItem>>),
}

/// How many times a settlement or a void is tried again after another writer changed the
/// claim's item between its read and its write (each time, the item that writer left is read
/// from the refusal): a handful of writers at most ever touch one claim.
const ATTEMPTS: usize = 8;

#[derive(Clone)]
pub struct Ledger {
    store: Arc<dyn ItemStore>,
}

fn pk(tenant: &TenantId) -> String {
    format!("TENANT#{tenant}#LEDGER")
}

const CLAIM_PREFIX: &str = "CLAIM#";

fn sk(claim_id: &str) -> String {
    format!("{CLAIM_PREFIX}{claim_id}")
}

fn read(item: &Item) -> Result<Stored<ClaimItem>, StoreError> {
    let value = serde_json::from_str(&item.body).map_err(|e| {
        StoreError::Unavailable(format!("the ledger item {} is corrupt: {e}", item.sk))
    })?;
    Ok(Stored {
        value,
        ver: item.ver,
    })
}

impl Ledger {
    pub fn new(store: Arc<dyn ItemStore>) -> Self {
        Self { store }
    }

    async fn claim_item(
        &self,
        tenant: &TenantId,
        claim_id: &str,
    ) -> Result<Option<Stored<ClaimItem>>, StoreError> {
        match self.store.get(&pk(tenant), &sk(claim_id)).await? {
            Some(item) => read(&item).map(Some),
            None => Ok(None),
        }
    }

    /// Writes a claim's item: created only if absent when `read_at` is `None`, else only if still
    /// at that version. One write, so one plain conditional write where the store has them.
    async fn put(
        &self,
        tenant: &TenantId,
        claim_id: &str,
        value: &ClaimItem,
        read_at: Option<u64>,
    ) -> Result<Put, StoreError> {
        let (ver, condition) = match read_at {
            None => (1, Condition::NotExists),
            Some(ver) => (ver + 1, Condition::VersionIs(ver)),
        };
        let item = Item {
            pk: pk(tenant),
            sk: sk(claim_id),
            gsi1: None,
            ver,
            body: serde_json::to_string(value).expect("ledger items serialize"),
        };
        let refused = match self
            .store
            .transact_or_found(vec![Write::Put { item, condition }])
            .await
        {
            Ok(()) => return Ok(Put::Written),
            Err(refused) => refused,
        };
        match refused.error {
            StoreError::ConditionFailed { .. } => {}
            error => return Err(error),
        }
        let found = match refused.found(0) {
            Some(Some(item)) => Some(read(item)?),
            Some(None) => None,
            None => self.claim_item(tenant, claim_id).await?,
        };
        Ok(Put::Refused(found))
    }

    pub async fn get(
        &self,
        tenant: &TenantId,
        claim_id: &str,
    ) -> Result<Option<Settlement>, StoreError> {
        let stored = self.claim_item(tenant, claim_id).await?;
        Ok(stored.and_then(|s| s.value.settlement))
    }

    /// What the call with this key did to the claim its args name, if anything is recorded.
    pub async fn call(
        &self,
        tenant: &TenantId,
        claim_id: &str,
        idempotency_key: &str,
    ) -> Result<Option<KeyState>, StoreError> {
        let stored = self.claim_item(tenant, claim_id).await?;
        Ok(stored.and_then(|s| s.value.state_of(idempotency_key)))
    }

    /// Settles the claim, unless it is settled already or this call's key was voided on it. The
    /// first settlement of a claim is one write, created only if absent, with no read; a refusal
    /// says what is stored, and a claim voided only for other keys is settled under the version
    /// found, its voided keys kept.
    pub async fn record(
        &self,
        tenant: &TenantId,
        settlement: Settlement,
    ) -> Result<Recorded, StoreError> {
        let claim_id = settlement.claim_id.clone();
        let key = settlement.idempotency_key.clone();
        let mut stored: Option<Stored<ClaimItem>> = None;
        for _ in 0..ATTEMPTS {
            let (voided, read_at) = match stored {
                None => (Vec::new(), None),
                Some(found) => {
                    match found.value.state_of(&key) {
                        Some(KeyState::Settled { settlement }) => {
                            return Ok(Recorded::Again(settlement));
                        }
                        Some(KeyState::Void { .. }) => return Ok(Recorded::Void),
                        None => {}
                    }
                    if let Some(other) = found.value.settlement {
                        return Ok(Recorded::Taken(other));
                    }
                    (found.value.voided, Some(found.ver))
                }
            };
            let value = ClaimItem {
                settlement: Some(settlement.clone()),
                voided,
            };
            match self.put(tenant, &claim_id, &value, read_at).await? {
                Put::Written => return Ok(Recorded::New(settlement)),
                Put::Refused(found) => stored = found,
            }
        }
        Err(StoreError::Contended)
    }

    /// Voids a key on the claim its call names, so the call can never settle it afterwards.
    /// Returns the key's state: `Void`, or the settlement of a call with this key that landed
    /// first. A claim settled by another call is not written: no call can settle it again.
    pub async fn void(
        &self,
        tenant: &TenantId,
        claim_id: &str,
        idempotency_key: &str,
        at: DateTime<Utc>,
    ) -> Result<KeyState, StoreError> {
        let mut stored: Option<Stored<ClaimItem>> = None;
        for _ in 0..ATTEMPTS {
            let (mut value, read_at) = match stored {
                None => (ClaimItem::default(), None),
                Some(found) => {
                    if let Some(state) = found.value.state_of(idempotency_key) {
                        return Ok(state);
                    }
                    if found.value.settlement.is_some() {
                        return Ok(KeyState::Void { at });
                    }
                    (found.value, Some(found.ver))
                }
            };
            value.voided.push(Voided {
                key: idempotency_key.to_string(),
                at,
            });
            match self.put(tenant, claim_id, &value, read_at).await? {
                Put::Written => return Ok(KeyState::Void { at }),
                Put::Refused(found) => stored = found,
            }
        }
        Err(StoreError::Contended)
    }

    /// Every settled claim of a tenant, by claim id.
    pub async fn all(&self, tenant: &TenantId) -> Result<Vec<Settlement>, StoreError> {
        let items = query_all(self.store.as_ref(), &pk(tenant), CLAIM_PREFIX).await?;
        let mut settled = Vec::new();
        for item in &items {
            settled.extend(read(item)?.value.settlement);
        }
        Ok(settled)
    }

    pub async fn payments(&self, tenant: &TenantId) -> Result<Vec<Settlement>, StoreError> {
        let mut all = self.all(tenant).await?;
        all.retain(|s| matches!(s.outcome, SettlementOutcome::Paid { .. }));
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use chrono::TimeZone;

    use super::*;
    use crate::adapters::sqlite::SqliteStore;
    use crate::ports::store::{Page, Query, Refused};

    /// The embedded store, counting what is asked of it; it can slip one write of its own in
    /// just before the first compare-and-set it is sent, as another writer of the same claim.
    struct Counting {
        inner: SqliteStore,
        reads: AtomicUsize,
        requests: AtomicUsize,
        writes: AtomicUsize,
        interloper: Mutex<Option<Write>>,
    }

    impl Counting {
        /// (reads, write requests, writes) so far.
        fn counts(&self) -> (usize, usize, usize) {
            let load = |n: &AtomicUsize| n.load(Ordering::SeqCst);
            (load(&self.reads), load(&self.requests), load(&self.writes))
        }
    }

    #[async_trait]
    impl ItemStore for Counting {
        async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, StoreError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.inner.get(pk, sk).await
        }

        async fn page(&self, query: Query<'_>) -> Result<Page, StoreError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.inner.page(query).await
        }

        async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
            self.transact_or_found(writes).await.map_err(|r| r.error)
        }

        async fn transact_or_found(&self, writes: Vec<Write>) -> Result<(), Refused> {
            if matches!(writes.as_slice(), [w] if matches!(w.condition(), Condition::VersionIs(_)))
            {
                let interloper = self.interloper.lock().unwrap().take();
                if let Some(write) = interloper {
                    self.inner.transact(vec![write]).await.unwrap();
                }
            }
            self.requests.fetch_add(1, Ordering::SeqCst);
            self.writes.fetch_add(writes.len(), Ordering::SeqCst);
            self.inner.transact_or_found(writes).await
        }
    }

    struct Books {
        store: Arc<Counting>,
        ledger: Ledger,
        tenant: TenantId,
        dir: std::path::PathBuf,
    }

    impl Drop for Books {
        fn drop(&mut self) {
            std::fs::remove_dir_all(&self.dir).ok();
        }
    }

    fn books(name: &str) -> Books {
        let dir = crate::testing::scratch_dir(&format!("ledger-{name}"));
        let store = Arc::new(Counting {
            inner: SqliteStore::open_dir(&dir).unwrap(),
            reads: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            writes: AtomicUsize::new(0),
            interloper: Mutex::new(None),
        });
        Books {
            ledger: Ledger::new(store.clone()),
            store,
            tenant: TenantId::parse("acme").unwrap(),
            dir,
        }
    }

    fn at(minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 2, 9, minute, 0).unwrap()
    }

    fn paid(claim_id: &str, key: &str, cents: i64) -> Settlement {
        Settlement {
            claim_id: claim_id.into(),
            employee: PersonId::parse("dana").unwrap(),
            outcome: SettlementOutcome::Paid {
                amount: Amount::from_cents(cents).unwrap(),
            },
            idempotency_key: key.into(),
            run_id: RunId::generate(),
            note: None,
            at: at(0),
        }
    }

    impl Books {
        /// Every item of the tenant's ledger, as stored.
        async fn items(&self) -> Vec<Item> {
            query_all(&self.store.inner, &pk(&self.tenant), "")
                .await
                .unwrap()
        }

        async fn record(&self, settlement: &Settlement) -> Recorded {
            let recorded = self.ledger.record(&self.tenant, settlement.clone());
            recorded.await.unwrap()
        }

        /// Has another writer change the claim's item from version 1 to 2, holding `value`,
        /// just before the next compare-and-set the ledger sends.
        fn meanwhile(&self, claim_id: &str, value: &ClaimItem) {
            let item = Item {
                pk: pk(&self.tenant),
                sk: sk(claim_id),
                gsi1: None,
                ver: 2,
                body: serde_json::to_string(value).unwrap(),
            };
            let condition = Condition::VersionIs(1);
            *self.store.interloper.lock().unwrap() = Some(Write::Put { item, condition });
        }

        async fn void(&self, claim_id: &str, key: &str, minute: u32) -> KeyState {
            let voided = self.ledger.void(&self.tenant, claim_id, key, at(minute));
            voided.await.unwrap()
        }
    }

    #[tokio::test]
    async fn a_first_settlement_is_one_write_of_one_item_and_no_read() {
        let b = books("first");
        let first = paid("c-101", "act-1:1", 25_000);
        assert_eq!(b.record(&first).await, Recorded::New(first.clone()));
        assert_eq!(b.store.counts(), (0, 1, 1), "(reads, requests, writes)");
        let items = b.items().await;
        assert_eq!(items.len(), 1, "{items:?}");
        assert_eq!((items[0].sk.as_str(), items[0].ver), ("CLAIM#c-101", 1));
        assert_eq!(
            b.ledger.get(&b.tenant, "c-101").await.unwrap(),
            Some(first.clone())
        );
        assert_eq!(
            b.ledger.all(&b.tenant).await.unwrap(),
            std::slice::from_ref(&first)
        );
        let state = b.ledger.call(&b.tenant, "c-101", "act-1:1").await.unwrap();
        assert_eq!(state, Some(KeyState::Settled { settlement: first }));
    }

    #[tokio::test]
    async fn the_same_call_again_finds_its_settlement_and_another_call_finds_the_claim_taken() {
        let b = books("again");
        let first = paid("c-101", "act-1:1", 25_000);
        b.record(&first).await;
        let again = Settlement {
            at: at(5),
            ..first.clone()
        };
        assert_eq!(b.record(&again).await, Recorded::Again(first.clone()));
        let other = paid("c-101", "act-2:1", 10_000);
        assert_eq!(b.record(&other).await, Recorded::Taken(first.clone()));
        let items = b.items().await;
        assert_eq!(items.len(), 1, "{items:?}");
        assert_eq!(items[0].ver, 1, "nothing written over the first settlement");
        assert_eq!(b.ledger.payments(&b.tenant).await.unwrap(), [first]);
        let other_state = b.ledger.call(&b.tenant, "c-101", "act-2:1").await.unwrap();
        assert_eq!(other_state, None);
    }

    #[tokio::test]
    async fn a_voided_key_settles_nothing_and_writes_nothing() {
        let b = books("void");
        assert_eq!(
            b.void("c-101", "act-1:1", 3).await,
            KeyState::Void { at: at(3) }
        );
        let before = b.items().await;
        assert_eq!(before.len(), 1, "{before:?}");
        let writes = b.store.counts().2;
        assert_eq!(
            b.record(&paid("c-101", "act-1:1", 25_000)).await,
            Recorded::Void
        );
        assert_eq!(
            b.store.counts().2,
            writes + 1,
            "a refused create and nothing more"
        );
        assert_eq!(b.items().await, before);
        assert_eq!(b.ledger.get(&b.tenant, "c-101").await.unwrap(), None);
        assert!(b.ledger.all(&b.tenant).await.unwrap().is_empty());
        let state = b.ledger.call(&b.tenant, "c-101", "act-1:1").await.unwrap();
        assert_eq!(state, Some(KeyState::Void { at: at(3) }));
        // Voiding it again keeps the first void.
        assert_eq!(
            b.void("c-101", "act-1:1", 9).await,
            KeyState::Void { at: at(3) }
        );
        assert_eq!(b.items().await, before);
    }

    #[tokio::test]
    async fn a_claim_voided_for_one_call_is_settled_by_another_which_keeps_the_void() {
        let b = books("void-then-other");
        b.void("c-101", "act-1:1", 3).await;
        let other = paid("c-101", "act-2:1", 25_000);
        assert_eq!(b.record(&other).await, Recorded::New(other.clone()));
        let items = b.items().await;
        assert_eq!(items.len(), 1, "{items:?}");
        assert_eq!(items[0].ver, 2, "settled under the void item's version");
        assert_eq!(
            b.ledger.payments(&b.tenant).await.unwrap(),
            std::slice::from_ref(&other)
        );
        // The voided call, landing now, is still void rather than taken.
        assert_eq!(
            b.record(&paid("c-101", "act-1:1", 25_000)).await,
            Recorded::Void
        );
        assert_eq!(
            b.void("c-101", "act-1:1", 9).await,
            KeyState::Void { at: at(3) }
        );
        assert_eq!(
            b.void("c-101", "act-2:1", 9).await,
            KeyState::Settled { settlement: other }
        );
        // A call that never landed on a settled claim is void without a write: it can settle
        // nothing now.
        let writes = b.store.counts().2;
        assert_eq!(
            b.void("c-101", "act-3:1", 9).await,
            KeyState::Void { at: at(9) }
        );
        assert_eq!(b.store.counts().2, writes + 1, "one refused create");
        assert_eq!(b.items().await, items);
    }

    #[tokio::test]
    async fn a_write_over_a_void_item_changed_meanwhile_is_made_again_under_its_new_version() {
        let b = books("race");
        b.void("c-101", "act-1:1", 3).await;
        // Another reconciliation voids act-2:1 between the settlement's read and its write.
        let interloper = ClaimItem {
            settlement: None,
            voided: vec![
                Voided {
                    key: "act-1:1".into(),
                    at: at(3),
                },
                Voided {
                    key: "act-2:1".into(),
                    at: at(4),
                },
            ],
        };
        b.meanwhile("c-101", &interloper);
        let third = paid("c-101", "act-3:1", 25_000);
        assert_eq!(b.record(&third).await, Recorded::New(third.clone()));
        let items = b.items().await;
        assert_eq!(items[0].ver, 3, "{items:?}");
        let stored = read(&items[0]).unwrap().value;
        assert_eq!(stored.settlement, Some(third));
        assert_eq!(stored.voided, interloper.voided, "both voids kept");
        assert_eq!(b.record(&paid("c-101", "act-2:1", 1)).await, Recorded::Void);

        // The same race the other way: a void whose compare-and-set meets a settlement.
        let settled = paid("c-102", "act-5:1", 25_000);
        b.void("c-102", "act-4:1", 3).await;
        let found = b.store.inner.get(&pk(&b.tenant), &sk("c-102")).await;
        let mut with_settlement = read(&found.unwrap().unwrap()).unwrap().value;
        with_settlement.settlement = Some(settled.clone());
        b.meanwhile("c-102", &with_settlement);
        assert_eq!(
            b.void("c-102", "act-5:1", 6).await,
            KeyState::Settled {
                settlement: settled.clone()
            }
        );
        assert_eq!(
            b.ledger.get(&b.tenant, "c-102").await.unwrap(),
            Some(settled)
        );
    }
}
