//! The start function. It answers `POST /runs` through API Gateway (the caller's token names
//! the requester): `202` once the run is stored, its drive message sent to the resume queue for
//! the resume function to drive it. A direct invoke, authorized by IAM, names the run's tenant
//! and requester itself and drives the run here, returning it done or paused with the approvals
//! it waits on: `{"agent": "refunds", "task": "...", "tenant": "acme", "requested_by": "sam",
//! "ttl": "30m"}`, or the expense agent's `{"claim_id": "c-102"}` for the claim's employee.

use std::sync::Arc;

use lambda_http::Context;
use serde::Deserialize;
use serde_json::Value;
use shared::api::{self, Authenticate};
use shared::domain::ids::{AgentName, PersonId, TenantId};
use shared::engine::{Engine, EngineError, RunReport, StartRun};
use shared::example::expense::{self, Claims};

/// A direct invoke: an agent's task for a named requester, or an expense claim.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StartClaim {
    Task(StartTask),
    Claim(StartOneClaim),
}

impl StartClaim {
    /// Reads a direct invoke: the expense short form when it names a claim, else an agent's
    /// task. Chosen by that one field, so a refusal names the field at fault (an untagged
    /// reading would only say that no form matched).
    pub fn from_event(event: Value) -> Result<Self, serde_json::Error> {
        if event.get("claim_id").is_some() {
            serde_json::from_value(event).map(Self::Claim)
        } else {
            serde_json::from_value(event).map(Self::Task)
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartTask {
    pub agent: String,
    pub task: String,
    pub tenant: String,
    pub requested_by: String,
    /// Time to decide, shorter than the policy's (`30m`, `2h`).
    pub ttl: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartOneClaim {
    pub claim_id: String,
    pub ttl: Option<String>,
}

pub struct Start {
    engine: Arc<Engine>,
    claims: Arc<Claims>,
    http: axum::Router,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("not a start request: {0}")]
    BadEvent(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl Start {
    pub fn new(engine: Arc<Engine>, auth: Arc<dyn Authenticate>, claims: Arc<Claims>) -> Self {
        let http = shared::lambda::with_gateway_claims(api::start_routes(
            engine.clone(),
            auth,
            claims.clone(),
        ));
        Self {
            engine,
            claims,
            http,
        }
    }

    /// An API Gateway event goes to the router; anything else must be a direct invoke.
    pub async fn handle(&self, event: Value, context: Context) -> Result<Value, StartError> {
        if event.get("requestContext").is_some() {
            return shared::lambda::invoke(self.http.clone(), event, context)
                .await
                .map_err(StartError::BadEvent);
        }
        let start =
            StartClaim::from_event(event).map_err(|e| StartError::BadEvent(e.to_string()))?;
        let report = self.start(start).await?;
        Ok(serde_json::to_value(report).expect("reports serialize"))
    }

    pub async fn start(&self, start: StartClaim) -> Result<RunReport, StartError> {
        let bad =
            |field: &str, e: &dyn std::fmt::Display| StartError::BadEvent(format!("{field}: {e}"));
        let (mut run, ttl) = match start {
            StartClaim::Claim(claim) => {
                (expense::task_for(&self.claims, &claim.claim_id)?, claim.ttl)
            }
            StartClaim::Task(task) => {
                let run = StartRun {
                    tenant: TenantId::parse(&task.tenant).map_err(|e| bad("tenant", &e))?,
                    agent: AgentName::parse(&task.agent).map_err(|e| bad("agent", &e))?,
                    requested_by: PersonId::parse(&task.requested_by)
                        .map_err(|e| bad("requested_by", &e))?,
                    started_by: None,
                    task: task.task,
                    approval_ttl: None,
                    standing: Default::default(),
                };
                (run, task.ttl)
            }
        };
        run.approval_ttl = match ttl.as_deref() {
            Some(ttl) => Some(humantime::parse_duration(ttl).map_err(|e| bad("ttl", &e))?),
            None => None,
        };
        shared::agents::prepare(&self.engine, &run.tenant, &run.agent).await?;
        Ok(self.engine.start(run).await?)
    }
}
