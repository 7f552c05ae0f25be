//! The ledger of settled claims, in the same item store as the engine. A settlement creates, in one
//! transaction, the claim's item and its call's key item, each only if absent: a claim is never
//! settled twice, and a key that reconciliation voided can never settle anything afterwards.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::ids::{PersonId, RunId, TenantId};
use crate::domain::money::Amount;
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
    /// The call with this key settled a claim.
    Settled { settlement: Settlement },
    /// Reconciliation found nothing under this key and voided it, so the call it stands for, if
    /// it is still in flight, fails when it lands.
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

#[derive(Clone)]
pub struct Ledger {
    store: Arc<dyn ItemStore>,
}

fn pk(tenant: &TenantId) -> String {
    format!("TENANT#{tenant}#LEDGER")
}

const CLAIM_PREFIX: &str = "CLAIM#";
const KEY_PREFIX: &str = "KEY#";

fn sk(claim_id: &str) -> String {
    format!("{CLAIM_PREFIX}{claim_id}")
}

fn key_sk(idempotency_key: &str) -> String {
    format!("{KEY_PREFIX}{idempotency_key}")
}

fn item<T: Serialize>(tenant: &TenantId, sk: String, value: &T) -> Item {
    Item {
        pk: pk(tenant),
        sk,
        gsi1: None,
        ver: 1,
        body: serde_json::to_string(value).expect("ledger items serialize"),
    }
}

fn read<T: serde::de::DeserializeOwned>(item: &Item) -> Result<T, StoreError> {
    serde_json::from_str(&item.body).map_err(|e| StoreError::Unavailable(e.to_string()))
}

impl Ledger {
    pub fn new(store: Arc<dyn ItemStore>) -> Self {
        Self { store }
    }

    pub async fn get(
        &self,
        tenant: &TenantId,
        claim_id: &str,
    ) -> Result<Option<Settlement>, StoreError> {
        match self.store.get(&pk(tenant), &sk(claim_id)).await? {
            Some(item) => read(&item).map(Some),
            None => Ok(None),
        }
    }

    /// What the call with this key did, if anything is recorded under it.
    pub async fn call(
        &self,
        tenant: &TenantId,
        idempotency_key: &str,
    ) -> Result<Option<KeyState>, StoreError> {
        match self
            .store
            .get(&pk(tenant), &key_sk(idempotency_key))
            .await?
        {
            Some(item) => read(&item).map(Some),
            None => Ok(None),
        }
    }

    /// Writes the claim's settlement and its key, both only if absent, in one transaction.
    pub async fn record(
        &self,
        tenant: &TenantId,
        settlement: Settlement,
    ) -> Result<Recorded, StoreError> {
        let key = KeyState::Settled {
            settlement: settlement.clone(),
        };
        let writes = vec![
            Write::Put {
                item: item(tenant, sk(&settlement.claim_id), &settlement),
                condition: Condition::NotExists,
            },
            Write::Put {
                item: item(tenant, key_sk(&settlement.idempotency_key), &key),
                condition: Condition::NotExists,
            },
        ];
        match self.store.transact(writes).await {
            Ok(()) => Ok(Recorded::New(settlement)),
            Err(StoreError::ConditionFailed { .. }) => {
                match self.call(tenant, &settlement.idempotency_key).await? {
                    Some(KeyState::Settled { settlement }) => {
                        return Ok(Recorded::Again(settlement));
                    }
                    Some(KeyState::Void { .. }) => return Ok(Recorded::Void),
                    None => {}
                }
                let existing = self
                    .get(tenant, &settlement.claim_id)
                    .await?
                    .ok_or_else(|| StoreError::Unavailable("the settlement vanished".into()))?;
                // Settlements written before key items existed carry their key on the claim.
                match existing.idempotency_key == settlement.idempotency_key {
                    true => Ok(Recorded::Again(existing)),
                    false => Ok(Recorded::Taken(existing)),
                }
            }
            Err(error) => Err(error),
        }
    }

    /// Voids a key nothing was recorded under, so a call with it can never settle afterwards.
    /// Returns the key's state: `Void`, or the settlement of a call that landed first.
    pub async fn void(
        &self,
        tenant: &TenantId,
        idempotency_key: &str,
        at: DateTime<Utc>,
    ) -> Result<KeyState, StoreError> {
        let void = KeyState::Void { at };
        let write = Write::Put {
            item: item(tenant, key_sk(idempotency_key), &void),
            condition: Condition::NotExists,
        };
        match self.store.transact(vec![write]).await {
            Ok(()) => Ok(void),
            Err(StoreError::ConditionFailed { .. }) => self
                .call(tenant, idempotency_key)
                .await?
                .ok_or_else(|| StoreError::Unavailable("the key item vanished".into())),
            Err(error) => Err(error),
        }
    }

    /// Every settled claim of a tenant, by claim id.
    pub async fn all(&self, tenant: &TenantId) -> Result<Vec<Settlement>, StoreError> {
        let items = query_all(self.store.as_ref(), &pk(tenant), CLAIM_PREFIX).await?;
        items.iter().map(read).collect()
    }

    pub async fn payments(&self, tenant: &TenantId) -> Result<Vec<Settlement>, StoreError> {
        let mut all = self.all(tenant).await?;
        all.retain(|s| matches!(s.outcome, SettlementOutcome::Paid { .. }));
        Ok(all)
    }
}
