//! The expense agent: claims, the ledger, its tools and an offline model that plays the agent.

mod claims;
mod ledger;
mod offline;
mod tools;

use std::sync::Arc;

pub use claims::{Claim, Claims, ClaimsError};
pub use ledger::{KeyState, Ledger, Settlement, SettlementOutcome};
pub use offline::OfflineExpenseAgent;
pub use tools::toolbox;

use crate::domain::identity::Directory;
use crate::domain::ids::AgentName;
use crate::domain::policy::Policy;
use crate::engine::{EngineError, StartRun};

/// The shipped data files, compiled in so the binaries run from anywhere.
pub const POLICY_TOML: &str = include_str!("../../../../agents/expense/policy.toml");
pub const PEOPLE_TOML: &str = include_str!("../../../example/people.toml");
pub const CLAIMS_TOML: &str = include_str!("../../../example/claims.toml");

pub fn default_policy() -> Arc<Policy> {
    Arc::new(Policy::from_toml(POLICY_TOML).expect("the shipped policy is valid"))
}

pub fn default_directory() -> Directory {
    Directory::from_toml(PEOPLE_TOML).expect("the shipped people directory is valid")
}

pub fn default_claims() -> Arc<Claims> {
    Arc::new(Claims::from_toml(CLAIMS_TOML).expect("the shipped claims are valid"))
}

/// The expense agent's name, as its definition (agents/expense/agent.toml) gives it.
pub const AGENT: &str = "expense";

/// The run that processes one claim, on behalf of the employee who filed it.
pub fn task_for(claims: &Claims, claim_id: &str) -> Result<StartRun, EngineError> {
    let claim = claims
        .get(claim_id)
        .ok_or_else(|| EngineError::not_found(format!("claim {claim_id}")))?;
    Ok(StartRun {
        tenant: claim.tenant.clone(),
        agent: AgentName::parse(AGENT).expect("a valid name"),
        requested_by: claim.employee.clone(),
        started_by: None,
        task: format!("Process expense claim {}.", claim.id),
        approval_ttl: None,
        standing: Default::default(),
    })
}
