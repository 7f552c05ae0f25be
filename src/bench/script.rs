//! What the bench runs on: generated lodging claims, a scripted model, and a clock the bench
//! can move forward.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::json;
use shared::domain::conversation::{Block, Role, StopReason};
use shared::domain::ids::{AgentName, PersonId, TenantId};
use shared::domain::money::Amount;
use shared::engine::StartRun;
use shared::example::expense::{self, Claim, Claims};
use shared::ports::clock::Clock;
use shared::ports::model::{Model, ModelError, ModelReply, ModelRequest};

/// What every generated claim asks for: one night of lodging at $480.
pub const CLAIMED_CENTS: i64 = 48_000;
/// What the scripted model proposes to pay: the lodging limit, $250.
pub const PROPOSED_CENTS: i64 = 25_000;

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
    }
}

/// A model that proposes `reimburse` of $250 on the claim named in the task, then reports what
/// came of it. No network, no reading: the engine's cost, not the model's, is what is measured.
pub struct ScriptedAgent;

#[async_trait]
impl Model for ScriptedAgent {
    fn name(&self) -> &str {
        "bench-script"
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelReply, ModelError> {
        let turn = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        if turn == 0 {
            let task = request
                .messages
                .first()
                .map(|m| m.text())
                .unwrap_or_default();
            let claim = task
                .split_whitespace()
                .map(|w| w.trim_end_matches('.'))
                .find(|w| w.starts_with("b-"))
                .ok_or_else(|| ModelError::BadReply(format!("no claim in {task:?}")))?;
            return Ok(ModelReply {
                content: vec![
                    Block::Text {
                        text: format!(
                            "Claim {claim} is one night of lodging at $480; the limit is $250 a night, so I propose paying $250."
                        ),
                    },
                    Block::ToolUse {
                        id: "toolu_bench_0".into(),
                        name: "reimburse".into(),
                        input: json!({"claim_id": claim, "amount_cents": PROPOSED_CENTS, "note": "Lodging is capped at $250 a night."}),
                    },
                ],
                stop_reason: StopReason::ToolUse,
            });
        }
        let told = request
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .filter_map(|b| match b {
                Block::ToolResult { content, .. } => Some(content.as_str()),
                _ => None,
            })
            .next_back()
            .unwrap_or("nothing");
        Ok(ModelReply {
            content: vec![Block::Text {
                text: format!("Reimbursement outcome: {told}"),
            }],
            stop_reason: StopReason::EndTurn,
        })
    }
}

/// The system clock, moved forward on demand (to put approvals past their deadline).
#[derive(Default)]
pub struct SkewedClock {
    ahead_ms: AtomicI64,
}

impl SkewedClock {
    /// Moves the clock to just past `at`, if it is not there yet.
    pub fn move_past(&self, at: DateTime<Utc>) {
        let needed = (at - Utc::now()).num_milliseconds() + 1_000;
        self.ahead_ms.fetch_max(needed, Ordering::SeqCst);
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::milliseconds(self.ahead_ms.load(Ordering::SeqCst))
    }
}
