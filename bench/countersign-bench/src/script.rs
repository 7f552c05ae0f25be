//! What the bench runs on: generated lodging claims, for shared's scripted agent
//! ([`shared::testing::ScriptedAgent`]) to propose paying.

use std::sync::Arc;

use shared::domain::ids::{AgentName, PersonId, TenantId};
use shared::domain::money::Amount;
use shared::engine::StartRun;
use shared::example::expense::{self, Claim, Claims};
pub use shared::testing::PROPOSED_CENTS;

/// What every generated claim asks for: one night of lodging at $480.
pub const CLAIMED_CENTS: i64 = 48_000;

pub fn claim_id(n: usize) -> String {
    format!("b-{n:06}")
}

fn employee(n: usize) -> PersonId {
    PersonId::parse(&format!("emp-{n:06}")).expect("a well-formed person id")
}

/// `count` lodging claims of $480, each by a different employee of `tenant`.
pub fn claims(tenant: &TenantId, count: usize) -> Arc<Claims> {
    let claims = (0..count)
        .map(|n| Claim {
            id: claim_id(n),
            tenant: tenant.clone(),
            employee: employee(n),
            category: "lodging".into(),
            amount: Amount::from_cents(CLAIMED_CENTS).expect("a valid amount"),
            nights: Some(1),
            date: "2026-11-03".into(),
            merchant: "Harbor Hotel".into(),
            description: "One night at the conference hotel".into(),
        })
        .collect();
    Arc::new(Claims::new(claims).expect("generated claims are distinct"))
}

/// The run that processes claim `n`, on behalf of the employee who filed it.
pub fn task(tenant: &TenantId, n: usize) -> StartRun {
    StartRun {
        tenant: tenant.clone(),
        agent: AgentName::parse(expense::AGENT).expect("a valid name"),
        requested_by: employee(n),
        started_by: None,
        task: format!("Process expense claim {}.", claim_id(n)),
        approval_ttl: None,
        standing: Default::default(),
    }
}
