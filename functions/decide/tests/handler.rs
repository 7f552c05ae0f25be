//! The decide function on API Gateway events with JWT authorizer claims, over the embedded store.

#[path = "../../fixtures/apigw.rs"]
mod apigw;
#[path = "../../../shared/tests/harness/mod.rs"]
mod harness;

use std::sync::Arc;

use apigw::{http_event, status_and_body, without_authorizer};
use harness::{Embedded, Harness, RecordingQueue};
use lambda_http::Context;
use serde_json::json;
use shared::engine::Delivery;

async fn invoke(app: &axum::Router, event: serde_json::Value) -> (u64, serde_json::Value) {
    let response = shared::lambda::invoke(app.clone(), event, Context::default())
        .await
        .unwrap();
    status_and_body(&response)
}

#[tokio::test]
async fn the_authorizers_claims_name_the_reviewer_and_a_decision_queues_the_resume() {
    let h = Harness::new(Embedded::fresh()).await;
    let queue = Arc::new(RecordingQueue::default());
    let process = h.process_with(|t| t, Delivery::Queue(queue.clone())).await;
    let (report, approval) = h.start_paused(&process, "c-102").await;
    let app = decide::app(
        Arc::new(process.engine),
        Arc::new(shared::api::GatewayClaims::default()),
    );

    let (status, listed) = invoke(
        &app,
        http_event(
            "GET",
            "/approvals",
            None,
            "dana",
            "acme",
            &["employee", "finance"],
        ),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(listed["approvals"][0]["id"], approval.id.to_string());

    let body = json!({"decision_id": "d-fixture", "action_version": 1, "choice": "approve"});
    let path = format!("/approvals/{}/decisions", approval.id);
    let (status, own) = invoke(
        &app,
        http_event(
            "POST",
            &path,
            Some(body.clone()),
            "ben",
            "acme",
            &["finance"],
        ),
    )
    .await;
    assert_eq!(
        (status, own["error"]["code"].as_str()),
        (403, Some("own_request"))
    );

    let (status, decided) = invoke(
        &app,
        http_event(
            "POST",
            &path,
            Some(body),
            "dana",
            "acme",
            &["employee", "finance"],
        ),
    )
    .await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["approval"]["status"], "approved");
    let queued = queue.published();
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].run_id, report.run_id);
}

#[tokio::test]
async fn another_tenants_claims_do_not_find_the_approval() {
    let h = Harness::new(Embedded::fresh()).await;
    let process = h.process().await;
    let (_, approval) = h.start_paused(&process, "c-102").await;
    let app = decide::app(
        Arc::new(process.engine),
        Arc::new(shared::api::GatewayClaims::default()),
    );

    let event = http_event(
        "GET",
        &format!("/approvals/{}", approval.id),
        None,
        "zoe",
        "globex",
        &["finance"],
    );
    let (status, body) = invoke(&app, event).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
}

#[tokio::test]
async fn without_an_authorizer_and_without_a_development_key_every_request_is_401() {
    let h = Harness::new(Embedded::fresh()).await;
    let process = h.process().await;
    let auth = shared::lambda::LambdaAuth::new(shared::api::GatewayClaims::default(), None);
    let app = decide::app(Arc::new(process.engine), Arc::new(auth));

    let event = without_authorizer(http_event(
        "GET",
        "/approvals",
        None,
        "dana",
        "acme",
        &["finance"],
    ));
    let (status, body) = invoke(&app, event).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("missing_token"))
    );
}
