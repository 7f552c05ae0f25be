//! The expense tools. The hard limits live here, so no approval can skip them: never pay more
//! than claimed, never settle a claim twice, the same `action_id:version` never acts twice.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::claims::{Claim, Claims};
use super::ledger::{KeyState, Ledger, Recorded, Settlement, SettlementOutcome};
use crate::domain::action::ToolOutcome;
use crate::domain::args::Args;
use crate::domain::ids::PersonId;
use crate::domain::money::Amount;
use crate::domain::policy::Policy;
use crate::ports::clock::Clock;
use crate::ports::model::ToolSpec;
use crate::ports::store::ItemStore;
use crate::ports::tools::{Tool, ToolCall, Toolbox};

/// What every expense tool reads from.
#[derive(Clone)]
struct Books {
    claims: Arc<Claims>,
    policy: Arc<Policy>,
    ledger: Ledger,
    clock: Arc<dyn Clock>,
}

/// The expense agent's five tools over one item store.
pub fn toolbox(
    claims: Arc<Claims>,
    policy: Arc<Policy>,
    store: Arc<dyn ItemStore>,
    clock: Arc<dyn Clock>,
) -> Toolbox {
    let books = Books {
        claims,
        policy,
        ledger: Ledger::new(store),
        clock,
    };
    Toolbox::new()
        .with(Arc::new(GetClaim(books.clone())))
        .with(Arc::new(GetPolicy(books.clone())))
        .with(Arc::new(FindSimilarClaims(books.clone())))
        .with(Arc::new(Settle(books.clone(), Settles::Reimburse)))
        .with(Arc::new(Settle(books, Settles::Decline)))
}

fn failed(error: impl Into<String>) -> ToolOutcome {
    ToolOutcome::Failed {
        error: error.into(),
    }
}

fn spec(name: &str, description: &str, properties: Value, required: &[&str]) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false}),
    }
}

impl Books {
    /// The employee whose claim a call settles: they never approve their own claim.
    fn claimant(&self, args: &Args) -> Vec<PersonId> {
        args.str("claim_id")
            .and_then(|id| self.claims.get(id))
            .map(|claim| vec![claim.employee.clone()])
            .unwrap_or_default()
    }

    /// The claim named by `claim_id`, if it belongs to the caller's tenant.
    fn claim<'a>(&'a self, call: &ToolCall<'_>) -> Result<&'a Claim, ToolOutcome> {
        let id = call
            .args
            .str("claim_id")
            .ok_or_else(|| failed("claim_id is required"))?;
        self.claims
            .get(id)
            .filter(|c| c.tenant == *call.tenant)
            .ok_or_else(|| failed(format!("there is no claim {id}")))
    }

    async fn status(&self, claim: &Claim) -> Result<Value, ToolOutcome> {
        let settled = self.ledger.get(&claim.tenant, &claim.id).await;
        let settled = settled.map_err(|e| ToolOutcome::Unknown {
            detail: e.to_string(),
        })?;
        Ok(match settled {
            None => json!("open"),
            Some(s) => match s.outcome {
                SettlementOutcome::Paid { amount } => json!(format!("paid {amount}")),
                SettlementOutcome::Declined { reason } => json!(format!("declined: {reason}")),
            },
        })
    }

    async fn describe(&self, claim: &Claim) -> Result<Value, ToolOutcome> {
        let mut value = serde_json::to_value(claim).expect("claims serialize");
        value["amount_cents"] = json!(claim.amount.cents());
        value["status"] = self.status(claim).await?;
        Ok(value)
    }

