//! Expense claims: what an employee asked to be paid.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::domain::ids::{PersonId, TenantId};
use crate::domain::money::Amount;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    pub id: String,
    pub tenant: TenantId,
    pub employee: PersonId,
    pub category: String,
    #[serde(with = "dollars")]
    pub amount: Amount,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nights: Option<u32>,
    pub date: String,
    pub merchant: String,
    pub description: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the claims file is not valid: {0}")]
pub struct ClaimsError(String);

/// The claims a deployment knows, by id.
#[derive(Debug, Clone, Default)]
pub struct Claims {
    by_id: BTreeMap<String, Claim>,
}

impl Claims {
    pub fn from_toml(text: &str) -> Result<Self, ClaimsError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            claims: Vec<Claim>,
        }
        let file: File =
            crate::domain::toml_text::from_str(text).map_err(|e| ClaimsError(e.to_string()))?;
        Self::new(file.claims)
    }

    pub fn new(claims: Vec<Claim>) -> Result<Self, ClaimsError> {
        let mut by_id = BTreeMap::new();
        for claim in claims {
            if claim.nights == Some(0) {
                return Err(ClaimsError(format!("{}: nights starts at 1", claim.id)));
            }
            if let Some(dup) = by_id.insert(claim.id.clone(), claim) {
                return Err(ClaimsError(format!("{} is listed twice", dup.id)));
            }
        }
        Ok(Self { by_id })
    }

    pub fn get(&self, id: &str) -> Option<&Claim> {
        self.by_id.get(id)
    }

    pub fn all(&self) -> impl Iterator<Item = &Claim> {
        self.by_id.values()
    }

    /// Other claims of the same tenant and employee, same category, amount and date.
    pub fn similar_to<'a>(&'a self, claim: &'a Claim) -> impl Iterator<Item = &'a Claim> {
        self.by_id.values().filter(move |other| {
            other.id != claim.id
                && other.tenant == claim.tenant
                && other.employee == claim.employee
                && other.category == claim.category
                && other.amount == claim.amount
                && other.date == claim.date
        })
    }
}

mod dollars {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::domain::money::Amount;

    pub fn serialize<S: Serializer>(amount: &Amount, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&amount.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Amount, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example::expense::CLAIMS_TOML;

    #[test]
    fn the_shipped_claims_load_and_c103_looks_like_c101() {
        let claims = Claims::from_toml(CLAIMS_TOML).unwrap();
        let c103 = claims.get("c-103").unwrap();
        let similar: Vec<&str> = claims.similar_to(c103).map(|c| c.id.as_str()).collect();
        assert_eq!(similar, ["c-101"]);
        assert_eq!(claims.get("c-102").unwrap().amount.cents(), 48_000);
        assert!(
            claims
                .similar_to(claims.get("c-102").unwrap())
                .next()
                .is_none()
        );
    }

    #[test]
    fn a_claim_listed_twice_is_refused() {
        let claims = Claims::from_toml(CLAIMS_TOML).unwrap();
        let one = claims.get("c-101").unwrap().clone();
        assert!(Claims::new(vec![one.clone(), one]).is_err());
    }
}
