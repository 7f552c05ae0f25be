//! The decide function on API Gateway events with JWT authorizer claims, over the embedded store.

#[path = "../../fixtures/apigw.rs"]
mod apigw;
#[path = "../../../shared/tests/harness/mod.rs"]
mod harness;
#[path = "../../../shared/tests/support/slack_form.rs"]
mod slack_form;

use std::sync::Arc;

use apigw::{http_event, status_and_body, without_authorizer};
use harness::{Embedded, Harness, RecordingQueue};
use lambda_http::Context;
use serde_json::json;
use shared::engine::Delivery;
use slack_form::interaction_form;

async fn invoke(app: &axum::Router, event: serde_json::Value) -> (u64, serde_json::Value) {
    let response = shared::lambda::invoke(app.clone(), event, Context::default())
        .await
        .unwrap();
    status_and_body(&response)
}

/// A `GET` of `path`, as `person` of `tenant` holding `roles`.
fn get_event(path: &str, person: &str, tenant: &str, roles: &[&str]) -> serde_json::Value {
    http_event("GET", path, None, person, tenant, roles)
}

/// An answer's status and error code.
fn refusal((status, body): &(u64, serde_json::Value)) -> (u64, Option<&str>) {
    (*status, body["error"]["code"].as_str())
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
        get_event("/approvals", "dana", "acme", &["employee", "finance"]),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(listed["approvals"][0]["id"], approval.id.to_string());

    let body = json!({"decision_id": "d-fixture", "action_version": 1, "choice": "approve"});
    let path = format!("/approvals/{}/decisions", approval.id);
    let own = invoke(
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
    assert_eq!(refusal(&own), (403, Some("own_request")));

    let log = shared::testing::JsonLog::capture();
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
    // The request's line: its route's template to group by, its own path, who and what.
    let lines = log.lines();
    let handled = lines
        .iter()
        .find(|l| l["message"] == "handled")
        .unwrap_or_else(|| panic!("a line for the request: {lines:?}"));
    assert_eq!(handled["route"], "/approvals/{id}/decisions");
    assert_eq!(handled["path"], path);
    assert_eq!(handled["method"], "POST");
    assert_eq!(handled["status"], 200);
    assert_eq!(handled["person"], "dana");
    assert_eq!(handled["approval_id"], approval.id.to_string());
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

    let event = get_event(
        &format!("/approvals/{}", approval.id),
        "zoe",
        "globex",
        &["finance"],
    );
    let answer = invoke(&app, event).await;
    assert_eq!(refusal(&answer), (404, Some("not_found")));
}

#[tokio::test]
async fn without_an_authorizer_and_without_a_development_key_every_request_is_401() {
    let h = Harness::new(Embedded::fresh()).await;
    let process = h.process().await;
    let auth = shared::lambda::LambdaAuth::new(shared::api::GatewayClaims::default(), None);
    let app = decide::app(Arc::new(process.engine), Arc::new(auth));

    let event = without_authorizer(get_event("/approvals", "dana", "acme", &["finance"]));
    let answer = invoke(&app, event).await;
    assert_eq!(refusal(&answer), (401, Some("missing_token")));
}

/// Standard base64, as API Gateway encodes a form body (`isBase64Encoded`).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test]
async fn a_slack_click_arrives_without_an_authorizer_signed_by_slack_and_decides() {
    use shared::adapters::slack::{SigningSecret, SlackApp, sign};
    use shared::ports::clock::Clock;

    assert_eq!(base64(b"any carnal pleas"), "YW55IGNhcm5hbCBwbGVhcw==");
    let h = Harness::new(Embedded::fresh()).await;
    let queue = Arc::new(RecordingQueue::default());
    let process = h.process_with(|t| t, Delivery::Queue(queue.clone())).await;
    let (_, approval) = h.start_paused(&process, "c-102").await;
    let secret = "0123456789abcdef0123456789abcdef";
    let slack = SlackApp::new(
        SigningSecret::new(secret).unwrap(),
        h.directory.clone(),
        "https://hooks.slack.com/",
    )
    .unwrap();
    let auth = shared::lambda::LambdaAuth::new(shared::api::GatewayClaims::default(), None);
    let app = decide::app_with_slack(
        Arc::new(process.engine),
        Arc::new(auth),
        Some(Arc::new(slack)),
        shared::api::mcp::Settings::default(),
    );

    let value = json!({
        "approval": approval.id,
        "version": 1,
        "args_hash": approval.args_hash,
    })
    .to_string();
    let payload = json!({
        "type": "block_actions",
        "user": {"id": "U0DANA001"},
        "actions": [{
            "type": "button",
            "action_id": format!("countersign.approve.{}.v1", approval.id),
            "value": value,
        }],
    });
    let body = interaction_form(&payload);
    let slack_event = |timestamp: i64, signature: &str| {
        let mut event = without_authorizer(http_event(
            "POST",
            "/slack/interactions",
            None,
            "nobody",
            "acme",
            &[],
        ));
        event["body"] = json!(base64(body.as_bytes()));
        event["isBase64Encoded"] = json!(true);
        event["headers"]["content-type"] = json!("application/x-www-form-urlencoded");
        event["headers"]["x-slack-request-timestamp"] = json!(timestamp.to_string());
        event["headers"]["x-slack-signature"] = json!(signature);
        event
    };
    let now = h.clock.now().timestamp();
    let signature = sign(
        &SigningSecret::new(secret).unwrap(),
        &now.to_string(),
        body.as_bytes(),
    );

    let refused = invoke(&app, slack_event(now, "v0=0000")).await;
    assert_eq!(refusal(&refused), (401, Some("slack_signature")));
    assert!(queue.published().is_empty());

    let (status, answer) = invoke(&app, slack_event(now, &signature)).await;
    assert_eq!(status, 200, "{answer}");
    let text = answer["text"].as_str().unwrap();
    assert!(
        text.starts_with("You approved reimburse version 1"),
        "{text}"
    );
    assert_eq!(queue.published().len(), 1, "the decision queued the resume");
}

/// A JSON-RPC request to the MCP gateway of `agent`, as `person` of acme: the event, with the
/// Accept header MCP clients send.
fn mcp_event(
    agent: &str,
    person: &str,
    method: &str,
    params: serde_json::Value,
) -> serde_json::Value {
    let message = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let mut event = http_event(
        "POST",
        &format!("/mcp/{agent}"),
        Some(message),
        person,
        "acme",
        &["employee"],
    );
    event["headers"]["accept"] = json!("application/json, text/event-stream");
    event
}

#[tokio::test]
async fn the_decide_function_serves_the_mcp_gateway_to_the_authorizers_person_on_its_public_host() {
    let h = Harness::new(Embedded::fresh()).await;
    let queue = Arc::new(RecordingQueue::default());
    let process = h.process_with(|t| t, Delivery::Queue(queue.clone())).await;
    let engine = Arc::new(process.engine);
    let gateway = shared::api::mcp::Settings {
        wait: std::time::Duration::ZERO,
        public_url: Some("https://review.example.com/".parse().unwrap()),
    };
    let app = decide::app_with_slack(
        engine.clone(),
        Arc::new(shared::api::GatewayClaims::default()),
        None,
        gateway,
    );
    let pay =
        json!({"name": "reimburse", "arguments": {"claim_id": "c-102", "amount_cents": 25_000}});

    let (status, listed) = invoke(&app, mcp_event("expense", "ben", "tools/list", json!({}))).await;
    let (_, called) = invoke(&app, mcp_event("expense", "ben", "tools/call", pay)).await;

    assert_eq!(status, 200, "{listed}");
    assert!(
        listed["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|tool| tool["name"] == "reimburse"),
        "{listed}"
    );
    let result = &called["result"];
    assert_eq!(result["isError"], false, "{called}");
    assert_eq!(result["_meta"]["countersign/status"], "awaiting_approval");
    let pending = engine.pending(&harness::acme()).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].requested_by[0].as_str(), "ben");
    assert_eq!(
        result["_meta"]["countersign/approval_url"],
        format!("https://review.example.com/#approval={}", pending[0].id)
    );
}