    /// Records a settlement; the same call again returns the first answer.
    async fn settle(
        &self,
        call: &ToolCall<'_>,
        claim: &Claim,
        outcome: SettlementOutcome,
        note: Option<String>,
    ) -> ToolOutcome {
        let settlement = Settlement {
            claim_id: claim.id.clone(),
            employee: claim.employee.clone(),
            outcome,
            idempotency_key: call.idempotency_key.to_string(),
            run_id: call.run_id.clone(),
            note,
            at: self.clock.now(),
        };
        match self.ledger.record(call.tenant, settlement).await {
            Ok(Recorded::New(s) | Recorded::Again(s)) => settled(&s),
            Ok(Recorded::Taken(other)) => failed(format!(
                "claim {} is already settled ({}) by {}; a claim is never settled twice",
                claim.id,
                describe_outcome(&other.outcome),
                other.idempotency_key
            )),
            Ok(Recorded::Void) => failed(format!(
                "this call ({}) came too late: it was reconciled as not executed, so it settles nothing",
                call.idempotency_key
            )),
            // The write may or may not have reached the ledger: say so, never guess.
            Err(error) => ToolOutcome::Unknown {
                detail: error.to_string(),
            },
        }
    }

    /// What became of the call with this key, read back from the claim its args name. When
    /// nothing is recorded, the key is voided on that claim first, so the call, if it is only
    /// slow, can never settle after this answer said it did not. A call whose args name no claim
    /// was refused before it wrote anything, and its args never change: there is nothing to void.
    async fn reconcile(&self, call: &ToolCall<'_>) -> Option<ToolOutcome> {
        let (tenant, key) = (call.tenant, call.idempotency_key);
        let Some(claim_id) = call.args.str("claim_id") else {
            return Some(failed(format!(
                "the call {key} names no claim, so it settled nothing and never will"
            )));
        };
        let state = match self.ledger.call(tenant, claim_id, key).await.ok()? {
            Some(state) => state,
            None => {
                let voided = self.ledger.void(tenant, claim_id, key, self.clock.now());
                voided.await.ok()?
            }
        };
        Some(match state {
            KeyState::Settled { settlement } => settled(&settlement),
            KeyState::Void { .. } => failed(format!(
                "nothing was recorded for the call {key} on claim {claim_id}; it is void now and will never settle"
            )),
        })
    }
}

fn describe_outcome(outcome: &SettlementOutcome) -> String {
    match outcome {
        SettlementOutcome::Paid { amount } => format!("paid {amount}"),
        SettlementOutcome::Declined { reason } => format!("declined: {reason}"),
    }
}

fn settled(s: &Settlement) -> ToolOutcome {
    let result = match &s.outcome {
        SettlementOutcome::Paid { amount } => {
            json!({"claim_id": s.claim_id, "paid_cents": amount.cents(), "paid": amount.to_string(), "employee": s.employee})
        }
        SettlementOutcome::Declined { reason } => {
            json!({"claim_id": s.claim_id, "declined": true, "reason": reason})
        }
    };
    ToolOutcome::Succeeded { result }
}

struct GetClaim(Books);
struct GetPolicy(Books);
struct FindSimilarClaims(Books);

#[async_trait]
impl Tool for GetClaim {
    fn reads_only(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        let properties =
            json!({"claim_id": {"type": "string", "description": "The claim id, such as c-101"}});
        spec(
            "get_claim",
            "Reads one expense claim: employee, category, amount, date, merchant and whether it is settled.",
            properties,
            &["claim_id"],
        )
    }

    async fn call(&self, call: ToolCall<'_>) -> ToolOutcome {
        let described = match self.0.claim(&call) {
            Ok(claim) => self.0.describe(claim).await,
            Err(outcome) => Err(outcome),
        };
        described.map_or_else(
            |outcome| outcome,
            |result| ToolOutcome::Succeeded { result },
        )
    }
}

#[async_trait]
impl Tool for GetPolicy {
    fn reads_only(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        let properties =
            json!({"category": {"type": "string", "description": "taxi, lodging or meals"}});
        spec(
            "get_policy",
            "Reads the company limit for one expense category, in cents, per claim or per night.",
            properties,
            &["category"],
        )
    }

    async fn call(&self, call: ToolCall<'_>) -> ToolOutcome {
        let Some(category) = call.args.str("category") else {
            return failed("category is required");
        };
        let limit = &self.0.policy.context["limits"][category];
        if limit.is_null() {
            return failed(format!(
                "the policy has no limit for {category}; it does not cover it"
            ));
        }
        let mut result = limit.clone();
        result["category"] = json!(category);
        result["policy_version"] = json!(self.0.policy.version);
        ToolOutcome::Succeeded { result }
    }
}

