//! The start function: starts the expense agent on a claim and returns the run done or paused
//! with the approvals it waits on. It answers `POST /runs` through API Gateway and a direct
//! invoke of `{"claim_id": "c-102", "ttl": "30m"}` (authorized by IAM, not by a token).

use std::sync::Arc;

use lambda_http::Context;
use serde::Deserialize;
use serde_json::Value;
use shared::api::{self, Authenticate};
use shared::engine::{Engine, EngineError, RunReport};
use shared::example::expense::{self, Claims};

/// A direct invoke.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartClaim {
    pub claim_id: String,
    /// Time to decide, overriding the policy (`30m`, `2h`).
    #[serde(default)]
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
        let start: StartClaim =
            serde_json::from_value(event).map_err(|e| StartError::BadEvent(e.to_string()))?;
        let report = self.start(start).await?;
        Ok(serde_json::to_value(report).expect("reports serialize"))
    }

    pub async fn start(&self, start: StartClaim) -> Result<RunReport, StartError> {
        let mut run = expense::task_for(&self.claims, &start.claim_id)?;
        run.approval_ttl = match start.ttl.as_deref() {
            Some(ttl) => Some(
                humantime::parse_duration(ttl)
                    .map_err(|e| StartError::BadEvent(format!("ttl {ttl:?}: {e}")))?,
            ),
            None => None,
        };
        Ok(self.engine.start(run).await?)
    }
}