#[tokio::test]
async fn the_decide_function_serves_the_gate_api_to_the_authorizers_person_with_the_approvals_link()
{
    let h = Harness::new(Embedded::fresh()).await;
    let queue = Arc::new(RecordingQueue::default());
    let process = h.process_with(|t| t, Delivery::Queue(queue.clone())).await;
    let gateway = shared::api::mcp::Settings {
        wait: std::time::Duration::ZERO,
        public_url: Some("https://review.example.com/".parse().unwrap()),
    };
    let app = decide::app_with_slack(
        Arc::new(process.engine),
        Arc::new(shared::api::GatewayClaims::default()),
        None,
        gateway,
    );
    let pay = json!({
        "agent": "expense",
        "tool": "reimburse",
        "args": {"claim_id": "c-102", "amount_cents": 25_000},
        "call_id": "call_1",
        "conversation": "thread-42",
    });

    let (status, proposed) = invoke(
        &app,
        http_event(
            "POST",
            "/gate/calls",
            Some(pay),
            "ben",
            "acme",
            &["employee"],
        ),
    )
    .await;
    let path = format!("/gate/calls/{}?wait=0", proposed["id"].as_str().unwrap());
    let (read_status, read) = invoke(&app, get_event(&path, "ben", "acme", &["employee"])).await;
    let elsewhere = invoke(&app, get_event(&path, "ben", "globex", &["employee"])).await;

    assert_eq!(status, 202, "{proposed}");
    assert_eq!(proposed["status"], "awaiting_approval");
    assert_eq!(proposed["call_id"], "call_1");
    assert_eq!(proposed["conversation"], "thread-42");
    assert_eq!(proposed["executor"], "countersign");
    let approval = proposed["approval"]["id"].as_str().unwrap();
    assert_eq!(
        proposed["approval"]["link"],
        format!("https://review.example.com/#approval={approval}")
    );
    assert_eq!(proposed["approval"]["approver_role"], "finance");
    assert_eq!(read_status, 200, "{read}");
    assert_eq!(read["id"], proposed["id"]);
    assert_eq!(read["status"], "awaiting_approval");
    assert_eq!(refusal(&elsewhere), (404, Some("not_found")));
}