#[async_trait]
impl Tool for FindSimilarClaims {
    fn reads_only(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        let properties = json!({"claim_id": {"type": "string"}});
        spec(
            "find_similar_claims",
            "Finds other claims by the same employee with the same category, amount and date, and whether each was settled.",
            properties,
            &["claim_id"],
        )
    }

    async fn call(&self, call: ToolCall<'_>) -> ToolOutcome {
        let found = async {
            let claim = self.0.claim(&call)?;
            let mut similar = Vec::new();
            for other in self.0.claims.similar_to(claim) {
                similar.push(self.0.describe(other).await?);
            }
            Ok(json!({"claim_id": claim.id, "similar": similar}))
        };
        found.await.map_or_else(
            |outcome| outcome,
            |result| ToolOutcome::Succeeded { result },
        )
    }
}

/// The two tools that settle a claim: they differ in what they check and how they settle, and
/// share the rest (the claimant, the claim lookup, the ledger, reconciling).
#[derive(Clone, Copy)]
enum Settles {
    Reimburse,
    Decline,
}

struct Settle(Books, Settles);

impl Settle {
    /// How this call settles `claim`, with the note for the employee; or why it cannot.
    fn outcome(
        &self,
        call: &ToolCall<'_>,
        claim: &Claim,
    ) -> Result<(SettlementOutcome, Option<String>), ToolOutcome> {
        match self.1 {
            Settles::Reimburse => {
                let Some(amount) = call
                    .args
                    .int("amount_cents")
                    .and_then(|c| Amount::from_cents(c).ok())
                    .filter(|a| *a > Amount::ZERO)
                else {
                    return Err(failed(
                        "amount_cents must be a whole number of cents above zero",
                    ));
                };
                if amount > claim.amount {
                    return Err(failed(format!(
                        "{amount} is more than the {} claimed; never pay more than claimed",
                        claim.amount
                    )));
                }
                let note = call.args.str("note").map(str::to_string);
                Ok((SettlementOutcome::Paid { amount }, note))
            }
            Settles::Decline => {
                let Some(reason) = call
                    .args
                    .str("reason")
                    .map(str::trim)
                    .filter(|r| !r.is_empty())
                else {
                    return Err(failed("a decline needs a reason"));
                };
                let reason = reason.to_string();
                Ok((SettlementOutcome::Declined { reason }, None))
            }
        }
    }
}

#[async_trait]
impl Tool for Settle {
    fn claimants(&self, args: &Args) -> Vec<PersonId> {
        self.0.claimant(args)
    }

    fn spec(&self) -> ToolSpec {
        match self.1 {
            Settles::Reimburse => {
                let properties = json!({
                    "claim_id": {"type": "string"},
                    "amount_cents": {"type": "integer", "minimum": 1, "description": "What to pay, in cents"},
                    "note": {"type": "string", "description": "Why this amount, for the employee"}
                });
                spec(
                    "reimburse",
                    "Pays an expense claim. Never more than claimed; a claim is paid at most once.",
                    properties,
                    &["claim_id", "amount_cents"],
                )
            }
            Settles::Decline => {
                let properties = json!({"claim_id": {"type": "string"}, "reason": {"type": "string", "description": "Why, for the employee"}});
                spec(
                    "decline",
                    "Declines an expense claim with a reason. A settled claim cannot be declined.",
                    properties,
                    &["claim_id", "reason"],
                )
            }
        }
    }

    async fn call(&self, call: ToolCall<'_>) -> ToolOutcome {
        let settled = async {
            let claim = self.0.claim(&call)?;
            let (outcome, note) = self.outcome(&call, claim)?;
            Ok::<_, ToolOutcome>(self.0.settle(&call, claim, outcome, note).await)
        };
        settled.await.unwrap_or_else(|refused| refused)
    }

    fn reconciles(&self) -> bool {
        true
    }

    async fn reconcile(&self, call: ToolCall<'_>) -> Option<ToolOutcome> {
        self.0.reconcile(&call).await
    }
}
