//! The ledger of settled claims, in the same item store as the engine. One item per claim, created
//! only if absent: that one condition is what makes paying a claim twice impossible.

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

/// What recording a settlement found.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    /// Written now.
    New(Settlement),
    /// This same call was recorded before: the same settlement, nothing new.
    Again(Settlement),
    /// The claim was settled by another call.
    Taken(Settlement),
}

#[derive(Clone)]
pub struct Ledger {
    store: Arc<dyn ItemStore>,
}

fn pk(tenant: &TenantId) -> String {
    format!("TENANT#{tenant}#LEDGER")
}

fn sk(claim_id: &str) -> String {
    format!("CLAIM#{claim_id}")
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
            Some(item) => serde_json::from_str(&item.body)
                .map(Some)
                .map_err(|e| StoreError::Unavailable(e.to_string())),
            None => Ok(None),
        }
    }

    pub async fn record(
        &self,
        tenant: &TenantId,
        settlement: Settlement,
    ) -> Result<Recorded, StoreError> {
        let item = Item {
            pk: pk(tenant),
            sk: sk(&settlement.claim_id),
            gsi1: None,
            ver: 1,
            body: serde_json::to_string(&settlement).expect("settlements serialize"),
        };
        match self
            .store
            .transact(vec![Write::Put {
                item,
                condition: Condition::NotExists,
            }])
            .await
        {
            Ok(()) => Ok(Recorded::New(settlement)),
            Err(StoreError::ConditionFailed { .. }) => {
                let existing = self
                    .get(tenant, &settlement.claim_id)
                    .await?
                    .ok_or_else(|| StoreError::Unavailable("the settlement vanished".into()))?;
                match existing.idempotency_key == settlement.idempotency_key {
                    true => Ok(Recorded::Again(existing)),
                    false => Ok(Recorded::Taken(existing)),
                }
            }
            Err(error) => Err(error),
        }
    }

    /// Every settled claim of a tenant, by claim id.
    pub async fn all(&self, tenant: &TenantId) -> Result<Vec<Settlement>, StoreError> {
        let items = query_all(self.store.as_ref(), &pk(tenant), "CLAIM#").await?;
        items
            .iter()
            .map(|item| {
                serde_json::from_str(&item.body).map_err(|e| StoreError::Unavailable(e.to_string()))
            })
            .collect()
    }

    pub async fn payments(&self, tenant: &TenantId) -> Result<Vec<Settlement>, StoreError> {
        let mut all = self.all(tenant).await?;
        all.retain(|s| matches!(s.outcome, SettlementOutcome::Paid { .. }));
        Ok(all)
    }
}
