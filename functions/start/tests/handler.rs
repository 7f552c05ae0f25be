//! The start function on a direct invoke and on an API Gateway POST /runs, over the embedded store.

#[path = "../../fixtures/apigw.rs"]
mod apigw;
#[path = "../../../shared/tests/harness/mod.rs"]
mod harness;

use std::sync::Arc;

use apigw::{http_event, status_and_body};
use harness::{Embedded, Harness};
use lambda_http::Context;
use serde_json::json;
use shared::domain::run::RunStatus;

async fn start(h: &Harness) -> start::Start {
    let process = h.process().await;
    start::Start::new(
        Arc::new(process.engine),
        Arc::new(shared::api::GatewayClaims::default()),
        h.claims.clone(),
    )
}

#[tokio::test]
async fn a_direct_invoke_starts_the_run_and_returns_where_it_paused() {
    let h = Harness::new(Embedded::fresh()).await;
    let start = start(&h).await;
    let event: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/direct-invoke.json")).unwrap();

    let report = start.handle(event, Context::default()).await.unwrap();

    assert_eq!(report["status"], "awaiting_approval");
    assert_eq!(report["approvals"][0]["args"]["amount_cents"], 25_000);
    let approval = &report["approvals"][0];
    let granted = chrono::DateTime::parse_from_rfc3339(approval["expires_at"].as_str().unwrap())
        .unwrap()
        - chrono::DateTime::parse_from_rfc3339(approval["created_at"].as_str().unwrap()).unwrap();
    assert_eq!(
        granted,
        chrono::TimeDelta::hours(2),
        "the invoke's ttl overrides the policy's 24h"
    );
}

#[tokio::test]
async fn a_direct_invoke_for_an_unknown_claim_or_with_extra_fields_is_refused() {
    let h = Harness::new(Embedded::fresh()).await;
    let start = start(&h).await;
    let unknown = start
        .handle(json!({"claim_id": "c-999"}), Context::default())
        .await
        .unwrap_err();
    assert!(unknown.to_string().contains("claim c-999"), "{unknown}");
    let extra = start
        .handle(
            json!({"claim_id": "c-102", "requested_by": "dana"}),
            Context::default(),
        )
        .await
        .unwrap_err();
    assert!(extra.to_string().contains("requested_by"), "{extra}");
}

#[tokio::test]
async fn post_runs_through_api_gateway_starts_the_run_for_the_claim() {
    let h = Harness::new(Embedded::fresh()).await;
    let start = start(&h).await;
    let event = http_event(
        "POST",
        "/runs",
        Some(json!({"claim_id": "c-101"})),
        "ana",
        "acme",
        &["employee"],
    );

    let response = start.handle(event, Context::default()).await.unwrap();

    let (status, body) = status_and_body(&response);
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["status"], "done");
    let reader = h.process().await;
    let run = h
        .run(
            &reader,
            &serde_json::from_value(body["run_id"].clone()).unwrap(),
        )
        .await;
    assert_eq!(run.status, RunStatus::Done);
    assert_eq!(h.payments().await.len(), 1);
}
